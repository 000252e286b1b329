"""Issue 38, LOW, at the edge: the API server itself refuses (CRD schema and CEL rules) what
the operator would refuse, so an edit never reaches a running service: a request rate beyond
the bound, engine args that repeat a flag kvscale sets from the plan, an image that is not an
image reference. Other args and images pass."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import GROUP, PLURAL, VERSION
from tests.cluster.harness import Cluster

ROOT = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "InferenceService",
    "metadata": {"name": "edge"},
    "spec": {
        "model": {"name": "llama-3.1-8b"},
        "workload": {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": 4},
        "slo": {"timeToFirstToken": "500ms", "timePerOutputToken": "50ms"},
        # Recommend: nothing would be deployed if an operator of another test saw it.
        "scaling": {"mode": "recommend"},
    },
}


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")


def create(api: client.ApiClient, namespace: str, patch: dict[str, Any], name: str = "edge") -> None:
    body = copy.deepcopy(BASE)
    body["metadata"] = {"name": name, "namespace": namespace}
    for key, value in patch.items():
        body["spec"][key] = {**body["spec"].get(key, {}), **value}
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"workload": {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": 1e308}}, "requestsPerSecond"),
        ({"engine": {"args": ["--enable-prefix-caching", "-tp", "8"]}}, "must not repeat a flag kvscale sets"),
        ({"engine": {"args": ["--port=9000"]}}, "must not repeat a flag kvscale sets"),
        ({"engine": {"args": ["--tensor_parallel_size", "2"]}}, "must not repeat a flag kvscale sets"),
        ({"engine": {"type": "sglang", "args": ["--tensor-parallel-size", "2"]}}, "must not repeat a flag"),
        ({"engine": {"type": "tgi", "args": ["-p", "1"]}}, "must not repeat a flag kvscale sets"),
        ({"engine": {"image": "vllm/vllm openai:v0.11.0"}}, "spec.engine.image"),
        ({"engine": {"image": "vllm/vllm-öpenai:v0.11.0"}}, "spec.engine.image"),
        ({"engine": {"rocmImage": "Rocm/vllm:latest"}}, "spec.engine.rocmImage"),
    ],
)
def test_the_api_server_refuses_at_the_edge(
    crds: None, api: client.ApiClient, namespace: str, patch: dict[str, Any], message: str
) -> None:
    with pytest.raises(ApiException) as refused:
        create(api, namespace, patch)
    assert refused.value.status == 422, refused.value.body
    assert message in json.loads(refused.value.body)["message"], refused.value.body


def test_other_args_and_images_pass(crds: None, api: client.ApiClient, namespace: str) -> None:
    create(
        api,
        namespace,
        {"engine": {"args": ["--enable-prefix-caching", "--seed=7"], "image": "vllm/vllm-openai:v0.11.0"}},
        "a",
    )
    create(api, namespace, {"engine": {"type": "sglang", "args": ["--enable-metrics"]}}, "b")
    create(
        api,
        namespace,
        {
            "engine": {
                "type": "tgi",
                "args": ["--sharded", "true"],
                "image": "registry.local:5000/tgi:3.3.7@sha256:" + "a" * 64,
            }
        },
        "c",
    )
    create(api, namespace, {"workload": {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": 1e6}}, "d")
