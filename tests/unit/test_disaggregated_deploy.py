"""spec.serving.disaggregation in the operator's pure core: the plan recorded as status.plan.prefill
and .decode, the two pool Deployments (names, role labels and selectors, vLLM's KV connector and
its side channel), the Service on the decode pods, readiness from both pools, the layout switched
back and forth, and the aggregated path unchanged when off."""

from __future__ import annotations

import copy
import datetime as dt
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from kvscale.api import LLMD_ROLE
from kvscale.api.crd import crd
from kvscale.api.intent import read_spec
from kvscale.api.models import InferenceServiceStatus, parse_status, status_dict
from kvscale.control.children import ChildView
from kvscale.control.inventory import gpu_inventory
from kvscale.control.memory import ServiceMemory
from kvscale.control.reconcile import DeploymentView, Observed, Resource, Result, reconcile, refresh
from kvscale.control.settings import Settings
from kvscale.control.status import get_condition
from kvscale.sizing.catalog import default_catalog
from tests.cluster.harness import node_objects

ROOT = Path(__file__).resolve().parents[2]
CAT = default_catalog()
POOLS = gpu_inventory(CAT, list(node_objects(ROOT / "tests" / "cluster" / "nodepool.yaml")), [])
SETTINGS = Settings()
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
RES = Resource("ns", "chat", "uid-1", 1)
# docs/disaggregation.md's steady case: long prompts, a tight TPOT (auto chooses the pools).
SPEC: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 4000, "outputTokens": 300, "requestsPerSecond": 8},
    "slo": {"timeToFirstToken": "1500ms", "timePerOutputToken": "12ms"},
    "hardware": {"gpuTypes": ["H100-SXM"]},
}
CONNECTOR = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def spec(mode: str | None = None, **patch: Any) -> dict[str, Any]:
    out = copy.deepcopy(SPEC)
    if mode is not None:
        out["serving"] = {"disaggregation": mode}
    for key, value in patch.items():
        out[key] = {**out.get(key, {}), **value}
    return out


def deployed(
    body: dict[str, Any], status: InferenceServiceStatus | None = None, seen: Observed | None = None
) -> Result:
    return reconcile(
        read_spec(body), RES, status or InferenceServiceStatus(), seen or Observed(POOLS), CAT, SETTINGS, now=NOW
    )


def by_name(result: Result) -> dict[str, dict[str, Any]]:
    return {f"{c['kind']}/{c['metadata']['name']}": c for c in result.apply}


def test_on_deploys_a_prefill_and_a_decode_deployment_with_their_roles_and_connector() -> None:
    result = deployed(spec("on"))
    assert result.retry is None
    children = by_name(result)
    assert sorted(children) == [
        "Deployment/chat-decode",
        "Deployment/chat-prefill",
        "PodDisruptionBudget/chat",
        "Service/chat",
    ]
    plan = result.status.plan
    assert plan is not None and plan.mode == "disaggregated" and plan.prefill and plan.decode
    for role, pool in (("prefill", plan.prefill), ("decode", plan.decode)):
        body = children[f"Deployment/chat-{role}"]
        assert body["metadata"]["labels"]["app.kubernetes.io/instance"] == "chat"  # the service's, for the informers
        assert body["spec"]["selector"]["matchLabels"][LLMD_ROLE] == role
        assert body["spec"]["replicas"] == pool.replicas == pool.workers
        template = body["spec"]["template"]
        assert template["metadata"]["labels"][LLMD_ROLE] == role
        assert template["metadata"]["labels"]["llm-d.ai/inference-serving"] == "true"
        container = template["spec"]["containers"][0]
        args = container["args"]
        assert args[args.index("--tensor-parallel-size") + 1] == str(pool.tensor_parallel)
        assert args[args.index("--max-num-seqs") + 1] == str(pool.max_batch)
        assert json.loads(args[args.index("--kv-transfer-config") + 1]) == CONNECTOR
        assert args[1:] == pool.engine_args  # status shows what runs, after `vllm serve MODEL`
        assert container["resources"]["limits"]["nvidia.com/gpu"] == str(pool.tensor_parallel)
        side = next(e for e in container["env"] if e["name"] == "VLLM_NIXL_SIDE_CHANNEL_HOST")
        assert side["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert pool.deployment == f"chat-{role}"
    assert children["Service/chat"]["spec"]["selector"][LLMD_ROLE] == "decode"
    assert LLMD_ROLE not in children["PodDisruptionBudget/chat"]["spec"]["selector"]["matchLabels"]
    assert plan.gpus_total == plan.prefill.gpus + plan.decode.gpus
    assert plan.replicas == plan.decode.workers and plan.tensor_parallel == plan.decode.tensor_parallel
    assert result.status.replicas == plan.decode.replicas
    assert plan.reason.startswith("spec.serving.disaggregation is on: ")
    scaled = get_condition(result.status, "PoolsAutoscaled")
    assert scaled is not None and (scaled.status, scaled.reason) == ("True", "EachOnItsSignal")
    assert "each pool then scales on its own signal" in scaled.message
    pinned = get_condition(deployed(spec("on", scaling={"replicas": 2})).status, "PoolsAutoscaled")
    assert pinned is not None and (pinned.status, pinned.reason) == ("False", "FixedAtPlan")
    for pool in (plan.prefill, plan.decode):  # each pool's share of TTFT, what its autoscaler scales it for
        assert pool.ttft_target_seconds is not None and 0 < pool.ttft_target_seconds <= 1.5
    assert result.applied_deployment is None  # the scale tick's drift check is the aggregated workload's


def test_status_round_trips_with_both_pools() -> None:
    st = deployed(spec("on")).status
    assert parse_status(status_dict(st)) == st
    wire = status_dict(st)["plan"]
    assert wire["mode"] == "disaggregated" and {"prefill", "decode", "kvTransferMs", "gpusTotal"} <= set(wire)
    assert {"gpuType", "tensorParallel", "workers", "replicas", "gpus", "engineArgs"} <= set(wire["prefill"])


def test_off_and_unset_build_the_aggregated_children_unchanged() -> None:
    unset, off = deployed(spec()), deployed(spec("off"))
    assert unset.apply == off.apply and unset.status == off.status
    assert [c["kind"] for c in unset.apply] == ["Service", "PodDisruptionBudget", "Deployment"]
    assert unset.apply[-1]["metadata"]["name"] == "chat"
    assert LLMD_ROLE not in json.dumps(unset.apply)
    assert "--kv-transfer-config" not in json.dumps(unset.apply)
    assert unset.status.plan is not None and unset.status.plan.mode is None
    assert get_condition(unset.status, "PoolsAutoscaled") is None
    assert "mode" not in status_dict(unset.status)["plan"]


def test_auto_keeps_aggregated_replicas_where_they_are_cheaper() -> None:
    short = spec(
        "auto",
        workload={"inputTokens": 200, "outputTokens": 200, "requestsPerSecond": 4},
        slo={"timeToFirstToken": "200ms", "timePerOutputToken": "50ms"},
    )
    result = deployed(short)
    assert result.status.plan is not None and result.status.plan.mode is None
    assert [c["metadata"]["name"] for c in result.apply if c["kind"] == "Deployment"] == ["chat"]


def test_auto_chooses_the_pools_where_they_are_cheaper_and_a_pd_router_reaches_them() -> None:
    from kvscale.control.reconcile import PoolView

    routed = spec("auto", routing={"inferencePool": {}})
    result = deployed(routed, seen=Observed(POOLS, pool=PoolView(api_installed=True)))
    plan = result.status.plan
    assert plan is not None and plan.mode == "disaggregated"
    assert plan.reason.startswith("disaggregated: ")  # the planner's reason: why the pools won
    # Behind a plain Service the decode pods would answer alone: auto keeps aggregated replicas.
    plain = deployed(spec("auto")).status.plan
    assert plain is not None and plain.mode is None


def test_on_refuses_an_engine_without_a_kv_connector() -> None:
    result = deployed(spec("on", engine={"type": "sglang"}))
    planned = get_condition(result.status, "Planned")
    assert planned is not None and planned.reason == "DisaggregationInfeasible"
    assert "vLLM" in planned.message and result.apply == ()


def test_on_refuses_a_kv_connector_in_the_engine_args() -> None:
    result = deployed(spec("on", engine={"args": ["--kv-transfer-config", "{}"]}))
    planned = get_condition(result.status, "Planned")
    assert planned is not None and planned.reason == "InvalidArgs" and result.apply == ()


def test_recommend_records_the_pools_and_deploys_nothing() -> None:
    result = deployed(spec("on", scaling={"mode": "recommend"}))
    assert result.apply == () and result.status.phase == "Recommended"
    assert result.status.plan is not None and result.status.plan.decode is not None


def _views(result: Result) -> dict[str, DeploymentView]:
    return {
        role: DeploymentView.of({**body, "status": {"readyReplicas": body["spec"]["replicas"]}})
        for role in ("prefill", "decode")
        for body in [by_name(result)[f"Deployment/chat-{role}"]]
    }


def test_ready_when_both_pools_are() -> None:
    first = deployed(spec("on"))
    views = _views(first)
    half = {**views, "prefill": DeploymentView(views["prefill"].replicas, 0, "H100-SXM")}
    waiting = refresh(
        read_spec(spec("on")), RES, first.status, Observed(POOLS, pool_workloads=half), CAT, SETTINGS, NOW
    )
    assert waiting is not None and waiting.status.phase == "Deploying"
    ready_msg = get_condition(waiting.status, "Ready")
    assert ready_msg is not None and "prefill 0/" in ready_msg.message
    ready = refresh(read_spec(spec("on")), RES, first.status, Observed(POOLS, pool_workloads=views), CAT, SETTINGS, NOW)
    assert ready is not None and ready.status.phase == "Ready"
    assert ready.status.ready_replicas == views["decode"].replicas


def _owned(result: Result) -> tuple[ChildView, ...]:
    return tuple(ChildView(c["kind"], "ns", c["metadata"]["name"], ("uid-1",)) for c in result.apply)


def test_switching_layouts_deletes_the_other_layouts_workloads() -> None:
    aggregated = deployed(spec("off"))
    agg_seen = Observed(
        POOLS, DeploymentView(1, 1, "H100-SXM"), applied=aggregated.applied_deployment, children=_owned(aggregated)
    )
    pools = deployed(spec("on"), aggregated.status, agg_seen)
    assert pools.delete == ("Deployment",)  # the aggregated <name> Deployment
    pool_seen = Observed(POOLS, children=_owned(pools), pool_workloads=_views(pools))
    back = deployed(spec("off"), pools.status, pool_seen)
    assert set(back.delete_named) == {("Deployment", "chat-prefill"), ("Deployment", "chat-decode")}
    assert back.status.plan is not None and back.status.plan.mode is None and back.status.plan.prefill is None
    assert get_condition(back.status, "PoolsAutoscaled") is None


def test_a_deleted_pool_is_restored_from_memory() -> None:
    result = deployed(spec("on"))
    memory = ServiceMemory().remembered(result)
    kept = {(c["kind"], c["metadata"]["name"]) for c in memory.applied_children()}
    assert {("Deployment", "chat-prefill"), ("Deployment", "chat-decode")} <= kept


def test_the_crd_offers_the_layouts() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"]["serving"]["properties"]["disaggregation"]
    assert field["enum"] == ["auto", "on", "off"] and field["default"] == "off"
    shipped = yaml.safe_load((ROOT / "crds" / "inferenceservices.kvscale.io.yaml").read_text())
    assert shipped == crd()
    plan = shipped["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["plan"]
    assert {"mode", "prefill", "decode"} <= set(plan["properties"])


def test_kvscale_status_shows_each_pool() -> None:
    from kvscale.cli.status import status_lines

    st = deployed(spec("on")).status
    obj = {
        "metadata": {"name": "chat", "namespace": "ns", "generation": 1},
        "spec": spec("on"),
        "status": status_dict(st),
    }
    text = "\n".join(status_lines(obj, []))
    assert "Plan:     disaggregated, 6 GPUs" in text
    assert "prefill 2 x 1 H100-SXM (bf16), chunk budget 16384 tokens" in text and "(chat-prefill)" in text
    assert "decode  2 x 2 H100-SXM (bf16), max batch" in text and "(chat-decode)" in text


def test_manifests_print_the_pools_the_operator_would_apply(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvscale.cli import app

    doc = {"apiVersion": "kvscale.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"}}
    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump({**doc, "spec": spec("on")}))
    out = CliRunner().invoke(app, ["manifests", "-f", str(path), "--gpus", "H100-SXM=16"])
    assert out.exit_code == 0, out.output
    docs = [d for d in yaml.safe_load_all(out.output) if d]
    operator = {k: v for k, v in by_name(deployed(spec("on"))).items()}
    printed = {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}
    assert sorted(printed) == sorted(operator)
    for role in ("prefill", "decode"):
        mine, theirs = printed[f"Deployment/chat-{role}"], operator[f"Deployment/chat-{role}"]
        assert (
            mine["spec"]["template"]["spec"]["containers"][0]["args"]
            == (theirs["spec"]["template"]["spec"]["containers"][0]["args"])
        )
        assert mine["spec"]["selector"] == theirs["spec"]["selector"]


def test_a_pool_scaled_outside_kvscale_is_reverted() -> None:
    first = deployed(spec("on"))
    views = _views(first)
    views["decode"] = replace(views["decode"], replicas=views["decode"].replicas + 3)
    memory = ServiceMemory().remembered(first)
    seen = Observed(POOLS, children=_owned(first), pool_workloads=views, applied_children=memory.applied_children())
    result = refresh(read_spec(spec("on")), RES, first.status, seen, CAT, SETTINGS, NOW)
    assert result is not None
    [body] = result.apply
    assert body["metadata"]["name"] == "chat-decode" and body["spec"]["replicas"] == views["decode"].replicas - 3
    assert any(e.reason == "DriftReverted" and "decode: replicas" in e.message for e in result.events)


def test_an_edit_that_cannot_be_planned_keeps_the_pools_serving() -> None:
    first = deployed(spec("on"))
    ready = first.status.model_copy(update={"phase": "Ready"})
    impossible = spec("on", slo={"timeToFirstToken": "1ms", "timePerOutputToken": "1ms"})
    seen = Observed(POOLS, children=_owned(first), pool_workloads=_views(first))
    result = deployed(impossible, ready, seen)
    planned = get_condition(result.status, "Planned")
    assert planned is not None and planned.status == "False" and "pools keep serving" in planned.message
    assert result.status.phase == "Ready" and result.apply == () and result.delete_named == ()
    assert result.status.plan == first.status.plan


def test_new_pools_start_within_the_gpus_their_budget_has_free() -> None:
    from types import SimpleNamespace

    from kvscale.api.budget import parse_budget_spec
    from kvscale.control.budget import BudgetBook
    from kvscale.operator.handlers import _pools_under_budget

    book = BudgetBook()
    rt: Any = SimpleNamespace(budgets=book, settings=SETTINGS)
    call: Any = SimpleNamespace(
        body={"metadata": {}}, res=RES, before=InferenceServiceStatus(), intent=read_spec(spec("on"))
    )
    result = deployed(spec("on"))
    assert _pools_under_budget(rt, call, result, Observed(POOLS)) is result  # no budget
    plan = result.status.plan
    assert plan is not None and plan.prefill is not None and plan.decode is not None
    need = plan.prefill.replicas * plan.prefill.tensor_parallel + plan.decode.replicas * plan.decode.tensor_parallel
    book.set_budget("team", parse_budget_spec({"limits": {"H100-SXM": need}}))
    fits = _pools_under_budget(rt, call, result, Observed(POOLS))
    assert fits is result  # the plan's counts fit: deployed as planned, and counted at once
    assert book.entries["ns/chat-prefill"].held_gpus + book.entries["ns/chat-decode"].held_gpus == need
    book.forget("ns", "chat")
    assert "ns/chat-prefill" not in book.entries  # the service's pools go with it
    book.set_budget("team", parse_budget_spec({"limits": {"H100-SXM": need - 1}}))
    cut = _pools_under_budget(rt, call, result, Observed(POOLS))
    replicas = {c["metadata"]["name"]: c["spec"]["replicas"] for c in cut.apply if c["kind"] == "Deployment"}
    gpus = (
        replicas["chat-prefill"] * plan.prefill.tensor_parallel + replicas["chat-decode"] * plan.decode.tensor_parallel
    )
    assert 0 < gpus <= need - 1 and min(replicas.values()) >= 1
    assert cut.status.plan is not None and cut.status.plan.prefill is not None
    assert cut.status.plan.prefill.replicas == replicas["chat-prefill"]
    book.forget("ns", "chat")
    book.set_budget("team", parse_budget_spec({"limits": {"H100-SXM": plan.decode.tensor_parallel}}))
    refused = _pools_under_budget(rt, call, result, Observed(POOLS))  # no room for one of each
    planned = get_condition(refused.status, "Planned")
    assert planned is not None and planned.reason == "PoolsUnderBudget" and "GPUBudget team" in planned.message
    assert refused.apply == () and refused.retry is not None and refused.retry.delay_s == SETTINGS.retry_backoff_s
    running = Observed(POOLS, pool_workloads=_views(result))
    assert _pools_under_budget(rt, call, result, running) is result  # pools already running: their tick's budget


def test_an_owned_inference_pool_selects_both_roles() -> None:
    from kvscale.control.reconcile import PoolView

    body = spec("on", routing={"inferencePool": {}})
    result = deployed(body, seen=Observed(POOLS, pool=PoolView(api_installed=True)))
    [pool] = [c for c in result.apply if c["kind"] == "InferencePool"]
    selected = pool["spec"]["selector"]["matchLabels"]
    assert selected["app.kubernetes.io/instance"] == "chat" and LLMD_ROLE not in selected
    for role in ("prefill", "decode"):
        labels = by_name(result)[f"Deployment/chat-{role}"]["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selected.items())


def test_behind_an_inference_pool_each_decode_pod_runs_llm_d_routing_sidecar_in_front_of_vllm() -> None:
    """llm-d-inference-scheduler v0.4.0's P/D layout (deploy/components/vllm-sim-pd): the endpoint
    picker's header names the prefill pod, the decode pod's sidecar on the pool's port does the
    two-step request, vLLM listens behind it. The probes, the PodMonitor's port `http` and the plain
    Service reach vLLM itself (the sidecar answers /health 200 whatever vLLM's state)."""
    from kvscale.control.reconcile import PoolView

    routed = spec("on", routing={"inferencePool": {}})
    settings = replace(SETTINGS, routing_sidecar_image="registry.example/llm-d-routing-sidecar:v0.4.0")
    result = reconcile(
        read_spec(routed),
        RES,
        InferenceServiceStatus(),
        Observed(POOLS, pool=PoolView(api_installed=True)),
        CAT,
        settings,
        now=NOW,
    )
    assert result.retry is None
    children = by_name(result)
    port = SETTINGS.engine_port
    decode = children["Deployment/chat-decode"]["spec"]["template"]
    [sidecar] = decode["spec"]["initContainers"]
    assert sidecar["name"] == "routing-sidecar" and sidecar["restartPolicy"] == "Always"  # a native sidecar
    assert sidecar["image"] == "registry.example/llm-d-routing-sidecar:v0.4.0"
    assert sidecar["args"] == [
        f"--port={port}",
        f"--vllm-port={port + 200}",
        "--connector=nixlv2",
        "--secure-proxy=false",
    ]
    assert sidecar["ports"] == [{"name": "pd-http", "containerPort": port, "protocol": "TCP"}]
    vllm = decode["spec"]["containers"][0]
    assert vllm["args"][vllm["args"].index("--port") + 1] == str(port + 200)
    assert vllm["ports"] == [{"name": "http", "containerPort": port + 200, "protocol": "TCP"}]
    assert vllm["readinessProbe"]["httpGet"]["port"] == "http"
    assert decode["metadata"]["annotations"]["prometheus.io/port"] == str(port + 200)
    plan = result.status.plan
    assert plan is not None and plan.decode is not None and "--port" in plan.decode.engine_args
    # The prefill pods take the sidecar's requests on the pool's port themselves.
    prefill = children["Deployment/chat-prefill"]["spec"]["template"]
    assert "initContainers" not in prefill["spec"]
    assert prefill["spec"]["containers"][0]["ports"][0]["containerPort"] == port
    pool = next(c for c in result.apply if c["kind"] == "InferencePool")
    assert pool["spec"]["targetPorts"] == [{"number": port}]  # the sidecar on decode pods, vLLM on prefill
    assert LLMD_ROLE not in pool["spec"]["selector"]["matchLabels"]  # both roles
    assert children["Service/chat"]["spec"]["ports"][0]["targetPort"] == "http"
    # Behind a plain Service nothing routes by the header: no sidecar, vLLM on the port.
    plain = by_name(deployed(spec("on")))["Deployment/chat-decode"]["spec"]["template"]["spec"]
    assert "initContainers" not in plain and plain["containers"][0]["ports"][0]["containerPort"] == port


def test_manifests_behind_an_inference_pool_give_the_pickers_pd_configuration(tmp_path: Path) -> None:
    """kvscale owns the pool, the user runs the picker: `manifests` prints llm-d's P/D
    EndpointPickerConfig (v0.4.0's deploy/config/pd-epp-config.yaml) for its --config-file, with
    the same Deployments (sidecar included) the operator applies."""
    from typer.testing import CliRunner

    from kvscale.cli import app

    doc = {"apiVersion": "kvscale.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"}}
    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump({**doc, "spec": spec("on", routing={"inferencePool": {}})}))
    out = CliRunner().invoke(app, ["manifests", "-f", str(path), "--gpus", "H100-SXM=16"])
    assert out.exit_code == 0, out.output
    printed = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(out.output) if d}
    config = yaml.safe_load(printed["ConfigMap/chat-epp-pd"]["data"]["pd-epp-config.yaml"])
    assert config["kind"] == "EndpointPickerConfig"
    types = {p["type"] for p in config["plugins"]}
    assert {"pd-profile-handler", "prefill-header-handler", "prefill-filter", "decode-filter"} <= types
    profiles = {p["name"]: [r["pluginRef"] for r in p["plugins"]] for p in config["schedulingProfiles"]}
    assert profiles["prefill"][0] == "prefill-filter" and profiles["decode"][0] == "decode-filter"
    assert all(ref in types for refs in profiles.values() for ref in refs)  # every reference is declared
    sidecars = printed["Deployment/chat-decode"]["spec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in sidecars] == ["routing-sidecar"]
    # Behind a plain Service no picker reads it: not printed.
    path.write_text(yaml.safe_dump({**doc, "spec": spec("on")}))
    plain = CliRunner().invoke(app, ["manifests", "-f", str(path), "--gpus", "H100-SXM=16"])
    assert "EndpointPickerConfig" not in plain.output
