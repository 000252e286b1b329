"""What the operator feeds the policy from the cluster: start-to-ready times of engine pods
(each counted once, shared by model and GPU type) and the longest per-pod queue."""

from __future__ import annotations

from typing import Any

from kvscale.api.intent import parse_intent
from kvscale.autoscaling.observation import Observation
from kvscale.control.inventory import EnginePod, engine_pod
from kvscale.control.scaling import Fleet, ScalerMemory, cold_start_key, newly_ready, tick
from tests.unit.test_reconcile import CAT, NOW, RES, SETTINGS, SPEC, deployed


def pod(name: str, created: str, ready: str | None, gpu: str = "L4", deleting: bool = False) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": created}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": ready})
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "creationTimestamp": created,
            "labels": {
                "app.kubernetes.io/managed-by": "kvscale",
                "app.kubernetes.io/instance": "chat",
                "kvscale.io/gpu-type": gpu,
            },
            **({"deletionTimestamp": ready} if deleting else {}),
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running", "conditions": conditions},
    }


def entry(body: dict[str, Any]) -> EnginePod:
    made = engine_pod(body)
    assert made is not None
    return made[1]


def test_start_to_ready_is_pod_creation_to_its_ready_condition() -> None:
    assert entry(pod("a", "2026-11-23T12:00:00Z", "2026-11-23T12:01:30Z")).started_to_ready_s == 90.0
    assert entry(pod("b", "2026-11-23T12:00:00Z", None)).started_to_ready_s is None  # not ready yet
    assert entry(pod("c", "2026-11-23T12:00:00Z", "2026-11-23T11:00:00Z")).started_to_ready_s is None  # clock skew
    assert entry(pod("d", "not a time", "2026-11-23T12:00:00Z")).started_to_ready_s is None


def test_each_ready_pod_counts_once_and_only_on_the_planned_gpu_type() -> None:
    plan = deployed().status.plan
    assert plan is not None
    pods = (
        entry(pod("a", "2026-11-23T12:00:00Z", "2026-11-23T12:01:00Z", plan.gpu_type)),
        entry(pod("b", "2026-11-23T12:00:00Z", "2026-11-23T12:02:00Z", "T4")),  # an old plan's pod
        entry(pod("c", "2026-11-23T12:00:00Z", None, plan.gpu_type)),
    )
    fresh, counted = newly_ready(pods, plan, frozenset())
    assert fresh == (60.0,) and counted == {"a", "b"}
    again, _ = newly_ready(pods, plan, counted)
    assert again == ()
    later = (*pods[:2], entry(pod("c", "2026-11-23T12:00:00Z", "2026-11-23T12:03:00Z", plan.gpu_type)))
    assert newly_ready(later, plan, counted)[0] == (180.0,)
    gone, kept = newly_ready(later[2:], plan, counted | {"c"})
    assert gone == () and kept == {"c"}  # pods gone are forgotten


def test_a_fresh_policy_starts_from_the_cold_starts_learned_elsewhere() -> None:
    status = deployed().status
    plan = status.plan
    assert plan is not None
    intent = parse_intent(SPEC)
    obs = Observation(time_s=NOW.timestamp(), ready_replicas=1, starting_replicas=0, stale=True)
    start = Fleet(plan.replicas, plan.replicas, plan)
    fresh = tick(intent, RES, status, start, obs, "no data", ScalerMemory(), CAT, SETTINGS, NOW, (40.0, 75.0))
    assert fresh.decision.cold_start_s == 75.0  # the slowest start seen
    modelled = tick(intent, RES, status, start, obs, "no data", ScalerMemory(), CAT, SETTINGS, NOW)
    assert modelled.decision.cold_start_s == modelled.memory.cold_start_s != 75.0
    # A policy already running keeps its own history.
    kept = tick(intent, RES, status, start, obs, "no data", fresh.memory, CAT, SETTINGS, NOW, (5.0,))
    assert kept.decision.cold_start_s == 75.0
    assert cold_start_key(intent, plan) == ("llama-3.1-8b", plan.gpu_type, plan.tensor_parallel, plan.precision)
