"""The operator with a model larger than a node, on the real API server with the real LWS CRD:
Llama 3.1 405B in bf16 on the kwok pool's 8-GPU H100 nodes plans TP 8 x PP 2 and is deployed
as a LeaderWorkerSet of two-node groups behind a Service of leaders; scaled in groups; edits to
the set reverted; back on one node (fp8) it becomes a Deployment again; whole free nodes are
what a group needs.

No LWS controller runs in the test cluster, so no group's pods exist: readiness stays 0 groups,
and the objects (not pods) are checked."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.control import leader_worker_set as lws
from tests.cluster.harness import GPU_TAINT, KWOK_TAINT, NODEPOOL, Cluster, node_objects, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_leader_worker_set import install_crd, read, uninstall_crd
from tests.cluster.test_operator import condition, create, events, get

ROOT = Path(__file__).resolve().parents[2]
BIG: dict[str, Any] = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "InferenceService",
    "metadata": {"name": "llama-405b"},
    "spec": {
        "model": {"name": "llama-3.1-405b", "precision": "bf16"},
        "workload": {"inputTokens": 1024, "outputTokens": 256, "requestsPerSecond": 0.5},
        "slo": {"timeToFirstToken": "5s", "timePerOutputToken": "150ms"},
        "hardware": {"gpuTypes": ["H100-SXM"]},
    },
}


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """The operator, started once the LWS CRD is served (its watch of sets then lists at once)."""
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
    install_crd(cluster)
    op = Operator(cluster, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()
    uninstall_crd(cluster)


def patch_spec(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec})


def deployment(api: client.ApiClient, namespace: str, name: str) -> Any:
    try:
        return client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def wait_for(
    check: Any, what: str, op: Operator, api: client.ApiClient, namespace: str, name: str = "llama-405b"
) -> None:
    try:
        wait_until(check, 60, what)
    except TimeoutError as exc:
        status = get(api, namespace, name).get("status")
        raise AssertionError(f"{exc}\nstatus: {status}\noperator log:\n{op.tail()}") from exc


def test_a_model_larger_than_a_node_runs_as_groups_of_nodes(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    name = BIG["metadata"]["name"]
    created = create(api, namespace, BIG)
    wait_for(
        lambda: read(api, namespace, name) is not None and "plan" in get(api, namespace, name).get("status", {}),
        "the LeaderWorkerSet and the plan in status",
        operator,
        api,
        namespace,
    )
    obj = get(api, namespace, name)
    plan = obj["status"]["plan"]
    assert (plan["gpuType"], plan["tensorParallel"], plan["pipelineParallel"], plan["nodes"]) == ("H100-SXM", 8, 2, 2)
    group = read(api, namespace, name)
    assert group is not None
    assert group["metadata"]["name"] == f"{name}-lws"
    assert group["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert group["spec"]["replicas"] == obj["status"]["replicas"] == plan["replicas"] == 1  # groups
    template = group["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert (
        "--pipeline-parallel-size 2" in leader["args"][0] and "--distributed-executor-backend ray" in leader["args"][0]
    )
    assert "$(LWS_LEADER_ADDRESS)" in worker["args"][0]
    svc = client.CoreV1Api(api).read_namespaced_service(name, namespace)
    assert svc.spec.selector[lws.LABEL_ROLE] == "leader"
    assert deployment(api, namespace, name) is None
    # No LWS controller here: no group's pods, so none ready, said in groups.
    wait_for(
        lambda: condition(get(api, namespace, name), "Ready").get("message") == "0/1 groups of 2 nodes ready",
        "readiness in groups",
        operator,
        api,
        namespace,
    )

    # Scaled in groups: the resource's scale subresource pins two groups (four nodes).
    client.CustomObjectsApi(api).patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"replicas": 2}}
    )
    wait_for(
        lambda: (read(api, namespace, name) or {})["spec"]["replicas"] == 2, "two groups", operator, api, namespace
    )
    wait_for(
        lambda: get(api, namespace, name)["status"].get("replicas") == 2, "status in groups", operator, api, namespace
    )

    # Someone scales the set itself: the status tick puts back what kvscale applied.
    client.CustomObjectsApi(api).patch_namespaced_custom_object_scale(
        lws.GROUP, lws.VERSION, namespace, lws.PLURAL, lws.set_name(name), {"spec": {"replicas": 5}}
    )
    wait_for(
        lambda: (read(api, namespace, name) or {})["spec"]["replicas"] == 2,
        "the edit reverted",
        operator,
        api,
        namespace,
    )
    wait_for(
        lambda: any(r == "DriftReverted" for r, _ in events(api, namespace, name)),
        "a DriftReverted Event",
        operator,
        api,
        namespace,
    )

    # In fp8 the model fits one node: a Deployment again, the set gone.
    patch_spec(api, namespace, name, {"model": {"name": "llama-3.1-405b", "precision": "fp8"}})
    wait_for(lambda: deployment(api, namespace, name) is not None, "the Deployment", operator, api, namespace)
    wait_for(lambda: read(api, namespace, name) is None, "the LeaderWorkerSet deleted", operator, api, namespace)
    wait_for(  # the status is written after the children are applied
        lambda: get(api, namespace, name)["status"]["plan"]["nodes"] == 1,
        "the plan on one node",
        operator,
        api,
        namespace,
    )
    plan = get(api, namespace, name)["status"]["plan"]
    assert (plan["nodes"], plan["pipelineParallel"]) == (1, 1)
    svc = client.CoreV1Api(api).read_namespaced_service(name, namespace)
    assert lws.LABEL_ROLE not in svc.spec.selector


def test_a_native_fp8_checkpoint_is_the_default_precision(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    """DeepSeek-R1 without spec.model.precision: the API server fills no default (the CRD has
    none), the operator plans the checkpoint's own fp8 (a bf16 default would be refused with
    NoMatchingCheckpoint) over two H100 nodes and loads it as published, without --quantization."""
    body = copy.deepcopy(BIG)
    name = body["metadata"]["name"] = "deepseek-r1"
    body["spec"]["model"] = {"name": "deepseek-r1"}
    body["spec"]["workload"]["requestsPerSecond"] = 0.2
    create(api, namespace, body)
    wait_for(
        lambda: read(api, namespace, name) is not None and "plan" in get(api, namespace, name).get("status", {}),
        "the LeaderWorkerSet and the plan in status",
        operator,
        api,
        namespace,
        name,
    )
    obj = get(api, namespace, name)
    assert "precision" not in obj["spec"]["model"]
    plan = obj["status"]["plan"]
    assert (plan["precision"], plan["nodes"], plan["tensorParallel"], plan["pipelineParallel"]) == ("fp8", 2, 8, 2)
    assert condition(obj, "Planned").get("status") == "True"
    group = read(api, namespace, name)
    assert group is not None
    leader = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert "deepseek-ai/DeepSeek-R1" in leader["args"][0] and "--quantization" not in leader["args"][0]


def test_expert_parallelism_deployed_where_tensor_parallelism_cannot_split(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    """A block-FP8 MoE checkpoint given as its config.json (Qwen3-235B-A22B's shapes, 1536-wide
    experts in 128-wide blocks): one replica for 25 req/s needs a whole H100 node, where vLLM
    refuses tensor parallel 8 alone; the operator deploys TP 8 with --enable-expert-parallel and
    the API server keeps status.plan.expertParallel (the CRD's schema)."""
    from tests.unit.test_expert_parallel import QWEN3_235B_FP8

    body = copy.deepcopy(BIG)
    name = body["metadata"]["name"] = "qwen3-235b-fp8"
    body["spec"]["model"] = {
        "name": "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8",
        "architecture": {"huggingFaceConfig": QWEN3_235B_FP8},
    }
    body["spec"]["workload"] = {"inputTokens": 1000, "outputTokens": 300, "requestsPerSecond": 25}
    body["spec"]["scaling"] = {"maxReplicas": 1}
    create(api, namespace, body)
    wait_for(
        lambda: deployment(api, namespace, name) is not None and "plan" in get(api, namespace, name).get("status", {}),
        "the Deployment and the plan in status",
        operator,
        api,
        namespace,
        name,
    )
    plan = get(api, namespace, name)["status"]["plan"]
    assert (plan["tensorParallel"], plan["expertParallel"], plan["precision"]) == (8, True, "fp8")
    container = deployment(api, namespace, name).spec.template.spec.containers[0]
    assert "--enable-expert-parallel" in container.args
    assert container.resources.limits["nvidia.com/gpu"] == "8"


def test_data_parallel_attention_deployed_when_the_spec_allows_it(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    """DeepSeek-R1 at 12 req/s on one H200 node (TP 8 would need two) with
    spec.hardware.dataParallelAttention: one pod of 8
    data-parallel attention ranks (vLLM --data-parallel-size 8 --enable-expert-parallel at TP 1),
    status.plan.dataParallel kept by the API server."""
    core = client.CoreV1Api(api)
    node = h100_node("h200-extra-0")
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H200"
    core.create_node(node)
    try:
        body = copy.deepcopy(BIG)
        name = body["metadata"]["name"] = "deepseek-dp"
        body["spec"]["model"] = {"name": "deepseek-ai/DeepSeek-R1"}
        body["spec"]["workload"] = {"inputTokens": 2000, "outputTokens": 500, "requestsPerSecond": 12}
        body["spec"]["slo"] = {"timeToFirstToken": "2s", "timePerOutputToken": "80ms"}
        body["spec"]["hardware"] = {"gpuTypes": ["H200"], "dataParallelAttention": True}
        create(api, namespace, body)
        wait_for(
            lambda: (
                deployment(api, namespace, name) is not None and "plan" in get(api, namespace, name).get("status", {})
            ),
            "the Deployment and the plan in status",
            operator,
            api,
            namespace,
            name,
        )
        plan = get(api, namespace, name)["status"]["plan"]
        assert (plan["dataParallel"], plan["expertParallel"], plan["tensorParallel"]) == (8, True, 1), plan
        container = deployment(api, namespace, name).spec.template.spec.containers[0]
        args = container.args
        assert args[args.index("--data-parallel-size") + 1] == "8" and "--enable-expert-parallel" in args
        assert container.resources.limits["nvidia.com/gpu"] == "8"
    finally:
        core.delete_node("h200-extra-0")


def h100_node(name: str) -> dict[str, Any]:
    """One more kwok node like the pool's H100 nodes (8 GPUs)."""
    node = next(n for n in node_objects(NODEPOOL) if n["metadata"]["name"] == "h100-0")
    node = copy.deepcopy(node)
    node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    return node


def holder(node: str, gpus: int) -> dict[str, Any]:
    """A pod bound to `node` holding `gpus` GPUs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"holds-{node}"},
        "spec": {
            "nodeName": node,
            "tolerations": [{**t, "operator": "Equal"} for t in (KWOK_TAINT, GPU_TAINT)],
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
    }


def test_a_group_needs_whole_free_nodes(operator: Operator, api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    extra = ("h100-extra-0", "h100-extra-1")
    h100s = ("h100-0", "h100-1", *extra)
    try:
        for name in extra:
            core.create_node(h100_node(name))

        def settled() -> bool:
            # The extra nodes ready; no other test's pods left on the H100 nodes.
            ready = all(
                any(c.type == "Ready" and c.status == "True" for c in core.read_node(n).status.conditions or [])
                for n in extra
            )
            others = [
                p
                for p in core.list_pod_for_all_namespaces().items
                if p.spec.node_name in h100s and p.metadata.namespace != namespace
            ]
            return ready and not others

        wait_until(settled, 120, "the extra H100 nodes ready and the H100 nodes otherwise empty")
        # Half of three nodes taken: 20 H100s free, more than a 16-GPU group, but one whole node.
        for node in h100s[:3]:
            core.create_namespaced_pod(namespace, holder(node, 4))
        wait_until(
            lambda: all(p.status.phase == "Running" for p in core.list_namespaced_pod(namespace).items),
            60,
            "the GPU-holding pods running",
        )
        body = copy.deepcopy(BIG)
        name = body["metadata"]["name"] = "llama-405b-tight"
        create(api, namespace, body)
        wait_for(
            lambda: condition(get(api, namespace, name), "Planned").get("reason") == "InsufficientGPUs",
            "InsufficientGPUs",
            operator,
            api,
            namespace,
            name,
        )
        message = condition(get(api, namespace, name), "Planned")["message"]
        assert "20 free H100-SXM" in message and "2 whole nodes each" in message, message
        assert read(api, namespace, name) is None
        # A second node freed whole: the retry (2 s backoff here) deploys the group.
        core.delete_namespaced_pod(f"holds-{h100s[2]}", namespace, grace_period_seconds=0)
        wait_for(lambda: read(api, namespace, name) is not None, "the LeaderWorkerSet", operator, api, namespace, name)
    finally:
        for name in extra:
            core.delete_node(name)
