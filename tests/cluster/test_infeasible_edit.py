"""Issue 39, on the real API server with the operator: README's 70B sample serving, an edit of
spec.workload.requestsPerSecond that no plan meets within maxReplicas 2 leaves it serving and
managed (phase and Ready from its pods, Planned=False saying what cannot be met and the
nearest rate this cluster's GPUs serve), still held to its bounds and read by the status tick;
an edit that can be met plans again."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from kvscale.api import GROUP, PLURAL, VERSION
from tests.cluster.harness import wait_until
from tests.cluster.processes import Operator

ROOT = Path(__file__).resolve().parents[2]
SAMPLE: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "samples" / "llama-3.1-70b-rag.yaml").read_text())
NAME = SAMPLE["metadata"]["name"]


def get(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    return dict(client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME))


def patch(api: client.ApiClient, namespace: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME, {"spec": spec})


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == kind), {})


def wait_for(
    api: client.ApiClient, namespace: str, op: Operator, what: str, test: Any, timeout: float = 90
) -> dict[str, Any]:
    try:
        wait_until(lambda: test(get(api, namespace)), timeout, what)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {get(api, namespace).get('status')}\noperator log:\n{op.tail()}") from exc
    return get(api, namespace)


def test_an_edit_that_cannot_be_met_keeps_the_fleet_serving_and_managed(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    body = copy.deepcopy(SAMPLE)
    body["metadata"]["namespace"] = namespace
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    first = wait_for(api, namespace, operator, "Ready", lambda o: (o.get("status") or {}).get("phase") == "Ready")
    apps = client.AppsV1Api(api)
    before = apps.read_namespaced_deployment(NAME, namespace)
    running = before.spec.replicas
    assert running == 2, "the sample plans 2 replicas at 2 requests/s (maxReplicas 2)"

    patch(api, namespace, {"workload": {"requestsPerSecond": 20}})

    def refused(o: dict[str, Any]) -> bool:
        planned = condition(o, "Planned")
        return (o.get("status") or {}).get("observedGeneration") == 2 and planned.get("status") == "False"

    obj = wait_for(api, namespace, operator, "Planned=False at generation 2", refused)
    planned, ready = condition(obj, "Planned"), condition(obj, "Ready")
    assert planned["reason"] == "SLOInfeasible", planned
    assert obj["status"]["phase"] == "Ready" and ready["status"] == "True", obj["status"]
    assert obj["status"]["plan"] == first["status"]["plan"]  # the running plan, as recorded
    message = planned["message"]
    assert "spec.workload.requestsPerSecond 20" in message and "keeps serving" in message
    # The nearest rate, sized on this cluster's GPUs: an H100 count no larger than the cluster's.
    cluster_h100 = sum(
        int(n.status.allocatable.get("nvidia.com/gpu", 0))
        for n in client.CoreV1Api(api).list_node().items
        if (n.metadata.labels or {}).get("nvidia.com/gpu.product") == first["status"]["plan"]["gpuProduct"]
    )
    for count in re.findall(r"(\d+) x H100-SXM x(\d+)", message):
        assert int(count[0]) * int(count[1]) <= cluster_h100, message
    assert re.search(r"at most [0-9.]+ requests/s within spec.scaling.maxReplicas 2", message), message
    after = apps.read_namespaced_deployment(NAME, namespace)
    assert after.spec.replicas == running and after.spec.template == before.spec.template  # untouched

    # Still managed: a lower bound scales it at once, and the status tick reads the result.
    patch(api, namespace, {"scaling": {"minReplicas": 1, "maxReplicas": 1}})
    obj = wait_for(
        api,
        namespace,
        operator,
        "scaled to 1 and read back by the status tick",
        lambda o: (
            (o.get("status") or {}).get("replicas") == 1
            and (o.get("status") or {}).get("readyReplicas") == 1
            and (o.get("status") or {}).get("observedGeneration") == 3
        ),
    )
    assert apps.read_namespaced_deployment(NAME, namespace).spec.replicas == 1
    assert condition(obj, "Planned")["status"] == "False" and obj["status"]["phase"] == "Ready"

    # A spec that can be met plans again.
    patch(api, namespace, {"workload": {"requestsPerSecond": 1}})
    wait_for(
        api,
        namespace,
        operator,
        "Planned=True at generation 4",
        lambda o: (
            condition(o, "Planned").get("status") == "True" and (o.get("status") or {}).get("observedGeneration") == 4
        ),
    )
