"""The InferencePool (Gateway API inference extension, inference.networking.k8s.io/v1) for an
InferenceService's engine pods, and what to do when one already exists. Pure: the handlers read
the API server, call these, and apply what they return.

Field names follow the v1 CRD of sigs.k8s.io/gateway-api-inference-extension
(config/crd/bases/inference.networking.k8s.io_inferencepools.yaml, fetched by
hack/fetch-inference-crd.sh): spec.selector.matchLabels, spec.targetPorts[].number and
spec.endpointPickerRef{group, kind, name, port{number}, failureMode}; all three are required.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kvscale.api.models import InferencePoolRouting

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
KIND = "InferencePool"
PLURAL = "inferencepools"
API_VERSION = f"{GROUP}/{VERSION}"
CONDITION = "InferencePool"
# The extension's inferencepool Helm chart names its endpoint picker "<pool>-epp" and serves it on
# 9002 (config/charts/inferencepool/templates/_helpers.tpl and values.yaml, inferenceExtension.extProcPort).
EPP_SUFFIX = "-epp"
EPP_PORT = 9002


def pool_name(service_name: str, routing: InferencePoolRouting) -> str:
    return routing.name or service_name


def endpoint_picker_ref(name: str, routing: InferencePoolRouting) -> dict[str, Any]:
    """spec.endpointPickerRef as written in the InferenceService, else the chart's conventional picker."""
    ref = routing.endpoint_picker_ref
    if ref is None:
        return {"name": f"{name}{EPP_SUFFIX}", "port": {"number": EPP_PORT}}
    out: dict[str, Any] = {"name": ref.name}
    if ref.group is not None:
        out["group"] = ref.group
    if ref.kind is not None:
        out["kind"] = ref.kind
    if ref.port is not None:
        out["port"] = {"number": ref.port.number}
    if ref.failure_mode is not None:
        out["failureMode"] = ref.failure_mode
    return out


def inference_pool(
    service_name: str, routing: InferencePoolRouting, selector_labels: Mapping[str, str], port: int
) -> dict[str, Any]:
    """The pool kvscale owns: it selects exactly the service's engine pods (the Deployment's own
    selector labels) on the engine port."""
    name = pool_name(service_name, routing)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "labels": dict(selector_labels)},
        "spec": {
            "selector": {"matchLabels": dict(selector_labels)},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": endpoint_picker_ref(name, routing),
        },
    }


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == owner_uid for r in refs)


@dataclass(frozen=True)
class PoolPlan:
    """What the operator does about the pool: apply the owned pool, join a foreign one by adding
    its selector's labels to the pods, or neither; and the InferencePool condition to report."""

    action: Literal["apply", "join", "none"]
    ok: bool
    reason: str
    message: str
    pool: dict[str, Any] | None = None
    join_labels: dict[str, str] = field(default_factory=dict)


def plan_pool(
    service_name: str,
    owner_uid: str,
    routing: InferencePoolRouting,
    selector_labels: Mapping[str, str],
    pod_labels: Mapping[str, str],
    port: int,
    api_installed: bool,
    existing: Mapping[str, Any] | None,
) -> PoolPlan:
    """Decides from what the API server holds: no InferencePool API (the CRD is not installed),
    no pool or one this service owns (apply ours), or a pool someone else owns (join it)."""
    name = pool_name(service_name, routing)
    if not api_installed:
        return PoolPlan(
            "none",
            False,
            "APINotInstalled",
            f"the InferencePool API ({API_VERSION}) is not installed in this cluster: install the Gateway API "
            "inference extension's CRDs; the engines are deployed without a pool",
        )
    if existing is None or owned_by(existing, owner_uid):
        pool = inference_pool(service_name, routing, selector_labels, port)
        picker = pool["spec"]["endpointPickerRef"]
        return PoolPlan(
            "apply",
            True,
            "Owned",
            f"InferencePool {name} selects this service's pods on port {port}; endpoint picker "
            f"{picker['name']}:{picker.get('port', {}).get('number', '-')}",
            pool=pool,
        )
    wanted = dict((existing.get("spec", {}).get("selector") or {}).get("matchLabels") or {})
    if not wanted:
        return PoolPlan(
            "none", False, "SelectorUnusable", f"InferencePool {name} exists, is not kvscale's, and has no matchLabels"
        )
    clashes = sorted(k for k, v in wanted.items() if k in pod_labels and pod_labels[k] != v)
    if clashes:
        detail = ", ".join(f"{k}={wanted[k]} (pods have {pod_labels[k]})" for k in clashes)
        return PoolPlan(
            "none",
            False,
            "SelectorConflict",
            f"InferencePool {name} exists and is not kvscale's; its selector needs {detail}, which would "
            "change labels kvscale relies on: name a different pool in spec.routing.inferencePool.name",
        )
    ports = [p.get("number") for p in existing.get("spec", {}).get("targetPorts") or []]
    if port not in ports:
        return PoolPlan(
            "join",
            False,
            "JoinedPortMismatch",
            f"joined InferencePool {name} (not kvscale's) but it targets ports {ports}, not the engine port {port}",
            join_labels=wanted,
        )
    return PoolPlan(
        "join",
        True,
        "Joined",
        f"InferencePool {name} exists and is not kvscale's: the pods carry its selector's labels "
        f"({', '.join(f'{k}={v}' for k, v in sorted(wanted.items()))}); the pool is left alone",
        join_labels=wanted,
    )
