"""Capacity never drops in a change (issue 27 item 2): a re-plan that changes the engine pods
(GPU type, TP, engine args) starts the new fleet at the load's size, keeps every running
replica until the new pods are ready, then scales to the load's count. Pure reconcile/refresh."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from kvscale.api.intent import read_spec
from kvscale.api.models import InferenceServiceStatus, ObservedStatus
from kvscale.autoscaling.budget import Grant
from kvscale.control.reconcile import DeploymentView, Observed, Resource, Result, reconcile, refresh, replan
from kvscale.control.replan import TARGET_ANNOTATION, Before, BudgetMove, recorded_target, size
from tests.unit.test_reconcile import CAT, NOW, POOLS, SETTINGS, condition_of, deployed, spec

A100 = {"hardware": {"gpuTypes": ["A100-80GB"]}}
H100 = {"hardware": {"gpuTypes": ["H100-SXM"]}}
A10G = {"hardware": {"gpuTypes": ["A10G"]}}
RES2 = Resource("ns", "chat", "uid-1", 2)


def test_size_converts_the_observed_load_by_per_replica_capacity() -> None:
    # 9/s observed, 10% headroom: 9.9/s; a new replica carries 4/s: 3 (ceil 2.475), rolled at the 6 running.
    before = Before(replicas=6, observed_rate_per_s=9.0, planned_rate_per_s=2.0)
    s = size(before, 4.0, 0.1, floor=1, ceiling=10)
    assert (s.target, s.applied) == (3, 6) and s.need_per_s == pytest.approx(9.9) and s.rolling
    # A smaller new replica: more of them, but only once the template has rolled at the count
    # that runs now (issue 38, finding 5: the increase would go to the old ReplicaSet).
    slower = size(before, 1.0, 0.1, floor=1, ceiling=20)
    assert (slower.target, slower.applied) == (10, 6) and slower.rolling
    # Never below the plan's count for its workload, never above maxReplicas.
    assert size(before, 4.0, 0.1, floor=5, ceiling=10).target == 5
    assert size(before, 1.0, 0.1, floor=1, ceiling=7).target == 7
    # Nothing observed: the rate the plan was made for (no headroom on top: the plan has it).
    assert size(Before(6, None, 2.0), 1.0, 0.1, 1, 10).target == 2
    # Nothing known at all: as many as run now.
    assert size(Before(6, None, None), 4.0, 0.1, 1, 10).target == 6
    # Exact multiples do not buy a replica through float rounding.
    assert size(Before(6, None, 9.0), 1.5, 0.1, 1, 10).target == 6
    # Nothing runs yet: the target at once.
    assert size(Before(0, 9.0), 4.0, 0.1, 1, 10).applied == 3


def test_a_move_is_sized_on_the_observed_load_not_on_the_old_fleets_capacity() -> None:
    # Issue 38, finding 6: 1 A100 of 16.3 requests/s, asked for by the last decision, carrying
    # 1 request/s, moved to L4 replicas of 2.2/s: "8 for the load (16.3 requests/s, from the
    # last decision, 1 x 16.3299/s)". The load is 1/s: one L4.
    s = size(Before(replicas=1, observed_rate_per_s=1.0, planned_rate_per_s=1.0), 2.2, 0.1, floor=1, ceiling=10)
    assert (s.target, s.applied) == (1, 1) and "observed" in s.basis


def _running_on_a100(replicas: int, observed: float | None = None) -> tuple[InferenceServiceStatus, DeploymentView]:
    first = deployed(spec(**A100))
    assert first.applied_deployment is not None and first.status.plan is not None
    view = DeploymentView.of(first.applied_deployment)
    seen = replace(view, replicas=replicas, ready_replicas=replicas, updated_replicas=replicas, pods=replicas)
    update: dict[str, Any] = {"desired_replicas": replicas, "replicas": replicas}
    if observed is not None:
        update["observed"] = ObservedStatus(requests_per_second=observed)
    status = first.status.model_copy(update=update)
    return status, seen


def _deployment(result: Result) -> dict[str, Any]:
    [body] = [b for b in result.apply if b["kind"] == "Deployment"]
    return body


def test_a_gpu_type_change_keeps_the_running_replicas_and_aims_at_the_loads_count() -> None:
    status, seen = _running_on_a100(6, observed=20.0)
    result = reconcile(read_spec(spec(**H100)), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    plan = result.status.plan
    assert plan is not None and plan.gpu_type == "H100-SXM"
    target = max(plan.replicas, math.ceil(20.0 * 1.1 / plan.rate_per_replica - 1e-9))
    body = _deployment(result)
    # Before issue 27 this was the plan's count for spec.workload (1): the Deployment controller
    # then scaled 6 ready A100 pods to 1 at once.
    assert plan.replicas < 6 and target < 6
    assert body["spec"]["replicas"] == 6 == result.status.replicas
    assert recorded_target(body) == target and body["metadata"]["annotations"][TARGET_ANNOTATION] == str(target)
    state, reason, message = condition_of(result.status, "Replanning")
    assert (state, reason) == ("True", "Rollout")
    assert "GPU type A100-80GB -> H100-SXM" in message and f"then {target} for the load" in message
    assert "observed 20/s" in message


def test_a_change_to_a_smaller_replica_rolls_at_the_running_count_then_grows() -> None:
    # Issue 38, finding 5: replicas and the template in one write gave the increase to the old
    # ReplicaSet (A100 1 -> 8 before any L4 came). The template rolls at 6; the new
    # ReplicaSet grows past them only once the rollout is done.
    status, seen = _running_on_a100(6, observed=60.0)
    body_spec = spec(**A10G, scaling={"maxReplicas": 100})
    result = reconcile(read_spec(body_spec), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    plan = result.status.plan
    assert plan is not None and plan.gpu_type == "A10G"
    target = math.ceil(60.0 * 1.1 / plan.rate_per_replica - 1e-9)
    body = _deployment(result)
    assert target > 6 and body["spec"]["replicas"] == 6 == result.status.replicas and recorded_target(body) == target
    # Mid-rollout (3 of 6 on A10G, 7 pods): nothing grows yet.
    new = DeploymentView.of(body)
    midway = replace(new, ready_replicas=6, updated_replicas=3, pods=7)
    during = refresh(
        read_spec(body_spec), RES2, result.status, Observed(POOLS, midway, applied=body), CAT, SETTINGS, NOW
    )
    assert during is not None and during.scale_to is None
    # Rolled out: every replica on A10G, the A100 pods gone: now the load's count.
    done = replace(new, ready_replicas=6, updated_replicas=6, pods=6)
    after = refresh(read_spec(body_spec), RES2, result.status, Observed(POOLS, done, applied=body), CAT, SETTINGS, NOW)
    assert after is not None and after.status.replicas == target
    # Growth is applied as the workload, so that a GPUBudget caps it (the handler's under_budget).
    assert after.scale_to is None and [b["spec"]["replicas"] for b in after.apply] == [target]
    assert after.applied_deployment == after.apply[0] and after.apply[0]["spec"]["template"] == body["spec"]["template"]
    assert condition_of(after.status, "Replanning")[:2] == ("False", "RolledOut")
    assert f"scaled to {target}" in condition_of(after.status, "Replanning")[2]


def test_the_observed_rate_sizes_the_new_fleet_where_it_is_larger() -> None:
    status, seen = _running_on_a100(6)
    busy = status.model_copy(update={"observed": ObservedStatus(requests_per_second=150.0)})
    result = reconcile(read_spec(spec(**H100)), RES2, busy, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    plan = result.status.plan
    assert plan is not None
    target = math.ceil(150.0 * 1.1 / plan.rate_per_replica - 1e-9)
    assert target > 2 and recorded_target(_deployment(result)) == min(10, max(plan.replicas, target))


def test_refresh_scales_to_the_loads_count_once_the_new_pods_are_all_ready() -> None:
    status, seen = _running_on_a100(6)
    changed = reconcile(read_spec(spec(**H100)), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    applied = changed.applied_deployment
    assert applied is not None
    target = recorded_target(applied)
    assert target is not None and target < 6
    new = DeploymentView.of(applied)
    # Mid-rollout: 2 of 6 on the new pods, 7 pods in all (maxSurge 1): nothing is scaled.
    midway = replace(new, ready_replicas=6, updated_replicas=2, pods=7)
    during = refresh(
        read_spec(spec(**H100)), RES2, changed.status, Observed(POOLS, midway, applied=applied), CAT, SETTINGS, NOW
    )
    assert during is not None and during.scale_to is None
    assert condition_of(during.status, "Replanning")[0] == "True"
    # Every replica on the new pods and ready, the old ones gone: the load's count.
    done = replace(new, ready_replicas=6, updated_replicas=6, pods=6)
    after = refresh(
        read_spec(spec(**H100)), RES2, changed.status, Observed(POOLS, done, applied=applied), CAT, SETTINGS, NOW
    )
    assert after is not None and after.scale_to == target == after.status.replicas == after.status.desired_replicas
    assert after.applied_deployment is not None and after.applied_deployment["spec"]["replicas"] == target
    assert condition_of(after.status, "Replanning")[:2] == ("False", "RolledOut")
    # And nothing more afterwards: the autoscaler owns the size again.
    settled = replace(done, replicas=target, ready_replicas=target, updated_replicas=target, pods=target)
    again = refresh(
        read_spec(spec(**H100)),
        RES2,
        after.status,
        Observed(POOLS, settled, applied=after.applied_deployment),
        CAT,
        SETTINGS,
        NOW,
    )
    assert again is not None and again.scale_to is None and again.apply == ()


def test_a_reconcile_during_the_rollout_keeps_every_running_replica() -> None:
    status, seen = _running_on_a100(6)
    changed = reconcile(read_spec(spec(**H100)), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    applied = changed.applied_deployment
    assert applied is not None
    midway = replace(DeploymentView.of(applied), ready_replicas=6, updated_replicas=2, pods=7)
    # A resume: the status says 6 desired (the rollout's), the pods are alike: 6 stay, target kept.
    again = reconcile(read_spec(spec(**H100)), RES2, changed.status, Observed(POOLS, midway), CAT, SETTINGS, now=NOW)
    body = _deployment(again)
    assert body["spec"]["replicas"] == 6 and recorded_target(body) == recorded_target(applied)


def test_the_unschedulable_replan_keeps_the_load() -> None:
    import datetime as dt

    from kvscale.control.inventory import EnginePod

    status, seen = _running_on_a100(6)
    # The A100 pods never placed (say the nodes went): after the timeout kvscale drops A100.
    from tests.unit.test_reconcile import SHORT  # the scheduler's words for "no GPU free": the one cause that re-plans

    stuck = EnginePod(
        "chat-1", "A100-80GB", None, "Pending", NOW - dt.timedelta(seconds=600), False, unschedulable_message=SHORT
    )
    waiting = replace(seen, ready_replicas=0)
    both = spec(hardware={"gpuTypes": ["A100-80GB", "H100-SXM"]})
    result = refresh(read_spec(both), RES2, status, Observed(POOLS, waiting, (stuck,)), CAT, SETTINGS, NOW)
    assert result is not None and result.status.plan is not None and result.status.plan.gpu_type == "H100-SXM"
    # Nothing observed (no pod serves): the rate the plan was made for, spec.workload's 4/s.
    target = max(result.status.plan.replicas, math.ceil(4.0 / result.status.plan.rate_per_replica - 1e-9))
    assert recorded_target(_deployment(result)) == target and _deployment(result)["spec"]["replicas"] == 6


def _scale_downs(status: InferenceServiceStatus) -> list[int]:
    """The autoscaler's scale-downs over 10 quiet minutes, starting from 6 replicas."""
    from kvscale.api.intent import parse_intent
    from kvscale.autoscaling.observation import Observation
    from kvscale.control.scaling import Fleet, ScalerMemory, tick

    body = spec(**H100)
    intent = parse_intent(body)
    assert status.plan is not None
    start = Fleet(6, 6, status.plan)
    memory, downs = ScalerMemory(), []
    for i in range(40):
        obs = Observation(
            time_s=1000.0 + 15 * i,
            ready_replicas=6,
            starting_replicas=0,
            arrival_rate_per_s=0.5,
            ttft_p_s=0.1,
            tpot_p_s=0.02,
            running=1.0,
            waiting=0.0,
        )
        done = tick(intent, RES2, status, start, obs, None, memory, CAT, SETTINGS, NOW)
        memory = done.memory
        if done.result.scale_to is not None and done.result.scale_to < 6:
            downs.append(done.result.scale_to)
    return downs


def test_the_autoscaler_does_not_scale_down_while_the_old_pods_are_replaced() -> None:
    status, seen = _running_on_a100(6)
    changed = reconcile(read_spec(spec(**H100)), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    assert condition_of(changed.status, "Replanning")[0] == "True"
    assert _scale_downs(changed.status) == []
    # The same quiet load once the rollout is over: the policy scales down (the check can fail).
    finished = refresh(
        read_spec(spec(**H100)),
        RES2,
        changed.status,
        Observed(
            POOLS,
            replace(DeploymentView.of(changed.applied_deployment or {}), ready_replicas=6, updated_replicas=6, pods=6),
            applied=changed.applied_deployment,
        ),
        CAT,
        SETTINGS,
        NOW,
    )
    assert finished is not None and condition_of(finished.status, "Replanning")[0] == "False"
    assert _scale_downs(finished.status)


def test_a_drift_replan_sizes_the_new_pods_for_the_load() -> None:
    from kvscale.control.workload import workload_tick
    from tests.unit.test_reconcile import RES, SPEC
    from tests.unit.test_replan import SETTINGS as DRIFT
    from tests.unit.test_replan import at, observed

    first = deployed()
    assert first.applied_deployment is not None and first.status.plan is not None
    six = replace(DeploymentView.of(first.applied_deployment), replicas=6, ready_replicas=6, updated_replicas=6, pods=6)
    status = first.status.model_copy(update={"desired_replicas": 6, "replicas": 6})
    cluster = Observed(POOLS, six, applied=first.applied_deployment)

    def tick(s: InferenceServiceStatus, minutes: float) -> Result:
        result = workload_tick(read_spec(SPEC), RES, s, lambda: cluster, observed(4096), None, CAT, DRIFT, at(minutes))
        assert result is not None
        return result

    replanned = tick(tick(tick(status, 0).status, 9).status, 10)
    assert [e.reason for e in replanned.events][:1] == ["Replanned"]
    old_rate, plan = first.status.plan.rate_per_replica, replanned.status.plan
    assert plan is not None and plan.rate_per_replica < old_rate  # 8x longer prompts: a replica carries less
    assert plan.workload is not None and plan.workload.source == "observed"
    # Sized on the rate the observed workload carries, the template rolled at the 6 running.
    need = plan.workload.requests_per_second
    target = max(plan.replicas, math.ceil(need / plan.rate_per_replica - 1e-9))
    body = _deployment(replanned)
    assert body["spec"]["replicas"] == 6 and recorded_target(body) == min(target, 10)
    assert condition_of(replanned.status, "Replanning")[0] == "True"


def test_a_budget_move_to_another_gpu_type_keeps_the_running_replicas() -> None:
    status, seen = _running_on_a100(6)
    both = spec(hardware={"gpuTypes": ["A100-80GB", "H100-SXM"]})
    grant = Grant("chat", 0, "H100-SXM", 8, 6, 6, 1, 0, True, "a budget's move")
    moved = replan(BudgetMove(grant, "b"), read_spec(both), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, NOW)
    assert moved.status.plan is not None and moved.status.plan.gpu_type == "H100-SXM"
    assert _deployment(moved)["spec"]["replicas"] == 6 and condition_of(moved.status, "Replanning")[0] == "True"


def test_a_move_whose_new_type_places_only_part_of_the_fleet_does_not_keep_both_for_good() -> None:
    # Issue 38, finding 6: 4 L4 placed, 1 Pending, and PartiallyPlaced kept 4 A100 + 4 L4
    # running for good. During a move the old fleet still serves: the new type that cannot
    # place the rest is left out again after the timeout, as one that places nothing is.
    import datetime as dt

    from kvscale.control.inventory import EnginePod
    from tests.unit.test_reconcile import SHORT

    status, seen = _running_on_a100(6)
    both = spec(hardware={"gpuTypes": ["A100-80GB", "H100-SXM"]})
    grant = Grant("chat", 0, "H100-SXM", 8, 6, 6, 1, 0, True, "a budget's move")
    moved = replan(BudgetMove(grant, "b"), read_spec(both), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, NOW)
    assert moved.status.plan is not None and moved.status.plan.gpu_type == "H100-SXM"
    body = _deployment(moved)
    rolling = replace(DeploymentView.of(body), ready_replicas=6, updated_replicas=2, pods=8)
    since = NOW - dt.timedelta(seconds=SETTINGS.unschedulable_timeout_s + 60)
    pods = (
        EnginePod("chat-h-1", "H100-SXM", "node-h1", "Running", None, False),
        EnginePod("chat-h-2", "H100-SXM", None, "Pending", since, False, unschedulable_message=SHORT),
    )
    cluster = Observed(POOLS, rolling, pods, applied=body)
    result = refresh(read_spec(both), RES2, moved.status, cluster, CAT, SETTINGS, NOW)
    assert result is not None and result.status.plan is not None
    assert [e.reason for e in result.events][:1] == ["GPUTypeUnschedulable"]
    assert result.status.plan.gpu_type == "A100-80GB" and "H100-SXM" in result.status.plan.excluded_gpu_types
    assert _deployment(result)["spec"]["replicas"] == 6  # back at the count that runs: the A100 pods stay
    assert condition_of(result.status, "Scheduled")[1] != "PartiallyPlaced"


def test_the_autoscaler_holds_the_count_while_a_type_change_rolls_out() -> None:
    # A scale-up mid-rollout is shared out in proportion to the ReplicaSets' sizes, most of it
    # to the old pods' ReplicaSet on the type being left: the count holds until the rollout's end
    # (which scales to the load's count).
    from kvscale.api.intent import parse_intent
    from kvscale.control.scaling import Fleet, ScalerMemory, fleet, tick
    from tests.unit.test_reconcile import _obs

    status, seen = _running_on_a100(2, observed=2.0)
    body = spec(**H100)
    result = reconcile(read_spec(body), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    assert condition_of(result.status, "Replanning")[0] == "True"
    intent = parse_intent(body)
    start = fleet(intent, result.status, DeploymentView(2, 2, "H100-SXM"))
    assert isinstance(start, Fleet)
    done = tick(intent, RES2, result.status, start, _obs(500.0, 2), None, ScalerMemory(), CAT, SETTINGS, NOW)
    assert done.decision.replicas > 2  # the policy does want more
    assert done.result.scale_to is None and done.result.status.replicas == 2
    # Once rolled out (no Replanning), the same tick scales.
    settled = result.status.model_copy(
        update={"conditions": [c for c in result.status.conditions if c.type != "Replanning"]}
    )
    done = tick(intent, RES2, settled, start, _obs(500.0, 2), None, ScalerMemory(), CAT, SETTINGS, NOW)
    assert done.result.scale_to is not None and done.result.scale_to > 2
