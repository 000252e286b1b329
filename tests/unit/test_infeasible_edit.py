"""Issue 39: a spec edit that cannot be planned leaves the running plan serving and scaling
(phase and Ready from the workload, Planned=False saying what cannot be met), and the nearest
thing that can be met is sized on the cluster's free GPUs, not on the catalog."""

from __future__ import annotations

import copy
import datetime as dt
import re
from pathlib import Path
from typing import Any

import yaml

from kvscale.api.intent import parse_intent, read_spec
from kvscale.api.models import InferenceServiceStatus, status_patch
from kvscale.control.inventory import gpu_inventory
from kvscale.control.reconcile import DeploymentView, Observed, Resource, Result, reconcile, refresh
from kvscale.control.scaling import Fleet, fleet
from kvscale.control.settings import Settings
from kvscale.control.status import get_condition
from kvscale.sizing.catalog import default_catalog
from tests.cluster.harness import node_objects

ROOT = Path(__file__).resolve().parents[2]
CAT = default_catalog()
POOLS = gpu_inventory(CAT, list(node_objects(ROOT / "tests" / "cluster" / "nodepool.yaml")), [])
SETTINGS = Settings()
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
SAMPLE: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "samples" / "llama-3.1-70b-rag.yaml").read_text())["spec"]


def at_rate(rps: float) -> dict[str, Any]:
    body = copy.deepcopy(SAMPLE)
    body["workload"]["requestsPerSecond"] = rps
    return body


def serving() -> tuple[InferenceServiceStatus, DeploymentView]:
    """The sample deployed, its replicas all ready (as the status tick saw them)."""
    status, seen, _ = serving_applied()
    return status, seen


def serving_applied() -> tuple[InferenceServiceStatus, DeploymentView, dict[str, Any]]:
    """serving(), with the workload body kvscale applied."""
    first = reconcile(
        read_spec(SAMPLE),
        Resource("ns", "rag", "u", 1),
        InferenceServiceStatus(),
        Observed(POOLS),
        CAT,
        SETTINGS,
        now=NOW,
    )
    assert first.status.plan is not None and first.applied_deployment is not None
    seen = DeploymentView.of(first.applied_deployment)
    seen = DeploymentView(seen.replicas, seen.replicas, seen.gpu_type, seen.image, seen.args)
    ready = refresh(
        read_spec(SAMPLE), Resource("ns", "rag", "u", 1), first.status, Observed(POOLS, seen), CAT, SETTINGS, NOW
    )
    assert ready is not None and ready.status.phase == "Ready"
    return ready.status, seen, first.applied_deployment


def edited(rps: float, status: InferenceServiceStatus, seen: DeploymentView) -> Result:
    return reconcile(
        read_spec(at_rate(rps)), Resource("ns", "rag", "u", 2), status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW
    )


def test_an_edit_that_cannot_be_met_keeps_the_running_plan_managed() -> None:
    status, seen = serving()
    result = edited(20, status, seen)
    st = result.status
    assert result.apply == () and result.delete == () and result.retry is None  # nothing torn down, no error loop
    assert st.phase == "Ready" and st.observed_generation == 2
    assert st.plan == status.plan  # the running plan stays the one recorded
    ready, planned = get_condition(st, "Ready"), get_condition(st, "Planned")
    assert ready is not None and ready.status == "True" and f"{seen.replicas}/{seen.replicas}" in ready.message
    assert planned is not None and (planned.status, planned.reason) == ("False", "SLOInfeasible")
    assert "spec.workload.requestsPerSecond 20" in planned.message and "keeps serving" in planned.message
    assert [e.reason for e in result.events] == ["SLOInfeasible"] and result.events[0].type == "Warning"
    # The scaling tick and the status tick keep working on it.
    start = fleet(parse_intent(at_rate(20)), st, seen, 2)
    assert isinstance(start, Fleet) and start.current == seen.replicas
    assert (
        refresh(read_spec(at_rate(20)), Resource("ns", "rag", "u", 2), st, Observed(POOLS, seen), CAT, SETTINGS, NOW)
        is not None
    )
    # Once said, the same verdict writes nothing and posts nothing again.
    again = edited(20, st, seen)
    assert status_patch(st, again.status) == {} and again.events == ()


def _quoted_rates(message: str) -> list[float]:
    return [float(x) for x in re.findall(r"at most ([0-9.e+]+) requests/s", message)]


def test_the_nearest_rate_is_sized_on_the_cluster_and_is_servable() -> None:
    status, seen = serving()
    planned = get_condition(edited(20, status, seen).status, "Planned")
    assert planned is not None
    h100 = POOLS["H100-SXM"].free
    assert f"{h100} H100-SXM" in planned.message  # the cluster's GPUs, as free to this service
    # The planner's catalog-wide fleet (10 replicas of 8 H100 on a cluster of 16) is not offered.
    assert "raise spec.scaling.maxReplicas to 10" not in planned.message
    within, *_ = _quoted_rates(planned.message)
    assert 0 < within < 20
    # The rate quoted as servable within maxReplicas is: an edit to it plans and deploys.
    fits = edited(within, status, seen)
    ok = get_condition(fits.status, "Planned")
    assert ok is not None and ok.status == "True" and fits.apply
    # And a little more is not (the quote is the most, not any rate that fits).
    over = get_condition(edited(within * 1.1, status, seen).status, "Planned")
    assert over is not None and over.status == "False"


def test_a_replica_limit_the_cluster_can_lift_says_how_far() -> None:
    """Where the cluster holds the fleet the rate needs, the fix is the replica limit, sized on it."""
    status, seen = serving()
    message = get_condition(edited(20, status, seen).status, "Planned")
    assert message is not None
    within, everything = _quoted_rates(message.message)  # within maxReplicas; with every free GPU of one type
    assert within < everything
    body = at_rate((within + everything) / 2)  # beyond maxReplicas, within the cluster's GPUs
    result = reconcile(
        read_spec(body), Resource("ns", "rag", "u", 2), status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW
    )
    planned = get_condition(result.status, "Planned")
    assert planned is not None and planned.status == "False"
    n = int(re.search(r"raise spec.scaling.maxReplicas to (\d+)", planned.message).group(1))  # type: ignore[union-attr]
    body["scaling"]["maxReplicas"] = n
    raised = reconcile(
        read_spec(body), Resource("ns", "rag", "u", 3), status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW
    )
    ok = get_condition(raised.status, "Planned")
    assert ok is not None and ok.status == "True"


def test_a_spec_that_cannot_be_met_before_anything_runs_still_fails() -> None:
    result = reconcile(
        read_spec(at_rate(20)),
        Resource("ns", "rag", "u", 1),
        InferenceServiceStatus(),
        Observed(POOLS),
        CAT,
        SETTINGS,
        now=NOW,
    )
    assert result.status.phase == "Failed" and result.apply == ()
    planned = get_condition(result.status, "Planned")
    assert planned is not None and planned.reason == "SLOInfeasible" and _quoted_rates(planned.message)


def test_the_kept_plan_is_held_to_a_lower_bound_at_once() -> None:
    """Scaling within the bounds goes on: a lower maxReplicas (or pin) scales the running fleet
    down at once, and the applied workload records it (not drift for the status tick to revert)."""
    status, seen, applied = serving_applied()
    assert seen.replicas >= 2
    for scaling in ({"minReplicas": 1, "maxReplicas": 1}, {"replicas": 1}):
        body = at_rate(20)
        body["scaling"] = {**body["scaling"], **scaling}
        observed = Observed(POOLS, seen, applied=applied)
        result = reconcile(read_spec(body), Resource("ns", "rag", "u", 2), status, observed, CAT, SETTINGS, now=NOW)
        planned = get_condition(result.status, "Planned")
        assert planned is not None and planned.status == "False", scaling
        assert result.scale_to == 1 and result.status.desired_replicas == 1 and result.apply == ()
        assert result.applied_deployment is not None and result.applied_deployment["spec"]["replicas"] == 1
        assert any(e.reason == "Scaled" for e in result.events)


def test_a_kept_plan_of_an_observed_workload_does_not_stand_in_for_the_spec() -> None:
    """A plan re-made for the observed workload is kept across restarts while the spec is the
    one it was made under; a kept plan after an edit is not that: a resume plans from the spec."""
    status, seen = serving()
    kept = edited(20, status, seen).status
    assert kept.plan is not None and kept.plan.workload is not None
    observed = kept.plan.workload.model_copy(update={"source": "observed", "requests_per_second": 1.0})
    kept = kept.model_copy(update={"plan": kept.plan.model_copy(update={"workload": observed})})
    resumed = edited(20, kept, seen)
    planned = get_condition(resumed.status, "Planned")
    assert planned is not None and planned.status == "False" and resumed.apply == ()
