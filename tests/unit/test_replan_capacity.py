"""Capacity never drops in a change (issue 27 item 2): a re-plan that changes the engine pods
(GPU type, TP, engine args) starts the new fleet at the load's size, keeps every running
replica until the new pods are ready, then scales to the load's count. Pure reconcile/refresh."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from kvscale.api.models import InferenceServiceStatus, ObservedStatus
from kvscale.control.reconcile import DeploymentView, Observed, Resource, Result, reconcile, refresh
from kvscale.control.replan import TARGET_ANNOTATION, Before, recorded_target, size
from tests.unit.test_reconcile import CAT, NOW, POOLS, SETTINGS, condition_of, deployed, spec

A100 = {"hardware": {"gpuTypes": ["A100-80GB"]}}
H100 = {"hardware": {"gpuTypes": ["H100-SXM"]}}
A10G = {"hardware": {"gpuTypes": ["A10G"]}}
RES2 = Resource("ns", "chat", "uid-1", 2)


def test_size_converts_the_load_by_per_replica_capacity() -> None:
    # 6 replicas of 1.5/s asked for: 9/s; a new replica carries 4/s: 3 (ceil 2.25).
    before = Before(replicas=6, desired=6, observed_rate_per_s=None, rate_per_replica=1.5)
    s = size(before, 4.0, 0.1, floor=1, ceiling=10)
    assert (s.target, s.applied, s.need_per_s) == (3, 6, 9.0) and s.rolling
    # The observed rate with headroom, where larger: 10/s x 1.1 = 11/s -> 3 (2.75).
    assert size(replace(before, observed_rate_per_s=10.0), 4.0, 0.1, 1, 10).need_per_s == 11.0
    # A smaller new replica: more of them, at once (old ones still go only as new ones are ready).
    slower = size(before, 1.0, 0.1, floor=1, ceiling=20)
    assert (slower.target, slower.applied) == (9, 9) and not slower.rolling
    # Never below the plan's count for spec.workload, never above maxReplicas.
    assert size(before, 4.0, 0.1, floor=5, ceiling=10).target == 5
    assert size(before, 1.0, 0.1, floor=1, ceiling=7).target == 7
    # No decision, no rate: what runs now, converted.
    assert size(Before(6, None, None, 1.5), 4.0, 0.1, 1, 10).target == 3
    # Exact multiples do not buy a replica through float rounding.
    assert size(Before(6, 6, None, 1.5), 1.5, 0.1, 1, 10).target == 6


def _running_on_a100(replicas: int) -> tuple[InferenceServiceStatus, DeploymentView]:
    first = deployed(spec(**A100))
    assert first.applied_deployment is not None and first.status.plan is not None
    view = DeploymentView.of(first.applied_deployment)
    seen = replace(view, replicas=replicas, ready_replicas=replicas, updated_replicas=replicas, pods=replicas)
    status = first.status.model_copy(update={"desired_replicas": replicas, "replicas": replicas})
    return status, seen


def _deployment(result: Result) -> dict[str, Any]:
    [body] = [b for b in result.apply if b["kind"] == "Deployment"]
    return body


def test_a_gpu_type_change_keeps_the_running_replicas_and_aims_at_the_loads_count() -> None:
    status, seen = _running_on_a100(6)
    old_rate = status.plan.rate_per_replica if status.plan else 0.0
    result = reconcile(spec(**H100), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    plan = result.status.plan
    assert plan is not None and plan.gpu_type == "H100-SXM"
    need = 6 * old_rate
    target = max(plan.replicas, math.ceil(need / plan.rate_per_replica - 1e-9))
    body = _deployment(result)
    # Before issue 27 this was the plan's count for spec.workload (1): the Deployment controller
    # then scaled 6 ready A100 pods to 1 at once.
    assert plan.replicas < 6 and target < 6
    assert body["spec"]["replicas"] == 6 == result.status.replicas
    assert recorded_target(body) == target and body["metadata"]["annotations"][TARGET_ANNOTATION] == str(target)
    state, reason, message = condition_of(result.status, "Replanning")
    assert (state, reason) == ("True", "Rollout")
    assert "GPU type A100-80GB -> H100-SXM" in message and f"then {target} for the load" in message


def test_a_change_to_a_smaller_replica_starts_at_the_loads_count_at_once() -> None:
    status, seen = _running_on_a100(6)
    old_rate = status.plan.rate_per_replica if status.plan else 0.0
    body_spec = spec(**A10G, scaling={"maxReplicas": 100})
    result = reconcile(body_spec, RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    plan = result.status.plan
    assert plan is not None and plan.gpu_type == "A10G"
    target = math.ceil(6 * old_rate / plan.rate_per_replica - 1e-9)
    assert target > 6 and _deployment(result)["spec"]["replicas"] == target


def test_the_observed_rate_sizes_the_new_fleet_where_it_is_larger() -> None:
    status, seen = _running_on_a100(6)
    busy = status.model_copy(update={"observed": ObservedStatus(requests_per_second=150.0)})
    result = reconcile(spec(**H100), RES2, busy, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    plan = result.status.plan
    assert plan is not None
    target = math.ceil(150.0 * 1.1 / plan.rate_per_replica - 1e-9)
    assert target > 2 and recorded_target(_deployment(result)) == min(10, max(plan.replicas, target))


def test_refresh_scales_to_the_loads_count_once_the_new_pods_are_all_ready() -> None:
    status, seen = _running_on_a100(6)
    changed = reconcile(spec(**H100), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    applied = changed.applied_deployment
    assert applied is not None
    target = recorded_target(applied)
    assert target is not None and target < 6
    new = DeploymentView.of(applied)
    # Mid-rollout: 2 of 6 on the new pods, 7 pods in all (maxSurge 1): nothing is scaled.
    midway = replace(new, ready_replicas=6, updated_replicas=2, pods=7)
    during = refresh(spec(**H100), RES2, changed.status, Observed(POOLS, midway, applied=applied), CAT, SETTINGS, NOW)
    assert during is not None and during.scale_to is None
    assert condition_of(during.status, "Replanning")[0] == "True"
    # Every replica on the new pods and ready, the old ones gone: the load's count.
    done = replace(new, ready_replicas=6, updated_replicas=6, pods=6)
    after = refresh(spec(**H100), RES2, changed.status, Observed(POOLS, done, applied=applied), CAT, SETTINGS, NOW)
    assert after is not None and after.scale_to == target == after.status.replicas == after.status.desired_replicas
    assert after.applied_deployment is not None and after.applied_deployment["spec"]["replicas"] == target
    assert condition_of(after.status, "Replanning")[:2] == ("False", "RolledOut")
    # And nothing more afterwards: the autoscaler owns the size again.
    settled = replace(done, replicas=target, ready_replicas=target, updated_replicas=target, pods=target)
    again = refresh(
        spec(**H100), RES2, after.status, Observed(POOLS, settled, applied=after.applied_deployment), CAT, SETTINGS, NOW
    )
    assert again is not None and again.scale_to is None and again.apply == ()


def test_a_reconcile_during_the_rollout_keeps_every_running_replica() -> None:
    status, seen = _running_on_a100(6)
    changed = reconcile(spec(**H100), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    applied = changed.applied_deployment
    assert applied is not None
    midway = replace(DeploymentView.of(applied), ready_replicas=6, updated_replicas=2, pods=7)
    # A resume: the status says 6 desired (the rollout's), the pods are alike: 6 stay, target kept.
    again = reconcile(spec(**H100), RES2, changed.status, Observed(POOLS, midway), CAT, SETTINGS, now=NOW)
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
    result = refresh(both, RES2, status, Observed(POOLS, waiting, (stuck,)), CAT, SETTINGS, NOW)
    assert result is not None and result.status.plan is not None and result.status.plan.gpu_type == "H100-SXM"
    old_rate = status.plan.rate_per_replica if status.plan else 0.0
    target = max(result.status.plan.replicas, math.ceil(6 * old_rate / result.status.plan.rate_per_replica - 1e-9))
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
    changed = reconcile(spec(**H100), RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    assert condition_of(changed.status, "Replanning")[0] == "True"
    assert _scale_downs(changed.status) == []
    # The same quiet load once the rollout is over: the policy scales down (the check can fail).
    finished = refresh(
        spec(**H100),
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
        result = workload_tick(SPEC, RES, s, lambda: cluster, observed(4096), None, CAT, DRIFT, at(minutes))
        assert result is not None
        return result

    replanned = tick(tick(tick(status, 0).status, 9).status, 10)
    assert [e.reason for e in replanned.events][:1] == ["Replanned"]
    old_rate, plan = first.status.plan.rate_per_replica, replanned.status.plan
    assert plan is not None and plan.rate_per_replica < old_rate  # 8x longer prompts: a replica carries less
    target = math.ceil(6 * old_rate / plan.rate_per_replica - 1e-9)
    # Before: the same GPU type kept 6 replicas, now each carrying less than the load needs.
    assert target > 6 and _deployment(replanned)["spec"]["replicas"] == min(target, 10)
    assert condition_of(replanned.status, "Replanning")[0] == "True"


def test_a_budget_move_to_another_gpu_type_keeps_the_running_replicas() -> None:
    status, seen = _running_on_a100(6)
    both = spec(hardware={"gpuTypes": ["A100-80GB", "H100-SXM"]})
    moved = reconcile(both, RES2, status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW, prefer_gpu="H100-SXM")
    assert moved.status.plan is not None and moved.status.plan.gpu_type == "H100-SXM"
    assert _deployment(moved)["spec"]["replicas"] == 6 and condition_of(moved.status, "Replanning")[0] == "True"
