"""`kvscale plan --trace`: a workload fitted from a trace, and the plan replayed on it."""

import json
import random
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

from kvscale.cli import app
from kvscale.sim.check import check_plan, sample
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.planner import PlanRequest, plan
from kvscale.sizing.workload import Slo, Workload

runner = CliRunner()
CAT = default_catalog()


def write_trace(path: Path, rate: float, span_s: float, seed: int = 1) -> Path:
    rng = random.Random(seed)
    t, lines = 0.0, []
    while t < span_s:
        t += rng.expovariate(rate)
        lines.append(
            json.dumps(
                {
                    "timestamp": int(t * 1000),
                    "input_length": rng.randint(200, 1200),
                    "output_length": rng.randint(20, 200),
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_plan_from_a_trace_says_what_it_fitted_and_checks_itself(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", 3.0, 240.0)
    args = ["plan", "--model", "llama-3.1-8b", "--gpu", "L4", "--ttft", "2s", "--tpot", "80ms", "--percentile", "99"]
    result = runner.invoke(app, [*args, "--trace", str(trace), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    fitted = " ".join(out["workload"]["fitted"])
    assert "index of dispersion" in fitted and "busiest minute" in fitted and "prefix-cache" in fitted
    assert 500 < out["workload"]["input_tokens"] < 900  # uniform 200..1200: mean 700
    check = out["check"]
    assert check["requests"] > 100 and check["planned_replicas"] == out["chosen"]["replicas"]
    assert 0.0 <= check["planned_attainment"] <= 1.0
    assert check["met"] == (check["attainment"] >= 0.99)
    human = runner.invoke(app, [*args, "--trace", str(trace)])
    assert human.exit_code == 0 and "simulated check" in human.stdout and "Workload fitted" in human.stdout


def test_trace_and_lengths_are_exclusive(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", 1.0, 60.0)
    base = ["plan", "--model", "llama-3.1-8b", "--ttft", "1s", "--tpot", "50ms"]
    both = runner.invoke(app, [*base, "--trace", str(trace), "--input", "100"])
    assert both.exit_code == 2 and "leave out --input/--output" in both.stderr
    neither = runner.invoke(app, [*base, "--rps", "1"])
    assert neither.exit_code == 2 and "--trace FILE" in neither.stderr


def test_a_missed_check_adds_replicas_until_the_target() -> None:
    # An undersized plan (headroom 0, Poisson sizing) replayed on batch submissions misses and
    # the check says how many replicas reach the target.
    rng = random.Random(4)
    trace = []
    for k in range(30):
        start = k * 10.0 + rng.uniform(0, 5)
        trace += [TraceRequest(start + rng.uniform(0, 1), 800, 20) for _ in range(30)]
    trace.sort(key=lambda r: r.arrival_s)
    request = PlanRequest(
        model=CAT.model("llama-3.1-8b"),
        workload=Workload(800, 20, 3.0),
        slo=Slo(1.0, 0.08, 99.0),
        gpus=("L4",),
        tensor_parallel=(1,),
        headroom=0.0,
    )
    chosen = plan(CAT, request).chosen
    assert chosen is not None
    check = check_plan(chosen, request.slo, sample(trace, 3.0))
    assert check.planned_attainment < 0.99
    assert check.replicas > check.planned_replicas
    assert check.attainment >= check.planned_attainment


def test_the_check_finds_the_fewest_replicas_that_reach_the_target() -> None:
    rng = random.Random(4)
    trace = []
    for k in range(30):
        start = k * 10.0 + rng.uniform(0, 5)
        trace += [TraceRequest(start + rng.uniform(0, 1), 800, 20) for _ in range(30)]
    trace.sort(key=lambda r: r.arrival_s)
    request = PlanRequest(
        model=CAT.model("llama-3.1-8b"),
        workload=Workload(800, 20, 3.0),
        slo=Slo(1.5, 0.08, 99.0),
        gpus=("L4",),
        tensor_parallel=(1,),
        headroom=0.0,
    )
    chosen = plan(CAT, request).chosen
    assert chosen is not None
    replay = sample(trace, 3.0)
    check = check_plan(chosen, request.slo, replay, routing="gateway")
    assert check.met and check.attainment >= 0.99
    fewer = replace(chosen, prediction=replace(chosen.prediction, replicas=check.replicas - 1))
    assert check_plan(fewer, request.slo, replay, routing="gateway").planned_attainment < 0.99
