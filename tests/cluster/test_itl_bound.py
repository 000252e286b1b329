"""Issue 31, defect 5 against the real API server and operator: spec.slo.maxInterTokenLatency is
checked by the CRD, reaches the plan (a smaller --max-num-batched-tokens in the Deployment), and
status.plan.predictedItlP99 shows the p99 token gap; a bound no chunk budget keeps is a
Planned=False condition naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.sizing.units import parse_duration_s
from tests.cluster.harness import wait_until
from tests.cluster.processes import Operator

ROOT = Path(__file__).resolve().parents[2]
# Long prompts and a tight TPOT on one H100: without a bound the plan takes a 16384-token chunk
# budget (hand-checked with `kvscale plan`: the same numbers as tests/unit/test_itl.py).
BODY: dict[str, Any] = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "InferenceService",
    "metadata": {"name": "rag"},
    "spec": {
        "model": {"name": "llama-3.1-8b"},
        "workload": {"inputTokens": 3000, "outputTokens": 200, "requestsPerSecond": 4},
        "slo": {"timeToFirstToken": "2s", "timePerOutputToken": "30ms"},
        "hardware": {"gpuTypes": ["H100-SXM"], "maxTensorParallel": 1},
        "scaling": {"minReplicas": 1, "maxReplicas": 4},
    },
}


def create(api: client.ApiClient, namespace: str, name: str, itl: str | None) -> None:
    body = copy.deepcopy(BODY)
    body["metadata"].update(name=name, namespace=namespace)
    body["spec"]["slo"]["maxInterTokenLatency"] = itl
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))


def wait_phase(api: client.ApiClient, namespace: str, name: str, phase: str, op: Operator) -> dict[str, Any]:
    try:
        wait_until(lambda: get(api, namespace, name).get("status", {}).get("phase") == phase, 60, f"{name} {phase}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {get(api, namespace, name).get('status')}\n{op.tail()}") from exc
    return get(api, namespace, name)


def budget_arg(api: client.ApiClient, namespace: str, name: str) -> int:
    args = client.AppsV1Api(api).read_namespaced_deployment(name, namespace).spec.template.spec.containers[0].args
    return int(args[args.index("--max-num-batched-tokens") + 1])


@pytest.mark.parametrize(
    ("itl", "message"),
    [
        ("0ms", "spec.slo.maxInterTokenLatency must be a positive duration"),
        ("150", "spec.slo.maxInterTokenLatency"),  # the pattern: a unit is required
        ("1" * 40, "spec.slo.maxInterTokenLatency"),  # maxLength 32
    ],
)
def test_api_server_checks_the_bound(
    operator: Operator, api: client.ApiClient, namespace: str, itl: str, message: str
) -> None:
    with pytest.raises(ApiException) as rejected:
        create(api, namespace, "bad", itl)
    assert rejected.value.status == 422 and message in json.loads(rejected.value.body)["message"]


def test_the_bound_lowers_the_deployed_chunk_budget(operator: Operator, api: client.ApiClient, namespace: str) -> None:
    create(api, namespace, "free", None)  # an explicit null: the optional field left unset
    create(api, namespace, "bounded", "60ms")
    free = wait_phase(api, namespace, "free", "Ready", operator)["status"]["plan"]
    bounded = wait_phase(api, namespace, "bounded", "Ready", operator)["status"]["plan"]
    assert free["maxNumBatchedTokens"] == budget_arg(api, namespace, "free") == 16384
    assert bounded["maxNumBatchedTokens"] == budget_arg(api, namespace, "bounded") < 16384
    # status.plan shows the p99 token gap beside TPOT; the bound holds it, the free plan's is longer.
    assert parse_duration_s(bounded["predictedItlP99"]) <= 0.060 < parse_duration_s(free["predictedItlP99"])
    assert parse_duration_s(free["predictedTpot"]) <= 0.030


def test_an_impossible_bound_names_the_field(operator: Operator, api: client.ApiClient, namespace: str) -> None:
    create(api, namespace, "tight", "1ms")
    obj = wait_phase(api, namespace, "tight", "Failed", operator)
    planned = next(c for c in obj["status"]["conditions"] if c["type"] == "Planned")
    assert planned["status"] == "False" and planned["reason"] == "SLOInfeasible"
    assert "spec.slo.maxInterTokenLatency" in planned["message"] and "--itl" not in planned["message"]
    assert client.AppsV1Api(api).list_namespaced_deployment(namespace).items == []
