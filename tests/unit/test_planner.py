"""The planner: cheapest feasible plan, reasons for every loser, deterministic, honest when infeasible."""

import time

import pytest

from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.planner import PlanRequest, plan
from kvscale.sizing.workload import Slo, Workload

CAT = default_catalog()


def request(model: str = "llama-3.1-8b", rps: float = 10.0, ttft: float = 0.5, tpot: float = 0.05, **kw) -> PlanRequest:  # type: ignore[no-untyped-def]
    return PlanRequest(model=CAT.model(model), workload=Workload(512, 256, rps), slo=Slo(ttft, tpot), **kw)


def test_every_candidate_has_a_verdict_and_a_reason() -> None:
    result = plan(CAT, request())
    assert result.feasible and result.chosen is not None
    total = len(CAT.gpus) * 4
    assert len(result.candidates) == total
    for c in result.candidates:
        assert c.reason, c


def test_chosen_is_the_cheapest_fully_evaluated() -> None:
    result = plan(CAT, request())
    assert result.chosen and result.chosen.prediction
    chosen_cost = result.chosen.prediction.cost_usd_per_hour
    for alt in result.alternatives:
        if alt.prediction is not None:
            assert alt.prediction.cost_usd_per_hour >= chosen_cost
    pred = result.chosen.prediction
    assert pred.ttft_p_s <= 0.5 and pred.tpot_p_s <= 0.05


def test_latency_objective_picks_the_fastest() -> None:
    result = plan(CAT, request(objective="latency"))
    assert result.chosen and result.chosen.prediction
    best = result.chosen.prediction.ttft_p_s + 256 * result.chosen.prediction.tpot_p_s
    for alt in result.alternatives:
        if alt.prediction is not None:
            assert alt.prediction.ttft_p_s + 256 * alt.prediction.tpot_p_s >= best - 1e-9


def test_more_load_needs_more_replicas() -> None:
    low = plan(CAT, request(rps=2, gpus=("A100-80GB",), tensor_parallel=(1,)))
    high = plan(CAT, request(rps=60, gpus=("A100-80GB",), tensor_parallel=(1,)))
    assert low.chosen and high.chosen and low.chosen.prediction and high.chosen.prediction
    assert high.chosen.prediction.replicas > low.chosen.prediction.replicas


def test_deterministic() -> None:
    a, b = plan(CAT, request()), plan(CAT, request())
    assert [(c.label, c.reason) for c in a.candidates] == [(c.label, c.reason) for c in b.candidates]


def test_big_model_rejected_where_it_does_not_fit() -> None:
    result = plan(CAT, request(model="llama-3.1-70b", gpus=("L4",)))
    assert not result.feasible
    assert all("does not fit" in c.reason or "exceeds" in c.reason or "divide" in c.reason for c in result.rejected)
    assert result.suggestions


def test_impossible_slo_names_the_closest_and_the_fix() -> None:
    result = plan(CAT, request(tpot=0.001))
    assert not result.feasible
    assert any("TPOT" in c.reason for c in result.rejected)
    assert any("--tpot" in s for s in result.suggestions)


def test_gpu_limits_and_max_replicas_reject_with_reasons() -> None:
    limited = plan(CAT, request(rps=50, gpus=("H100-SXM",), tensor_parallel=(1,), gpu_limits={"H100-SXM": 1}))
    assert not limited.feasible
    assert "the cluster has 1 free" in limited.rejected[0].reason
    capped = plan(CAT, request(rps=50, tpot=0.1, gpus=("L4",), tensor_parallel=(1,), max_replicas=1))
    assert not capped.feasible and "maxReplicas" in capped.rejected[0].reason


def test_fp8_unsupported_on_ampere() -> None:
    result = plan(CAT, request(gpus=("A100-80GB",), precisions=("fp8",)))
    assert not result.feasible
    assert all("no fp8" in c.reason for c in result.rejected)


@pytest.mark.parametrize("precisions", [("bf16",), ("bf16", "fp8", "int8", "int4")])
def test_full_catalog_plan_is_fast_enough_to_run_per_reconcile(precisions: tuple[str, ...]) -> None:
    # A loose guard (the tight target lives in benchmarks/plan_speed.py): a plan must stay
    # well under a second so the operator can re-plan on every spec change.
    req = request(precisions=precisions)
    start = time.perf_counter()
    plan(CAT, req)
    assert time.perf_counter() - start < 2.0
