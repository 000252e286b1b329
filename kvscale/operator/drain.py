"""Before a Deployment scale-down, each engine pod's pod-deletion-cost from its requests in
flight (kvscale.control.drain), so the ReplicaSet deletes the least loaded. Best effort: without
Prometheus, without a per-pod reading, or when a write fails, the scale goes ahead in the
ReplicaSet controller's own order (logged)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kvscale.api.models import InferenceServiceStatus
from kvscale.control.drain import preempted, scale_down_marks
from kvscale.control.inventory import EnginePod
from kvscale.control.reconcile import Resource, Result
from kvscale.metrics.client import AsyncPrometheusClient, Missing
from kvscale.metrics.engines import ENGINES
from kvscale.metrics.promql import in_flight_by_pod
from kvscale.operator.k8s import Kube

log = logging.getLogger("kvscale.operator")

Io = Callable[..., Awaitable[Any]]


async def in_flight(prometheus: AsyncPrometheusClient | None, res: Resource, engine: str) -> dict[str, float]:
    """Requests in flight per engine pod, as Prometheus last scraped them; empty when unknown."""
    if prometheus is None or engine not in ENGINES:
        return {}
    reading = await prometheus.vector(in_flight_by_pod(ENGINES[engine], res.namespace, res.name))
    if isinstance(reading, Missing):
        return {}
    return {s.labels["pod"]: s.value for s in reading if "pod" in s.labels}


async def mark_scale_down(
    kube: Kube,
    prometheus: AsyncPrometheusClient | None,
    io: Io,
    res: Resource,
    engine: str,
    current: int | None,
    pods: Sequence[EnginePod],
    result: Result,
) -> int:
    """Writes the deletion costs when `result` scales the Deployment down; returns the pods written."""
    if not scale_down_marks(result.scale_to, result.scale_kind, current, pods, {}):
        return 0  # not a scale-down: nothing to read
    try:
        loads = await in_flight(prometheus, res, engine)
        if not loads:
            return 0
        marks = scale_down_marks(result.scale_to, result.scale_kind, current, pods, loads)
        written: int = await io(kube.mark_deletion_costs, res.namespace, marks)
    except Exception as exc:  # the scale-down still happens, in the ReplicaSet's own order
        log.warning("Could not mark %s/%s's pods for a drain-aware scale-down: %s", res.namespace, res.name, exc)
        return 0
    return written


async def shorten_preempted(
    kube: Kube, io: Io, res: Resource, grace_s: int | None, status: InferenceServiceStatus, pods: Sequence[EnginePod]
) -> int:
    """The pods the budget took drain within its grace (kvscale.control.drain.preempted); each
    tick while they are being deleted (idempotent: the API server keeps the shorter grace)."""
    victims = preempted(status, pods) if grace_s is not None else ()
    if not victims or grace_s is None:
        return 0
    try:
        written: int = await io(kube.shorten_grace, res.namespace, victims, grace_s)
    except Exception as exc:  # they still drain, within their own grace period
        log.warning("Could not shorten %s/%s's preempted pods' grace: %s", res.namespace, res.name, exc)
        return 0
    return written
