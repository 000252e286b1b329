"""Drain-aware scale-down, the operator's pure part: before a Deployment scale-down, the
pod-deletion-cost of each engine pod from its requests in flight, so the ReplicaSet deletes the
least loaded (kvscale.autoscaling.drain, the rule the simulator uses too).

What follows the deletion is Kubernetes' and the pod's: a pod being deleted leaves routing at
once (the EndpointSlice controller marks its endpoint not ready and terminating, k8s.io/endpointslice
v0.34.4 utils.go podToEndpoint, so kube-proxy sends it nothing new; the InferencePool's endpoint
picker drops a pod with a deletionTimestamp from its datastore, sigs.k8s.io/gateway-api-inference-extension
v1.3.0 pkg/epp/util/pod/pod.go IsPodReady and pkg/epp/controller/pod_reconciler.go;
tests/cluster/test_drain.py watches the EndpointSlice), the preStop sleep
(kvscale.control.resources.PRE_STOP_SLEEP_S) lets its in-flight requests finish, and only then
does the engine get SIGTERM, on which vLLM 0.11 stops at once (vllm/entrypoints/launcher.py,
serve_http: the handler cancels the HTTP server task; api_server.py shuts the engine down before
it awaits the server): the preStop is the drain's bound.

A replica the GPUBudget takes for a higher priority drains within the budget's
spec.preemptionGraceSeconds instead: the operator deletes the ReplicaSet's victims again with that
grace period, which the API server accepts only when shorter (k8s.io/apiserver v0.34.4
pkg/registry/rest/delete.go BeforeDelete: "only a shorter grace period may be provided"), and
the kubelet then ends the preStop early.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kvscale.api.models import InferenceServiceStatus
from kvscale.autoscaling.drain import deletion_costs
from kvscale.control.budget import CONDITION as HELD
from kvscale.control.budget import BudgetBook
from kvscale.control.inventory import EnginePod
from kvscale.control.reconcile import DEPLOYMENT


def scale_down_marks(
    scale_to: int | None,
    scale_kind: str,
    current: int | None,
    pods: Sequence[EnginePod],
    in_flight: Mapping[str, float],
) -> dict[str, int]:
    """The deletion cost to write on each live engine pod before the Deployment goes from
    `current` to `scale_to` replicas; none when it is not a scale-down (a LeaderWorkerSet
    scales whole groups by index, which a cost does not steer). A pod whose load Prometheus did
    not report gets the highest cost: it may be busy."""
    if scale_to is None or current is None or scale_kind != DEPLOYMENT or scale_to >= current:
        return {}
    live = sorted(p.name for p in pods if not p.deleting)
    return deletion_costs({name: in_flight.get(name, math.nan) for name in live})


def preemption_grace_s(
    book: BudgetBook, namespace: str, labels: Mapping[str, str], gpu_type: str | None = None
) -> int | None:
    """The grace of the GPUBudget that bounds the service's `gpu_type` (the type its preempted
    pods run on: each type is bounded by its own budget), spec.preemptionGraceSeconds; None
    without one."""
    budget = book.governing(namespace, labels, gpu_type)
    spec = book.specs.get(budget) if budget is not None else None
    return spec.preemption_grace_seconds if spec is not None else None


def preempted(status: InferenceServiceStatus, pods: Sequence[EnginePod]) -> tuple[str, ...]:
    """Engine pods being deleted while the budget holds the service below its want (HeldByBudget
    True): the budget took them for a higher priority, so their drain is the budget's grace, not
    the pod's own. (A service held below its want is not scaled down by its policy.)"""
    held = any(c.type == HELD and c.status == "True" for c in status.conditions)
    return tuple(sorted(p.name for p in pods if p.deleting)) if held else ()
