"""Issue 31, LOW: a service pinned to 0 replicas showed phase Deploying (as if replicas were
coming). Its phase is Planned, and Ready says why nothing runs; lifting the pin deploys again."""

from __future__ import annotations

from kvscale.control.reconcile import DeploymentView, Observed, reconcile, refresh, settled
from tests.unit.test_children import mine
from tests.unit.test_reconcile import CAT, NOW, POOLS, RES, SETTINGS, condition_of, deployed, spec


def test_a_pin_to_zero_is_planned_not_deploying_and_says_so_once() -> None:
    body = spec(scaling={"replicas": 0})
    first = deployed(body)
    assert first.applied_deployment is not None and first.applied_deployment["spec"]["replicas"] == 0
    seen = Observed(
        POOLS,
        DeploymentView.of(first.applied_deployment),
        applied=first.applied_deployment,
        children=tuple(mine(b) for b in first.apply),
        applied_children=first.apply,
    )
    result = refresh(body, RES, first.status, seen, CAT, SETTINGS, NOW)
    assert result is not None and result.status.phase == "Planned"
    state, reason, message = condition_of(result.status, "Ready")
    assert (state, reason) == ("False", "PinnedToZero") and "spec.scaling.replicas pins 0 replicas" in message
    assert [e.reason for e in result.events] == ["PinnedToZero"]
    again = refresh(body, RES, result.status, seen, CAT, SETTINGS, NOW)
    assert again is not None and again.events == () and again.status.phase == "Planned"
    # An operator restart reconciles again: nothing to apply, and the phase stays Planned.
    resumed = reconcile(body, RES, result.status, seen, CAT, SETTINGS, now=NOW)
    assert settled(resumed, result.status, seen, RES)


def test_lifting_the_pin_deploys_and_the_phase_follows() -> None:
    pinned = spec(scaling={"replicas": 0})
    first = deployed(pinned)
    assert first.status.plan is not None
    gpu = first.status.plan.gpu_type
    zero = refresh(pinned, RES, first.status, Observed(POOLS, DeploymentView(0, 0, gpu)), CAT, SETTINGS, NOW)
    assert zero is not None and zero.status.phase == "Planned"
    lifted = spec(scaling={"replicas": 2})
    coming = refresh(lifted, RES, zero.status, Observed(POOLS, DeploymentView(2, 0, gpu)), CAT, SETTINGS, NOW)
    assert coming is not None and coming.status.phase == "Deploying"
    assert condition_of(coming.status, "Ready")[1] == "ReplicasNotReady"
    ready = refresh(lifted, RES, coming.status, Observed(POOLS, DeploymentView(2, 2, gpu)), CAT, SETTINGS, NOW)
    assert ready is not None and ready.status.phase == "Ready"
