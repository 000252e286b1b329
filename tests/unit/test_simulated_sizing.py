"""Issue 26, item 3: the analytic plan proposes, the simulated check sizes it, below and above
the analytic count; a check no fleet passes makes the plan infeasible with the closest fleet."""

import json
import random
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

from kvscale.cli import app
from kvscale.planner.search import PlanRequest, plan
from kvscale.planner.serialize import plan_to_dict
from kvscale.sim import check as sim_check
from kvscale.sim.check import check_and_size, check_plan, sample, search_replicas
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.workload import Slo, Workload
from tests.unit.profiles import VLLM_0_2_AS_VLLM, catalog_2023

runner = CliRunner()
CAT = default_catalog()
ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "benchmarks" / "data" / "traces" / "mooncake-synthetic.jsonl"


def _poisson(rate: float, span_s: float, seed: int = 5) -> list[TraceRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    while t < span_s:
        t += rng.expovariate(rate)
        out.append(TraceRequest(t, rng.randint(300, 900), rng.randint(50, 200)))
    return out


def _write(path: Path, trace: list[TraceRequest]) -> Path:
    rows = (
        json.dumps(
            {"timestamp": int(r.arrival_s * 1000), "input_length": r.input_tokens, "output_length": r.output_tokens}
        )
        for r in trace
    )
    path.write_text("\n".join(rows) + "\n")
    return path


def test_the_search_goes_below_and_above_the_analytic_count() -> None:
    # Misses inversely proportional to replicas: 0.5 / n, so 99% holds from 50 replicas on.
    def attain(n: int) -> float:
        return 1.0 - 0.5 / n

    for analytic in (200, 60, 20):
        seen: dict[int, float] = {}
        n, met = search_replicas(attain, analytic, 0.99, seen)
        assert met and attain(n) >= 0.99
        assert n <= 50 * (1 + sim_check.TOLERANCE) + 1, (analytic, n, seen)
        assert len(seen) <= 8  # a few replays, not a sweep
    # A first step up of a few replicas that the replay's noise leaves no better is no
    # plateau: only a doubling that closes too little of the gap ends the search.
    noisy = {17: 0.9893, 19: 0.9890, 38: 0.9951}
    n, met = search_replicas(lambda k: noisy.get(k, 0.9951 if k > 19 else 0.9890), 17, 0.99)
    assert met and 19 < n <= 38
    # The search stays cheap: it looks no further than MAX_UP times the analytic count, and
    # then names the closest fleet it saw.
    n, met = search_replicas(attain, 3, 0.99)
    assert not met and n == 3 * sim_check.MAX_UP


def test_a_plateau_below_the_target_is_no_fleet_with_the_closest_one() -> None:
    # 1.5% of requests miss whatever the fleet (their own prefill exceeds the TTFT target).
    def attain(n: int) -> float:
        return 0.985 - 0.05 / n

    seen: dict[int, float] = {}
    n, met = search_replicas(attain, 10, 0.99, seen)
    assert not met
    best = max(seen.values())
    assert seen[n] == best and n == min(k for k, a in seen.items() if a >= best)
    assert max(seen) <= 10 * sim_check.MAX_UP


def test_an_over_provisioned_plan_is_sized_down_by_its_check() -> None:
    # Headroom 2 (3x the capacity needed): the analytic count meets the SLO with room to
    # spare; the simulator confirms fewer, and one replica fewer than that misses.
    trace = _poisson(6.0, 600.0)
    request = PlanRequest(
        model=CAT.model("llama-3.1-8b"),
        workload=Workload(600, 125, 6.0),
        slo=Slo(1.0, 0.1, 99.0),
        gpus=("L4",),
        tensor_parallel=(1,),
        headroom=2.0,
    )
    planned = plan(CAT, request)
    assert planned.chosen is not None
    replay = sample(trace, 6.0)
    sized = check_and_size(planned, replay)
    chosen = sized.chosen
    assert chosen is not None and chosen.check is not None and sized.feasible
    assert chosen.check.analytic_replicas == planned.chosen.prediction.replicas
    assert chosen.prediction.replicas == chosen.check.replicas < chosen.check.analytic_replicas
    assert chosen.check.attainment >= 0.99 and chosen.check.met
    assert chosen.prediction.cost_usd_per_hour < planned.chosen.prediction.cost_usd_per_hour
    assert "fewer" in chosen.check.why
    fewer = replace(planned.chosen, prediction=replace(planned.chosen.prediction, replicas=chosen.check.replicas - 1))
    if chosen.check.replicas > 1:
        below = check_plan(fewer, request.slo, replay).analytic_attainment
        assert below is not None and below < 0.99
    # Typed, and in the plan's JSON (what the operator's status maps): both counts.
    out = plan_to_dict(sized)
    assert out["chosen"]["analytic_replicas"] == chosen.check.analytic_replicas
    assert out["chosen"]["replicas"] == chosen.check.replicas
    assert out["chosen"]["check"]["tried"][0]["replicas"] == chosen.check.analytic_replicas


def test_plan_prints_both_counts_and_why(tmp_path: Path) -> None:
    trace = _write(tmp_path / "p.jsonl", _poisson(6.0, 600.0))
    args = ["plan", "--model", "llama-3.1-8b", "--gpu", "L4", "--tp", "1", "--ttft", "1s", "--tpot", "100ms"]
    args += ["--percentile", "99", "--headroom", "2", "--trace", str(trace)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    check = out["check"]
    assert out["chosen"]["replicas"] == check["replicas"] < check["analytic_replicas"]
    assert out["chosen"]["analytic_replicas"] == check["analytic_replicas"]
    assert check["met"] and check["attainment"] >= 0.99 and check["why"]
    human = runner.invoke(app, args)
    assert human.exit_code == 0
    text = " ".join(human.stdout.split())
    assert f"{check['replicas']} (simulated) instead of {check['analytic_replicas']} (analytic)" in text
    assert f"the analytic model asked for {check['analytic_replicas']}" in text


def test_a_check_no_fleet_passes_is_infeasible_with_the_closest_fleet() -> None:
    # Mooncake's long prompts and 4-token answers behind a plain Service: a short answer that
    # lands beside another prompt's 16k-token chunks misses TPOT however many replicas share
    # the load (96.0% on the analytic 12, 98.7% on 48): exit 1, the closest fleet, and what
    # would meet it.
    args = ["plan", "--model", "llama-3.1-70b", "--gpu", "H100-SXM", "--tp", "4", "--ttft", "10s", "--tpot", "80ms"]
    args += ["--percentile", "99", "--trace", str(MOONCAKE), "--rps", "0.5", "--disaggregation", "off"]
    # sized on the 2023 vLLM profile (tests/unit/profiles.py), as the scenario was measured
    args += ["--catalog", str(VLLM_0_2_AS_VLLM)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 1, result.output
    out = json.loads(result.stdout)
    assert out["feasible"] is False
    check = out["check"]
    assert not check["met"] and check["attainment"] < 0.99
    assert out["chosen"]["replicas"] == check["replicas"] > check["analytic_replicas"]
    assert check["attainment"] == max(t["attainment"] for t in check["tried"])
    said = " ".join(out["suggestions"])
    assert "--percentile" in said and "--routing gateway" in said and "--gpu" in said
    human = runner.invoke(app, args)
    assert human.exit_code == 1
    text = " ".join(human.stdout.split())
    assert "Closest fleet (infeasible)" in text and "It would be met with" in text


def test_the_search_above_stays_within_the_replica_limit() -> None:
    # Batches behind a gateway that need more replicas than the analytic count, under --max-replicas
    # equal to that count: no fleet within the limit meets the SLO, so the plan is infeasible
    # (it never deploys past the limit), and its reason names the limit. Sized on the 2023 vLLM
    # profile (tests/unit/profiles.py): under vllm-0.11 the analytic count is far above the need.
    cat = catalog_2023()
    rng = random.Random(4)
    trace = []
    for k in range(30):
        start = k * 10.0 + rng.uniform(0, 5)
        trace += [TraceRequest(start + rng.uniform(0, 1), 800, 20) for _ in range(30)]
    trace.sort(key=lambda r: r.arrival_s)
    base = PlanRequest(
        model=cat.model("llama-3.1-8b"),
        workload=Workload(800, 20, 3.0),
        slo=Slo(1.5, 0.08, 99.0),
        gpus=("L4",),
        tensor_parallel=(1,),
        headroom=0.0,
    )
    free = check_and_size(plan(cat, base), sample(trace, 3.0), routing="gateway")
    assert free.chosen is not None and free.chosen.check is not None and free.feasible
    analytic = free.chosen.check.analytic_replicas
    assert free.chosen.prediction.replicas > analytic  # without a limit the search adds replicas
    limited = check_and_size(plan(cat, replace(base, max_replicas=analytic)), sample(trace, 3.0), routing="gateway")
    assert limited.chosen is not None and limited.chosen.check is not None
    assert not limited.feasible and limited.chosen.prediction.replicas <= analytic
    assert "at most" in limited.chosen.check.why
