"""What the policy sees each tick, and what it answers."""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def complete(self) -> bool:
        """Everything a scale-down decision needs is present and fresh."""
        return not self.stale and None not in (self.arrival_rate_per_s, self.running, self.waiting)

    @property
    def current_replicas(self) -> int:
        return self.ready_replicas + self.starting_replicas


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    capacity_per_replica: float | None = None  # requests/s one replica sustains within the SLO
    calibration: float = 1.0
