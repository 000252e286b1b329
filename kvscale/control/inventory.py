"""The cluster's GPUs by catalog type (pure).

The operator keeps informers of GPU nodes and GPU-holding pods, fed by watches: each
object becomes a small entry here (`node_entry`, `pod_entry`) when it changes, and a
reconcile sums the entries (`pools`) instead of listing every pod in the cluster.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvscale.api import LABEL_GPU_TYPE, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_OWNER_UID, MANAGED_BY
from kvscale.control.unschedulable import Taint, Toleration, taints_of, tolerations_of
from kvscale.sizing.catalog import Catalog

GPU_PRODUCT_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name")
_FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class GpuPool:
    gpu_type: str
    product_label: str
    label_key: str
    resource_name: str
    allocatable: int
    requested: int
    max_per_node: int
    free_by_node: tuple[int, ...] = ()  # free GPUs on each node, largest first
    taints: tuple[Taint, ...] = ()  # the NoSchedule/NoExecute taints its nodes carry (each once)

    @property
    def nodes(self) -> int:
        return len(self.free_by_node)

    @property
    def free(self) -> int:
        return max(0, self.allocatable - self.requested)

    def pods_fitting(self, gpus_per_pod: int) -> int:
        """How many pods of `gpus_per_pod` GPUs the free GPUs hold, node by node: a plan larger
        than a node needs whole nodes, which a sum of free GPUs over nodes overstates."""
        if gpus_per_pod <= 0:
            return 0
        return sum(free // gpus_per_pod for free in self.free_by_node)


@dataclass(frozen=True)
class NodeGpus:
    """A schedulable node with GPUs of a catalog type."""

    name: str
    gpu_type: str
    product_label: str
    label_key: str
    resource_name: str
    allocatable: int
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True)
class PodGpus:
    """GPUs a pod holds on its node (extended resources, by name)."""

    node_name: str
    requests: tuple[tuple[str, int], ...]
    owner_uid: str | None

    def count(self, resource: str) -> int:
        return sum(n for r, n in self.requests if r == resource)


@dataclass(frozen=True)
class EnginePod:
    """An engine pod of one InferenceService, as the status refresh needs it."""

    name: str
    gpu_type: str | None
    node_name: str | None
    phase: str | None
    unschedulable_since: dt.datetime | None
    deleting: bool
    # Pod creation to its Ready condition, once Ready: what a scale-up waits for.
    started_to_ready_s: float | None = None
    # The scheduler's message on PodScheduled while unschedulable ("0/8 nodes are available: ...").
    unschedulable_message: str | None = None
    tolerations: tuple[Toleration, ...] = ()


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def node_entry(catalog: Catalog, node: Mapping[str, Any]) -> NodeGpus | None:
    """The node's GPUs, or None for a node without catalog GPUs or closed to scheduling."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable") or any(
        t.get("effect") == "NoSchedule" and t.get("key") == "node.kubernetes.io/unschedulable"
        for t in spec.get("taints") or []
    ):
        return None
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key in GPU_PRODUCT_LABELS:
        product = labels.get(key)
        gpu = catalog.gpu_for_node_label(product) if product else None
        if gpu is None:
            continue
        allocatable = _quantity(((node.get("status") or {}).get("allocatable") or {}).get(gpu.resource_name, 0))
        return NodeGpus(
            meta.get("name", ""), gpu.name, product or "", key, gpu.resource_name, allocatable, taints_of(spec)
        )
    return None


def pod_entry(pod: Mapping[str, Any], resources: Iterable[str]) -> PodGpus | None:
    """The GPUs a bound, unfinished pod holds, or None when it holds none."""
    node_name = (pod.get("spec") or {}).get("nodeName")
    if not node_name or (pod.get("status") or {}).get("phase") in _FINISHED:
        return None
    wanted = set(resources)
    totals: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for name in wanted & (set(limits) | set(requests)):
            totals[name] = totals.get(name, 0) + _quantity(limits.get(name, requests.get(name, 0)))
    held = tuple(sorted((r, n) for r, n in totals.items() if n > 0))
    if not held:
        return None
    owner = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_OWNER_UID)
    return PodGpus(node_name, held, owner)


def _unschedulable(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return dict(c)
    return None


def _unschedulable_since(pod: Mapping[str, Any]) -> dt.datetime | None:
    c = _unschedulable(pod)
    if c is None:
        return None
    stamp = c.get("lastTransitionTime") or (pod.get("metadata") or {}).get("creationTimestamp")
    return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None


def _stamp(text: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def _started_to_ready_s(pod: Mapping[str, Any]) -> float | None:
    created = _stamp((pod.get("metadata") or {}).get("creationTimestamp"))
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            ready = _stamp(c.get("lastTransitionTime"))
            if created is None or ready is None or ready < created:
                return None
            return (ready - created).total_seconds()
    return None


def engine_pod(pod: Mapping[str, Any]) -> tuple[tuple[str, str], EnginePod] | None:
    """((namespace, instance), entry) for a pod kvscale manages, else None."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or LABEL_INSTANCE not in labels:
        return None
    entry = EnginePod(
        name=meta.get("name", ""),
        gpu_type=labels.get(LABEL_GPU_TYPE),
        node_name=(pod.get("spec") or {}).get("nodeName"),
        phase=(pod.get("status") or {}).get("phase"),
        unschedulable_since=_unschedulable_since(pod),
        deleting=bool(meta.get("deletionTimestamp")),
        started_to_ready_s=_started_to_ready_s(pod),
        unschedulable_message=str((_unschedulable(pod) or {}).get("message") or "") or None,
        tolerations=tolerations_of(pod.get("spec")),
    )
    return (meta.get("namespace", ""), labels[LABEL_INSTANCE]), entry


def pools(
    nodes: Iterable[NodeGpus], pods: Iterable[PodGpus], exclude_owner_uid: str | None = None
) -> dict[str, GpuPool]:
    """GPU pools by catalog type. Pods of `exclude_owner_uid` do not count as requested: a
    re-plan may reuse the GPUs its own pods hold."""
    by_node = {n.name: n for n in nodes}
    requested: dict[str, int] = {}
    for pod in pods:
        node = by_node.get(pod.node_name)
        if node is None or (exclude_owner_uid and pod.owner_uid == exclude_owner_uid):
            continue
        requested[node.name] = requested.get(node.name, 0) + pod.count(node.resource_name)
    out: dict[str, GpuPool] = {}
    free_by_node: dict[str, list[int]] = {}
    taints: dict[str, set[Taint]] = {}
    for name, node in sorted(by_node.items()):
        old = out.get(node.gpu_type)
        free_by_node.setdefault(node.gpu_type, []).append(max(0, node.allocatable - requested.get(name, 0)))
        taints.setdefault(node.gpu_type, set()).update(node.taints)
        out[node.gpu_type] = GpuPool(
            gpu_type=node.gpu_type,
            product_label=old.product_label if old else node.product_label,
            label_key=node.label_key,
            resource_name=node.resource_name,
            allocatable=(old.allocatable if old else 0) + node.allocatable,
            requested=(old.requested if old else 0) + requested.get(name, 0),
            max_per_node=max(old.max_per_node if old else 0, node.allocatable),
        )
    return {
        t: replace(
            p,
            free_by_node=tuple(sorted(free_by_node[t], reverse=True)),
            taints=tuple(sorted(taints[t], key=Taint.text)),
        )
        for t, p in out.items()
    }


def gpu_inventory(
    catalog: Catalog,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    exclude_owner_uid: str | None = None,
) -> dict[str, GpuPool]:
    """GPU pools from whole Node and Pod objects (the CLI and tests; the operator uses informers)."""
    node_entries = [e for n in nodes if (e := node_entry(catalog, n)) is not None]
    resources = {n.resource_name for n in node_entries}
    pod_entries = [h for p in pods if (h := pod_entry(p, resources)) is not None]
    return pools(node_entries, pod_entries, exclude_owner_uid)
