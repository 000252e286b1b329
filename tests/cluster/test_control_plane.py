"""The harness is a real cluster: schema validation, subresources, watches, conflicts,
scheduling onto GPU nodes, garbage collection and RBAC behave as in production."""

from __future__ import annotations

import base64
import copy
import threading
from typing import Any

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.cluster.harness import Cluster, wait_until

GROUP, VERSION, PLURAL = "test.kvscale.io", "v1", "widgets"
GPU_TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"},
]

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"},
                },
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                    "replicas": {"type": "integer", "minimum": 0},
                                },
                            },
                            "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
                        },
                    }
                },
            }
        ],
    },
}


def widget(name: str, size: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size, "replicas": 1},
    }


@pytest.fixture(scope="module")
def widgets_crd(api: client.ApiClient) -> client.CustomObjectsApi:
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(CRD)
    except ApiException as exc:
        if exc.status != 409:
            raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

    wait_until(established, 30, "the CRD Established")
    return client.CustomObjectsApi(api)


def test_crd_schema_is_enforced_by_the_api_server(widgets_crd: client.CustomObjectsApi, namespace: str) -> None:
    created = widgets_crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("ok", 3))
    assert created["spec"]["size"] == 3
    with pytest.raises(ApiException) as rejected:
        widgets_crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("too-big", 99))
    assert rejected.value.status == 422
    assert "spec.size" in rejected.value.body and "less than or equal to 10" in rejected.value.body


def test_status_and_scale_subresources(widgets_crd: client.CustomObjectsApi, namespace: str) -> None:
    widgets_crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("scaled", 2))
    widgets_crd.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "scaled", {"status": {"replicas": 1}}
    )
    scale = widgets_crd.get_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, "scaled")
    assert scale["spec"]["replicas"] == 1 and scale["status"]["replicas"] == 1
    widgets_crd.patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, "scaled", {"spec": {"replicas": 4}}
    )
    obj = widgets_crd.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "scaled")
    assert obj["spec"]["replicas"] == 4
    # A write to the main resource cannot change status: the subresource owns it.
    obj["status"] = {"replicas": 7}
    updated = widgets_crd.replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "scaled", obj)
    assert updated["status"]["replicas"] == 1


def test_watch_sees_create_and_update(widgets_crd: client.CustomObjectsApi, namespace: str) -> None:
    listed = widgets_crd.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    since = listed["metadata"]["resourceVersion"]  # a watch from here gets every later event
    events: list[tuple[str, int]] = []
    stream = watch.Watch()

    def consume() -> None:
        for event in stream.stream(
            widgets_crd.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            resource_version=since,
            timeout_seconds=30,
        ):
            events.append((event["type"], event["object"]["spec"]["size"]))
            if len(events) >= 2:
                stream.stop()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    widgets_crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("watched", 1))
    widgets_crd.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "watched", {"spec": {"size": 2}})
    thread.join(30)
    assert events == [("ADDED", 1), ("MODIFIED", 2)]


def test_stale_resource_version_conflicts(widgets_crd: client.CustomObjectsApi, namespace: str) -> None:
    first = widgets_crd.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("contended", 1))
    stale = copy.deepcopy(first)
    first["spec"]["size"] = 2
    widgets_crd.replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "contended", first)
    stale["spec"]["size"] = 3
    with pytest.raises(ApiException) as conflict:
        widgets_crd.replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "contended", stale)
    assert conflict.value.status == 409


def gpu_deployment(name: str, gpus: int, product: str, replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": product},
                    "tolerations": GPU_TOLERATIONS,
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:latest",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def pods(api: client.ApiClient, namespace: str, app: str) -> list[client.V1Pod]:
    return list(client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"app={app}").items)


def test_gpu_pods_run_on_matching_nodes_only(api: client.ApiClient, namespace: str) -> None:
    client.AppsV1Api(api).create_namespaced_deployment(
        namespace, gpu_deployment("a100-engine", 2, "NVIDIA-A100-SXM4-80GB")
    )

    def running() -> bool:
        items = pods(api, namespace, "a100-engine")
        return len(items) == 2 and all(p.status.phase == "Running" for p in items)

    wait_until(running, 60, "2 Running pods")
    core = client.CoreV1Api(api)
    for pod in pods(api, namespace, "a100-engine"):
        node = core.read_node(pod.spec.node_name)
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"


def _failed_scheduling(api: client.ApiClient, namespace: str, app: str) -> str:
    events = client.CoreV1Api(api).list_namespaced_event(namespace).items
    names = {p.metadata.name for p in pods(api, namespace, app)}
    messages = [e.message for e in events if e.reason == "FailedScheduling" and e.involved_object.name in names]
    return "\n".join(messages)


@pytest.mark.parametrize(
    ("product", "gpus", "why"),
    [
        ("NVIDIA-B200", 1, "didn't match Pod's node affinity/selector"),
        ("NVIDIA-H100-80GB-HBM3", 9, "Insufficient nvidia.com/gpu"),
    ],
)
def test_unsatisfiable_gpu_requests_stay_pending(
    api: client.ApiClient, namespace: str, product: str, gpus: int, why: str
) -> None:
    client.AppsV1Api(api).create_namespaced_deployment(namespace, gpu_deployment("nowhere", gpus, product, replicas=1))
    wait_until(lambda: why in _failed_scheduling(api, namespace, "nowhere"), 60, f"FailedScheduling: {why}")
    assert all(p.status.phase == "Pending" and not p.spec.node_name for p in pods(api, namespace, "nowhere"))


def test_deleting_the_owner_collects_its_children(api: client.ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(namespace, gpu_deployment("owned", 1, "NVIDIA-L4", replicas=2))
    wait_until(lambda: len(pods(api, namespace, "owned")) == 2, 60, "2 pods")
    assert apps.list_namespaced_replica_set(namespace, label_selector="app=owned").items
    apps.delete_namespaced_deployment("owned", namespace, propagation_policy="Background")
    wait_until(
        lambda: (
            not pods(api, namespace, "owned")
            and not apps.list_namespaced_replica_set(namespace, label_selector="app=owned").items
        ),
        60,
        "the garbage collector to delete the ReplicaSet and pods",
    )


def test_service_account_can_do_exactly_what_its_role_allows(
    api: client.ApiClient, cluster: Cluster, namespace: str
) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader-reads-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    token = core.create_namespaced_service_account_token(
        "reader", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    configuration = client.Configuration()
    configuration.host = kubeconfig["clusters"][0]["cluster"]["server"]
    ca_file = cluster.workdir / "sa-test-ca.crt"
    ca_file.write_bytes(base64.b64decode(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]))
    configuration.ssl_ca_cert = str(ca_file)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    as_reader = client.CoreV1Api(client.ApiClient(configuration))

    def reader_can_list() -> bool:
        as_reader.list_namespaced_pod(namespace)
        return True

    wait_until(reader_can_list, 30, "the RoleBinding to take effect")  # RBAC caches update asynchronously
    with pytest.raises(ApiException) as forbidden:
        as_reader.create_namespaced_config_map(namespace, {"metadata": {"name": "nope"}})
    assert forbidden.value.status == 403
    with pytest.raises(ApiException) as other_namespace:
        as_reader.list_namespaced_pod("default")
    assert other_namespace.value.status == 403

    authz = client.AuthorizationV1Api(api)
    user = f"system:serviceaccount:{namespace}:reader"

    def allowed(verb: str, resource: str) -> bool:
        review = authz.create_subject_access_review(
            {"spec": {"user": user, "resourceAttributes": {"namespace": namespace, "verb": verb, "resource": resource}}}
        )
        return bool(review.status.allowed)

    assert allowed("list", "pods") and allowed("get", "pods")
    assert not allowed("delete", "pods") and not allowed("create", "configmaps")
