"""What the policy sees each tick, and what it answers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class Observation:
    """Fleet-wide measurements over the last window. None means the metric was not available."""

    time_s: float
    ready_replicas: int
    starting_replicas: int
    arrival_rate_per_s: float | None = None
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    ttft_p_s: float | None = None  # at the SLO percentile
    tpot_p_s: float | None = None
    running: float | None = None  # requests running, summed over ready replicas
    waiting: float | None = None  # requests queued, summed
    kv_usage: float | None = None  # mean KV-cache use of ready replicas, 0..1
    stale: bool = False  # the metrics source answered with old samples
    tpot_source: str | None = None  # what the TPOT quantile was read from (per request, or inter-token)
    ttft_source: str | None = None  # set when the engine cannot report TTFT, saying why
    waiting_max: float | None = None  # the longest queue of one ready replica (None: unknown)
    # Start-to-ready seconds of replicas that became ready since the previous tick (pod
    # creation to Ready): what the policy learns its cold start from.
    started_to_ready_s: tuple[float, ...] = ()

    @property
    def complete(self) -> bool:
        """Everything a scale-down decision needs is present and fresh."""
        return not self.stale and None not in (self.arrival_rate_per_s, self.running, self.waiting)

    @property
    def current_replicas(self) -> int:
        return self.ready_replicas + self.starting_replicas


class DecisionKind(StrEnum):
    """The term of the policy that set a decision's replica count (a label value for
    dashboards and events; the decision's `reason` says the same in prose)."""

    FORECAST = "forecast"  # forecast arrivals over per-replica capacity, with headroom
    BURST_RESERVE = "burst_reserve"  # an upper quantile of arrivals over the cold-start horizon
    BACKLOG = "backlog"  # drain the queued requests within the TTFT budget
    FEEDBACK = "feedback"  # the observed SLO was missed: add beyond the model
    HOLD = "hold"  # fewer would not absorb the load, or a scale-down is not yet safe
    STABILIZATION = "stabilization"  # a scale-down waits for its stabilization window
    MISSING_METRICS = "missing_metrics"  # metrics missing or stale: hold, never scale down
    BOUNDS = "bounds"  # minReplicas or maxReplicas set the count
    STATIC = "static"  # a fixed count (baselines, schedules)


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    kind: DecisionKind = DecisionKind.STATIC
    capacity_per_replica: float | None = None  # requests/s one replica sustains within the SLO
    calibration: float = 1.0
    cold_start_s: float | None = None  # the cold start the policy planned with (learned or default)
