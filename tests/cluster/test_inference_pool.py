"""spec.routing.inferencePool against the real InferencePool CRD (Gateway API inference extension,
fetched from its Go module by hack/fetch-inference-crd.sh): the owned pool, its garbage
collection, adopt mode, removal, and the condition when the CRD is not installed."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.control import inference_pool as ip
from kvscale.control.resources import labels
from tests.cluster.harness import Cluster, find_inference_crd, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_operator import SAMPLES, condition, create, engine_pods, get, objects, wait_phase

ROOT = Path(__file__).resolve().parents[2]
CRD_NAME = f"{ip.PLURAL}.{ip.GROUP}"


def routed(service: str, **pool: Any) -> dict[str, Any]:
    """The small custom-architecture sample, on L4 or A10G, asking for an InferencePool (`pool`:
    spec.routing.inferencePool's fields)."""
    body: dict[str, Any] = copy.deepcopy(SAMPLES["custom-architecture"])
    body["metadata"]["name"] = service
    body["spec"]["hardware"]["gpuTypes"] = ["L4", "A10G"]
    body["spec"]["routing"] = {"inferencePool": pool}
    return body


def served(cluster: Cluster) -> bool:
    return cluster.kubectl_ok("get", "--raw", f"/apis/{ip.GROUP}/{ip.VERSION}")


def install_crd(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(find_inference_crd()))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    wait_until(lambda: served(cluster), 30, "the InferencePool API in discovery")


def uninstall_crd(cluster: Cluster) -> None:
    cluster.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true", "--timeout=60s")
    wait_until(lambda: not served(cluster), 30, "the InferencePool API gone from discovery")


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
    op = Operator(cluster, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()


def pools(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def read_pool(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(pools(api).get_namespaced_custom_object(ip.GROUP, ip.VERSION, namespace, ip.PLURAL, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def wait_condition(api: client.ApiClient, namespace: str, name: str, reason: str, op: Operator) -> dict[str, Any]:
    try:
        wait_until(
            lambda: condition(get(api, namespace, name), ip.CONDITION).get("reason") == reason,
            60,
            f"{name}: InferencePool condition {reason}",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {get(api, namespace, name).get('status')}\n{op.tail()}") from exc
    return condition(get(api, namespace, name), ip.CONDITION)


def pool_members(api: client.ApiClient, namespace: str, pool: dict[str, Any]) -> set[str]:
    """The pods the pool's selector picks, as a gateway's endpoint picker would."""
    match = pool["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in match.items())
    return {
        p.metadata.name for p in client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    }


def test_without_the_crd_the_rest_deploys_and_the_pool_follows_the_crd(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    uninstall_crd(cluster)
    create(api, namespace, routed("early"))
    wait_phase(api, namespace, "early", "Ready", operator)
    missing = wait_condition(api, namespace, "early", "APINotInstalled", operator)
    assert missing["status"] == "False" and f"{ip.GROUP}/{ip.VERSION}" in missing["message"]
    assert client.AppsV1Api(api).read_namespaced_deployment("early", namespace).status.ready_replicas >= 1
    # Installed later: the status refresh notices and the pool is created.
    install_crd(cluster)
    wait_condition(api, namespace, "early", "Owned", operator)
    assert read_pool(api, namespace, "early") is not None


def test_owned_pool_selects_exactly_the_engine_pods_and_goes_with_the_service(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    install_crd(cluster)
    create(api, namespace, routed("chat"))
    # A neighbour in the same namespace whose pods the pool must not pick.
    create(api, namespace, {**routed("other"), "spec": {**routed("other")["spec"], "routing": {}}})
    obj = wait_phase(api, namespace, "chat", "Ready", operator)
    wait_phase(api, namespace, "other", "Ready", operator)
    owned = wait_condition(api, namespace, "chat", "Owned", operator)
    assert owned["status"] == "True"
    pool = read_pool(api, namespace, "chat")
    assert pool is not None
    assert pool["spec"]["selector"]["matchLabels"] == labels("chat")
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"]["name"] == "chat-epp"
    assert pool["spec"]["endpointPickerRef"]["port"] == {"number": 9002}
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"  # the CRD's default
    owner = pool["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "InferenceService",
        "chat",
        obj["metadata"]["uid"],
        True,
    )
    mine = {p.metadata.name for p in engine_pods(api, namespace, "chat")}
    assert mine and pool_members(api, namespace, pool) == mine
    gpu = obj["status"]["plan"]["gpuType"]
    for p in engine_pods(api, namespace, "chat"):
        assert p.metadata.labels["kvscale.io/model"] == "acme-in-house-3b"
        assert p.metadata.labels["kvscale.io/gpu-type"] == gpu
        assert p.metadata.labels["kvscale.io/variant"] == f"{gpu.lower()}-tp1-bf16"
    assert read_pool(api, namespace, "other") is None

    objects(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "chat")
    wait_until(lambda: read_pool(api, namespace, "chat") is None, 90, "the owned pool garbage-collected")


def test_an_endpoint_picker_ref_is_passed_through_and_renames_move_the_pool(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    install_crd(cluster)
    ref = {"name": "picker", "port": {"number": 9100}, "failureMode": "FailOpen"}
    create(api, namespace, routed("svc", name="first", endpointPickerRef=ref))
    wait_condition(api, namespace, "svc", "Owned", operator)
    first = read_pool(api, namespace, "first")
    assert first is not None and first["spec"]["endpointPickerRef"] == {**ref, "group": "", "kind": "Service"}
    patch = {"spec": {"routing": {"inferencePool": {"name": "second", "endpointPickerRef": ref}}}}
    objects(api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "svc", patch)
    wait_until(
        lambda: read_pool(api, namespace, "second") is not None and read_pool(api, namespace, "first") is None,
        60,
        "the pool renamed: second created, first deleted",
    )
    # Routing removed: the pool goes and so does the condition.
    objects(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "svc", {"spec": {"routing": {"inferencePool": None}}}
    )
    wait_until(lambda: read_pool(api, namespace, "second") is None, 60, "the pool deleted with routing removed")
    wait_until(lambda: not condition(get(api, namespace, "svc"), ip.CONDITION), 30, "the condition dropped")


def foreign_pool(namespace: str, name: str, match: dict[str, str], port: int = 8000) -> dict[str, Any]:
    return {
        "apiVersion": ip.API_VERSION,
        "kind": ip.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": match},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {"name": "shared-epp", "port": {"number": 9002}},
        },
    }


def test_a_pool_kvscale_does_not_own_is_joined_and_left_alone(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    install_crd(cluster)
    shared = foreign_pool(namespace, "shared", {"pool": "shared-llama"})
    pools(api).create_namespaced_custom_object(ip.GROUP, ip.VERSION, namespace, ip.PLURAL, shared)
    before = read_pool(api, namespace, "shared")
    assert before is not None
    create(api, namespace, routed("a", name="shared"))
    create(api, namespace, routed("b", name="shared"))
    for name in ("a", "b"):
        joined = wait_condition(api, namespace, name, "Joined", operator)
        assert joined["status"] == "True" and "pool=shared-llama" in joined["message"]
        wait_phase(api, namespace, name, "Ready", operator)

    def both_joined() -> bool:
        members = pool_members(api, namespace, before)
        ours = {p.metadata.name for n in ("a", "b") for p in engine_pods(api, namespace, n)}
        return bool(ours) and members == ours

    wait_until(both_joined, 60, "the pods of a and b, and only those, in the shared pool")
    after = read_pool(api, namespace, "shared")
    assert after is not None and after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert not after["metadata"].get("ownerReferences")
    objects(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "a")
    wait_until(lambda: not engine_pods(api, namespace, "a"), 60, "a's pods gone")
    assert read_pool(api, namespace, "shared") is not None


def test_a_foreign_selector_that_would_relabel_kvscales_pods_is_refused(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    install_crd(cluster)
    clash = foreign_pool(namespace, "vllm", {"app.kubernetes.io/instance": "vllm"})
    pools(api).create_namespaced_custom_object(ip.GROUP, ip.VERSION, namespace, ip.PLURAL, clash)
    create(api, namespace, routed("mine", name="vllm"))
    refused = wait_condition(api, namespace, "mine", "SelectorConflict", operator)
    assert refused["status"] == "False" and "app.kubernetes.io/instance=vllm" in refused["message"]
    wait_phase(api, namespace, "mine", "Ready", operator)  # the engines still deploy
    assert all(p.metadata.labels["app.kubernetes.io/instance"] == "mine" for p in engine_pods(api, namespace, "mine"))
