"""The InferenceService API: strict models, the generated CRD, and the samples."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from kvscale.api.crd import crd, crd_yaml
from kvscale.api.models import parse_spec

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "deploy" / "samples").glob("*.yaml"))
MINIMAL = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 512, "outputTokens": 128},
    "slo": {"timeToFirstToken": "500ms", "timePerOutputToken": "50ms"},
}


def test_committed_crd_matches_the_models() -> None:
    committed = (ROOT / "crds" / "inferenceservices.kvscale.io.yaml").read_text()
    assert committed == crd_yaml(), (
        "crds/ drifted from kvscale/api: run `kvscale crd > crds/inferenceservices.kvscale.io.yaml`"
    )


def _walk(node: object, path: str = "") -> list[str]:
    problems = []
    if isinstance(node, dict):
        for bad in ("$ref", "anyOf", "oneOf", "title", "const", "$defs"):
            if bad in node:
                problems.append(f"{path}: {bad}")
        if "properties" in node:
            for key, child in node["properties"].items():
                # The API server refuses anything on metadata but name and generateName.
                if "description" not in child and f"{path}.{key}" != ".metadata":
                    problems.append(f"{path}.{key}: no description")
                problems += _walk(child, f"{path}.{key}")
        if "items" in node:
            problems += _walk(node["items"], f"{path}[]")
    return problems


def test_crd_is_structural_and_explained() -> None:
    version = crd()["spec"]["versions"][0]
    assert _walk(version["schema"]["openAPIV3Schema"]) == []
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.scaling.replicas"
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {
        "Model",
        "GPU",
        "TP",
        "Replicas",
        "Ready",
        "TTFT",
        "TPOT",
        "Phase",
        "Age",
    }
    scaling = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["scaling"]
    # `kubectl scale` on a spec without a scaling block creates one holding only replicas.
    assert any(
        "has(self.minReplicas)" in r["rule"] and "maxReplicas" in r["rule"] for r in scaling["x-kubernetes-validations"]
    )


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_samples_validate(sample: Path) -> None:
    doc = yaml.safe_load(sample.read_text())
    assert doc["kind"] == "InferenceService"
    parse_spec(doc["spec"])


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"slo": {"timeToFirstToken": "soon", "timePerOutputToken": "50ms"}}, "timeToFirstToken"),
        ({"scaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas"),
        ({"model": {"name": "x", "precision": "fp4"}}, "precision"),
        ({"model": {}}, "spec.model.name"),
        ({"workload": {"inputTokens": 512, "outputTokens": 128, "maxContextTokens": 100}}, "maxContextTokens"),
        ({"unknownField": 1}, "unknownField"),
    ],
)
def test_invalid_specs_name_the_field(patch: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_spec({**MINIMAL, **patch})
    assert field in str(exc.value)


def test_committed_gpubudget_crd_matches_the_models() -> None:
    from kvscale.api.budget_crd import budget_crd, budget_crd_yaml

    committed = (ROOT / "crds" / "gpubudgets.kvscale.io.yaml").read_text()
    assert committed == budget_crd_yaml(), (
        "crds/ drifted from kvscale/api: run `kvscale crd --kind gpubudget > crds/gpubudgets.kvscale.io.yaml`"
    )
    version = budget_crd()["spec"]["versions"][0]
    assert budget_crd()["spec"]["scope"] == "Cluster"
    assert _walk(version["schema"]["openAPIV3Schema"]) == []


def test_gpubudget_spec_is_strict_and_selects() -> None:
    from kvscale.api.budget import budget_of, parse_budget_spec

    spec = parse_budget_spec(
        {
            "limits": {"H100-SXM": 8, "L40S": 4},
            "namespaceLimits": {"team-a": {"H100-SXM": 2}},
            "selector": {"namespaces": ["team-a", "team-b"], "matchLabels": {"tier": "prod"}},
        }
    )
    assert spec.selector.selects("team-a", {"tier": "prod", "x": "y"})
    assert not spec.selector.selects("team-a", {"tier": "dev"})
    assert not spec.selector.selects("team-c", {"tier": "prod"})
    budget = budget_of("prod", spec)
    assert (budget.limits, budget.namespace_limits) == ({"H100-SXM": 8, "L40S": 4}, {"team-a": {"H100-SXM": 2}})
    for bad, field in (
        ({"limits": {}}, "spec.limits"),
        ({"limits": {"H100-SXM": -1}}, "limits"),
        ({"limits": {"A": 1}, "x": 1}, "x"),
    ):
        with pytest.raises(ValidationError, match=field):
            parse_budget_spec(bad)


def test_priority_defaults_to_zero_and_is_bounded() -> None:
    assert parse_spec(MINIMAL).scaling.priority == 0
    assert parse_spec({**MINIMAL, "scaling": {"priority": 100}}).scaling.priority == 100
    with pytest.raises(ValidationError, match="priority"):
        parse_spec({**MINIMAL, "scaling": {"priority": 5000}})


def test_the_gpubudget_sample_is_valid() -> None:
    from kvscale.api.budget import parse_budget_spec

    sample = yaml.safe_load((ROOT / "deploy" / "budget" / "gpubudget.yaml").read_text())
    assert sample["kind"] == "GPUBudget"
    spec = parse_budget_spec(sample["spec"])
    assert spec.limits == {"H100-SXM": 64, "L40S": 32} and spec.selector.selects("serving", {"tier": "prod"})


def test_the_crds_cache_variables_are_the_catalogs() -> None:
    import typing

    from kvscale.api.crd import ENGINE_CACHE_ENV
    from kvscale.api.models import EngineSpec
    from kvscale.sizing.catalog import default_catalog

    catalog = default_catalog()
    served = set(typing.get_args(EngineSpec.model_fields["type"].annotation))
    assert set(ENGINE_CACHE_ENV) == served
    # every release's profile of an engine (engines.yaml keys vllm-0.11, vllm-0.2, ...)
    cache_envs = {name: {p.cache_env for p in catalog.engine_profiles(name)} for name in served}
    assert cache_envs == {name: {env} for name, env in ENGINE_CACHE_ENV.items()}
