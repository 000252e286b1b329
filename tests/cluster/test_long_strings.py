"""Issue 28, finding 6 on the real API server: a long string or list used to pass the schema and
wedge the object (kopf's annotations past 256 KiB: a Deployment but no status, and `kubectl
delete` hung on the finalizer). Now the API server refuses each such field by name, and a spec
the schema cannot bound (a long config.json, applied with kubectl's client-side apply, which
keeps a copy in an annotation) gets its status and deletes cleanly."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import GROUP, PLURAL, VERSION
from tests.cluster.harness import Cluster, ClusterError, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_operator import SAMPLES, condition, create, get, objects


def sample(name: str) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(SAMPLES["llama-3.1-8b-chat"])
    body["metadata"]["name"] = name
    return body


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("spec.engine.image", "registry.example/" + "a" * 200_000),
        ("spec.model.source", "hf://" + "a" * 200_000),
        ("spec.model.name", "a" * 200_000),
        ("spec.engine.args", ["--flag"] * 10_000),
        ("spec.engine.args", ["a" * 4000] * 5),
    ],
    ids=["image", "source", "model-name", "10000-args", "args-total"],
)
def test_the_api_server_refuses_a_field_past_its_bound_by_name(
    operator: Operator, api: client.ApiClient, namespace: str, field: str, value: Any
) -> None:
    body = sample("long")
    _, section, key = field.split(".")
    body["spec"].setdefault(section, {})[key] = value
    with pytest.raises(ApiException) as exc:
        create(api, namespace, body)
    assert exc.value.status == 422
    assert field in json.loads(exc.value.body)["message"]


def test_a_spec_past_half_the_annotation_limit_gets_status_and_deletes(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    body: dict[str, Any] = sample("bigconfig")
    body["metadata"]["namespace"] = namespace
    # A config.json of ~140 KB: with kubectl's last-applied copy, kopf's own copy of the spec
    # took the annotations past 256 KiB. Its size is the operator's to refuse (the schema cannot
    # bound a free-form object), naming the field.
    config = {"model_type": "llama", "padding": "x" * 140_000}
    body["spec"]["model"] = {"architecture": {"huggingFaceConfig": config}}
    cluster.kubectl_apply([body])
    try:
        wait_until(
            lambda: condition(get(api, namespace, "bigconfig"), "Planned").get("status") == "False", 60, "status"
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{get(api, namespace, 'bigconfig').get('status')}\n{operator.tail()}") from exc
    assert "huggingFaceConfig" in condition(get(api, namespace, "bigconfig"), "Planned")["message"]
    annotations = get(api, namespace, "bigconfig")["metadata"]["annotations"]
    kopf_bytes = sum(len(k) + len(v) for k, v in annotations.items() if k.startswith("kvscale.io/"))
    assert kopf_bytes < 2048, {k: len(v) for k, v in annotations.items()}
    try:
        cluster.kubectl("delete", "inferenceservice.kvscale.io", "bigconfig", "-n", namespace, "--timeout=30s")
    except ClusterError as exc:
        raise AssertionError(f"{exc}\n{operator.tail()}") from exc

    def gone() -> bool:
        try:
            objects(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "bigconfig")
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_until(gone, 30, "bigconfig deleted")
