"""kvscale's autoscaling policy on hand-built observations."""

import math

import pytest

from kvscale.autoscaling.observation import DecisionKind, Observation
from kvscale.autoscaling.policy import PolicyConfig, PolicyState, decide, forecast_rate


class FixedCapacity:
    """A replica carries exactly `rate` req/s; predictions are exact, so calibration stays 1."""

    def __init__(self, rate: float = 2.0, max_batch: int = 64, tpot_s: float = 0.03) -> None:
        self.rate, self.max_batch, self.tpot_s = rate, max_batch, tpot_s

    def rate_per_replica(self, input_tokens: float, output_tokens: float) -> float:
        return self.rate

    def predicted_tpot_s(self, rate_per_replica: float, input_tokens: float, output_tokens: float) -> float:
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
    assert decision.kind is DecisionKind.BOUNDS and "maxReplicas" in decision.reason
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
