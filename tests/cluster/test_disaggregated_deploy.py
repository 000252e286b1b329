"""A disaggregated InferenceService on the real API server: spec.serving.disaggregation on
deploys a prefill and a decode Deployment (no aggregated one), each pod labelled with its
llm-d.ai/role and running vLLM's NixlConnector, the Service selecting the decode pods; a pool
scaled by hand goes back to its count; set back to off, the pools go and the aggregated
Deployment comes."""

from __future__ import annotations

import copy
import json
from typing import Any

from kubernetes import client

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.control import inference_pool as ip
from tests.cluster.harness import Cluster, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_inference_pool import install_crd, uninstall_crd
from tests.cluster.test_multinode_operator import deployment, patch_spec
from tests.cluster.test_operator import create, engine_pods, get, wait_phase

NAME = "pd-chat"
BODY: dict[str, Any] = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "InferenceService",
    "metadata": {"name": NAME},
    "spec": {
        "model": {"name": "llama-3.1-8b"},
        "workload": {"inputTokens": 4000, "outputTokens": 300, "requestsPerSecond": 8},
        "slo": {"timeToFirstToken": "1500ms", "timePerOutputToken": "12ms"},
        "hardware": {"gpuTypes": ["H100-SXM"]},
        "serving": {"disaggregation": "on"},
    },
}


def test_disaggregated_service_deploys_two_pools_with_their_roles(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    create(api, namespace, BODY)
    obj = wait_phase(api, namespace, NAME, "Ready", operator, timeout=90)
    plan = obj["status"]["plan"]
    assert plan["mode"] == "disaggregated"
    assert deployment(api, namespace, NAME) is None  # no aggregated Deployment
    for role in ("prefill", "decode"):
        pool = plan[role]
        dep = deployment(api, namespace, f"{NAME}-{role}")
        assert dep is not None, f"no {role} Deployment"
        assert pool["deployment"] == f"{NAME}-{role}"
        assert dep.spec.replicas == pool["replicas"] >= 1
        assert dep.spec.selector.match_labels["llm-d.ai/role"] == role
        assert dep.metadata.owner_references[0].name == NAME
        container = dep.spec.template.spec.containers[0]
        args = container.args
        assert args[args.index("--tensor-parallel-size") + 1] == str(pool["tensorParallel"])
        connector = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert connector == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        assert container.resources.limits["nvidia.com/gpu"] == str(pool["tensorParallel"])
        side = next(e for e in container.env if e.name == "VLLM_NIXL_SIDE_CHANNEL_HOST")
        assert side.value_from.field_ref.field_path == "status.podIP"
    pods = engine_pods(api, namespace, NAME)
    roles = [p.metadata.labels.get("llm-d.ai/role") for p in pods]
    assert sorted(roles) == sorted(["prefill"] * plan["prefill"]["replicas"] + ["decode"] * plan["decode"]["replicas"])
    for pod in pods:
        assert pod.spec.node_name, f"{pod.metadata.name} not scheduled"
        role = pod.metadata.labels["llm-d.ai/role"]
        assert pod.metadata.labels["kvscale.io/variant"] == f"h100-sxm-tp{plan[role]['tensorParallel']}-bf16"
    svc = client.CoreV1Api(api).read_namespaced_service(NAME, namespace)
    assert svc.spec.selector["llm-d.ai/role"] == "decode"
    scaled = next(c for c in obj["status"]["conditions"] if c["type"] == "PoolsAutoscaled")
    assert (scaled["status"], scaled["reason"]) == ("True", "EachOnItsSignal")
    assert obj["status"]["readyReplicas"] == plan["decode"]["replicas"]

    # A pool scaled by hand goes back to the count kvscale set (no Prometheus here: the tick holds).
    decode = plan["decode"]["replicas"]
    client.AppsV1Api(api).patch_namespaced_deployment_scale(
        f"{NAME}-decode", namespace, {"spec": {"replicas": decode + 2}}
    )
    reverted = lambda: deployment(api, namespace, f"{NAME}-decode").spec.replicas == decode  # noqa: E731
    wait_until(reverted, 60, "the decode pool back at its count")

    # Back to aggregated: the pools go, the aggregated Deployment comes.
    patch_spec(api, namespace, NAME, {"serving": {"disaggregation": "off"}})
    wait_until(lambda: deployment(api, namespace, NAME) is not None, 60, "the aggregated Deployment")
    pools_gone = lambda: all(deployment(api, namespace, f"{NAME}-{r}") is None for r in ("prefill", "decode"))  # noqa: E731
    wait_until(pools_gone, 60, "the pools deleted")
    aggregated = lambda: "mode" not in get(api, namespace, NAME)["status"]["plan"]  # noqa: E731
    wait_until(aggregated, 60, "status.plan aggregated")
    obj = wait_phase(api, namespace, NAME, "Ready", operator, timeout=90)
    assert "prefill" not in obj["status"]["plan"] and "decode" not in obj["status"]["plan"]
    assert not any(c["type"] == "PoolsAutoscaled" for c in get(api, namespace, NAME)["status"]["conditions"])


def test_pools_are_not_deployed_where_their_budget_has_no_room_for_one_of_each(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    objects = client.CustomObjectsApi(api)
    budget = f"pools-{namespace}"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUBudget",
        "metadata": {"name": budget},
        # one prefill worker (TP1) and one decode worker (TP2) need 3
        "spec": {"limits": {"H100-SXM": 2}, "selector": {"namespaces": [namespace]}},
    }
    objects.create_cluster_custom_object(GROUP, VERSION, "gpubudgets", body)
    try:

        def status() -> dict[str, Any]:
            return dict(dict(objects.get_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget)).get("status", {}))

        wait_until(lambda: "allocated" in status(), 30, "the budget's first status")
        create(api, namespace, BODY)
        obj = wait_phase(api, namespace, NAME, "Pending", operator)
        planned = next(c for c in obj["status"]["conditions"] if c["type"] == "Planned")
        assert planned["reason"] == "PoolsUnderBudget" and f"H100-SXM by GPUBudget {budget}" in planned["message"]
        assert "no room now for one prefill and one decode worker" in planned["message"]
        assert all(deployment(api, namespace, f"{NAME}-{r}") is None for r in ("prefill", "decode"))
    finally:
        objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget)


def test_behind_an_inference_pool_decode_pods_run_the_routing_sidecar(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    """The real API server takes the native sidecar (an init container with restartPolicy Always,
    llm-d's P/D layout); the pool kvscale owns targets the sidecar's port and selects both roles."""
    install_crd(cluster)
    try:
        body = copy.deepcopy(BODY)
        body["metadata"]["name"] = "pd-routed"
        body["spec"]["routing"] = {"inferencePool": {}}
        create(api, namespace, body)
        obj = wait_phase(api, namespace, "pd-routed", "Ready", operator, timeout=90)
        assert obj["status"]["plan"]["mode"] == "disaggregated"
        decode = deployment(api, namespace, "pd-routed-decode")
        assert decode is not None
        [sidecar] = decode.spec.template.spec.init_containers
        assert sidecar.name == "routing-sidecar" and sidecar.restart_policy == "Always"
        assert "--connector=nixlv2" in sidecar.args and "--vllm-port=8200" in sidecar.args
        assert [(p.name, p.container_port) for p in decode.spec.template.spec.containers[0].ports] == [("http", 8200)]
        prefill = deployment(api, namespace, "pd-routed-prefill")
        assert prefill is not None and not prefill.spec.template.spec.init_containers
        objects = client.CustomObjectsApi(api)
        pool = objects.get_namespaced_custom_object(ip.GROUP, ip.VERSION, namespace, ip.PLURAL, "pd-routed")
        assert pool["spec"]["targetPorts"] == [{"number": 8000}]
        assert "llm-d.ai/role" not in pool["spec"]["selector"]["matchLabels"]
        decode_pods = [
            p for p in engine_pods(api, namespace, "pd-routed") if p.metadata.labels["llm-d.ai/role"] == "decode"
        ]
        assert decode_pods and all(p.spec.init_containers[0].name == "routing-sidecar" for p in decode_pods)
        objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "pd-routed")
        wait_until(lambda: deployment(api, namespace, "pd-routed-decode") is None, 60, "the pools gone")
    finally:
        uninstall_crd(cluster)
