"""`kvscale plan --trace` checks a disaggregated plan as it checks an aggregated one: the pools
replayed on the trace's busiest stretch (kvscale.sim.check_pools), grown where they miss, and
`auto` choosing the cheaper layout the replay confirms."""

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvscale.cli import app
from kvscale.cli.plan_layouts import CheckedLayout, checked_layouts, infeasible, layout_lines, with_layouts
from kvscale.planner.disaggregated import plan_layouts
from kvscale.planner.search import PlanRequest, plan
from kvscale.planner.serialize import plan_to_dict
from kvscale.sim.check import MAX_UP, check_and_size, sample
from kvscale.sim.check_pools import check_pools, pools_setup, replay_pools
from kvscale.sim.fit import fit_trace
from kvscale.sim.trace import TraceRequest, read_trace
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.workload import Slo

runner = CliRunner()
CAT = default_catalog()


def write_trace(path: Path, rate: float, span_s: float, seed: int, long_share: float = 0.0) -> Path:
    """Poisson arrivals; prompts of 3000-5000 tokens, `long_share` of them 10000-14000 instead;
    outputs of 200-400."""
    rng = random.Random(seed)
    t, lines = 0.0, []
    while t < span_s:
        t += rng.expovariate(rate)
        long = rng.random() < long_share
        prompt = rng.randint(10_000, 14_000) if long else rng.randint(3000, 5000)
        lines.append(
            json.dumps({"timestamp": int(t * 1000), "input_length": prompt, "output_length": rng.randint(200, 400)})
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def plan_args(trace: Path, ttft: str, tpot: str, *more: str) -> list[str]:
    base = ["plan", "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--ttft", ttft, "--tpot", tpot]
    return [*base, "--trace", str(trace), *more]


def pools_cost(d: dict[str, Any], key: str = "workers") -> float:
    """A disaggregated dict's $/h at its pools' `workers` (or `analytic_workers`)."""
    return float(sum(d[r]["cost_usd_per_hour"] / d[r]["workers"] * d[r][key] for r in ("prefill", "decode")))


def assert_check_consistent(d: dict[str, Any]) -> dict[str, Any]:
    """The pools' check: its counts are the plan's, its figures those of the replay it names."""
    check: dict[str, Any] = d["check"]
    assert {"requests", "rate_per_s", "routing", "target", "attainment", "met", "why", "tried"} <= set(check)
    for role in ("prefill", "decode"):
        assert check["workers"][role] == d[role]["workers"]
        assert check["analytic_workers"][role] == d[role]["analytic_workers"]
    tried = {(t["prefill"], t["decode"]): t["attainment"] for t in check["tried"]}
    planned = (check["analytic_workers"]["prefill"], check["analytic_workers"]["decode"])
    assert tried.get(planned) == check["analytic_attainment"]  # None: not replayed
    assert tried[check["workers"]["prefill"], check["workers"]["decode"]] == check["attainment"]
    assert check["met"] == (check["attainment"] >= check["target"])
    assert check["gpu_hours"] > 0
    return check


def test_long_prompts_and_a_tight_tpot_choose_the_pools_the_replay_confirms(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "long.jsonl", 8.0, 240.0, seed=1)
    result = runner.invoke(app, [*plan_args(trace, "1.5s", "12ms"), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    chosen = out["chosen"]
    assert out["layout"]["mode"] == "disaggregated" and chosen["mode"] == "disaggregated" and out["feasible"]
    check = assert_check_consistent(chosen)
    assert check["met"] and check["routing"] == "service" and check["requests"] == out["check"]["requests"]
    # met at p95: 95% of the requests meet both targets, so the p95 of each is within its target
    assert check["ttft_p_ms"] <= 1500 and check["tpot_p_ms"] <= 12
    # the cheaper of two checked layouts: the aggregated one beside it was sized by its own check
    beside = out["aggregated_beside"]
    assert beside["mode"] == "aggregated" and out["check"]["met"]
    assert chosen["cost_usd_per_hour"] < beside["cost_usd_per_hour"]
    assert chosen["gpus_total"] == chosen["prefill"]["gpus"] + chosen["decode"]["gpus"]
    assert "both layouts checked in the simulator" in out["layout"]["reason"]
    # the replay's figures are the replay's: the same pools replayed again give them
    fitted = read_trace(trace)
    request = PlanRequest(
        model=CAT.model("llama-3.1-8b"), workload=fit_trace(fitted).workload, slo=Slo(1.5, 0.012), gpus=("H100-SXM",)
    )
    found = plan_layouts(CAT, request, "on")
    assert found.disaggregated is not None
    replay = sample(fitted, request.workload.requests_per_s)
    again = replay_pools(
        pools_setup(found.disaggregated, "service"), replay, check["workers"]["prefill"], check["workers"]["decode"]
    )
    assert round(again.attainment, 5) == check["attainment"] and round(again.gpu_hours, 4) == check["gpu_hours"]

    human = runner.invoke(app, plan_args(trace, "1.5s", "12ms"))
    assert human.exit_code == 0
    assert "Layout: disaggregated (auto)" in human.stdout and "pools' simulated check" in human.stdout
    assert "does not replay" not in human.stdout


def test_on_reports_the_pools_check(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "long.jsonl", 8.0, 240.0, seed=1)
    result = runner.invoke(app, [*plan_args(trace, "1.5s", "12ms", "--disaggregation", "on"), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["chosen"]["mode"] == "disaggregated" and out["layout"]["disaggregation"] == "on"
    check = assert_check_consistent(out["chosen"])
    assert out["feasible"] == check["met"]
    assert out["aggregated_beside"]["mode"] == "aggregated"


def test_pools_that_miss_as_planned_lose_to_the_checked_aggregated_plan(tmp_path: Path) -> None:
    # A tail of long prompts (8% of 10k-14k tokens) and TTFT 0.8 s: the pools as planned are cheaper than the
    # aggregated replicas, but miss in the replay; the pools that meet the SLO are no cheaper.
    trace = write_trace(tmp_path / "tail.jsonl", 6.0, 240.0, seed=2, long_share=0.08)
    result = runner.invoke(app, [*plan_args(trace, "0.8s", "15ms"), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    chosen = out["chosen"]
    assert out["layout"]["mode"] == "aggregated" and chosen["mode"] == "aggregated"
    beside = chosen["disaggregated_beside"]
    check = assert_check_consistent(beside)
    assert check["analytic_attainment"] < check["target"]  # the planned pools miss
    assert pools_cost(beside, "analytic_workers") < chosen["cost_usd_per_hour"]  # and were cheaper
    assert check["met"] and beside["cost_usd_per_hour"] >= chosen["cost_usd_per_hour"]
    reason = out["layout"]["reason"]
    assert reason.startswith("aggregated: ") and "the simulator needs more" in reason
    assert f"{check['analytic_attainment']:.2%}" in reason

    # --disaggregation off: no pools replayed, and the aggregated plan exactly as under auto
    def no_replay(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the pools were replayed under --disaggregation off")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("kvscale.sim.check_pools.check_pools", no_replay)
        off = runner.invoke(app, [*plan_args(trace, "0.8s", "15ms", "--disaggregation", "off"), "--json"])
    assert off.exit_code == 0, off.output
    kept = json.loads(off.stdout)
    assert kept["chosen"]["disaggregated_beside"] == {"why": "not searched (--disaggregation off)"}
    assert kept["layout"] == {
        "disaggregation": "off",
        "mode": "aggregated",
        "reason": "aggregated only (--disaggregation off)",
    }
    assert kept["check"] == out["check"]
    same = {k: v for k, v in chosen.items() if k != "disaggregated_beside"}
    assert {k: v for k, v in kept["chosen"].items() if k != "disaggregated_beside"} == same


def test_pools_no_count_meets_keep_the_aggregated_plan(tmp_path: Path) -> None:
    # The aggregated plan confirmed on the sample; the pools replayed on prompts twelve times as
    # long (each prefill alone past TTFT): no pools meet it, auto keeps the aggregated plan.
    trace = read_trace(write_trace(tmp_path / "long.jsonl", 8.0, 240.0, seed=1))
    request = PlanRequest(
        model=CAT.model("llama-3.1-8b"), workload=fit_trace(trace).workload, slo=Slo(1.5, 0.012), gpus=("H100-SXM",)
    )
    replay = sample(trace, request.workload.requests_per_s)
    result = check_and_size(plan(CAT, request), replay)
    assert result.feasible and result.chosen is not None and result.chosen.check is not None
    found = plan_layouts(CAT, request, "auto", aggregated=result)
    assert found.mode == "disaggregated" and found.disaggregated is not None  # by the model alone
    longer = [TraceRequest(r.arrival_s, r.input_tokens * 12, r.output_tokens) for r in replay]
    checked = checked_layouts(found, result, longer, "service")
    assert isinstance(checked, CheckedLayout) and checked.check is not None
    assert not checked.check.met and checked.mode == "aggregated"
    assert checked.reason.startswith("aggregated: the disaggregated pools miss the SLO in the simulated check")
    assert "no pools up to" in checked.reason
    # the search stayed within its bound: MAX_UP x the planned workers of each pool
    planned = found.disaggregated
    assert max(t[0] for t in checked.check.tried) <= MAX_UP * planned.prefill.workers
    assert max(t[1] for t in checked.check.tried) <= MAX_UP * planned.decode.workers
    assert not infeasible(checked, result.feasible)
    out = with_layouts(plan_to_dict(result), checked, None, None, result.feasible)
    assert out["chosen"]["mode"] == "aggregated" and out["feasible"]
    assert out["chosen"]["disaggregated_beside"]["check"]["met"] is False
    lines = layout_lines(checked)
    assert lines[0].startswith("Layout: aggregated (auto): aggregated: the disaggregated pools miss")
    assert any("not met" in line for line in lines)
    # under on, the same pools are the plan, infeasible (exit 1), their check said
    on = checked_layouts(replace(found, disaggregation="on"), result, longer, "service")
    assert on.mode == "disaggregated" and infeasible(on, result.feasible)
    on_out = with_layouts(plan_to_dict(result), on, None, None, result.feasible)
    assert on_out["feasible"] is False and on_out["chosen"]["check"]["met"] is False


def test_the_check_grows_the_pool_whose_stage_misses() -> None:
    # Pools planned for 8 req/s replayed at twice the rate: prefill waits miss first, and the
    # search adds prefill workers until the percentile is met.
    request = PlanRequest(
        model=CAT.model("llama-3.1-8b"),
        workload=fit_trace([TraceRequest(i / 8.0, 4000, 300) for i in range(960)]).workload,
        slo=Slo(1.5, 0.012),
        gpus=("H100-SXM",),
    )
    found = plan_layouts(CAT, request, "on")
    assert found.disaggregated is not None
    d = found.disaggregated
    rng = random.Random(3)
    t, replay = 0.0, []
    while t < 120.0:
        t += rng.expovariate(16.0)
        replay.append(TraceRequest(t, 4000, 300))
    check = check_pools(d, replay)
    planned = check.analytic
    assert planned is not None and planned.attainment < check.target
    assert planned.prefill_misses > planned.decode_misses
    assert check.met and check.prefill > d.prefill.workers
    assert check.checked.attainment >= check.target and "the simulator needs more" in check.why
