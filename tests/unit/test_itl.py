"""Issue 31, defect 5: inter-token stalls. A chunk step stalls every running request; the
per-request TPOT averages it away, a streaming user sees it. Plans report the p99 token gap
beside TPOT, and an optional bound (--itl, spec.slo.maxInterTokenLatency) limits the chunk
budget (--max-num-batched-tokens)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from typer.testing import CliRunner

from kvscale.api.crd import crd
from kvscale.api.intent import parse_intent, plan_request
from kvscale.cli import app
from kvscale.cli.status import status_lines
from kvscale.control.inventory import GpuPool
from kvscale.control.planning import Planned
from kvscale.control.status import plan_status
from kvscale.planner.search import PlanRequest, plan
from kvscale.sim.policies import StaticPolicy
from kvscale.sim.report import summary
from kvscale.sim.run import SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.load import CHUNK_BUDGETS, ReplicaModel
from kvscale.sizing.roofline import mixed_step
from kvscale.sizing.units import format_duration
from kvscale.sizing.workload import LengthDistribution, Slo, Workload
from tests.unit.profiles import VLLM_0_2_AS_VLLM, catalog_2023

CAT = default_catalog()
runner = CliRunner()
# The case: Llama 3.1 70B on 4 H100s under a tight TPOT, long prompts (RAG).
RAG = [
    "plan",
    "--model",
    "llama-3.1-70b",
    "--ttft",
    "2s",
    "--tpot",
    "40ms",
    "--rps",
    "5",
    "--input",
    "4000",
    "--output",
    "300",
    "--gpu",
    "H100-SXM",
    "--tp",
    "4",
    # the aggregated replica's chunk budget is the subject (prefill/decode pools would take the
    # chunks out of the decode steps altogether: tests/unit/test_disaggregation.py)
    "--disaggregation",
    "off",
    "--json",
]


def plan_json(*extra: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, [*RAG, *extra])
    return result.exit_code, json.loads(result.stdout)


def test_without_a_bound_the_plan_shows_the_stall_its_chunk_budget_brings() -> None:
    code, out = plan_json("--catalog", str(VLLM_0_2_AS_VLLM))  # sized on it (tests/unit/profiles.py)
    chosen = out["chosen"]
    assert code == 0 and out["slo"]["itl_ms"] is None
    # The reading: a 16k budget, whose full step is about a second on TP4 H100s,
    # far above the 40 ms TPOT the plan meets.
    assert chosen["max_num_batched_tokens"] == 16384
    assert 800.0 < chosen["itl_max_ms"] < 1200.0
    assert chosen["tpot_ms"] <= 40.0 < chosen["itl_p99_ms"] <= chosen["itl_max_ms"]
    for alternative in out["alternatives"]:
        assert alternative["itl_p99_ms"] <= alternative["itl_max_ms"]


@pytest.mark.parametrize("bound_ms", [300, 150])
def test_a_tight_itl_lowers_the_chunk_budget(bound_ms: int) -> None:
    _, free = plan_json()
    code, out = plan_json("--itl", f"{bound_ms}ms")
    chosen = out["chosen"]
    assert code == 0 and out["slo"]["itl_ms"] == bound_ms
    assert chosen["max_num_batched_tokens"] < free["chosen"]["max_num_batched_tokens"]
    assert chosen["itl_p99_ms"] <= chosen["itl_max_ms"] <= bound_ms
    # The largest budget within the bound: the next one up steps longer than it.
    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-70b"), CAT.gpu("H100-SXM"), "bf16", 4)
    up = CHUNK_BUDGETS[CHUNK_BUDGETS.index(chosen["max_num_batched_tokens"]) + 1]
    bigger = ReplicaModel(cfg.with_chunk_budget(up), Workload(4000, 300, 5.0))
    assert bigger.worst_step_s(min(chosen["max_batch"], bigger.slot_limit)) * 1e3 > bound_ms
    assert f"--max-num-batched-tokens {chosen['max_num_batched_tokens']}" in " ".join(chosen["engine_args"])


def test_an_impossible_itl_is_infeasible_and_names_the_knob() -> None:
    code, out = plan_json("--itl", "5ms")
    assert code == 1 and out["chosen"] is None
    itl = [r for r in out["rejected"] if "best_itl_ms" in r]
    assert itl and all("--itl bound of 5.0ms" in r["reason"] for r in itl)
    assert any(line.startswith("--itl binds") and "feasible with --itl " in line for line in out["suggestions"])
    human = runner.invoke(app, [*RAG[:-1], "--itl", "5ms"])
    assert human.exit_code == 1 and "--itl binds" in human.stdout


def test_the_operator_passes_the_bound_and_names_the_field() -> None:
    spec = {
        "model": {"name": "llama-3.1-70b"},
        "workload": {"inputTokens": 4000, "outputTokens": 300, "requestsPerSecond": 5},
        "slo": {"timeToFirstToken": "2s", "timePerOutputToken": "40ms"},
        "hardware": {"gpuTypes": ["H100-SXM"], "maxTensorParallel": 4},
    }
    model = CAT.model("llama-3.1-70b")
    free = plan(CAT, plan_request(parse_intent(spec), model, ("H100-SXM",), None))
    spec["slo"]["maxInterTokenLatency"] = "150ms"  # type: ignore[index]
    bounded = plan(CAT, plan_request(parse_intent(spec), model, ("H100-SXM",), None))
    assert free.chosen is not None and bounded.chosen is not None
    assert bounded.request.max_itl_s == pytest.approx(0.150)
    assert bounded.chosen.max_num_batched_tokens < free.chosen.max_num_batched_tokens
    assert bounded.chosen.prediction.itl_max_s <= 0.150
    spec["slo"]["maxInterTokenLatency"] = "1ms"  # type: ignore[index]
    impossible = plan(CAT, plan_request(parse_intent(spec), model, ("H100-SXM",), None))
    assert impossible.chosen is None
    assert any("spec.slo.maxInterTokenLatency binds" in line for line in impossible.suggestions)
    assert not any("--itl" in line for line in impossible.suggestions)


def test_the_crd_has_the_field_with_a_description() -> None:
    versions = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    slo = versions["spec"]["properties"]["slo"]
    field = slo["properties"]["maxInterTokenLatency"]
    assert (
        field["type"] == "string" and field["maxLength"] == 32 and "p99 gap between two tokens" in field["description"]
    )
    assert "maxInterTokenLatency" not in slo["required"]
    assert any("maxInterTokenLatency" in rule["rule"] for rule in slo["x-kubernetes-validations"])
    plan_status = versions["status"]["properties"]["plan"]["properties"]["predictedItlP99"]
    assert "p99 gap between two tokens" in plan_status["description"]


def test_worst_step_is_a_full_budget_beside_the_batch_and_bounds_every_split() -> None:
    # By hand: a step of the whole budget, either one decode and the rest of a prompt chunk or
    # the whole batch and the rest, of the longest prompt in the mix (attention over half of it).
    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu("H100-SXM"), "bf16", 1).with_chunk_budget(2048)
    workload = Workload.of(LengthDistribution((500, 3000), (0.9, 0.1)), LengthDistribution.constant(200), 2.0)
    replica = ReplicaModel(cfg, workload)
    context = workload.mean_decode_context_tokens
    ends = [mixed_step(cfg, n, context, 2048 - n, 3072).seconds for n in (1, 100)]  # 3000 bucketed up to 3072
    assert replica.worst_step_s(100) == pytest.approx(max(ends), rel=1e-9)
    # The step is convex in the decodes beside a fixed token count: no split steps longer.
    for n in range(1, 101, 9):
        assert mixed_step(cfg, n, context, 2048 - n, 3072).seconds <= replica.worst_step_s(100) * (1 + 1e-9)
    # A larger budget never steps shorter.
    steps = [ReplicaModel(cfg.with_chunk_budget(b), workload).worst_step_s(64) for b in CHUNK_BUDGETS]
    assert steps == sorted(steps)


def test_p99_gap_is_the_decode_step_until_chunk_steps_reach_the_tail() -> None:
    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu("H100-SXM"), "bf16", 1).with_chunk_budget(2048)
    replica = ReplicaModel(cfg, Workload(3000, 200, 1.0))
    quiet = replica.at_rate(0.01, 128, 95)  # a chunk step now and then: below 1% of the steps
    assert quiet.chunk_share < 0.01 and replica.itl_percentile_s(quiet) == quiet.decode.seconds
    busy = replica.at_rate(6.0, 128, 95)  # 3000 > the room: a full-room chunk in every prompt
    assert busy.chunk_share > 0.05
    room = replica.chunk_room(round(busy.concurrency))
    assert replica.itl_percentile_s(busy) >= replica.length_chunk_s(round(busy.concurrency), room, 3000) * 0.95
    assert replica.itl_percentile_s(busy) <= replica.worst_step_s(128)


def test_simulated_p99_itl_is_within_10_percent_of_the_plans() -> None:
    cat = catalog_2023()  # the rates are sized on this profile (tests/unit/profiles.py)
    # Tolerance 10%: the simulator schedules every step (chunks packed from the waiting queue,
    # decodes advancing beside them); the plan reads the p99 off the load model's chunk share
    # and a Poisson count of prompts sharing a step. Ten minutes of Poisson arrivals on the
    # planned fleet, at the planned rate, with and without a bound (16384 and 1024 tokens).
    for bound_s, budget in ((None, 16384), (0.06, 1024)):
        request = PlanRequest(
            cat.model("llama-3.1-8b"),
            Workload(3000, 200, 4.0),
            Slo(2.0, 0.03),
            gpus=("H100-SXM",),
            tensor_parallel=(1,),
            max_itl_s=bound_s,
        )
        chosen = plan(cat, request).chosen
        assert chosen is not None and chosen.max_num_batched_tokens == budget
        p = chosen.prediction
        rng, t, trace = random.Random(11), 0.0, []
        while t < 600.0:
            t += rng.expovariate(4.0)
            trace.append(TraceRequest(t, 3000, 200))
        setup = SimSetup(chosen.config, request.slo, p.max_batch, cold_start_s=0.0, initial_replicas=p.replicas)
        row = summary(simulate(setup, Source(trace), StaticPolicy(p.replicas)), setup.slo)
        assert p.itl_p99_s * 1e3 == pytest.approx(row["itl_p99_ms"], rel=0.10)
        if bound_s is not None:
            assert row["itl_p99_ms"] <= bound_s * 1e3


def test_simulate_takes_the_bound_and_reports_p99_itl() -> None:
    base = ["simulate", "--model", "llama-3.1-8b", "--ttft", "2s", "--tpot", "30ms", "--gpu", "H100-SXM", "--tp", "1"]
    base += ["--catalog", str(VLLM_0_2_AS_VLLM)]  # the load is sized on it (tests/unit/profiles.py)
    load = ["--load", "poisson:rate=4,input=3000,output=200,duration=3m", "--policy", "static"]
    rows = {}
    for extra in ([], ["--itl", "60ms"]):
        result = runner.invoke(app, [*base, *load, *extra, "--json"])
        assert result.exit_code == 0, result.output
        rows[bool(extra)] = json.loads(result.stdout)[0]
    # The bound's smaller budget takes the long chunk steps out of the tail.
    assert rows[True]["itl_p99_ms"] <= 60.0 < rows[False]["itl_p99_ms"]
    human = runner.invoke(app, [*base, *load, "--itl", "60ms"])
    assert human.exit_code == 0 and "ITL p99 ms" in human.stdout and "chunk budget 1024" in human.stdout


def test_plan_and_status_show_p99_itl_beside_tpot() -> None:
    human = runner.invoke(app, [*RAG[:-1], "--itl", "150ms"])
    assert human.exit_code == 0 and "p99 ITL <= 150 ms" in human.stdout
    assert "p99 ITL" in human.stdout.split("TPOT", 2)[2] and "longest step" in human.stdout
    # The operator's status.plan (a typed field) and `kvscale status`, from the same plan.
    spec = {
        "model": {"name": "llama-3.1-8b"},
        "workload": {"inputTokens": 3000, "outputTokens": 200, "requestsPerSecond": 4},
        "slo": {"timeToFirstToken": "2s", "timePerOutputToken": "30ms", "maxInterTokenLatency": "60ms"},
        "hardware": {"gpuTypes": ["H100-SXM"], "maxTensorParallel": 1},
    }
    result = plan(CAT, plan_request(parse_intent(spec), CAT.model("llama-3.1-8b"), ("H100-SXM",), None))
    assert result.chosen is not None
    pool = GpuPool("H100-SXM", "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.product", "nvidia.com/gpu", 8, 0, 8)
    planned = Planned(result, result.chosen, CAT.model("llama-3.1-8b"), pool, CAT)
    status = plan_status(planned, 4096, ())
    assert status.predicted_itl_p99 == format_duration(result.chosen.prediction.itl_p99_s)
    plan_wire = status.model_dump(by_alias=True, exclude_none=True)
    assert plan_wire["predictedItlP99"] == status.predicted_itl_p99
    wire = {"plan": plan_wire, "phase": "Ready"}
    lines = status_lines({"metadata": {"name": "chat", "namespace": "a"}, "spec": spec, "status": wire}, [])
    assert "TPOT <= 30ms, p99 ITL <= 60ms" in lines[1]
    assert any(f"p99 ITL {status.predicted_itl_p99} at the planned load" in line for line in lines)
