"""kvscale's autoscaling policy on hand-built observations."""

import math
from dataclasses import replace

import pytest

from kvscale.autoscaling.observation import DecisionKind, Observation
from kvscale.autoscaling.policy import PolicyConfig, PolicyState, burst_reserve, decide, forecast_rate


class FixedCapacity:
    """A replica carries exactly `rate` req/s; predictions are exact, so calibration stays 1."""

    def __init__(self, rate: float = 2.0, max_batch: int = 64, tpot_s: float = 0.03) -> None:
        self.rate, self.max_batch, self.tpot_s = rate, max_batch, tpot_s

    def rate_per_replica(
        self, input_tokens: float, output_tokens: float, fleet_rate_per_s: float | None = None
    ) -> float:
        return self.rate

    def predicted_tpot_s(
        self,
        rate_per_replica: float,
        input_tokens: float,
        output_tokens: float,
        fleet_rate_per_s: float | None = None,
    ) -> float:
        return self.tpot_s


CONFIG = PolicyConfig(
    ttft_target_s=1.0,
    tpot_target_s=0.05,
    default_input_tokens=512,
    default_output_tokens=128,
    headroom=0.1,
    scale_down_stabilization_s=120,
    cold_start_s=45,
    tick_s=15,
)


def obs(t: float, rate: float | None, ready: int, starting: int = 0, **kw: object) -> Observation:
    defaults: dict[str, object] = {
        "running": 10.0,
        "waiting": 0.0,
        "ttft_p_s": 0.3,
        "tpot_p_s": 0.03,
        "kv_usage": 0.3,
    }
    defaults.update(kw)
    return Observation(time_s=t, ready_replicas=ready, starting_replicas=starting, arrival_rate_per_s=rate, **defaults)  # type: ignore[arg-type]


def run(observations: list[Observation], capacity: FixedCapacity | None = None) -> list[int]:
    state, out = PolicyState(), []
    for o in observations:
        decision, state = decide(o, state, capacity or FixedCapacity(), CONFIG)
        out.append(decision.replicas)
        assert decision.reason
    return out


def test_model_target_is_rate_over_capacity_with_headroom() -> None:
    decisions = run([obs(15 * i, 7.0, 3) for i in range(1, 4)])
    assert decisions[-1] == math.ceil(7.0 * 1.1 / 2.0)  # 4


def test_forecast_looks_ahead_on_a_ramp() -> None:
    history = tuple((float(t), 1.0 + 0.01 * t) for t in range(0, 180, 15))
    assert forecast_rate(history, 165, 180, 60) == pytest.approx(1.0 + 0.01 * 225, rel=1e-6)
    falling = tuple((float(t), 5.0 - 0.01 * t) for t in range(0, 180, 15))
    assert forecast_rate(falling, 165, 180, 60) == pytest.approx(5.0 - 0.01 * 165)  # never below the latest


def test_the_forecast_takes_out_the_trailing_windows_lag() -> None:
    # Each sample is the mean over the last 60 s of a rate rising 0.01 req/s per second: the
    # rate of 30 s before. Read with that lag, the forecast 60 s ahead is the true rate then.
    def true(t: float) -> float:
        return 1.0 + 0.01 * t

    history = tuple((float(t), true(t - 30.0)) for t in range(30, 210, 15))
    assert forecast_rate(history, 195, 180, 60, lag_s=30.0) == pytest.approx(true(195 + 60), rel=1e-6)
    assert forecast_rate(history, 195, 180, 60) == pytest.approx(true(195 + 60 - 30), rel=1e-6)  # 30 s behind


def test_never_scales_down_on_missing_or_stale_metrics() -> None:
    decisions = run([obs(15, None, 5), obs(30, 0.1, 5, running=None), obs(45, 0.1, 5, waiting=None)])
    assert decisions == [5, 5, 5]
    stale = Observation(
        time_s=60, ready_replicas=5, starting_replicas=0, arrival_rate_per_s=0.1, running=0, waiting=0, stale=True
    )
    decision, _ = decide(stale, PolicyState(), FixedCapacity(), CONFIG)
    assert decision.replicas == 5 and "missing or stale" in decision.reason


def test_missing_metrics_with_a_queue_may_still_add_one() -> None:
    decision, _ = decide(obs(15, None, 2, waiting=40.0), PolicyState(), FixedCapacity(), CONFIG)
    assert decision.replicas == 3


def test_scale_down_waits_for_the_stabilization_window() -> None:
    # Load drops from 7 req/s (needs 4) to 1 req/s (needs 1) at t=300.
    series = [obs(t, 7.0, 4) for t in range(15, 300, 15)] + [obs(t, 1.0, 4) for t in range(300, 600, 15)]
    decisions = run(series)
    drop = series.index(next(o for o in series if o.time_s == 300))
    assert all(d == 4 for d in decisions[drop : drop + 7])  # held for the 120 s window
    assert decisions[-1] == 1


def test_no_scale_down_before_the_history_covers_the_window() -> None:
    assert run([obs(15, 0.5, 4), obs(30, 0.5, 4)]) == [4, 4]


def test_slo_miss_adds_capacity_beyond_the_model() -> None:
    decisions = run([obs(15, 2.0, 2, ttft_p_s=3.0, waiting=30.0)])
    assert decisions == [3]


def test_feedback_waits_for_its_window_before_adding_again() -> None:
    # The SLO stays missed while the latency window still holds old samples: one replica per cooldown.
    series = [obs(15 * i, 2.0, 2 + (1 if i > 1 else 0), ttft_p_s=3.0, waiting=30.0) for i in range(1, 5)]
    decisions = run(series)
    assert decisions[0] == 3
    assert decisions[1:3] == [3, 3]  # within 45 s of the first feedback
    assert decisions[3] == 4


def test_bounds_hold() -> None:
    config = PolicyConfig(
        ttft_target_s=1,
        tpot_target_s=0.05,
        default_input_tokens=1,
        default_output_tokens=1,
        min_replicas=2,
        max_replicas=5,
    )
    d, _ = decide(obs(15, 100.0, 3), PolicyState(), FixedCapacity(), config)
    assert d.replicas == 5
    with pytest.raises(ValueError, match="minReplicas"):
        PolicyConfig(
            ttft_target_s=1,
            tpot_target_s=1,
            default_input_tokens=1,
            default_output_tokens=1,
            min_replicas=3,
            max_replicas=2,
        )


def test_calibration_learns_a_slow_engine() -> None:
    state = PolicyState()
    for i in range(1, 20):
        decision, state = decide(obs(15 * i, 4.0, 3, tpot_p_s=0.045), state, FixedCapacity(tpot_s=0.03), CONFIG)
    assert decision.calibration == pytest.approx(1.5, rel=0.02)
    assert decision.capacity_per_replica == pytest.approx(2.0 / decision.calibration)


def kinds(observations: list[Observation], capacity: FixedCapacity | None = None) -> list[DecisionKind]:
    state, out = PolicyState(), []
    for o in observations:
        decision, state = decide(o, state, capacity or FixedCapacity(), CONFIG)
        assert isinstance(decision.kind, DecisionKind)
        out.append(decision.kind)
    return out


def test_each_decision_names_the_term_that_set_it() -> None:
    assert kinds([obs(15, 7.0, 3)]) == [DecisionKind.FORECAST]
    assert kinds([obs(15, None, 3)]) == [DecisionKind.MISSING_METRICS]
    assert kinds([obs(15, None, 2, waiting=40.0)]) == [DecisionKind.BACKLOG]
    assert kinds([obs(15, 2.0, 2, ttft_p_s=3.0, waiting=30.0)]) == [DecisionKind.FEEDBACK]
    capped = PolicyConfig(
        ttft_target_s=1, tpot_target_s=0.05, default_input_tokens=1, default_output_tokens=1, max_replicas=5
    )
    decision, _ = decide(obs(15, 100.0, 3), PolicyState(), FixedCapacity(), capped)
    assert decision.kind is DecisionKind.BOUNDS and "more than maxReplicas 5: capped" in decision.reason
    # Load drops: first held by the stabilization window, then scaled down by the forecast.
    series = [obs(t, 7.0, 4) for t in range(15, 300, 15)] + [obs(t, 1.0, 4) for t in range(300, 600, 15)]
    seen = kinds(series)
    assert DecisionKind.STABILIZATION in seen[19:27]
    assert seen[-1] in (DecisionKind.FORECAST, DecisionKind.HOLD)
    assert str(DecisionKind.BURST_RESERVE) == "burst_reserve"  # label values are plain strings


def test_cold_start_is_learned_from_observed_starts_and_kept_in_state() -> None:
    state = PolicyState()
    decision, state = decide(obs(15, 2.0, 1), state, FixedCapacity(), CONFIG)
    assert decision.cold_start_s == CONFIG.cold_start_s  # nothing observed yet: the default
    decision, state = decide(obs(30, 2.0, 2, started_to_ready_s=(130.0,)), state, FixedCapacity(), CONFIG)
    assert decision.cold_start_s == 130.0 and state.cold_start_samples == (130.0,)
    assert "145s ahead" in decision.reason  # the forecast horizon is the learned start plus a tick
    # Only the latest samples count: a slow start ages out.
    for i in range(CONFIG.cold_start_samples):
        decision, state = decide(obs(45 + 15 * i, 2.0, 2, started_to_ready_s=(60.0,)), state, FixedCapacity(), CONFIG)
    assert decision.cold_start_s == 60.0
    # Restored from status after a restart (the operator keeps the samples there).
    restored = PolicyState(cold_start_samples=(200.0,))
    decision, _ = decide(obs(15, 2.0, 1), restored, FixedCapacity(), CONFIG)
    assert decision.cold_start_s == 200.0


def test_calibration_ignores_ticks_with_warming_replicas() -> None:
    state = PolicyState()
    for i in range(1, 10):
        decision, state = decide(obs(15 * i, 4.0, 3, 1, tpot_p_s=0.06), state, FixedCapacity(tpot_s=0.03), CONFIG)
    assert decision.calibration == 1.0


def test_damped_trend_saturates_instead_of_extrapolating_linearly() -> None:
    history = tuple((float(t), 1.0 + 0.01 * t) for t in range(0, 180, 15))
    linear = forecast_rate(history, 165, 180, 600)
    damped = forecast_rate(history, 165, 180, 600, damping_s=60)
    assert linear == pytest.approx(1.0 + 0.01 * 765)
    # the fitted line at now, plus the slope over 60 x (1 - e^-10) seconds
    assert damped == pytest.approx(1.0 + 0.01 * 165 + 0.01 * 60 * (1 - math.exp(-10)), rel=1e-6)
    assert forecast_rate(history, 165, 180, 600, damping_s=60) < forecast_rate(history, 165, 180, 600, damping_s=120)


def test_burst_reserve_is_the_upper_quantile_of_rises_within_the_horizon() -> None:
    # Smooth: the rate never rises, the reserve is 0.
    flat = tuple((float(t), 5.0) for t in range(0, 1200, 15))
    assert burst_reserve(flat, 90, 0.95) == 0.0
    # Bursty: every 300 s the rate jumps from 1 to 31 for 60 s. A quarter or more of the
    # ticks see a jump within the next 90 s, so the 95th percentile rise is the full jump.
    bursty = tuple((float(t), 31.0 if t % 300 >= 240 else 1.0) for t in range(0, 1800, 15))
    assert burst_reserve(bursty, 90, 0.95) == pytest.approx(30.0)
    # ... while its median rise is 0: the reserve is the quantile, not the mean.
    assert burst_reserve(bursty, 90, 0.5) == 0.0
    # Too little history: no reserve yet.
    assert burst_reserve(bursty[:10], 90, 0.95) == 0.0


def test_a_bursty_history_holds_capacity_a_smooth_one_releases() -> None:
    """After the same quiet minutes, a fleet that saw bursts keeps its reserve; one that saw
    only a slow drift consolidates."""
    bursty_rates = [31.0 if t % 300 >= 240 else 1.0 for t in range(15, 1500, 15)]
    smooth_rates = [1.0 + 0.5 * math.sin(t / 400) for t in range(15, 1500, 15)]
    ends = {}
    for name, rates in (("bursty", bursty_rates), ("smooth", smooth_rates)):
        state, ready, decision = PolicyState(), 16, None
        for i, rate in enumerate([*rates, *[1.0] * 12]):
            decision, state = decide(obs(15.0 * (i + 1), rate, ready), state, FixedCapacity(), CONFIG)
            ready = decision.replicas
        assert decision is not None
        ends[name] = decision
    assert ends["bursty"].replicas >= math.ceil(31 * 1.1 / 2.0)  # the burst's replicas stay
    assert ends["bursty"].kind in (DecisionKind.BURST_RESERVE, DecisionKind.STABILIZATION, DecisionKind.HOLD)
    assert ends["smooth"].replicas <= 2


def test_backlog_behind_a_gateway_is_drained_by_new_replicas() -> None:
    gateway = PolicyConfig(**{**CONFIG.__dict__, "queue_moves": True})
    # 4 req/s on 2 replicas of 2 req/s, 600 requests queued: drain them within a cold start
    # (45 s) plus the TTFT target (1 s) after new replicas are ready.
    decision, _ = decide(obs(15, 4.0, 2, waiting=600.0), PolicyState(), FixedCapacity(), gateway)
    assert decision.kind is DecisionKind.BACKLOG
    assert decision.replicas == math.ceil((4.0 + 600 / 46) * 1.1 / 2.0)  # 10


def test_backlog_behind_a_service_sizes_for_the_longest_replica_queue() -> None:
    # A Service leaves 300 requests on one replica. New replicas cannot take them; they take
    # its share of new arrivals, so it keeps spare capacity to drain: at most half of it.
    decision, _ = decide(obs(15, 4.0, 2, waiting=320.0, waiting_max=300.0), PolicyState(), FixedCapacity(), CONFIG)
    assert decision.kind is DecisionKind.BACKLOG
    assert decision.replicas == math.ceil(4.0 * 1.1 / (2.0 - 1.0))  # 5
    # A short queue needs less: 46 requests drain at 1 req/s within 46 s.
    decision, _ = decide(obs(15, 4.0, 2, waiting=50.0, waiting_max=23.0), PolicyState(), FixedCapacity(), CONFIG)
    assert decision.replicas == math.ceil(4.0 * 1.1 / (2.0 - 0.5))  # 3
    # The same queue behind a gateway moves to new replicas: sized on the total.
    gateway = PolicyConfig(**{**CONFIG.__dict__, "queue_moves": True})
    decision, _ = decide(obs(15, 4.0, 2, waiting=320.0, waiting_max=300.0), PolicyState(), FixedCapacity(), gateway)
    assert decision.replicas == math.ceil((4.0 + 320 / 46) * 1.1 / 2.0)  # 7


def test_no_scale_down_on_missing_metrics_even_with_a_learned_reserve_or_backlog_history() -> None:
    state = PolicyState()
    for i in range(1, 40):
        _, state = decide(obs(15 * i, 20.0 if i % 10 == 0 else 1.0, 8), state, FixedCapacity(), CONFIG)
    for missing in ({"running": None}, {"waiting": None}, {"stale": True}):
        o = replace(obs(15 * 41, 0.1, 8, running=0.0, waiting=0.0), **missing)
        decision, _ = decide(o, state, FixedCapacity(), CONFIG)
        assert decision.replicas >= 8 and decision.kind is DecisionKind.MISSING_METRICS


def test_default_cold_start_counts_the_download_unless_weights_are_cached() -> None:
    from kvscale.autoscaling.capacity import default_cold_start_s
    from kvscale.sizing.catalog import default_catalog
    from kvscale.sizing.config import ServingConfig

    cat = default_catalog()
    small = ServingConfig.build(cat, cat.model("llama-3.1-8b"), cat.gpu("H100-SXM"), "bf16", 1)
    large = ServingConfig.build(cat, cat.model("llama-3.1-70b"), cat.gpu("H100-SXM"), "bf16", 4)
    engine = small.engine
    # 8B in bf16 is ~16 GB: download at the engine profile's rate, then load one shard.
    expected = (
        engine.cold_start_fixed_s + 16.06e9 / engine.download_bytes_per_s + 16.06e9 / engine.weight_load_bytes_per_s
    )
    assert default_cold_start_s(small) == pytest.approx(expected, rel=0.02)
    assert default_cold_start_s(small, weights_cached=True) < default_cold_start_s(small)
    assert default_cold_start_s(large) > default_cold_start_s(small)  # more weights to fetch


def test_slo_feedback_lowers_capacity_while_missed_and_relaxes_when_met() -> None:
    # The model says 2 req/s per replica; the engine misses TTFT at that load with no queue.
    # Each raise brings TTFT closer to its target, so feedback keeps going.
    state, ready, seen = PolicyState(), 4, []
    for i in range(1, 13):
        ttft = 1.6 - 0.04 * i
        decision, state = decide(obs(15 * i, 7.0, ready, ttft_p_s=ttft), state, FixedCapacity(), CONFIG)
        ready = decision.replicas
        seen.append(decision.kind)
    assert state.slo_factor == pytest.approx(1.1**4, rel=1e-6)  # once per 45 s cooldown over 180 s
    assert ready == math.ceil(7.0 * 1.1 * 1.1**4 / 2.0)  # 6
    assert DecisionKind.FEEDBACK in seen and "SLO feedback" in decision.reason
    # Met with room: the factor decays back toward 1, never below.
    for i in range(13, 800):
        decision, state = decide(obs(15 * i, 7.0, ready, ttft_p_s=0.2, tpot_p_s=0.01), state, FixedCapacity(), CONFIG)
        ready = decision.replicas
    assert state.slo_factor == 1.0 and ready == 4
    # A queue explains the miss: the backlog term acts, the factor stays.
    _, queued = decide(obs(15, 7.0, 4, ttft_p_s=3.0, waiting=100.0), PolicyState(), FixedCapacity(), CONFIG)
    assert queued.slo_factor == 1.0


def test_slo_feedback_stops_when_a_raise_does_not_help() -> None:
    """A tail no fleet size fixes (a prompt whose own prefill outlasts the target): after one
    raise that leaves TTFT where it was, the factor stops growing."""
    state, ready = PolicyState(), 4
    for i in range(1, 30):
        decision, state = decide(obs(15 * i, 7.0, ready, ttft_p_s=1.4), state, FixedCapacity(), CONFIG)
        ready = decision.replicas
    assert state.slo_factor == pytest.approx(1.1)
    # Met again: the next miss starts afresh.
    _, state = decide(obs(15 * 31, 7.0, ready, ttft_p_s=0.5), state, FixedCapacity(), CONFIG)
    assert state.slo_miss_at_raise is None


class PromptBoundCapacity(FixedCapacity):
    """A replica carries 2000 prompt tokens/s: its request rate falls as prompts grow."""

    def rate_per_replica(
        self, input_tokens: float, output_tokens: float, fleet_rate_per_s: float | None = None
    ) -> float:
        return 2000.0 / input_tokens


def test_work_units_ask_for_more_replicas_for_longer_prompts_at_the_same_rate() -> None:
    from kvscale.autoscaling.policy import work_lengths

    short = [obs(15 * i, 4.0, 2, prefill_tokens_per_s=4.0 * 500, decode_tokens_per_s=400.0) for i in range(1, 4)]
    long = [obs(15 * i, 4.0, 2, prefill_tokens_per_s=4.0 * 2000, decode_tokens_per_s=400.0) for i in range(1, 4)]
    assert work_lengths(long[0], CONFIG) == (2000.0, 100.0)
    assert run(long, PromptBoundCapacity())[-1] > run(short, PromptBoundCapacity())[-1]


def test_missing_work_metrics_fall_back_to_the_means_and_never_scale_down() -> None:
    from kvscale.autoscaling.policy import work_lengths

    o = obs(15, 4.0, 2, input_tokens_mean=900.0, output_tokens_mean=80.0)
    assert work_lengths(o, CONFIG) == (900.0, 80.0)
    assert work_lengths(obs(15, 4.0, 2), CONFIG) == (512, 128)  # the spec's lengths
    # the arrival rate missing: held, whatever the token counters say
    decisions = run([obs(15 * i, None, 5, prefill_tokens_per_s=10.0) for i in range(1, 20)])
    assert min(decisions) == 5


def test_the_operators_policy_reads_its_rates_lag_from_the_metrics_window() -> None:
    from kvscale.api.intent import parse_intent, policy_config
    from tests.unit.test_reconcile import spec

    config = policy_config(parse_intent(spec()), 90.0, 15.0, 120.0)
    assert config.rate_window_s == 120.0 and config.feedback_cooldown_s == 135.0


def test_a_fleet_above_max_replicas_comes_down_to_it_whatever_holds() -> None:
    """A hold (missing metrics, a missed SLO, the stabilization window) never keeps a fleet above
    maxReplicas: the bound is the spec's, not a reading (a simulated start above it held 1,752
    replicas for a whole replay where maxReplicas was 64)."""
    capped = replace(CONFIG, max_replicas=4)
    cases = [
        obs(15, None, 10),  # metrics missing
        obs(15, 50.0, 10, ttft_p_s=5.0),  # the load needs more and the SLO is missed
        obs(15, 1.0, 10, waiting=400.0),  # a queue, metrics complete
    ]
    for o in cases:
        decision, _ = decide(o, PolicyState(), FixedCapacity(), capped)
        assert decision.replicas == 4 and decision.kind == DecisionKind.BOUNDS, decision
        assert "maxReplicas 4" in decision.reason
    within, _ = decide(obs(15, None, 3), PolicyState(), FixedCapacity(), capped)
    assert within.replicas == 3  # within the bound, missing metrics still hold
