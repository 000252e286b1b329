"""The scale tick of a disaggregated plan's pools (kvscale.control.pool_scaling): each pool on its
own observation and capacity, through the one tick; a missing reading never scales a pool down;
the memory keeps the scaled counts so the drift check does not revert them."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from kvscale.api.intent import Intent, read_spec
from kvscale.api.models import InferenceServiceStatus
from kvscale.autoscaling.observation import Observation
from kvscale.control.memory import ServiceMemory
from kvscale.control.pool_scaling import PoolReading, PoolsMemory, autoscaled, tick_pools, ttft_targets
from kvscale.control.reconcile import DeploymentView, Observed, Result, refresh
from kvscale.control.status import get_condition
from tests.unit.test_disaggregated_deploy import CAT, NOW, POOLS, RES, SETTINGS, _owned, _views, deployed, spec


def intent_of(body: dict[str, Any]) -> Intent:
    intent = read_spec(body)
    assert isinstance(intent, Intent), intent
    return intent


def _first() -> tuple[Result, dict[str, DeploymentView]]:
    first = deployed(spec("on"))
    return first, _views(first)


def _obs(ready: int, **figures: float) -> Observation:
    return Observation(time_s=1000.0, ready_replicas=ready, starting_replicas=0, **figures)  # type: ignore[arg-type]


def _rate(pool: str, status: InferenceServiceStatus) -> float:
    return float(getattr(status.plan, pool).rate_per_worker)


def test_each_pool_scales_on_its_own_signal() -> None:
    """Prefill overloaded (its requests arrive at 3x what its workers carry, TTFT over its
    share), decode well within its TPOT and batch: prefill grows, decode does not."""
    first, views = _first()
    st = first.status
    assert st.plan is not None
    intent = intent_of(spec("on"))
    p, d = views["prefill"].replicas, views["decode"].replicas
    rate = 3 * p * _rate("prefill", st)
    targets = ttft_targets(intent, st.plan)
    readings = {
        "prefill": PoolReading(
            _obs(
                p,
                arrival_rate_per_s=rate,
                input_tokens_mean=4000,
                output_tokens_mean=1,
                ttft_p_s=4 * targets["prefill"],
                running=4.0 * p,
                waiting=20.0 * p,
                kv_usage=0.3,
            ),
            None,
            views["prefill"],
        ),
        "decode": PoolReading(
            _obs(
                d,
                arrival_rate_per_s=0.3 * d * _rate("decode", st),
                input_tokens_mean=4000,
                output_tokens_mean=300,
                ttft_p_s=0.2 * targets["decode"],
                tpot_p_s=0.5 * intent.slo.tpot_s,
                running=2.0 * d,
                waiting=0.0,
                kv_usage=0.1,
            ),
            None,
            views["decode"],
        ),
    }
    done = tick_pools(intent, RES, st, readings, PoolsMemory(), CAT, SETTINGS, NOW)
    grown = done.scaled.get("chat-prefill")
    assert grown is not None and grown >= math.ceil(rate / _rate("prefill", st)) > p
    assert "chat-decode" not in done.scaled or done.scaled["chat-decode"] <= d
    assert ("Deployment", "chat-prefill", grown) in done.result.scale_named
    plan = done.result.status.plan
    assert plan is not None and plan.prefill is not None and plan.prefill.replicas == grown
    cond = get_condition(done.result.status, "PoolsAutoscaled")
    assert cond is not None and cond.status == "True" and f"prefill {p} -> {grown}" in cond.message
    assert any(
        e.reason == "Scaled" and e.message.startswith(f"Scaled prefill pool {p} -> {grown}") for e in done.result.events
    )
    assert set(done.memory.states) == {"prefill", "decode"}
    gauges = done.gauges["chat-prefill"]
    assert (gauges.desired, gauges.current) == (grown, p) and gauges.ttft_observed_s == 4 * targets["prefill"]
    assert gauges.tpot_observed_s is None and done.gauges["chat-decode"].tpot_observed_s == 0.5 * intent.slo.tpot_s


def test_a_pool_whose_metrics_are_missing_is_not_scaled_down() -> None:
    first, views = _first()
    st = first.status
    assert st.plan is not None
    intent = intent_of(spec("on"))
    big = {r: replace(v, replicas=v.replicas + 4, ready_replicas=v.replicas + 4) for r, v in views.items()}
    readings = {
        r: PoolReading(
            Observation(time_s=1000.0, ready_replicas=v.replicas, starting_replicas=0, stale=True), "no answer", v
        )
        for r, v in big.items()
    }
    memory = PoolsMemory()
    for _ in range(30):  # well past the scale-down stabilization
        done = tick_pools(intent, RES, st, readings, memory, CAT, SETTINGS, NOW)
        memory = done.memory
        assert not done.scaled
    cond = get_condition(done.result.status, "PoolsAutoscaled")
    assert cond is not None and "metrics not read: no answer" in cond.message


def test_pinned_or_recommend_pools_are_not_autoscaled() -> None:
    assert autoscaled(intent_of(spec("on")))
    assert not autoscaled(intent_of(spec("on", scaling={"replicas": 2})))
    assert not autoscaled(intent_of(spec("on", scaling={"mode": "recommend"})))


def test_a_scaled_pool_is_not_reverted_as_drift_and_keeps_its_count_on_reapply() -> None:
    first, views = _first()
    st = first.status
    assert st.plan is not None
    memory = ServiceMemory().remembered(first)
    grown = views["prefill"].replicas + 2
    memory = memory.pools_ticked(memory.pools, {"chat-prefill": grown})
    now_views = {**views, "prefill": replace(views["prefill"], replicas=grown, ready_replicas=grown)}
    seen = Observed(POOLS, children=_owned(first), pool_workloads=now_views, applied_children=memory.applied_children())
    result = refresh(intent_of(spec("on")), RES, st, seen, CAT, SETTINGS, NOW)
    assert result is not None and result.apply == ()
    assert not any(e.reason == "DriftReverted" for e in result.events)
    # A re-apply (a restart's reconcile) keeps the running counts, not the plan's.
    again = deployed(spec("on"), st, seen)
    bodies = {c["metadata"]["name"]: c for c in again.apply if c["kind"] == "Deployment"}
    assert bodies["chat-prefill"]["spec"]["replicas"] == grown


def test_a_prefill_pool_whose_longest_prompts_miss_on_their_own_prefill_is_sized_not_maxed() -> None:
    """Prompts whose prefill alone takes longer than the pool's TTFT share: no number of workers
    serves them in time, so a capacity of 0 (the policy then scales to maxReplicas for nothing,
    as the Mooncake replay showed) is replaced by the reachable percentile's, or half a worker's
    no-queue rate."""
    from kvscale.api.intent import pool_serving_config
    from kvscale.autoscaling.pool_capacity import PrefillCapacity
    from kvscale.sizing.disaggregation import PrefillWorker
    from kvscale.sizing.workload import Workload

    first, _ = _first()
    plan = first.status.plan
    assert plan is not None and plan.prefill is not None and plan.prefill.ttft_target_seconds is not None
    intent = intent_of(spec("on"))
    cfg = pool_serving_config(intent, plan, plan.prefill, CAT)
    share = plan.prefill.ttft_target_seconds
    capacity = PrefillCapacity(cfg, intent.slo, share, plan.prefill.max_batch, None)
    long_prompt = 100_000
    worker = PrefillWorker(cfg, Workload(long_prompt, 1, 1.0), least_loaded=True)
    assert worker.idle_ttft_p_s(intent.slo.percentile) > share  # its own prefill misses the share
    assert worker.max_rate(share, intent.slo.percentile) == 0.0  # the model alone: 0, an unbounded pool
    rate = capacity.rate_per_replica(long_prompt, 1)
    assert 0 < rate <= worker.capacity_rate_per_s() + 1e-9
    assert capacity.rate_per_replica(4000, 1) > rate  # prompts that fit keep their own, larger figure
