"""kvscale's autoscaling policy.

Each tick the policy computes a replica count from terms, and the decision names the term
that set it (its `DecisionKind`):

- forecast: the arrival rate one cold start ahead, a damped trend (a ramp's slope counts,
  but its extrapolation saturates instead of running linearly over the whole cold start),
  over what one replica carries within the SLO (the sizing model, calibrated by observed
  TPOT), with headroom;
- burst reserve: an upper quantile of how much the arrival rate rose within one cold start,
  learned from the arrival process itself over the last half hour; a bursty process keeps a
  large reserve (so it consolidates slowly), a smooth one a small one (promptly);
- backlog: when requests queue, enough replicas to drain the queue within the TTFT target
  once new replicas are ready. Behind a gateway the queue moves to new replicas; behind a
  plain Service a queued request stays where it is, so the fleet is sized for the longest
  replica queue to drain while that replica still takes its share of new arrivals;
- feedback: the observed SLO was missed: one step beyond the ready replicas;
- scale-down needs a stabilization window and the remaining replicas to absorb the load,
  and never happens on missing or stale metrics.

The cold start is learned from observed start-to-ready times (the slowest of the recent
ones), defaulting from the model size; it sets the forecast and reserve horizon.

On bursty arrivals (the rate can more than double within a cold start) the fleet is held
(kvscale.autoscaling.holding, issue 27): sized for a decayed high quantile of the rate over
windows of the cold start, grown at once only for a change that lasted a cold start (or
past its tolerance), shrunk only after the bursts' recurrence interval. Each decision names
its regime: absorbing bursts, following a trend, or reacting to a sustained change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Protocol

from kvscale.autoscaling.holding import Holding, Regime, bursts_outlast, holding
from kvscale.autoscaling.observation import Decision, DecisionKind, Observation


class Capacity(Protocol):
    max_batch: int

    def rate_per_replica(
        self, input_tokens: float, output_tokens: float, fleet_rate_per_s: float | None = None
    ) -> float: ...

    def predicted_tpot_s(
        self,
        rate_per_replica: float,
        input_tokens: float,
        output_tokens: float,
        fleet_rate_per_s: float | None = None,
    ) -> float: ...


@dataclass(frozen=True)
class PolicyConfig:
    ttft_target_s: float
    tpot_target_s: float
    default_input_tokens: float
    default_output_tokens: float
    min_replicas: int = 1
    max_replicas: int = 100
    headroom: float = 0.10
    # A new replica's start-to-ready time before any was observed: the default from the model
    # size (container start, weight download and load, engine warm-up); see capacity.py.
    cold_start_s: float = 90.0
    tick_s: float = 15.0  # how often the policy runs
    # Behind a gateway that holds requests until a replica has room, a queue moves to new
    # replicas; behind a plain Service it stays on the replica it was routed to.
    queue_moves: bool = False
    forecast_window_s: float = 180.0  # the trend is fitted over this much rate history
    # The observed rate is a mean over this trailing window (the PromQL range, the simulator's
    # window): it is the rate of half a window ago, so a trend is read that much behind.
    rate_window_s: float = 60.0
    trend_damping_s: float = 120.0  # the trend's extrapolation saturates after about this long
    burst_quantile: float = 0.95  # the rise over one cold start the reserve covers
    burst_memory_s: float = 3600.0  # how much arrival history the reserve learns from
    burst_hold_s: float = 1200.0  # a peak in the memory counts in full this long, then fades
    scale_down_stabilization_s: float = 120.0
    queue_per_replica_threshold: float = 4.0
    # After a feedback scale-up the latency window still holds the old samples: wait this
    # long before feedback adds more, or one slow minute buys several replicas.
    feedback_cooldown_s: float = 45.0
    calibration_smoothing: float = 0.3
    calibration_bounds: tuple[float, float] = (0.9, 3.0)  # little optimism: a fast engine is a bonus, not a plan
    slo_feedback_step: float = 0.10  # capacity correction per missed window
    slo_feedback_decay: float = 0.005  # per tick while the SLO is met with room
    slo_feedback_relax_below: float = 0.8
    slo_feedback_max: float = 2.0
    scale_down_margin: float = 0.10  # extra spare capacity a scale-down must leave (hysteresis against flapping)
    # A held fleet (bursty arrivals) grows only when what it is sized for needs more than this
    # share above it (HPA's default tolerance): noise in the observed lengths moves the need
    # by a few percent, and a burst it would chase is over before the replica is ready.
    hold_tolerance: float = 0.10
    cold_start_samples: int = 8  # observed start-to-ready times kept for learning
    # A causal trailing floor (issue 35): the level is at least `trailing_margin` x the largest
    # observed (per-minute, trailing-window) rate of the last `trailing_lookback_s`. 0: off,
    # the default; the holding tuner (kvscale.autoscaling.autotune) runs it before there is
    # history to tune on, and may keep it after.
    trailing_margin: float = 0.0
    trailing_lookback_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})")
        if not self.cold_start_s >= 0:
            raise ValueError(f"the cold start must be >= 0 seconds, got {self.cold_start_s}")
        if not 0 < self.burst_quantile <= 1:
            raise ValueError(f"burst_quantile must be in (0, 1], got {self.burst_quantile}")
        if not self.trailing_margin >= 0:
            raise ValueError(f"trailing_margin must be >= 0, got {self.trailing_margin}")


@dataclass(frozen=True)
class PolicyState:
    rates: tuple[tuple[float, float], ...] = ()  # (time, observed arrival rate)
    targets: tuple[tuple[float, int], ...] = ()  # (time, unstabilized target) for scale-down
    calibration: float = 1.0
    # SLO feedback on capacity: grows while the observed SLO is missed without a backlog to
    # explain it, decays while it is met with room; divides what the model says a replica carries.
    slo_factor: float = 1.0
    # How far over target the SLO was when the factor last rose (None: met since): a raise
    # that did not bring it closer is not repeated (a tail no fleet size fixes).
    slo_miss_at_raise: float | None = None
    last_feedback_s: float | None = None
    # Observed start-to-ready seconds (newest last). The operator may restore them from status
    # after a restart; empty means the config's default cold start applies.
    cold_start_samples: tuple[float, ...] = ()
    history_limit_s: float = field(default=3600.0, repr=False)

    def cold_start_s(self, config: PolicyConfig) -> float:
        """The cold start to plan with: the slowest recent observed start (a scale-up must
        land before the need even when a start is slow), or the config's default."""
        return max(self.cold_start_samples) if self.cold_start_samples else config.cold_start_s

    def learn_cold_start(self, observed_s: tuple[float, ...], config: PolicyConfig) -> PolicyState:
        valid = tuple(s for s in observed_s if math.isfinite(s) and s >= 0)
        if not valid:
            return self
        return replace(self, cold_start_samples=(*self.cold_start_samples, *valid)[-config.cold_start_samples :])

    def remember(self, time_s: float, rate: float | None, target: int) -> PolicyState:
        horizon = time_s - self.history_limit_s
        rates = tuple(r for r in self.rates if r[0] >= horizon)
        if rate is not None:
            rates += ((time_s, rate),)
        targets = (*tuple(t for t in self.targets if t[0] >= horizon), (time_s, target))
        return replace(self, rates=rates, targets=targets)


def forecast_rate(
    history: tuple[tuple[float, float], ...],
    now_s: float,
    window_s: float,
    horizon_s: float,
    damping_s: float | None = None,
    lag_s: float = 0.0,
) -> float:
    """The rate `horizon_s` ahead: the latest rate plus the least-squares slope over the
    window, extrapolated over damping_s x (1 - exp(-horizon/damping_s)) seconds (a damped
    trend; None: linear over the whole horizon). Never below the latest. `lag_s`: how far
    behind each rate sample is (half its trailing window); the line is read that much later
    before the forecast's damped extrapolation, as that time has already passed."""
    points = [(t, r) for t, r in history if t >= now_s - window_s]
    if not points:
        return 0.0
    latest = points[-1][1]
    if len(points) < 3:
        return latest
    mean_t = sum(t for t, _ in points) / len(points)
    mean_r = sum(r for _, r in points) / len(points)
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    if var_t <= 0:
        return latest
    slope = sum((t - mean_t) * (r - mean_r) for t, r in points) / var_t
    if damping_s is None:
        return max(latest, mean_r + slope * (now_s + lag_s + horizon_s - mean_t))
    reach_s = damping_s * (1 - math.exp(-horizon_s / damping_s)) if damping_s > 0 else 0.0
    # The fitted line at now (the samples' lag taken out), then the damped extrapolation.
    return max(latest, mean_r + slope * (now_s + lag_s - mean_t) + slope * reach_s)


def burst_reserve(
    history: tuple[tuple[float, float], ...], horizon_s: float, quantile: float, min_spans: int = 4
) -> float:
    """The `quantile` of how much the rate rose within `horizon_s` after each past tick
    (max over the following horizon minus the rate then, floored at 0). 0 until the
    history holds `min_spans` complete horizons."""
    if not history:
        return 0.0
    times = [t for t, _ in history]
    rates = [r for _, r in history]
    end = times[-1]
    rises: list[float] = []
    j = 0
    peak_window: list[int] = []  # indices of a decreasing-rate deque over (t_k, t_k + horizon]
    for k, t_k in enumerate(times):
        if t_k + horizon_s > end + 1e-9:
            break
        while j < len(times) and times[j] <= t_k + horizon_s + 1e-9:
            while peak_window and rates[peak_window[-1]] <= rates[j]:
                peak_window.pop()
            peak_window.append(j)
            j += 1
        while peak_window and peak_window[0] <= k:
            peak_window.pop(0)
        ahead = rates[peak_window[0]] if peak_window else rates[k]
        rises.append(max(0.0, ahead - rates[k]))
    if not rises or (end - times[0]) < min_spans * horizon_s:
        return 0.0
    return _quantile(rises, quantile)


def burst_ceiling(history: tuple[tuple[float, float], ...], now_s: float, config: PolicyConfig) -> float:
    """The highest rate the memory holds, each weighed by its age: in full for the first
    `burst_hold_s`, then fading linearly to nothing at the end of `burst_memory_s`."""
    fade_s = max(config.burst_memory_s - config.burst_hold_s, 1e-9)
    best = 0.0
    for t, r in history:
        age = now_s - t
        if age > config.burst_memory_s:
            continue
        weight = 1.0 if age <= config.burst_hold_s else max(0.0, 1.0 - (age - config.burst_hold_s) / fade_s)
        best = max(best, r * weight)
    return best


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def work_lengths(obs: Observation, config: PolicyConfig) -> tuple[float, float]:
    """Prompt and output tokens per request the capacity is looked up for: the work that
    arrives (prefill tokens/s after prefix-cache hits, decode tokens/s) over the request rate
    when the engines export it, so a minute of long prompts asks for more replicas than one
    of short prompts at the same rate; else the observed means; else the spec's lengths.
    A missing work metric falls back, never to less than the spec's lengths' worth of work."""
    inp = obs.input_tokens_mean or config.default_input_tokens
    out = obs.output_tokens_mean or config.default_output_tokens
    rate = obs.arrival_rate_per_s
    if rate is not None and rate > 0:
        if obs.prefill_tokens_per_s is not None and obs.prefill_tokens_per_s > 0:
            inp = obs.prefill_tokens_per_s / rate
        if obs.decode_tokens_per_s is not None and obs.decode_tokens_per_s > 0:
            out = obs.decode_tokens_per_s / rate
    return max(inp, 1.0), max(out, 1.0)


def _clamp(value: int, config: PolicyConfig) -> int:
    return max(config.min_replicas, min(config.max_replicas, value))


def _slo_missed(obs: Observation, config: PolicyConfig) -> str | None:
    if obs.ttft_p_s is not None and obs.ttft_p_s > config.ttft_target_s:
        return f"TTFT {obs.ttft_p_s * 1e3:.0f}ms over the {config.ttft_target_s * 1e3:.0f}ms target"
    if obs.tpot_p_s is not None and obs.tpot_p_s > config.tpot_target_s:
        return f"TPOT {obs.tpot_p_s * 1e3:.1f}ms over the {config.tpot_target_s * 1e3:.1f}ms target"
    if obs.waiting is not None and obs.waiting > config.queue_per_replica_threshold * max(obs.ready_replicas, 1):
        return f"{obs.waiting:.0f} requests queued"
    return None


def _calibrate(
    obs: Observation, state: PolicyState, capacity: Capacity, config: PolicyConfig, lengths: tuple[float, float]
) -> float:
    """Smoothed observed/predicted TPOT at the observed per-replica load: how much slower
    (or faster) the engine runs than the model says. Not while replicas warm up or just
    became ready (their latency window mixes fleet sizes), nor while requests queue."""
    if (
        obs.tpot_p_s is None
        or obs.arrival_rate_per_s is None
        or obs.ready_replicas < 1
        or not obs.arrival_rate_per_s > 0
        or obs.starting_replicas > 0
        or obs.started_to_ready_s
        or (obs.waiting or 0.0) > config.queue_per_replica_threshold * obs.ready_replicas
    ):
        # A queue means the batch is full whatever the model predicts at this rate: what it
        # shows is overload, not a slower engine.
        return state.calibration
    predicted = capacity.predicted_tpot_s(
        obs.arrival_rate_per_s / obs.ready_replicas, *lengths, fleet_rate_per_s=obs.arrival_rate_per_s
    )
    if not math.isfinite(predicted) or predicted <= 0:
        return state.calibration
    lo, hi = config.calibration_bounds
    ratio = min(hi, max(lo, obs.tpot_p_s / predicted))
    a = config.calibration_smoothing
    return min(hi, max(lo, (1 - a) * state.calibration + a * ratio))


def _miss_ratio(obs: Observation, config: PolicyConfig) -> float:
    ratios = [0.0]
    if obs.ttft_p_s is not None:
        ratios.append(obs.ttft_p_s / config.ttft_target_s)
    if obs.tpot_p_s is not None:
        ratios.append(obs.tpot_p_s / config.tpot_target_s)
    return max(ratios)


def _slo_feedback(
    obs: Observation, state: PolicyState, config: PolicyConfig, missed: str | None
) -> tuple[float, float | None]:
    """The SLO-feedback factor on per-replica capacity, and the miss it was raised at. The
    model can be optimistic about a tail (p99 TTFT under heavy-tailed prompts, say) in a way
    TPOT calibration does not see: a missed SLO with no queue to explain it raises the factor
    by `slo_feedback_step` (at most once per feedback cooldown, as the latency window lags),
    but only while each raise brings the quantile closer to its target (more replicas do not
    shorten a prompt's own prefill); a met SLO with room (both quantiles under
    `slo_feedback_relax_below` of their targets) lets it decay to 1."""
    factor, at_raise = state.slo_factor, state.slo_miss_at_raise
    queued = (obs.waiting or 0.0) > config.queue_per_replica_threshold * max(obs.ready_replicas, 1)
    cooled = state.last_feedback_s is None or obs.time_s - state.last_feedback_s >= config.feedback_cooldown_s
    if not missed:
        at_raise = None
    elif not queued and cooled and obs.ready_replicas > 0:
        ratio = _miss_ratio(obs, config)
        if at_raise is None or ratio < 0.95 * at_raise:
            return min(config.slo_feedback_max, factor * (1 + config.slo_feedback_step)), ratio
    relaxed = (
        not missed
        and obs.ttft_p_s is not None
        and obs.tpot_p_s is not None
        and obs.ttft_p_s <= config.slo_feedback_relax_below * config.ttft_target_s
        and obs.tpot_p_s <= config.slo_feedback_relax_below * config.tpot_target_s
    )
    if relaxed:
        return max(1.0, factor * (1 - config.slo_feedback_decay)), at_raise
    return factor, at_raise


def _replicas_for(rate: float, per_replica: float, headroom: float) -> int:
    return math.ceil(rate * (1 + headroom) / per_replica - 1e-9)


def _backlog_target(
    obs: Observation, config: PolicyConfig, rate: float, per_replica: float, cold_start_s: float
) -> tuple[int, str] | None:
    """Replicas that drain the queue within the TTFT target after new replicas are ready."""
    assert obs.waiting is not None
    if obs.waiting <= config.queue_per_replica_threshold * max(obs.ready_replicas, 1):
        return None
    drain_s = cold_start_s + config.ttft_target_s
    if config.queue_moves:
        needed = _replicas_for(rate + obs.waiting / drain_s, per_replica, config.headroom)
        return needed, (
            f"{obs.waiting:.0f} queued at the gateway, drained within {drain_s:.0f}s, plus {rate:.2f} req/s "
            f"over the {per_replica:.2f} req/s one replica carries"
        )
    # Behind a Service: the longest replica queue drains only at its own spare capacity, so
    # its share of new arrivals must leave room for that (at most half of it).
    longest = obs.waiting_max if obs.waiting_max is not None else obs.waiting / max(obs.ready_replicas, 1)
    drain_rate = min(longest / drain_s, per_replica / 2)
    needed = _replicas_for(rate, per_replica - drain_rate, config.headroom)
    return needed, (
        f"{longest:.0f} queued on one replica (a Service does not move them), drained within {drain_s:.0f}s "
        f"while it takes its share of {rate:.2f} req/s over the {per_replica:.2f} req/s one replica carries"
    )


def decide(
    obs: Observation, state: PolicyState, capacity: Capacity, config: PolicyConfig
) -> tuple[Decision, PolicyState]:
    """One tick: the replica count, the term that set it (its kind) and why, and the new
    state; with the replicas its forecast asks for one lead further (Decision.lead_replicas)."""
    decision, state = _decide(obs, state, capacity, config)
    if decision.replicas > config.max_replicas:
        # A fleet above maxReplicas (the bound lowered, a start above it): the bound is the spec's,
        # not a reading, so neither a hold on missing metrics nor one on a missed SLO keeps it there.
        bounded = config.max_replicas
        why = f"maxReplicas {bounded}: scale down {obs.current_replicas} -> {bounded} ({decision.reason})"
        decision = replace(decision, replicas=bounded, reason=why, kind=DecisionKind.BOUNDS)
    if decision.capacity_per_replica:
        decision = replace(decision, lead_replicas=replicas_ahead(decision, state, config, obs.time_s))
    return decision, state


def _decide(
    obs: Observation, state: PolicyState, capacity: Capacity, config: PolicyConfig
) -> tuple[Decision, PolicyState]:
    state = state.learn_cold_start(obs.started_to_ready_s, config)
    cold_start_s = state.cold_start_s(config)
    current = obs.current_replicas
    missed = _slo_missed(obs, config)
    if not obs.complete:
        # Hold on missing or stale data; only a visible queue may still add a replica.
        target, kind = current, DecisionKind.MISSING_METRICS
        reason = "metrics missing or stale: holding"
        if (
            obs.waiting is not None
            and obs.waiting > config.queue_per_replica_threshold * max(obs.ready_replicas, 1)
            and obs.starting_replicas == 0
        ):
            target, kind = current + 1, DecisionKind.BACKLOG
            reason = f"metrics incomplete but {obs.waiting:.0f} requests queued: one more replica"
        replicas = max(current, _clamp(target, config))
        decision = Decision(replicas, reason, kind, calibration=state.calibration, cold_start_s=cold_start_s)
        return decision, state.remember(obs.time_s, None, replicas)

    assert obs.arrival_rate_per_s is not None and obs.running is not None and obs.waiting is not None
    lengths = work_lengths(obs, config)
    calibration = _calibrate(obs, state, capacity, config, lengths)
    slo_factor, miss_at_raise = _slo_feedback(obs, state, config, missed)
    raised = slo_factor > state.slo_factor
    if raised:
        state = replace(state, last_feedback_s=obs.time_s)
    state = replace(state, slo_factor=slo_factor, slo_miss_at_raise=miss_at_raise)
    state = replace(state, calibration=calibration, history_limit_s=max(config.burst_memory_s, state.history_limit_s))
    rate_now = obs.arrival_rate_per_s
    history = state.remember(obs.time_s, rate_now, 0).rates
    horizon_s = cold_start_s + config.tick_s
    forecast = forecast_rate(
        history, obs.time_s, config.forecast_window_s, horizon_s, config.trend_damping_s, config.rate_window_s / 2
    )
    rise = burst_reserve(history, horizon_s, config.burst_quantile)
    ceiling = burst_ceiling(history, obs.time_s, config)
    recent_history = tuple((t, r) for t, r in history if t >= obs.time_s - config.burst_memory_s)
    recent = [r for _, r in recent_history]
    # Bursty: the rate can more than double within a cold start, and the bursts end before
    # capacity chasing them would have served them. A finished burst that lasted longer than
    # two cold starts plus the rate window (what the trailing mean smears it over) was a step
    # the fleet could follow: holding its peak for burst_hold_s would pay for a burst that
    # is over (a single surge, then quiet).
    chase_s = 2 * (cold_start_s + config.rate_window_s)
    bursty = rise > 0 and rise >= _quantile(recent, 0.5) and not bursts_outlast(recent_history, chase_s)
    held: Holding | None = None
    regime = Regime.FOLLOWING_TREND
    if bursty:
        # On/off traffic: the trend says nothing about the next burst (a burst's own rise
        # extrapolates far past it) and a replica started now lands after this one; hold
        # capacity for the work per cold start the recent past brought, and follow the rate
        # itself only once it has lasted a cold start.
        held = holding(
            history,
            obs.time_s,
            cold_start_s,
            config.rate_window_s,
            config.burst_quantile,
            config.burst_hold_s,
            config.burst_memory_s,
        )
        level, kind, regime = held.rate, DecisionKind.BURST_RESERVE, held.regime
        every = f", recurring every {held.recurrence_s:.0f}s" if held.recurrence_s is not None else ""
        why = (
            f"bursty arrivals (p{config.burst_quantile * 100:g} rise {rise:.2f} req/s within {horizon_s:.0f}s{every}): "
            f"holding {level:.2f} req/s (p{config.burst_quantile * 100:g} over {cold_start_s:.0f}s windows "
            f"{held.level:.2f}, sustained {held.sustained:.2f}, now {rate_now:.2f})"
        )
    else:
        # A rise counts from the current rate, but not past the highest rate the memory holds.
        reserve = max(0.0, min(rise, ceiling - rate_now))
        if rate_now + reserve > forecast:
            level, kind = rate_now + reserve, DecisionKind.BURST_RESERVE
            why = (
                f"now {rate_now:.2f} req/s plus a burst reserve of {reserve:.2f} "
                f"(p{config.burst_quantile * 100:g} rise within {horizon_s:.0f}s)"
            )
        else:
            level, kind = forecast, DecisionKind.FORECAST
            why = f"forecast {forecast:.2f} req/s {horizon_s:.0f}s ahead (now {rate_now:.2f})"
    if config.trailing_margin > 0:
        trailing = config.trailing_margin * max(
            (r for t, r in history if t >= obs.time_s - config.trailing_lookback_s), default=0.0
        )
        if trailing > level:
            level, kind = trailing, DecisionKind.BURST_RESERVE
            why = (
                f"trailing floor {config.trailing_margin:g} x the largest per-minute rate of the last "
                f"{config.trailing_lookback_s:.0f}s = {trailing:.2f} req/s (now {rate_now:.2f}; {why})"
            )
    # What a replica carries in a fleet sized for `level`: its share of each burst shrinks as
    # the fleet grows (a burst is requests, not a rate the level already holds).
    per_replica = capacity.rate_per_replica(*lengths, fleet_rate_per_s=level) / (calibration * slo_factor)
    if per_replica <= 0:
        target, kind = config.max_replicas, DecisionKind.BOUNDS
        why = "no replica meets the SLO at the observed lengths: scaling to the maximum"
    else:
        target = _replicas_for(level, per_replica, config.headroom)
        if regime is Regime.ABSORBING_BURSTS and target > current:
            # Grow a held fleet only past the tolerance: a need of 4.1 keeps 4.
            target = max(current, _replicas_for(level, per_replica * (1 + config.hold_tolerance), config.headroom))
        why += f" over the {per_replica:.2f} req/s one replica carries, {config.headroom:.0%} headroom"
        if slo_factor > 1.0 + 1e-6:
            why += f" (capacity lowered x{slo_factor:.2f} by SLO feedback)"
        if raised and missed and target > current:
            kind, why = DecisionKind.FEEDBACK, f"{missed}: {why}"
    backlog = _backlog_target(obs, config, max(rate_now, forecast), per_replica, cold_start_s) if per_replica else None
    if backlog is not None and backlog[0] > target:
        target, kind, why = backlog[0], DecisionKind.BACKLOG, backlog[1]
    cooled = state.last_feedback_s is None or obs.time_s - state.last_feedback_s >= config.feedback_cooldown_s
    # Feedback covers what the model misses. While the backlog term already adds replicas the
    # queue is its to size (the latency window lags the drain, and more replicas do not
    # shorten a queue a Service has pinned).
    backlog_adds = backlog is not None and backlog[0] > obs.ready_replicas
    pinned = (
        not config.queue_moves
        and backlog is not None
        and obs.waiting_max is not None
        and obs.waiting_max > obs.waiting / 2
        and obs.ready_replicas > 1
    )
    if missed and not backlog_adds and not pinned and obs.starting_replicas == 0 and cooled:
        feedback = obs.ready_replicas + 1
        if feedback > target:
            target, kind = feedback, DecisionKind.FEEDBACK
            why = f"{missed}: adding {feedback - obs.ready_replicas} beyond the ready {obs.ready_replicas}"
            state = replace(state, last_feedback_s=obs.time_s)
    clamped = _clamp(target, config)
    if clamped != target:
        if clamped < target:  # the load is the news here, not the latency term that measured it
            why = f"the load needs {target} replicas, more than maxReplicas {clamped}: capped ({why})"
        else:
            why = f"{why}; minReplicas {clamped}"
        target, kind = clamped, DecisionKind.BOUNDS
    state = state.remember(obs.time_s, rate_now, target)
    why = f"{regime.value}: {why}"

    def answer(replicas: int, reason: str, kind: DecisionKind) -> Decision:
        return Decision(replicas, reason, kind, per_replica, calibration, cold_start_s, regime=regime)

    if target >= current:
        verb = "scale up" if target > current else "hold"
        return answer(target, f"{verb} {current} -> {target}: {why}", kind), state

    # Scale-down: the largest target of the stabilization window, and a consolidation check.
    # A held fleet waits out the bursts' recurrence interval too (the next burst is due), and
    # must absorb the held level, not just the quiet rate between bursts.
    stabilization_s = config.scale_down_stabilization_s
    if held is not None and held.recurrence_s is not None:
        stabilization_s = max(stabilization_s, min(held.recurrence_s, config.burst_hold_s))
    since = obs.time_s - stabilization_s
    window = [t for when, t in state.targets if when >= since]
    history_covers_window = bool(state.targets) and state.targets[0][0] <= since + 1e-9
    stabilized = max([target, *window]) if history_covers_window else current
    absorbing = max(rate_now, held.rate if held is not None else 0.0)
    absorbed = absorbing * (1 + config.headroom + config.scale_down_margin) <= stabilized * per_replica
    queue_ok = obs.running + obs.waiting <= stabilized * capacity.max_batch
    if stabilized >= current:
        why = f"{regime.value}: within the {stabilization_s:.0f}s stabilization window"
        if stabilization_s > config.scale_down_stabilization_s:
            why += " (the bursts' recurrence interval)"
        return answer(current, f"hold {current}: {why}", DecisionKind.STABILIZATION), state
    if not absorbed or not queue_ok or missed:
        why = "the remaining replicas would not absorb the load" if not (absorbed and queue_ok) else missed or ""
        return answer(current, f"hold {current}: {regime.value}: {why}", DecisionKind.HOLD), state
    return (
        answer(
            stabilized,
            f"scale down {current} -> {stabilized}: {regime.value}: {stabilized} replicas absorb {absorbing:.2f} req/s "
            f"(capacity {stabilized * per_replica:.2f}) after {stabilization_s:.0f}s stable",
            kind if stabilized == target else DecisionKind.STABILIZATION,
        ),
        state,
    )


def replicas_ahead(
    decision: Decision, state: PolicyState, config: PolicyConfig, now_s: float, lead_s: float | None = None
) -> int:
    """Replicas the forecast asks for one lead beyond the decision's horizon: the damped
    trend read `lead_s` further (default the policy's own lead over the cold start, its
    horizon of one cold start and a tick), over what one replica carries, with headroom;
    within maxReplicas, and never below the decision.

    Under a GPU budget a replica may have to wait for a lower priority to release GPUs
    before its cold start begins; the budget holds room for this many (issue 29: "room ahead
    of need"), so a diurnal rise does not wait for a release each time. 0 extra on a flat or
    falling rate; the decision's own count when it says nothing of capacity (held metrics)."""
    per_replica = decision.capacity_per_replica
    if not per_replica or per_replica <= 0 or not state.rates:
        return decision.replicas
    cold_start_s = decision.cold_start_s if decision.cold_start_s is not None else state.cold_start_s(config)
    horizon_s = cold_start_s + config.tick_s
    lead = horizon_s if lead_s is None else max(lead_s, 0.0)
    rate = forecast_rate(
        state.rates,
        now_s,
        config.forecast_window_s,
        horizon_s + lead,
        config.trend_damping_s,
        config.rate_window_s / 2,
    )
    ahead = _replicas_for(rate, per_replica, config.headroom) if rate > 0 else 0
    return max(decision.replicas, min(config.max_replicas, ahead))
