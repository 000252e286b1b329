"""Autoscaling policies the simulator compares: kvscale's own and today's, as their projects
document them. Each sees the same Observation every tick and answers a replica count."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kvscale.autoscaling.observation import Decision, DecisionKind, Observation

if TYPE_CHECKING:  # imported when a KvscalePolicy is made: `kvscale plan --trace` replays with StaticPolicy
    from kvscale.autoscaling.policy import Capacity, PolicyConfig, PolicyState
    from kvscale.autoscaling.tick import Idle, Seat, TickDecision, TickInput

HPA_TOLERANCE = 0.10  # kube-controller-manager --horizontal-pod-autoscaler-tolerance
HPA_SCALE_DOWN_STABILIZATION_S = 300.0  # behavior.scaleDown.stabilizationWindowSeconds default


class SimPolicy(Protocol):
    name: str

    def decide(self, obs: Observation) -> Decision: ...


class CapacityRefresh(Protocol):
    """The operator's capacity worker in a replay (kvscale.sim.online_refresh.OnlineRefresh)."""

    def due(self, now_s: float) -> bool: ...

    def search(self, now_s: float) -> Capacity | None: ...


@dataclass
class StaticPolicy:
    replicas: int
    name: str = "static"

    def decide(self, obs: Observation) -> Decision:
        return Decision(self.replicas, f"static: always {self.replicas}")


def _new_state() -> PolicyState:
    from kvscale.autoscaling.policy import PolicyState

    return PolicyState()


@dataclass
class KvscalePolicy:
    capacity: Capacity
    config: PolicyConfig
    name: str = "kvscale"
    state: PolicyState = field(default_factory=_new_state)
    kinds: dict[str, int] = field(default_factory=dict)  # decisions by kind, as the operator counts them
    # The operator's capacity search on the replay's past window (None: the capacity stays as given)
    refresh: CapacityRefresh | None = None

    def decide(self, obs: Observation) -> Decision:
        """The deployed tick alone (no idle rule, no budget): the single-service simulator's."""
        from kvscale.autoscaling.tick import tick

        return self.ticked(tick(self.tick_input(obs))).decision

    def tick_input(self, obs: Observation, idle: Idle | None = None, seat: Seat | None = None) -> TickInput:
        """The tick's inputs for this observation (the deployed tick: kvscale.autoscaling.tick),
        with the capacity the operator's capacity worker confirmed by then (`refresh`)."""
        from kvscale.autoscaling.tick import TickInput

        if self.refresh is not None and self.refresh.due(obs.time_s):
            confirmed = self.refresh.search(obs.time_s)
            if confirmed is not None:
                self.capacity = confirmed

        return TickInput(obs, self.capacity, self.config, self.state, idle, seat)

    def ticked(self, done: TickDecision) -> TickDecision:
        """Keeps the tick's new policy state and counts its decision."""
        self.state = done.state
        kind = done.policy.kind.value
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        return done


@dataclass
class _HpaCore:
    """The Kubernetes HPA algorithm: ratio with tolerance, default scale-up limits
    (max of +100% and +4 pods per 15 s), 300 s scale-down stabilization."""

    min_replicas: int
    max_replicas: int
    stabilization_s: float = HPA_SCALE_DOWN_STABILIZATION_S
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)

    def recommend(self, now_s: float, current: int, raw: int) -> int:
        raw = max(self.min_replicas, min(self.max_replicas, raw))
        self.recommendations.append((now_s, raw))
        while self.recommendations and self.recommendations[0][0] < now_s - self.stabilization_s:
            self.recommendations.popleft()
        if raw < current:
            return min(current, max(r for _, r in self.recommendations))
        return min(raw, max(2 * current, current + 4), self.max_replicas)


@dataclass
class HpaRunningPolicy:
    """HPA on vllm:num_requests_running, AverageValue target per pod."""

    target_running_per_replica: float
    min_replicas: int = 1
    max_replicas: int = 100
    name: str = "hpa"
    core: _HpaCore = field(init=False)

    def __post_init__(self) -> None:
        self.core = _HpaCore(self.min_replicas, self.max_replicas)

    def decide(self, obs: Observation) -> Decision:
        current = obs.current_replicas
        if obs.running is None or obs.ready_replicas == 0:
            return Decision(current, "hpa: no metrics, holding", DecisionKind.MISSING_METRICS)
        ratio = (obs.running / obs.ready_replicas) / self.target_running_per_replica
        raw = current if abs(ratio - 1) <= HPA_TOLERANCE else math.ceil(ratio * obs.ready_replicas)
        desired = self.core.recommend(obs.time_s, current, raw)
        return Decision(
            desired,
            f"hpa: {obs.running / obs.ready_replicas:.1f} running/pod vs target {self.target_running_per_replica:g}",
            DecisionKind.FEEDBACK,
        )


@dataclass
class KedaWaitingPolicy:
    """KEDA's Prometheus scaler on sum(vllm:num_requests_waiting), threshold 5, polling 15 s
    (the vLLM production-stack chart's defaults). KEDA hands the value to an HPA as an
    AverageValue target; cooldownPeriod (360 s) governs only scaling to zero."""

    threshold: float = 5.0
    min_replicas: int = 1
    max_replicas: int = 100
    name: str = "keda"
    core: _HpaCore = field(init=False)

    def __post_init__(self) -> None:
        self.core = _HpaCore(self.min_replicas, self.max_replicas)

    def decide(self, obs: Observation) -> Decision:
        current = obs.current_replicas
        if obs.waiting is None:
            return Decision(current, "keda: no metrics, holding", DecisionKind.MISSING_METRICS)
        ratio = obs.waiting / (self.threshold * max(current, 1))
        raw = current if abs(ratio - 1) <= HPA_TOLERANCE else math.ceil(obs.waiting / self.threshold)
        desired = self.core.recommend(obs.time_s, current, raw)
        return Decision(
            desired, f"keda: {obs.waiting:.0f} waiting vs {self.threshold:g} per replica", DecisionKind.FEEDBACK
        )


@dataclass
class SaturationPolicy:
    """Saturation-based scaling (llm-d workload-variant-autoscaler's default mode): one more
    replica when KV use > 80% or more than 5 waiting per replica; one fewer when the load
    would still fit under those limits on one replica fewer."""

    max_batch: int
    kv_limit: float = 0.80
    waiting_limit: float = 5.0
    min_replicas: int = 1
    max_replicas: int = 100
    name: str = "saturation"

    def decide(self, obs: Observation) -> Decision:
        current = obs.current_replicas
        ready = obs.ready_replicas
        if obs.kv_usage is None or obs.waiting is None or obs.running is None or ready == 0:
            return Decision(current, "saturation: no metrics, holding", DecisionKind.MISSING_METRICS)
        if obs.kv_usage > self.kv_limit or obs.waiting / ready > self.waiting_limit:
            if obs.starting_replicas:
                return Decision(current, "saturation: saturated, a replica is already starting", DecisionKind.HOLD)
            return Decision(
                min(self.max_replicas, current + 1),
                f"saturation: KV {obs.kv_usage:.0%}, {obs.waiting:.0f} waiting",
                DecisionKind.FEEDBACK,
            )
        fewer = ready - 1
        if current > self.min_replicas and fewer >= 1 and obs.starting_replicas == 0:
            kv_on_fewer = obs.kv_usage * ready / fewer
            slots_on_fewer = (obs.running + obs.waiting) / (fewer * self.max_batch)
            if kv_on_fewer <= self.kv_limit and slots_on_fewer <= self.kv_limit and obs.waiting == 0:
                return Decision(
                    current - 1, f"saturation: load fits on {fewer} (KV {kv_on_fewer:.0%})", DecisionKind.FEEDBACK
                )
        return Decision(current, "saturation: within limits", DecisionKind.HOLD)


@dataclass
class SchedulePolicy:
    """Replays a precomputed replica schedule (the oracle's)."""

    schedule: list[tuple[float, int]]  # (time, replicas), sorted
    name: str = "oracle"

    def decide(self, obs: Observation) -> Decision:
        desired = self.schedule[0][1]
        for when, replicas in self.schedule:
            if when > obs.time_s:
                break
            desired = replicas
        return Decision(desired, f"oracle: {desired} planned for t={obs.time_s:.0f}s")


TRAILING_FACTOR = 1.3  # issue 27's rule: 1.3 x the trailing per-minute need
TRAILING_LOOKBACK_S = 600.0  # over the last ten minutes


@dataclass
class TrailingPolicy:
    """A causal baseline (issue 27): hold ceil(factor x the `quantile` of the per-interval
    bound counts of the last `lookback_s`), each interval's count known only once it has
    ended. The counts are the bound's (kvscale.sim.compare.run_bound: the fewest warm
    replicas meeting the SLO on that interval's arrivals alone), computed from the trace in
    advance but read only as each interval closes, so the rule sees nothing of the future.
    Before the first interval closes it holds the starting fleet."""

    counts: list[int]  # the bound's count per interval, in order from t=0
    interval_s: float
    lookback_s: float = TRAILING_LOOKBACK_S
    factor: float = TRAILING_FACTOR
    quantile: float = 1.0  # 1.0: the largest count of the lookback
    min_replicas: int = 1
    max_replicas: int = 100
    name: str = "trailing"

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"the trailing quantile must be in (0, 1], got {self.quantile}")
        if not self.interval_s > 0.0:
            raise ValueError(f"the trailing interval must be > 0 s, got {self.interval_s}")

    def decide(self, obs: Observation) -> Decision:
        closed = min(len(self.counts), int(obs.time_s // self.interval_s + 1e-9))  # intervals already over
        first = max(0, closed - max(1, round(self.lookback_s / self.interval_s)))
        seen = sorted(self.counts[first:closed])
        if not seen:
            return Decision(obs.current_replicas, "trailing: no interval has closed yet, holding", DecisionKind.HOLD)
        level = seen[min(len(seen) - 1, max(0, math.ceil(self.quantile * len(seen)) - 1))]
        desired = max(self.min_replicas, min(self.max_replicas, math.ceil(self.factor * level - 1e-9)))
        which = "largest" if self.quantile >= 1.0 else f"p{self.quantile * 100:g}"
        return Decision(
            desired,
            f"trailing: {self.factor:g} x {level} (the {which} of the last {len(seen)} intervals' bound counts)",
            DecisionKind.STATIC,
        )
