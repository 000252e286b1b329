"""GPU budgets over a disaggregated plan's pools (kvscale.control.pool_budget): the pools' GPUs
split by what they serve (not in proportion), scale-ups into free GPUs only, the pools weighed
against the budget's other services by priority."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscale.api.budget import parse_budget_spec
from kvscale.api.models import InferenceServiceStatus
from kvscale.autoscaling.budget import Demand, Option
from kvscale.autoscaling.pool_capacity import split_pools as split_gpus
from kvscale.control.budget import BudgetBook, Entry
from kvscale.control.pool_budget import govern_pools
from kvscale.control.pool_scaling import PoolReading, PoolsGovernor, PoolsMemory, tick_pools
from kvscale.control.status import get_condition
from kvscale.planner.disaggregated import Role
from tests.unit.test_disaggregated_deploy import CAT, NOW, RES, SETTINGS, _views, deployed, spec
from tests.unit.test_pool_scaling import _obs, intent_of

ROLES: tuple[Role, ...] = ("prefill", "decode")


def served(counts: dict[Role, int], rates: dict[Role, float]) -> float:
    return min(counts["prefill"] * rates["prefill"], counts["decode"] * rates["decode"])


@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(2, 64),
    want_p=st.integers(1, 20),
    want_d=st.integers(1, 20),
    rate_p=st.floats(0.5, 30),
    rate_d=st.floats(0.5, 30),
    gpus_p=st.sampled_from([1, 2, 4]),
    gpus_d=st.sampled_from([1, 2, 4, 8]),
)
def test_the_split_serves_at_least_what_any_other_split_within_the_gpus_does(
    total: int, want_p: int, want_d: int, rate_p: float, rate_d: float, gpus_p: int, gpus_d: int
) -> None:
    rates: dict[Role, float] = {"prefill": rate_p, "decode": rate_d}
    p_got, d_got = split_gpus(total, (want_p, want_d), (rate_p, rate_d), (gpus_p, gpus_d))
    got: dict[Role, int] = {"prefill": p_got, "decode": d_got}
    if total < gpus_p + gpus_d:
        assert got == {"prefill": 1, "decode": 1}  # nothing fits: the caller refuses
        return
    assert got["prefill"] * gpus_p + got["decode"] * gpus_d <= total
    assert 1 <= got["prefill"] <= want_p and 1 <= got["decode"] <= want_d
    for p in range(1, want_p + 1):  # every other split within the GPUs and the wants
        for d in range(1, want_d + 1):
            if p * gpus_p + d * gpus_d <= total:
                assert served(got, rates) >= served({"prefill": p, "decode": d}, rates) - 1e-9


def test_a_proportional_clamp_serves_less_than_the_split() -> None:
    """Dynamo's clamp keeps the wants' proportions; with prefill cheap to carry (TP1) and decode
    dear (TP2) at these rates, it leaves prefill workers idle that decode needs."""
    wants: dict[Role, int] = {"prefill": 4, "decode": 8}
    rates: dict[Role, float] = {"prefill": 10.0, "decode": 4.0}
    total = 12  # the wants need 20
    share = total / 20
    proportional: dict[Role, int] = {r: max(1, math.floor(wants[r] * share)) for r in ROLES}
    p, d = split_gpus(total, (wants["prefill"], wants["decode"]), (10.0, 4.0), (1, 2))
    assert served({"prefill": p, "decode": d}, rates) > served(proportional, rates)


def _deployed_status() -> tuple[InferenceServiceStatus, dict[Role, int]]:
    first = deployed(spec("on"))
    views = _views(first)
    return first.status, {r: views[r].replicas for r in ROLES}


def test_the_pools_are_held_to_their_budget_and_split_by_what_they_serve() -> None:
    status, current = _deployed_status()
    plan = status.plan
    assert plan is not None and plan.prefill is not None and plan.decode is not None
    pools = {"prefill": plan.prefill, "decode": plan.decode}
    book = BudgetBook()
    book.set_budget("team", parse_budget_spec({"limits": {"H100-SXM": 8}}))
    intent = intent_of(spec("on"))
    wants: dict[Role, int] = {"prefill": 6, "decode": 4}  # 6 + 8 GPUs: more than the 8
    got = govern_pools(book, RES, {}, intent, status, status, pools, current, wants, NOW, 60.0)  # type: ignore[arg-type]
    gpus = {r: pools[r].tensor_parallel for r in ROLES}
    assert sum(got.counts[r] * gpus[r] for r in ROLES) <= 8
    rates = {r: pools[r].rate_per_worker for r in ROLES}
    best_p, best_d = split_gpus(8, (6, 4), (rates["prefill"], rates["decode"]), (gpus["prefill"], gpus["decode"]))
    best = {"prefill": best_p, "decode": best_d}
    # scale-ups only into GPUs free now: from the current counts, within what is free
    assert all(got.counts[r] <= max(best[r], current[r]) for r in ROLES)
    held = get_condition(got.status, "HeldByBudget")
    assert held is not None and held.status == "True" and "not in proportion" in held.message
    assert any(e.reason == "HeldByBudget" for e in got.events)
    listed = book.view().entries
    assert {"ns/chat-prefill", "ns/chat-decode"} <= set(listed)  # the budget's status lists both pools


def test_a_higher_priority_service_keeps_its_gpus_from_the_pools() -> None:
    status, current = _deployed_status()
    plan = status.plan
    assert plan is not None and plan.prefill is not None and plan.decode is not None
    pools = {"prefill": plan.prefill, "decode": plan.decode}
    book = BudgetBook()
    book.set_budget("team", parse_budget_spec({"limits": {"H100-SXM": 10}}))
    now_s = NOW.timestamp()
    other = Demand("ns/vip", (Option("H100-SXM", 1, 6, 5.0),), 100, 1, "ns", 0.0, "H100-SXM", True, True)
    book.record(Entry("team", other, "ns", "vip", 6, "H100-SXM", now_s))
    intent = intent_of(spec("on"))
    wants: dict[Role, int] = {"prefill": 4, "decode": 4}
    got = govern_pools(book, RES, {}, intent, status, status, pools, current, wants, NOW, 60.0)  # type: ignore[arg-type]
    used = sum(got.counts[r] * pools[r].tensor_parallel for r in ROLES)
    assert used <= 10 - 6  # the priority-100 service's six stay its own


def test_the_pools_tick_runs_the_budget_stage() -> None:
    status, current = _deployed_status()
    plan = status.plan
    assert plan is not None and plan.prefill is not None
    intent = intent_of(spec("on"))
    views = _views(deployed(spec("on")))
    rate = 6 * current["prefill"] * plan.prefill.rate_per_worker
    readings = {
        "prefill": PoolReading(
            _obs(
                current["prefill"],
                arrival_rate_per_s=rate,
                input_tokens_mean=4000,
                output_tokens_mean=1,
                ttft_p_s=10.0,
                running=8.0,
                waiting=40.0,
                kv_usage=0.3,
            ),
            None,
            views["prefill"],
        ),
        "decode": PoolReading(
            _obs(
                current["decode"],
                arrival_rate_per_s=1.0,
                input_tokens_mean=4000,
                output_tokens_mean=300,
                ttft_p_s=0.1,
                tpot_p_s=0.005,
                running=2.0,
                waiting=0.0,
                kv_usage=0.1,
            ),
            None,
            views["decode"],
        ),
    }
    book = BudgetBook()
    limit = current["prefill"] + 1 + current["decode"] * 2  # room for one more prefill worker
    book.set_budget("team", parse_budget_spec({"limits": {"H100-SXM": limit}}))
    governor = PoolsGovernor(book, {}, 60.0, status)
    done = tick_pools(intent, RES, status, readings, PoolsMemory(), CAT, SETTINGS, NOW, governor)
    assert done.scaled.get("chat-prefill") == current["prefill"] + 1  # wanted more; the budget holds one more
    assert done.decisions["prefill"].replicas > current["prefill"] + 1
    cond = get_condition(done.result.status, "PoolsAutoscaled")
    assert cond is not None and "the budget holds it to" in cond.message
    assert get_condition(done.result.status, "HeldByBudget") is not None
