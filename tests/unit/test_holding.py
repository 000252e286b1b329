"""Burst-aware holding (issue 27): the held level, the sustained rate, the bursts' recurrence,
and the policy's regimes on hand-built histories."""

import math

import pytest

from kvscale.autoscaling.holding import (
    Regime,
    burst_lengths_s,
    bursts_outlast,
    decayed_quantile,
    holding,
    recurrence_interval_s,
    sustained_rate,
    window_rates,
)
from kvscale.autoscaling.observation import Decision
from kvscale.autoscaling.policy import PolicyConfig, PolicyState, decide
from tests.unit.test_policy import FixedCapacity, obs

# The policy's cold start is longer than the metric window here (125 s vs 60 s), as with a
# weight download: a 40 s burst is over long before a replica started for it is ready.
CONFIG = PolicyConfig(
    ttft_target_s=1.0,
    tpot_target_s=0.05,
    default_input_tokens=512,
    default_output_tokens=128,
    headroom=0.1,
    scale_down_stabilization_s=120,
    cold_start_s=125,
    tick_s=15,
    rate_window_s=60,
)
TICK = 15.0


def spikes(
    start: float, end: float, every: float = 300.0, length: float = 60.0, base: float = 1.0, peak: float = 21.0
) -> list[tuple[float, float]]:
    """(time, 60 s trailing rate) samples of bursts of `length` every `every` seconds."""
    out = []
    t = start
    while t < end:
        inside = sum(1 for s in range(int(t) - 59, int(t) + 1) if s >= 0 and s % every < length)
        out.append((t, base + (peak - base) * inside / 60.0))
        t += TICK
    return out


def test_window_rates_average_the_samples_that_span_the_window() -> None:
    history = ((0.0, 1.0), (15.0, 2.0), (30.0, 3.0), (45.0, 10.0), (60.0, 4.0))
    # A 90 s window is this sample and those of the last 30 s (each covers its own 60 s).
    assert window_rates(history, 90.0, 60.0) == [(0.0, 1.0), (15.0, 1.5), (30.0, 2.0), (45.0, 5.0), (60.0, 17 / 3)]
    # No longer than the metric's window: the samples themselves.
    assert window_rates(history, 60.0, 60.0) == list(history)


def test_the_held_quantile_decays_after_the_hold() -> None:
    samples = [(0.0, 20.0), *((float(t), 2.0) for t in range(15, 3600, 15))]
    # At 1200 s the burst is within the 20-minute hold: it counts in full (the largest sample).
    assert decayed_quantile(samples[:81], 1200.0, 1.0, 1200.0, 3600.0) == 20.0
    # Halfway through the fade it counts half; after the memory, not at all.
    assert decayed_quantile(samples, 2400.0, 1.0, 1200.0, 3600.0) == pytest.approx(10.0)
    assert decayed_quantile([*samples, (3700.0, 2.0)], 3700.0, 1.0, 1200.0, 3600.0) == 2.0


def test_recurrence_is_the_median_interval_between_bursts() -> None:
    assert recurrence_interval_s(tuple(spikes(15, 1800, every=300))) == pytest.approx(300.0)
    # Ticks of 15 s: a burst is seen up to one tick late.
    assert recurrence_interval_s(tuple(spikes(15, 1800, every=200, length=30))) == pytest.approx(200.0, abs=TICK)
    assert recurrence_interval_s(tuple((float(t), 5.0) for t in range(15, 1800, 15))) is None  # no bursts


def test_a_burst_shorter_than_the_span_is_not_sustained_a_step_is() -> None:
    burst = tuple(spikes(15, 600, every=10_000, length=40, peak=31))  # one 40 s burst at t = 0
    step = tuple((float(t), 1.0 if t < 300 else 30.0) for t in range(15, 600, 15))
    # Two non-overlapping 60 s windows span the 125 s cold start: a 40 s burst shows in both
    # only split between them, never above the rate over the cold start that held it.
    sustained = max(sustained_rate(burst[: k + 1], burst[k][0], 125.0, 60.0) for k in range(len(burst)))
    assert sustained < max(r for _, r in window_rates(burst, 125.0, 60.0)) < max(r for _, r in burst)
    assert sustained_rate(step, 345.0, 125.0, 60.0) == 1.0  # 45 s after the step: not yet
    assert sustained_rate(step, 360.0, 125.0, 60.0) == 30.0  # both windows show it


def test_burst_lengths_count_finished_runs_only() -> None:
    # Above 5 from 30 to 60 (finished: 30 s) and from 90 on (not finished); the history starts
    # below, so the first run is counted from its rise.
    history = tuple((float(t), 10.0 if 30 <= t < 60 or t >= 90 else 1.0) for t in range(0, 120, 15))
    assert burst_lengths_s(history, 5.0) == [30.0]
    # A run already above when the history begins has no known start.
    assert burst_lengths_s(tuple((float(t), 10.0 if t < 30 else 1.0) for t in range(0, 90, 15)), 5.0) == []


def test_a_burst_that_outlasts_the_chase_is_a_step() -> None:
    short = tuple(spikes(15, 2400))  # 60 s bursts, seen over ~120 s in the 60 s trailing rate
    assert not bursts_outlast(short, 2 * (125 + 60))
    surge = tuple((float(t), 20.0 if 300 <= t < 900 else 0.5) for t in range(0, 1800, 15))
    assert bursts_outlast(surge, 2 * (125 + 60))
    assert not bursts_outlast(surge[:70], 2 * (125 + 60))  # still going: not known to have outlasted


def test_a_single_long_surge_is_followed_down_not_held() -> None:
    # Quiet, a 10-minute surge (five cold starts), quiet again: capacity started for the
    # surge served it, so afterwards the fleet follows the quiet rate down within minutes
    # instead of holding the surge's peak for burst_hold_s (a burst that is over).
    surge = [(float(t), 20.0 if 300 <= t < 900 else 0.5) for t in range(15, 2400, 15)]
    decisions = _run(surge, ready=1)
    quiet = [d for (t, _), d in zip(surge, decisions, strict=True) if t >= 900 + 60 + 2 * 120 + 300]
    assert quiet and all(d.regime is Regime.FOLLOWING_TREND for d in quiet)
    assert quiet[-1].replicas < max(d.replicas for d in decisions) / 2
    # The same peak in one-minute bursts is held: the rule changes nothing for short bursts.
    assert _run(spikes(15, 2400, every=300, length=60, peak=20.0), ready=4)[-1].regime is Regime.ABSORBING_BURSTS


def _run(
    rates: list[tuple[float, float]], ready: int, capacity: FixedCapacity | None = None, config: PolicyConfig = CONFIG
) -> list[Decision]:
    state, decisions = PolicyState(), []
    for t, rate in rates:
        decision, state = decide(obs(t, rate, ready), state, capacity or FixedCapacity(), config)
        ready = decision.replicas
        decisions.append(decision)
    return decisions


def test_bursty_arrivals_are_absorbed_by_a_held_fleet_and_say_so() -> None:
    decisions = _run(spikes(15, 2400), ready=4)
    late = decisions[len(decisions) // 2 :]
    assert all(d.regime is Regime.ABSORBING_BURSTS for d in late)
    assert all("absorbing bursts" in d.reason for d in late)
    # Held through the quiet minutes between bursts: one count, no swing.
    assert len({d.replicas for d in late}) == 1
    assert "recurring every 300s" in late[-1].reason


def test_a_smooth_rate_is_followed_as_a_trend() -> None:
    decisions = _run([(float(t), 4.0 + 0.002 * t) for t in range(15, 1800, 15)], ready=3)
    assert decisions[-1].regime is Regime.FOLLOWING_TREND and "following a trend" in decisions[-1].reason
    # The forecast leads the ramp: at least the replicas for the rate now.
    assert decisions[-1].replicas >= math.ceil((4.0 + 0.002 * 1785) * 1.1 / 2.0)


def test_a_spike_above_the_held_level_is_not_chased_a_sustained_step_is() -> None:
    history = spikes(15, 1800)
    held = _run(history, ready=4)[-1].replicas
    # A spike above everything held, shorter than the cold start (30 s at 61 req/s): no
    # replica started now would be ready before it is over, so the count stays.
    spike = [(1800.0 + 15 * i, r) for i, r in enumerate((1.0, 31.0, 31.0, 16.0, 1.0, 1.0))]
    after_spike = _run([*history, *spike], ready=4)
    assert max(d.replicas for d in after_spike[-len(spike) :]) == held
    # The same rise that lasts: once both metric windows spanning the cold start show it, the
    # fleet grows for it at once, and the reason says it reacts to a sustained change.
    step = [(1800.0 + 15 * i, 41.0) for i in range(12)]
    after_step = _run([*history, *step], ready=held)
    grown = [d for d in after_step[-len(step) :] if d.replicas > held]
    assert grown, "a sustained step must scale up"
    assert grown[0].regime is Regime.SUSTAINED_CHANGE and "reacting to a sustained change" in grown[0].reason
    assert grown[0].replicas >= math.ceil(41.0 * 1.1 / 2.0)
    assert grown[0].replicas - held == max(d.replicas for d in after_step[-len(step) :]) - held  # one scale-up


def test_a_held_fleet_does_not_shrink_before_the_bursts_recur() -> None:
    # Bursts every 10 minutes; then replicas become twice as fast (say a new calibration): the
    # need halves at once, but the fleet waits out the 600 s recurrence interval, not just the
    # 120 s stabilization, before it shrinks to it.
    history = spikes(15, 3000, every=600)
    state, ready = PolicyState(), 4
    for t, rate in history:
        decision, state = decide(obs(t, rate, ready), state, FixedCapacity(), CONFIG)
        ready = decision.replicas
    held = ready
    after = []
    for i in range(1, 70):
        decision, state = decide(obs(3000.0 + 15 * i, 1.0, ready), state, FixedCapacity(rate=4.0), CONFIG)
        ready = decision.replicas
        after.append((15.0 * i, decision))
    final = after[-1][1].replicas
    assert final < held - 1  # it does shrink in the end (not a fleet that never moves)
    assert all(d.replicas > final for s, d in after if s < 600.0 - TICK)  # not before the recurrence
    shrunk = [d for _, d in after if "scale down" in d.reason]
    assert shrunk and all(d.regime is Regime.ABSORBING_BURSTS and "600s stable" in d.reason for d in shrunk)


@pytest.mark.parametrize(("need", "expected"), [(4.2, 4), (4.6, 5)])
def test_a_held_fleet_grows_only_past_the_tolerance(need: float, expected: int) -> None:
    # The level the history holds, then a capacity that makes it `need` replicas' worth:
    # within the 10% tolerance of the 4 ready the fleet stays (noise in the lengths moves the
    # need by a few percent), beyond it it grows.
    history = spikes(15, 2400)
    state, ready = PolicyState(), 4
    for t, rate in history[:-1]:
        decision, state = decide(obs(t, rate, ready), state, FixedCapacity(), CONFIG)
        ready = 4
    level = holding(
        (*state.rates, (history[-1][0], history[-1][1])),
        history[-1][0],
        CONFIG.cold_start_s,
        CONFIG.rate_window_s,
        CONFIG.burst_quantile,
        CONFIG.burst_hold_s,
        CONFIG.burst_memory_s,
    ).rate
    decision, _ = decide(obs(history[-1][0], history[-1][1], 4), state, FixedCapacity(rate=level * 1.1 / need), CONFIG)
    assert decision.regime is Regime.ABSORBING_BURSTS
    assert decision.replicas == expected
