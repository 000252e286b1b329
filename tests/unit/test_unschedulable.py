"""Issue 31, defect 2: why engine pods wait, read from the scheduler's message, and the re-plan
only a GPU shortage earns, left in force for KVSCALE_GPU_EXCLUSION_TTL. The messages follow
kube-scheduler v1.34.4's FitError.Error (pkg/scheduler/framework/types.go); the cluster test
(tests/cluster/test_unschedulable.py) checks them against the real scheduler."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from kvscale.api.models import InferenceServiceStatus
from kvscale.control import exclusions
from kvscale.control.inventory import EnginePod, engine_pod, gpu_inventory
from kvscale.control.reconcile import DeploymentView, Observed, reconcile, refresh, replans
from kvscale.control.settings import Settings
from kvscale.control.unschedulable import Taint, Toleration, diagnose, scheduler_reasons, untolerated
from tests.unit.test_reconcile import CAT, NODES, NOW, POOLS, RES, SETTINGS, SHORT, SPEC, condition_of, deployed

# The scheduler's messages on the test cluster (12 kwok nodes, 4 of the planned type); SHORT: GPUs taken.
TAINTED = (
    "0/12 nodes are available: 4 node(s) had untolerated taint(s), 8 node(s) didn't match Pod's node "
    "affinity/selector. no new claims to deallocate, preemption: 0/12 nodes are available: 12 Preemption is not "
    "helpful for scheduling."
)
UNBOUND = (
    "0/12 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/12 nodes are "
    "available: 12 Preemption is not helpful for scheduling."
)
MAINTENANCE = Taint("maintenance", "true", "NoSchedule")
GPU_TOLERATION = Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule")
TTL = SETTINGS.gpu_exclusion_ttl_s


def test_the_schedulers_message_reads_into_a_histogram_or_a_prefilter_cause() -> None:
    assert scheduler_reasons(SHORT) == (
        12,
        "",
        {"Insufficient nvidia.com/gpu": 4, "node(s) didn't match Pod's node affinity/selector": 8},
    )
    assert scheduler_reasons(UNBOUND) == (12, "pod has unbound immediate PersistentVolumeClaims", {})
    assert scheduler_reasons("pod is waiting on a custom scheduler") is None
    assert scheduler_reasons(None) is None


def test_tolerations_match_taints_as_kubernetes_does() -> None:
    assert Toleration(operator="Exists").tolerates(MAINTENANCE)  # no key: every taint
    assert Toleration("maintenance", "Equal", "true", "NoSchedule").tolerates(MAINTENANCE)
    assert not Toleration("maintenance", "Equal", "false", "NoSchedule").tolerates(MAINTENANCE)
    assert not Toleration("maintenance", "Exists", "", "NoExecute").tolerates(MAINTENANCE)
    assert Toleration("maintenance", "", "true", "").tolerates(MAINTENANCE)  # no operator is Equal
    gpu = Taint("nvidia.com/gpu", "present", "NoSchedule")
    assert untolerated((gpu, MAINTENANCE), (GPU_TOLERATION,)) == (MAINTENANCE,)


def test_only_a_gpu_shortage_on_every_node_of_the_type_replans() -> None:
    short = diagnose(SHORT, "A100-80GB", "nvidia.com/gpu", 4)
    assert short.replan and short.reason == "WaitingForGPUs" and short.quote == SHORT
    # Two A100 nodes full, two tainted: tolerating the taint is the fix, not another GPU type.
    mixed = (
        "0/12 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint(s), "
        "8 node(s) didn't match Pod's node affinity/selector."
    )
    partly = diagnose(mixed, "A100-80GB", "nvidia.com/gpu", 4, (MAINTENANCE,), (GPU_TOLERATION,))
    assert not partly.replan and partly.reason == "UntoleratedTaint"
    assert not diagnose(SHORT, "A100-80GB", "nvidia.com/gpu", 5).replan  # a fifth node refused for another reason
    gone = diagnose(SHORT, "A100-80GB", "nvidia.com/gpu", 0)  # no schedulable node of the type is left
    assert gone.replan and gone.reason == "NoGPUNodes"


def test_other_causes_are_named_with_their_fix_and_never_replan() -> None:
    taint = diagnose(TAINTED, "A100-80GB", "nvidia.com/gpu", 4, (MAINTENANCE,), (GPU_TOLERATION,))
    assert (taint.replan, taint.reason) == (False, "UntoleratedTaint")
    assert "maintenance=true:NoSchedule" in taint.cause and "KVSCALE_EXTRA_TOLERATIONS" in taint.fix
    assert TAINTED in taint.says()
    volume = diagnose(UNBOUND, "A100-80GB", "nvidia.com/gpu", 4)
    assert (volume.replan, volume.reason) == (False, "VolumeNotBound") and "spec.model.cache" in volume.cause
    cpu = diagnose(
        "0/12 nodes are available: 4 Insufficient cpu, 8 node(s) didn't match Pod's node affinity/selector.",
        "A100-80GB",
        "nvidia.com/gpu",
        4,
    )
    assert (cpu.replan, cpu.reason) == (False, "InsufficientResources") and "free cpu" in cpu.cause
    other = diagnose("waiting for a gang of 8", "A100-80GB", "nvidia.com/gpu", 4)
    assert (other.replan, other.reason) == (False, "Unschedulable") and other.quote == "waiting for a gang of 8"


def test_an_engine_pod_carries_the_schedulers_message_and_its_tolerations() -> None:
    pod = {
        "metadata": {
            "name": "chat-1",
            "namespace": "ns",
            "labels": {"app.kubernetes.io/managed-by": "kvscale", "app.kubernetes.io/instance": "chat"},
        },
        "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": TAINTED,
                    "lastTransitionTime": "2026-11-23T11:50:00Z",
                }
            ],
        },
    }
    found = engine_pod(pod)
    assert found is not None
    _, entry = found
    assert entry.unschedulable_message == TAINTED and entry.tolerations == (GPU_TOLERATION,)
    assert entry.unschedulable_since == dt.datetime(2026, 11, 23, 11, 50, tzinfo=dt.UTC)


def test_the_inventory_keeps_the_taints_of_a_types_nodes() -> None:
    tainted = [
        {
            **n,
            "spec": {
                **n["spec"],
                "taints": [
                    *n["spec"].get("taints", []),
                    {"key": "maintenance", "value": "true", "effect": "NoSchedule"},
                ],
            },
        }
        if n["metadata"]["name"].startswith("a100")
        else n
        for n in NODES
    ]
    pools = gpu_inventory(CAT, tainted, [])
    assert MAINTENANCE in pools["A100-80GB"].taints and MAINTENANCE not in pools["H100-SXM"].taints
    assert pools["A100-80GB"].nodes == 4


def stuck(gpu: str, message: str, waited_s: float) -> EnginePod:
    return EnginePod(
        "chat-1",
        gpu,
        None,
        "Pending",
        NOW - dt.timedelta(seconds=waited_s),
        False,
        unschedulable_message=message,
        tolerations=(GPU_TOLERATION, Toleration("kwok.x-k8s.io/node", "Exists", "", "NoSchedule")),
    )


def tainted_pools() -> Observed:
    return Observed(
        {
            name: replace(pool, taints=(*pool.taints, MAINTENANCE)) if name == "A100-80GB" else pool
            for name, pool in POOLS.items()
        }
    )


def test_pods_held_by_a_taint_never_replan_and_the_condition_quotes_the_scheduler() -> None:
    first = deployed()
    assert first.status.plan is not None
    gpu = first.status.plan.gpu_type
    waited = SETTINGS.unschedulable_timeout_s * 10
    seen = replace(tainted_pools(), deployment=DeploymentView(1, 0, gpu), pods=(stuck(gpu, TAINTED, waited),))
    assert not replans(first.status, seen, SETTINGS, NOW)
    result = refresh(SPEC, RES, first.status, seen, CAT, SETTINGS, NOW)
    assert result is not None and result.apply == () and result.status.plan is not None
    assert result.status.plan.gpu_type == gpu and result.status.plan.excluded_gpu_types == []
    state, reason, message = condition_of(result.status, "Scheduled")
    assert (state, reason) == ("False", "UntoleratedTaint")
    assert f'"{TAINTED}"' in message and "maintenance=true:NoSchedule" in message and "does not re-plan" in message
    assert [e.reason for e in result.events] == ["UntoleratedTaint"]
    again = refresh(SPEC, RES, result.status, seen, CAT, SETTINGS, NOW)
    assert again is not None and "UntoleratedTaint" not in [e.reason for e in again.events]


def test_a_gpu_shortage_waits_the_timeout_then_replans_and_leaves_the_type_out_for_the_ttl() -> None:
    first = deployed()
    assert first.status.plan is not None
    gpu = first.status.plan.gpu_type
    early = Observed(POOLS, DeploymentView(1, 0, gpu), (stuck(gpu, SHORT, 1),))
    waiting = refresh(SPEC, RES, first.status, early, CAT, SETTINGS, NOW)
    assert waiting is not None and waiting.status.plan is not None and waiting.status.plan.gpu_type == gpu
    state, reason, message = condition_of(waiting.status, "Scheduled")
    assert (state, reason) == ("False", "WaitingForGPUs") and SHORT in message and "re-plans without" in message
    late = replace(early, pods=(stuck(gpu, SHORT, SETTINGS.unschedulable_timeout_s),))
    assert replans(first.status, late, SETTINGS, NOW)
    result = refresh(SPEC, RES, first.status, late, CAT, SETTINGS, NOW)
    assert result is not None and result.status.plan is not None
    assert result.status.plan.excluded_gpu_types == [gpu] and result.status.plan.gpu_type != gpu
    assert (
        result.events[0].reason == "GPUTypeUnschedulable" and "Insufficient nvidia.com/gpu" in result.events[0].message
    )
    until = NOW + dt.timedelta(seconds=TTL)
    assert exclusions.expires_at(result.status, TTL) == until
    _, _, said = condition_of(result.status, exclusions.CONDITION)
    assert exclusions.until_in(said) == until and "30m" in said


def excluded_status() -> tuple[InferenceServiceStatus, str]:
    first = deployed()
    assert first.status.plan is not None
    gpu = first.status.plan.gpu_type
    late = Observed(POOLS, DeploymentView(1, 0, gpu), (stuck(gpu, SHORT, SETTINGS.unschedulable_timeout_s),))
    result = refresh(SPEC, RES, first.status, late, CAT, SETTINGS, NOW)
    assert result is not None
    return result.status, gpu


def test_the_exclusion_expires_and_the_cheaper_plan_returns() -> None:
    status, gpu = excluded_status()
    assert status.plan is not None
    moved = status.plan.gpu_type
    there = Observed(POOLS, DeploymentView(1, 1, moved))
    before = NOW + dt.timedelta(seconds=TTL - 1)
    assert not replans(status, there, SETTINGS, before)
    kept = refresh(SPEC, RES, status, there, CAT, SETTINGS, before)
    assert kept is not None and kept.status.plan is not None and kept.status.plan.gpu_type == moved
    at = NOW + dt.timedelta(seconds=TTL)
    assert replans(status, there, SETTINGS, at)
    back = refresh(SPEC, RES, status, there, CAT, SETTINGS, at)
    assert back is not None and back.status.plan is not None
    assert back.status.plan.gpu_type == gpu and back.status.plan.excluded_gpu_types == []
    assert exclusions.CONDITION not in [c.type for c in back.status.conditions]
    assert back.events[0].reason == "GPUTypesReturned" and gpu in back.events[0].message
    assert any(e.reason == "Planned" for e in back.events)


def test_a_spec_change_keeps_an_exclusion_in_force_and_drops_one_expired_or_without_a_time() -> None:
    status, gpu = excluded_status()
    assert status.plan is not None
    moved = status.plan.gpu_type
    soon = reconcile(SPEC, RES, status, Observed(POOLS), CAT, SETTINGS, now=NOW + dt.timedelta(seconds=60))
    assert soon.status.plan is not None and soon.status.plan.gpu_type == moved
    assert soon.status.plan.excluded_gpu_types == [gpu]
    later = reconcile(SPEC, RES, status, Observed(POOLS), CAT, SETTINGS, now=NOW + dt.timedelta(seconds=TTL))
    assert later.status.plan is not None and later.status.plan.gpu_type == gpu
    assert exclusions.CONDITION not in [c.type for c in later.status.conditions]
    # An exclusion an older operator wrote, without a time: it kept services on dearer plans for good.
    legacy = status.model_copy(update={"conditions": [c for c in status.conditions if c.type != exclusions.CONDITION]})
    assert exclusions.expired(legacy, TTL, NOW)
    again = reconcile(SPEC, RES, legacy, Observed(POOLS), CAT, SETTINGS, now=NOW)
    assert again.status.plan is not None and again.status.plan.gpu_type == gpu


def test_the_ttl_is_a_setting() -> None:
    assert Settings().gpu_exclusion_ttl_s == 1800
    assert Settings.from_env({"KVSCALE_GPU_EXCLUSION_TTL": "2h"}).gpu_exclusion_ttl_s == 7200
