"""Kubernetes I/O for the operator: reads, server-side apply, deletes. Nothing here decides."""

from __future__ import annotations

from functools import cache
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kvscale.operator import inference_pool
from kvscale.operator.resources import FIELD_MANAGER


@cache
def api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def core() -> client.CoreV1Api:
    return client.CoreV1Api(api_client())


def apps() -> client.AppsV1Api:
    return client.AppsV1Api(api_client())


def policy() -> client.PolicyV1Api:
    return client.PolicyV1Api(api_client())


def list_nodes() -> list[dict[str, Any]]:
    items = core().list_node().items
    return [api_client().sanitize_for_serialization(n) for n in items]


def list_gpu_pods() -> list[dict[str, Any]]:
    """Pods that hold node resources (not finished), in every namespace."""
    items = core().list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items
    return [api_client().sanitize_for_serialization(p) for p in items]


def list_pods(namespace: str, label_selector: str) -> list[dict[str, Any]]:
    items = core().list_namespaced_pod(namespace, label_selector=label_selector).items
    return [api_client().sanitize_for_serialization(p) for p in items]


def read_deployment(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(api_client().sanitize_for_serialization(apps().read_namespaced_deployment(name, namespace)))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


_APPLY = {
    "Deployment": lambda ns, name, body: apps().patch_namespaced_deployment(
        name, ns, body, field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml"
    ),
    "Service": lambda ns, name, body: core().patch_namespaced_service(
        name, ns, body, field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml"
    ),
    "PodDisruptionBudget": lambda ns, name, body: policy().patch_namespaced_pod_disruption_budget(
        name, ns, body, field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml"
    ),
}
_DELETE = {
    "Deployment": lambda ns, name: apps().delete_namespaced_deployment(name, ns),
    "Service": lambda ns, name: core().delete_namespaced_service(name, ns),
    "PodDisruptionBudget": lambda ns, name: policy().delete_namespaced_pod_disruption_budget(name, ns),
}


def apply(obj: dict[str, Any]) -> None:
    """Server-side apply: idempotent, and only the fields kvscale sets are kvscale's."""
    meta = obj["metadata"]
    _APPLY[obj["kind"]](meta["namespace"], meta["name"], obj)


def delete_if_present(kind: str, namespace: str, name: str) -> bool:
    try:
        _DELETE[kind](namespace, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def scale_deployment(namespace: str, name: str, replicas: int) -> None:
    """Through the scale subresource, so only the replica count changes."""
    apps().patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}})


# -- InferencePool (Gateway API inference extension) ---------------------------------------


def custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client())


def inference_pool_api_installed() -> bool:
    """Whether the API server serves inferencepools in inference.networking.k8s.io/v1 (its CRD is
    installed). Discovery: every authenticated user may read it, no RBAC rule needed."""
    try:
        resources = custom().get_api_resources(inference_pool.GROUP, inference_pool.VERSION)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.name == inference_pool.PLURAL for r in resources.resources or [])


def read_inference_pool(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj = custom().get_namespaced_custom_object(
            inference_pool.GROUP, inference_pool.VERSION, namespace, inference_pool.PLURAL, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(obj)


def list_inference_pools(namespace: str, label_selector: str) -> list[dict[str, Any]]:
    listed = custom().list_namespaced_custom_object(
        inference_pool.GROUP, inference_pool.VERSION, namespace, inference_pool.PLURAL, label_selector=label_selector
    )
    return [dict(i) for i in dict(listed).get("items", [])]


def apply_inference_pool(obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    custom().patch_namespaced_custom_object(
        inference_pool.GROUP,
        inference_pool.VERSION,
        meta["namespace"],
        inference_pool.PLURAL,
        meta["name"],
        obj,
        field_manager=FIELD_MANAGER,
        force=True,
        _content_type="application/apply-patch+yaml",
    )


def delete_inference_pool(namespace: str, name: str) -> bool:
    try:
        custom().delete_namespaced_custom_object(
            inference_pool.GROUP, inference_pool.VERSION, namespace, inference_pool.PLURAL, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
