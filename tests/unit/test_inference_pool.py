"""spec.routing.inferencePool: parsing, the InferencePool builder, adopt decisions, pod labels."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kvscale.api.intent import parse_intent
from kvscale.api.models import InferencePoolRouting, InferenceServiceStatus, parse_spec
from kvscale.control.inference_pool import inference_pool, owned_by, plan_pool
from kvscale.control.inventory import gpu_inventory
from kvscale.control.labels import LABEL_VALUE, label_value, serving_labels
from kvscale.control.planning import Planned, plan_service
from kvscale.control.reconcile import Observed, PoolView, Resource, Result, reconcile, refresh
from kvscale.control.resources import deployment, labels
from kvscale.control.settings import Settings
from kvscale.control.status import get_condition
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from tests.cluster.harness import node_objects

SPEC: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 512, "outputTokens": 256},
    "slo": {"timeToFirstToken": "500ms", "timePerOutputToken": "50ms"},
}
SELECT = {"app.kubernetes.io/instance": "chat", "app.kubernetes.io/managed-by": "kvscale"}
PODS = {**SELECT, "kvscale.io/model": "llama-3.1-8b"}


def routing(**pool: Any) -> InferencePoolRouting:
    parsed = parse_spec({**SPEC, "routing": {"inferencePool": pool}})
    assert parsed.routing.inference_pool is not None
    return parsed.routing.inference_pool


def test_routing_is_absent_unless_asked_for() -> None:
    assert parse_spec(SPEC).routing.inference_pool is None
    assert parse_spec({**SPEC, "routing": {"inferencePool": None}}).routing.inference_pool is None
    assert routing() == InferencePoolRouting()


@pytest.mark.parametrize(
    ("pool", "where"),
    [
        ({"name": "Not_A_Name"}, "inferencePool.name"),
        ({"endpointPickerRef": {"name": "epp"}}, "port is required"),
        ({"endpointPickerRef": {"name": "epp", "port": {"number": 0}}}, "port.number"),
        ({"endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "Maybe"}}, "failureMode"),
        ({"endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "extra": 1}}, "extra"),
    ],
)
def test_bad_routing_names_the_field(pool: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as err:
        routing(**pool)
    assert where in str(err.value)


def test_owned_pool_selects_exactly_the_services_pods() -> None:
    pool = inference_pool("chat", routing(), SELECT, 8000)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    assert pool["metadata"]["name"] == "chat"
    assert pool["spec"] == {
        "selector": {"matchLabels": SELECT},
        "targetPorts": [{"number": 8000}],
        # The extension's inferencepool chart: "<release>-epp" on extProcPort 9002.
        "endpointPickerRef": {"name": "chat-epp", "port": {"number": 9002}},
    }


def test_endpoint_picker_ref_is_passed_through() -> None:
    ref = {"name": "picker", "port": {"number": 9100}, "failureMode": "FailOpen"}
    pool = inference_pool("chat", routing(name="shared", endpointPickerRef=ref), SELECT, 8000)
    assert pool["metadata"]["name"] == "shared"
    assert pool["spec"]["endpointPickerRef"] == ref
    other = {"name": "picker", "group": "example.com", "kind": "Picker"}  # no port needed for other kinds
    assert inference_pool("chat", routing(endpointPickerRef=other), SELECT, 8000)["spec"]["endpointPickerRef"] == other


def foreign(selector: dict[str, str], ports: tuple[int, ...] = (8000,), owner: str = "someone") -> dict[str, Any]:
    return {
        "metadata": {"name": "chat", "ownerReferences": [{"uid": owner}]},
        "spec": {"selector": {"matchLabels": selector}, "targetPorts": [{"number": p} for p in ports]},
    }


def decide(existing: dict[str, Any] | None, installed: bool = True) -> Any:
    return plan_pool("chat", "uid-1", routing(), SELECT, PODS, 8000, installed, existing)


def test_no_pool_or_our_pool_is_applied() -> None:
    for existing in (None, foreign(SELECT, owner="uid-1")):
        plan = decide(existing)
        assert plan.action == "apply" and plan.ok and plan.reason == "Owned"
        assert plan.pool is not None and plan.pool["spec"]["selector"]["matchLabels"] == SELECT
        assert plan.join_labels == {}


def test_a_foreign_pool_is_joined_not_touched() -> None:
    plan = decide(foreign({"pool": "shared", "kvscale.io/model": "llama-3.1-8b"}))
    assert plan.action == "join" and plan.ok and plan.reason == "Joined" and plan.pool is None
    assert plan.join_labels == {"pool": "shared", "kvscale.io/model": "llama-3.1-8b"}
    # Owned by another InferenceService is still not ours.
    assert decide(foreign({"pool": "shared"}, owner="uid-2")).action == "join"
    mismatch = decide(foreign({"pool": "shared"}, ports=(9000,)))
    assert mismatch.action == "join" and not mismatch.ok and "[9000]" in mismatch.message


def test_joining_never_rewrites_kvscales_own_labels() -> None:
    plan = decide(foreign({"app.kubernetes.io/instance": "vllm"}))
    assert plan.action == "none" and not plan.ok and plan.reason == "SelectorConflict"
    assert "app.kubernetes.io/instance=vllm" in plan.message and "spec.routing.inferencePool.name" in plan.message
    assert decide(foreign({})).reason == "SelectorUnusable"


def test_absent_api_is_a_condition_not_an_error() -> None:
    plan = decide(None, installed=False)
    assert plan.action == "none" and not plan.ok and plan.reason == "APINotInstalled"
    assert "inference.networking.k8s.io/v1" in plan.message


def test_owned_by_matches_uid() -> None:
    assert owned_by(foreign({}, owner="uid-1"), "uid-1") and not owned_by(foreign({}), "uid-1")
    assert not owned_by({"metadata": {}}, "uid-1")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("llama-3.1-8b", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama-Llama-3.1-8B-Instruct"),
        ("hf://org/name", "hf-org-name"),
        ("/leading and trailing/", "leading-and-trailing"),
        ("x" * 62 + "/y", "x" * 62),  # cut at 63, then the trailing '-' trimmed
        ("///", "unknown"),
    ],
)
def test_label_values_are_valid(text: str, value: str) -> None:
    assert label_value(text) == value
    assert LABEL_VALUE.match(value) and len(value) <= 63


def test_serving_labels_tell_variants_apart() -> None:
    a = serving_labels("llama-3.1-8b", "H100-SXM", 1, "bf16")
    b = serving_labels("llama-3.1-8b", "A100-80GB", 2, "fp8")
    assert a["kvscale.io/model"] == b["kvscale.io/model"] == "llama-3.1-8b"
    assert a["kvscale.io/gpu-type"] == "H100-SXM" and a["kvscale.io/variant"] == "h100-sxm-tp1-bf16"
    assert b["kvscale.io/variant"] == "a100-80gb-tp2-fp8"
    assert (a["llm-d.ai/inference-serving"], a["llm-d.ai/model"], a["llm-d.ai/variant"]) == (
        "true",
        "llama-3.1-8b",
        "h100-sxm-tp1-bf16",
    )


def test_engine_pods_carry_identity_and_pool_labels() -> None:
    cat = default_catalog()
    pools = gpu_inventory(cat, list(node_objects(Path(__file__).parents[1] / "cluster" / "nodepool.yaml")), [])
    intent = parse_intent({**SPEC, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}})
    spec = intent.spec
    result = plan_service(intent, cat, pools)
    assert isinstance(result, Planned)
    chosen, model = result.chosen, result.model
    cfg = ServingConfig.build(cat, model, cat.gpu(chosen.gpu), chosen.precision, chosen.tensor_parallel)
    dep = deployment("chat", "uid-1", spec, model, cfg, chosen, pools[chosen.gpu], 1, 8000, pool_labels={"pool": "p"})
    got = dep["spec"]["template"]["metadata"]["labels"]
    assert got["kvscale.io/model"] == "llama-3.1-8b"  # the catalog name, not the alias typed
    assert got["kvscale.io/gpu-type"] == chosen.gpu
    assert got["kvscale.io/variant"] == f"{chosen.gpu.lower()}-tp{chosen.tensor_parallel}-{chosen.precision}"
    assert got["pool"] == "p" and labels("chat").items() <= got.items()
    assert dep["spec"]["selector"]["matchLabels"] == labels("chat")


# -- reconcile: the pool among the children ---------------------------------------------------

RES = Resource("ns", "chat", "uid-1", 1)
NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
ROUTED = {**SPEC, "hardware": {"gpuTypes": ["L4", "A10G"]}, "routing": {"inferencePool": {}}}
GPUS = gpu_inventory(default_catalog(), list(node_objects(Path(__file__).parents[1] / "cluster" / "nodepool.yaml")), [])


def reconciled(body: dict[str, Any], pool: PoolView | None, status: InferenceServiceStatus | None = None) -> Result:
    observed = Observed(GPUS, pool=pool)
    return reconcile(body, RES, status or InferenceServiceStatus(), observed, default_catalog(), Settings(), now=NOW)


def pool_condition(result: Result) -> tuple[str, str] | None:
    c = get_condition(result.status, "InferencePool")
    return None if c is None else (c.status, c.reason)


def test_reconcile_applies_the_owned_pool_after_the_deployment() -> None:
    result = reconciled(ROUTED, PoolView(api_installed=True))
    assert [c["kind"] for c in result.apply] == ["Service", "PodDisruptionBudget", "Deployment", "InferencePool"]
    pool = result.apply[-1]
    assert pool["spec"]["selector"]["matchLabels"] == result.apply[2]["spec"]["selector"]["matchLabels"]
    assert pool_condition(result) == ("True", "Owned") and result.keep_pool == "chat"
    assert not result.prune_pools  # never owned one before: no list call


def test_reconcile_joins_a_foreign_pool_through_the_pod_template() -> None:
    result = reconciled(ROUTED, PoolView(api_installed=True, existing=foreign({"pool": "shared"})))
    assert [c["kind"] for c in result.apply] == ["Service", "PodDisruptionBudget", "Deployment"]
    assert result.apply[2]["spec"]["template"]["metadata"]["labels"]["pool"] == "shared"
    assert pool_condition(result) == ("True", "Joined")


@pytest.mark.parametrize(
    ("view", "reason"),
    [(PoolView(api_installed=False), "APINotInstalled"), (PoolView(api_installed=True, forbidden=True), "Forbidden")],
)
def test_reconcile_without_the_api_or_rbac_deploys_the_rest(view: PoolView, reason: str) -> None:
    result = reconciled(ROUTED, view)
    assert [c["kind"] for c in result.apply] == ["Service", "PodDisruptionBudget", "Deployment"]
    assert pool_condition(result) == ("False", reason)
    assert any(e.type == "Warning" and e.reason == f"InferencePool{reason}" for e in result.events)


def test_routing_removed_prunes_the_owned_pool_and_the_condition() -> None:
    owned = reconciled(ROUTED, PoolView(api_installed=True)).status
    unrouted = {**ROUTED, "routing": {}}
    result = reconciled(unrouted, None, owned)
    assert result.prune_pools and result.keep_pool is None and pool_condition(result) is None
    assert all(c["kind"] != "InferencePool" for c in result.apply)
    recommend = reconciled({**ROUTED, "scaling": {"mode": "recommend"}}, PoolView(api_installed=True), owned)
    assert recommend.prune_pools and recommend.apply == () and pool_condition(recommend) is None
    # A service that never owned a pool never looks.
    assert not reconciled(unrouted, None).prune_pools


def test_refresh_reconciles_once_the_crd_arrives() -> None:
    missing = reconciled(ROUTED, PoolView(api_installed=False))
    seen = Observed(GPUS, pool=PoolView(api_installed=True))
    status = missing.status.model_copy(update={"phase": "Ready"})
    later = refresh(ROUTED, RES, status, seen, default_catalog(), Settings(), NOW)
    assert later is not None and later.apply[-1]["kind"] == "InferencePool"
    still = refresh(
        ROUTED, RES, status, Observed(GPUS, pool=PoolView(api_installed=False)), default_catalog(), Settings(), NOW
    )
    assert still is None or all(c["kind"] != "InferencePool" for c in still.apply)
