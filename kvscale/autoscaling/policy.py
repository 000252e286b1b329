"""kvscale's autoscaling policy.

Model-based target (forecast arrival rate over per-replica capacity from the plan),
corrected by a calibration factor learned from observed vs predicted TPOT, with a
feedback term when the SLO is missed or the queue grows. Scale-up looks one cold start
ahead; scale-down needs the remaining replicas to provably absorb the load and a
stabilization window, and never happens on missing or stale metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Protocol

from kvscale.autoscaling.observation import Decision, Observation


class Capacity(Protocol):
    max_batch: int

    def rate_per_replica(self, input_tokens: float, output_tokens: float) -> float: ...

    def predicted_tpot_s(self, rate_per_replica: float, input_tokens: float, output_tokens: float) -> float: ...


@dataclass(frozen=True)
class PolicyConfig:
    ttft_target_s: float
    tpot_target_s: float
    default_input_tokens: float
    default_output_tokens: float
    min_replicas: int = 1
    max_replicas: int = 100
    headroom: float = 0.10
    forecast_horizon_s: float = 120.0  # a cold start plus a tick: scale-up must land before need
    forecast_window_s: float = 180.0
    scale_down_stabilization_s: float = 120.0
    queue_per_replica_threshold: float = 4.0
    # After a feedback scale-up the latency window still holds the old samples: wait this
    # long before feedback adds more, or one slow minute buys several replicas.
    feedback_cooldown_s: float = 45.0
    calibration_smoothing: float = 0.3
    calibration_bounds: tuple[float, float] = (0.9, 3.0)  # little optimism: a fast engine is a bonus, not a plan
    scale_down_margin: float = 0.10  # extra spare capacity a scale-down must leave (hysteresis against flapping)

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})")


@dataclass(frozen=True)
class PolicyState:
    rates: tuple[tuple[float, float], ...] = ()  # (time, observed arrival rate)
    targets: tuple[tuple[float, int], ...] = ()  # (time, unstabilized target) for scale-down
    calibration: float = 1.0
    last_feedback_s: float | None = None
    history_limit_s: float = field(default=900.0, repr=False)

    def remember(self, time_s: float, rate: float | None, target: int) -> PolicyState:
        horizon = time_s - self.history_limit_s
        rates = tuple(r for r in self.rates if r[0] >= horizon)
        if rate is not None:
            rates += ((time_s, rate),)
        targets = (*tuple(t for t in self.targets if t[0] >= horizon), (time_s, target))
        return replace(self, rates=rates, targets=targets)


def forecast_rate(history: tuple[tuple[float, float], ...], now_s: float, window_s: float, horizon_s: float) -> float:
    """Least-squares trend over the window, projected `horizon_s` ahead; never below the latest."""
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
    projected = mean_r + slope * (now_s + horizon_s - mean_t)
    return max(latest, projected)


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
    (or faster) the engine runs than the model says."""
    if (
        obs.tpot_p_s is None
        or obs.arrival_rate_per_s is None
        or obs.ready_replicas < 1
        or not obs.arrival_rate_per_s > 0
    ):
        return state.calibration
    predicted = capacity.predicted_tpot_s(obs.arrival_rate_per_s / obs.ready_replicas, *lengths)
    if not math.isfinite(predicted) or predicted <= 0:
        return state.calibration
    lo, hi = config.calibration_bounds
    ratio = min(hi, max(lo, obs.tpot_p_s / predicted))
    a = config.calibration_smoothing
    return min(hi, max(lo, (1 - a) * state.calibration + a * ratio))


def decide(
    obs: Observation, state: PolicyState, capacity: Capacity, config: PolicyConfig
) -> tuple[Decision, PolicyState]:
    current = obs.current_replicas
    missed = _slo_missed(obs, config)
    if not obs.complete:
        # Hold on missing or stale data; only a visible queue may still add a replica.
        target = current
        reason = "metrics missing or stale: holding"
        if (
            obs.waiting is not None
            and obs.waiting > config.queue_per_replica_threshold * max(obs.ready_replicas, 1)
            and obs.starting_replicas == 0
        ):
            target = current + 1
            reason = f"metrics incomplete but {obs.waiting:.0f} requests queued: one more replica"
        replicas = max(current, _clamp(target, config))
        return Decision(replicas, reason, calibration=state.calibration), state.remember(obs.time_s, None, replicas)

    assert obs.arrival_rate_per_s is not None and obs.running is not None and obs.waiting is not None
    lengths = (
        obs.input_tokens_mean or config.default_input_tokens,
        obs.output_tokens_mean or config.default_output_tokens,
    )
    calibration = _calibrate(obs, state, capacity, config, lengths)
    per_replica = capacity.rate_per_replica(*lengths) / calibration
    state = replace(state, calibration=calibration)
    rate_now = obs.arrival_rate_per_s
    history = state.remember(obs.time_s, rate_now, 0).rates
    forecast = forecast_rate(history, obs.time_s, config.forecast_window_s, config.forecast_horizon_s)
    if per_replica <= 0:
        target, why = config.max_replicas, "no replica meets the SLO at the observed lengths: scaling to the maximum"
    else:
        target = math.ceil(forecast * (1 + config.headroom) / per_replica - 1e-9)
        why = (
            f"forecast {forecast:.2f} req/s (now {rate_now:.2f}) over {per_replica:.2f} req/s per replica "
            f"with {config.headroom:.0%} headroom"
        )
    cooled = state.last_feedback_s is None or obs.time_s - state.last_feedback_s >= config.feedback_cooldown_s
    if missed and obs.starting_replicas == 0 and cooled:
        backlog = math.ceil(obs.waiting / max(capacity.max_batch, 1))
        feedback = obs.ready_replicas + max(1, backlog)
        if feedback > target:
            target, why = (
                feedback,
                f"{missed}: adding {feedback - obs.ready_replicas} beyond the ready {obs.ready_replicas}",
            )
            state = replace(state, last_feedback_s=obs.time_s)
    target = _clamp(target, config)
    state = state.remember(obs.time_s, rate_now, target)

    if target >= current:
        verb = "scale up" if target > current else "hold"
        return Decision(target, f"{verb} {current} -> {target}: {why}", per_replica, calibration), state

    # Scale-down: the largest target of the stabilization window, and a consolidation check.
    since = obs.time_s - config.scale_down_stabilization_s
    window = [t for when, t in state.targets if when >= since]
    history_covers_window = bool(state.targets) and state.targets[0][0] <= since + 1e-9
    stabilized = max([target, *window]) if history_covers_window else current
    absorbed = rate_now * (1 + config.headroom + config.scale_down_margin) <= stabilized * per_replica
    queue_ok = obs.running + obs.waiting <= stabilized * capacity.max_batch
    if stabilized >= current or not absorbed or not queue_ok or missed:
        hold_why = (
            f"within the {config.scale_down_stabilization_s:.0f}s stabilization window"
            if stabilized >= current
            else "the remaining replicas would not absorb the load"
            if not (absorbed and queue_ok)
            else missed or ""
        )
        return Decision(current, f"hold {current}: {hold_why}", per_replica, calibration), state
    return (
        Decision(
            stabilized,
            f"scale down {current} -> {stabilized}: {stabilized} replicas absorb {rate_now:.2f} req/s "
            f"(capacity {stabilized * per_replica:.2f}) after {config.scale_down_stabilization_s:.0f}s stable",
            per_replica,
            calibration,
        ),
        state,
    )
