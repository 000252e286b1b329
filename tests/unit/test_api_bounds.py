"""Issue 28, finding 6: every string, list and map a user writes in an InferenceService or a
GPUBudget is bounded in the CRD, so no spec can grow an object's annotations (kopf's diff base,
kubectl's last-applied copy) past the API server's 256 KiB; the operator and the CLI refuse the
same inputs with the field named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from kvscale.api import models
from kvscale.api.budget import parse_budget_spec
from kvscale.api.budget_crd import budget_crd
from kvscale.api.crd import crd
from kvscale.api.models import parse_spec
from kvscale.operator.diffbase import DigestDiffBaseStorage

MINIMAL: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 512, "outputTokens": 128},
    "slo": {"timeToFirstToken": "500ms", "timePerOutputToken": "50ms"},
}
ANNOTATIONS_LIMIT_BYTES = 256 * 1024


def spec_schema(definition: dict[str, Any]) -> dict[str, Any]:
    return dict(definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])


def unbounded(node: dict[str, Any], path: str) -> list[str]:
    """Strings without maxLength (enums aside), lists without maxItems, maps without maxProperties."""
    out = []
    kind = node.get("type")
    if kind == "string" and "maxLength" not in node and "enum" not in node:
        out.append(path)
    if kind == "array" and "maxItems" not in node:
        out.append(path)
    is_map = "additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields")
    if kind == "object" and is_map and "maxProperties" not in node:
        out.append(path)
    for key, child in (node.get("properties") or {}).items():
        out += unbounded(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        out += unbounded(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += unbounded(node["additionalProperties"], f"{path}{{}}")
    return out


@pytest.mark.parametrize("definition", [crd(), budget_crd()], ids=["inferenceservice", "gpubudget"])
def test_every_string_list_and_map_of_a_spec_is_bounded(definition: dict[str, Any]) -> None:
    assert unbounded(spec_schema(definition), "spec") == []


def worst_bytes(node: dict[str, Any], path: str = "spec") -> int:
    """The largest JSON a spec can take within the schema's bounds (keys counted at their bound,
    a free-form object at the operator's limit), with the CEL totals of engine.args and env."""
    if path == "spec.engine.args":
        return models.MAX_ARGS_TOTAL_LENGTH + 4 * models.MAX_ARGS
    if path == "spec.engine.env":
        return models.MAX_ENV_TOTAL_LENGTH + 40 * models.MAX_ENV  # names and values, plus the JSON around them
    if node.get("x-kubernetes-preserve-unknown-fields") and "properties" not in node:
        return models.MAX_CONFIG_BYTES
    kind = node.get("type")
    if kind == "string":
        return int(node.get("maxLength") or max(len(str(v)) for v in node["enum"])) + 2
    if kind in ("integer", "number", "boolean"):
        return 24
    if kind == "array":
        return int(node["maxItems"]) * (worst_bytes(node["items"], f"{path}[]") + 1) + 2
    if "additionalProperties" in node and isinstance(node["additionalProperties"], dict):
        key = 320
        return int(node["maxProperties"]) * (key + worst_bytes(node["additionalProperties"], f"{path}{{}}")) + 2
    props = node.get("properties") or {}
    return sum(len(k) + 4 + worst_bytes(v, f"{path}.{k}") for k, v in props.items()) + 2


def test_the_largest_spec_stays_far_below_the_annotation_limit() -> None:
    worst = worst_bytes(spec_schema(crd()))
    # kubectl apply's last-applied copy and the object's other annotations need the rest.
    assert worst < ANNOTATIONS_LIMIT_BYTES / 2, worst


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("engine", "image"), "r/" + "a" * 200_000, "engine.image"),
        (("model", "source"), "hf://" + "a" * 200_000, "model.source"),
        (("model", "name"), "a" * 200_000, "model.name"),
        (("engine", "args"), ["--x"] * 10_000, "engine.args"),
        (("engine", "args"), ["a" * 4000] * 5, "engine.args"),
        (("engine", "env"), [{"name": f"V{i}", "value": "x" * 8000} for i in range(3)], "engine.env"),
        (("hardware", "gpuTypes"), ["H100-SXM"] * 100, "hardware.gpuTypes"),
    ],
)
def test_the_models_refuse_what_the_schema_refuses_naming_the_field(
    path: tuple[str, str], value: Any, field: str
) -> None:
    spec = json.loads(json.dumps(MINIMAL))
    spec.setdefault(path[0], {})[path[1]] = value
    with pytest.raises(ValidationError) as exc:
        parse_spec(spec)
    assert field.split(".")[-1] in str(exc.value)


def test_a_config_json_beyond_the_operators_limit_is_refused_naming_the_field() -> None:
    spec = json.loads(json.dumps(MINIMAL))
    spec["model"] = {"architecture": {"huggingFaceConfig": {"model_type": "llama", "pad": "x" * 40_000}}}
    with pytest.raises(ValidationError) as exc:
        parse_spec(spec)
    assert "huggingFaceConfig" in str(exc.value) and str(models.MAX_CONFIG_BYTES) in str(exc.value)


def test_kopfs_diff_base_is_a_digest_of_the_spec_whatever_its_size() -> None:
    storage = DigestDiffBaseStorage(prefix="kvscale.io", key="last-handled-configuration")

    def body(spec: dict[str, Any], status: dict[str, Any]) -> Any:
        from kopf._cogs.structs import bodies  # kopf's own Body, as its handlers get it

        return bodies.Body(
            {
                "apiVersion": "kvscale.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": "a"},
                "spec": spec,
                "status": status,
            }
        )

    big = {**MINIMAL, "model": {"architecture": {"huggingFaceConfig": {"pad": "x" * 200_000}}}}
    essence = storage.build(body=body(big, {}))
    assert len(json.dumps(essence)) < 300
    # A status write is no change; a spec change is one, seen under `spec` (the update handler's field).
    assert storage.build(body=body(big, {"phase": "Ready"})) == essence
    changed = storage.build(body=body({**big, "workload": {"inputTokens": 1, "outputTokens": 1}}, {}))
    assert changed["spec"] != essence["spec"]


def test_a_budgets_namespace_limit_above_its_limit_is_refused_naming_both() -> None:
    with pytest.raises(ValidationError) as exc:
        parse_budget_spec({"limits": {"H100-SXM": 8}, "namespaceLimits": {"team-a": {"H100-SXM": 9}}})
    assert "spec.namespaceLimits.team-a.H100-SXM" in str(exc.value) and "spec.limits.H100-SXM" in str(exc.value)
    # A namespace limit on a type the budget does not limit is allowed (the type is unlimited).
    parse_budget_spec({"limits": {"H100-SXM": 8}, "namespaceLimits": {"team-a": {"L4": 2}}})


def test_a_budget_names_the_gpu_types_its_catalog_does_not_know() -> None:
    spec = parse_budget_spec({"limits": {"H100": 8, "L4": 2}, "namespaceLimits": {"t": {"A100": 1}}})
    assert spec.unknown_gpu_types(["H100-SXM", "L4"]) == ["A100", "H100"]
