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

from kvscale.autoscaling.observation import Decision, DecisionKind, Observation


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
    # A new replica's start-to-ready time before any was observed: the default from the model
    # size (container start, weight download and load, engine warm-up); see ServingConfig.
    cold_start_s: float = 90.0
    tick_s: float = 15.0  # how often the policy runs
    forecast_window_s: float = 180.0
    scale_down_stabilization_s: float = 120.0
    queue_per_replica_threshold: float = 4.0
    # After a feedback scale-up the latency window still holds the old samples: wait this
    # long before feedback adds more, or one slow minute buys several replicas.
    feedback_cooldown_s: float = 45.0
    calibration_smoothing: float = 0.3
    calibration_bounds: tuple[float, float] = (0.9, 3.0)  # little optimism: a fast engine is a bonus, not a plan
    scale_down_margin: float = 0.10  # extra spare capacity a scale-down must leave (hysteresis against flapping)

    cold_start_samples: int = 8  # observed start-to-ready times kept for learning

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})")
        if not self.cold_start_s >= 0:
            raise ValueError(f"the cold start must be >= 0 seconds, got {self.cold_start_s}")


@dataclass(frozen=True)
class PolicyState:
    rates: tuple[tuple[float, float], ...] = ()  # (time, observed arrival rate)
    targets: tuple[tuple[float, int], ...] = ()  # (time, unstabilized target) for scale-down
    calibration: float = 1.0
    last_feedback_s: float | None = None
    # Observed start-to-ready seconds (newest last). The operator may restore them from status
    # after a restart; empty means the config's default cold start applies.
    cold_start_samples: tuple[float, ...] = ()
    history_limit_s: float = field(default=900.0, repr=False)

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
    (or faster) the engine runs than the model says. Not while replicas warm up or just
    became ready: their latency window mixes fleet sizes."""
    if (
        obs.tpot_p_s is None
        or obs.arrival_rate_per_s is None
        or obs.ready_replicas < 1
        or not obs.arrival_rate_per_s > 0
        or obs.starting_replicas > 0
        or obs.started_to_ready_s
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
    """One tick: the replica count, the term that set it (its kind) and why, and the new state."""
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
    lengths = (
        obs.input_tokens_mean or config.default_input_tokens,
        obs.output_tokens_mean or config.default_output_tokens,
    )
    calibration = _calibrate(obs, state, capacity, config, lengths)
    per_replica = capacity.rate_per_replica(*lengths) / calibration
    state = replace(state, calibration=calibration)
    rate_now = obs.arrival_rate_per_s
    history = state.remember(obs.time_s, rate_now, 0).rates
    horizon_s = cold_start_s + config.tick_s
    forecast = forecast_rate(history, obs.time_s, config.forecast_window_s, horizon_s)
    if per_replica <= 0:
        target, kind = config.max_replicas, DecisionKind.BOUNDS
        why = "no replica meets the SLO at the observed lengths: scaling to the maximum"
    else:
        target, kind = math.ceil(forecast * (1 + config.headroom) / per_replica - 1e-9), DecisionKind.FORECAST
        why = (
            f"forecast {forecast:.2f} req/s (now {rate_now:.2f}) over {per_replica:.2f} req/s per replica "
            f"with {config.headroom:.0%} headroom, {horizon_s:.0f}s ahead"
        )
    cooled = state.last_feedback_s is None or obs.time_s - state.last_feedback_s >= config.feedback_cooldown_s
    if missed and obs.starting_replicas == 0 and cooled:
        backlog = math.ceil(obs.waiting / max(capacity.max_batch, 1))
        feedback = obs.ready_replicas + max(1, backlog)
        if feedback > target:
            target, kind = feedback, DecisionKind.FEEDBACK
            why = f"{missed}: adding {feedback - obs.ready_replicas} beyond the ready {obs.ready_replicas}"
            state = replace(state, last_feedback_s=obs.time_s)
    clamped = _clamp(target, config)
    if clamped != target:
        bound = "maxReplicas" if clamped < target else "minReplicas"
        target, kind, why = clamped, DecisionKind.BOUNDS, f"{why}; {bound} {clamped}"
    state = state.remember(obs.time_s, rate_now, target)

    def answer(replicas: int, reason: str, kind: DecisionKind) -> Decision:
        return Decision(replicas, reason, kind, per_replica, calibration, cold_start_s)

    if target >= current:
        verb = "scale up" if target > current else "hold"
        return answer(target, f"{verb} {current} -> {target}: {why}", kind), state

    # Scale-down: the largest target of the stabilization window, and a consolidation check.
    since = obs.time_s - config.scale_down_stabilization_s
    window = [t for when, t in state.targets if when >= since]
    history_covers_window = bool(state.targets) and state.targets[0][0] <= since + 1e-9
    stabilized = max([target, *window]) if history_covers_window else current
    absorbed = rate_now * (1 + config.headroom + config.scale_down_margin) <= stabilized * per_replica
    queue_ok = obs.running + obs.waiting <= stabilized * capacity.max_batch
    if stabilized >= current:
        why = f"within the {config.scale_down_stabilization_s:.0f}s stabilization window"
        return answer(current, f"hold {current}: {why}", DecisionKind.STABILIZATION), state
    if not absorbed or not queue_ok or missed:
        why = "the remaining replicas would not absorb the load" if not (absorbed and queue_ok) else missed or ""
        return answer(current, f"hold {current}: {why}", DecisionKind.HOLD), state
    return (
        answer(
            stabilized,
            f"scale down {current} -> {stabilized}: {stabilized} replicas absorb {rate_now:.2f} req/s "
            f"(capacity {stabilized * per_replica:.2f}) after {config.scale_down_stabilization_s:.0f}s stable",
            kind if stabilized == target else DecisionKind.STABILIZATION,
        ),
        state,
    )
