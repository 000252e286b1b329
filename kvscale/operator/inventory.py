"""The cluster's GPUs by catalog type, from Node and Pod objects (plain dicts: pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvscale.sizing.catalog import Catalog

GPU_PRODUCT_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name")


@dataclass(frozen=True)
class GpuPool:
    gpu_type: str
    product_label: str
    label_key: str
    resource_name: str
    allocatable: int
    requested: int
    max_per_node: int

    @property
    def free(self) -> int:
        return max(0, self.allocatable - self.requested)


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def _pod_gpus(pod: Mapping[str, Any], resource: str) -> int:
    total = 0
    for container in pod.get("spec", {}).get("containers", []) or []:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        total += _quantity(limits.get(resource, requests.get(resource, 0)))
    return total


def gpu_inventory(
    catalog: Catalog,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    exclude_owner_uid: str | None = None,
) -> dict[str, GpuPool]:
    """GPU pools by catalog type. Pods owned (via ReplicaSet labels) by `exclude_owner_uid`
    are not counted as requested: a re-plan may reuse the GPUs its own pods hold."""
    by_node: dict[str, tuple[str, str, str, str, int]] = {}
    for node in nodes:
        meta = node.get("metadata", {})
        labels = meta.get("labels", {}) or {}
        if any(
            t.get("effect") == "NoSchedule" and t.get("key") == "node.kubernetes.io/unschedulable"
            for t in node.get("spec", {}).get("taints", []) or []
        ):
            continue
        if node.get("spec", {}).get("unschedulable"):
            continue
        for key in GPU_PRODUCT_LABELS:
            product = labels.get(key)
            gpu = catalog.gpu_for_node_label(product) if product else None
            if gpu is None:
                continue
            allocatable = _quantity((node.get("status", {}).get("allocatable") or {}).get(gpu.resource_name, 0))
            by_node[meta.get("name", "")] = (gpu.name, product or "", key, gpu.resource_name, allocatable)
            break
    requested: dict[str, int] = {}
    for pod in pods:
        node_name = pod.get("spec", {}).get("nodeName")
        if node_name not in by_node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if (
            exclude_owner_uid
            and (pod.get("metadata", {}).get("labels", {}) or {}).get("kvscale.io/owner-uid") == exclude_owner_uid
        ):
            continue
        requested[node_name] = requested.get(node_name, 0) + _pod_gpus(pod, by_node[node_name][3])
    pools: dict[str, GpuPool] = {}
    for node_name, (gpu_type, product, key, resource, allocatable) in sorted(by_node.items()):
        old = pools.get(gpu_type)
        used = requested.get(node_name, 0)
        pools[gpu_type] = GpuPool(
            gpu_type=gpu_type,
            product_label=old.product_label if old else product,
            label_key=key,
            resource_name=resource,
            allocatable=(old.allocatable if old else 0) + allocatable,
            requested=(old.requested if old else 0) + used,
            max_per_node=max(old.max_per_node if old else 0, allocatable),
        )
    return pools
