"""What the policy sees each tick, and what it answers."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kvscale.autoscaling.holding import Regime
from kvscale.sizing.workload import BURST_SHARE_MIN_DISPERSION, Burstiness


@dataclass(frozen=True)
class LengthHistogram:
    """Requests per token-length bucket, as an engine's length histogram counts them over a
    window: `counts[i]` requests (or requests/s) of length in (upper_bounds[i-1],
    upper_bounds[i]]; the last bound may be infinite."""

    upper_bounds: tuple[float, ...]
    counts: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.upper_bounds) != len(self.counts):
            raise ValueError(f"{len(self.upper_bounds)} bucket bounds but {len(self.counts)} counts")
        if list(self.upper_bounds) != sorted(self.upper_bounds):
            raise ValueError("bucket bounds must increase")
        if any(not (c >= 0 and math.isfinite(c)) for c in self.counts):
            raise ValueError("bucket counts must be finite and non-negative")

    @classmethod
    def from_cumulative(cls, buckets: list[tuple[float, float]]) -> LengthHistogram | None:
        """From Prometheus's cumulative (le, count) pairs, in any order; None when empty. A
        count below the previous bucket's (counters reset between scrapes) counts as none."""
        ordered = sorted(buckets)
        bounds, counts, below = [], [], 0.0
        for le, cumulative in ordered:
            if not math.isfinite(cumulative):
                return None
            bounds.append(le)
            counts.append(max(0.0, cumulative - below))
            below = max(below, cumulative)
        if not counts or sum(counts) <= 0:
            return None
        return cls(tuple(bounds), tuple(counts))

    @property
    def total(self) -> float:
        return sum(self.counts)

    def quantile(self, q: float) -> float:
        """Prometheus's histogram_quantile: linear within the bucket that holds rank q; in the
        open last bucket, its lower bound."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        rank, below, lower = q * self.total, 0.0, 0.0
        for bound, count in zip(self.upper_bounds, self.counts, strict=True):
            if count > 0 and below + count >= rank:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * (rank - below) / count
            below += count
            lower = bound if math.isfinite(bound) else lower
        return lower


@dataclass(frozen=True)
class ObservedWorkload:
    """The work that arrived over a window longer than a tick's (minutes), with the peaks of
    a short-window rate over the last hour and day: what the service is re-planned for."""

    time_s: float
    window_s: float  # the window the rates, means and histograms cover
    requests_per_s: float | None = None
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    prompt_lengths: LengthHistogram | None = None
    output_lengths: LengthHistogram | None = None
    prompt_tokens_per_s: float | None = None  # every prompt token, cached or not
    prefill_tokens_per_s: float | None = None  # prompt tokens computed: after prefix-cache hits
    decode_tokens_per_s: float | None = None
    prefix_cache_hit_ratio: float | None = None  # of the prompt tokens looked up, found in the cache
    peak_window_s: float | None = None  # the short window of the peak rates below
    peak_requests_per_s_1h: float | None = None
    peak_requests_per_s_1d: float | None = None
    peak_prefill_tokens_per_s_1h: float | None = None
    peak_prefill_tokens_per_s_1d: float | None = None
    # The index of dispersion of the requests arriving per `burst_window_s` over the window
    # (1: Poisson; see kvscale.metrics.promql.arrival_dispersion): None when unread.
    arrival_dispersion: float | None = None
    burst_window_s: float | None = None
    # Of the arrivals over the window, the share in burst windows far above the mean before
    # them (None: no window was), and the size-biased mean of those windows' arrivals above
    # that mean: the burst a request of one finds.
    arrivals_in_bursts: float | None = None
    burst_requests: float | None = None

    @property
    def burst_windows(self) -> float:
        """How many burst windows the window holds: what the dispersion was estimated from."""
        return self.window_s / self.burst_window_s if self.burst_window_s else 0.0

    @property
    def burstiness(self) -> Burstiness | None:
        """The arrivals' burstiness as the planner takes it; None when unread or estimated
        from fewer than MIN_BURST_WINDOWS windows (a missing measure is never Poisson)."""
        d, b = self.arrival_dispersion, self.burst_window_s
        if d is None or b is None or not math.isfinite(d) or d < 0 or self.burst_windows < MIN_BURST_WINDOWS:
            return None
        d = max(d, MIN_DISPERSION)
        share, size = self.arrivals_in_bursts, self.burst_requests
        # The rule of Burstiness.from_arrivals (what `plan --trace` fits): near Poisson, or no
        # window far above its neighbours, every request is taken as in a burst of D.
        if d < BURST_SHARE_MIN_DISPERSION or share is None or size is None or not (share > 0.0 and size > 0.0):
            return Burstiness(d, b)
        if not (math.isfinite(share) and math.isfinite(size)):
            return Burstiness(d, b)
        return Burstiness(d, b, min(1.0, share), max(1.0, size))


MIN_BURST_WINDOWS = 8  # burst windows in the workload window before their dispersion says anything
MIN_DISPERSION = 0.05  # as Burstiness.from_arrivals floors it


def dispersion_of_counts(counts: Sequence[float]) -> float | None:
    """The index of dispersion the operator reads from Prometheus (kvscale.metrics.promql
    `arrival_dispersion`), over the arrivals counted in consecutive windows: the mean squared
    difference of neighbouring counts over twice the mean count. First differences take a
    slow drift of the rate out (a ramp adds only its slope squared), as Burstiness.from_arrivals
    does by comparing each window with its minute. None without two counts or arrivals."""
    if len(counts) < 2 or sum(counts) <= 0:
        return None
    squares = [(b - a) ** 2 for a, b in itertools.pairwise(counts)]
    return (sum(squares) / len(squares)) / (2.0 * sum(counts) / len(counts))


def bursts_of_counts(
    counts: Sequence[float], mean_windows: int, first: int = 0, sds: float = 3.0
) -> tuple[float, float] | None:
    """The burst share and size the operator reads (kvscale.metrics.promql `burst_queries`:
    `arrivals_in_bursts`, `burst_requests`) from arrivals counted in consecutive windows, over
    the windows from `first` on (those before only feed the means): a window holds a burst
    when its count is more than `sds` Poisson standard deviations and one above the mean of
    the last `mean_windows` windows (itself included); the share is the arrivals in such
    windows over all, the size their excess over that mean, size-biased (sum of squares over
    sum). None when no window holds one."""
    bursty = squares = excess = 0.0
    for i in range(first, len(counts)):
        recent = counts[max(0, i - mean_windows + 1) : i + 1]
        local = sum(recent) / len(recent)
        c = counts[i]
        if c > local + sds * math.sqrt(local) + 1.0:
            bursty += c
            squares += (c - local) ** 2
            excess += c - local
    total = sum(counts[first:])
    if bursty <= 0 or excess <= 0 or total <= 0:
        return None
    return bursty / total, squares / excess


def dispersion_noise(windows: float) -> float:
    """The relative standard error of `dispersion_of_counts` over `windows` counts of a
    stationary stream: sqrt(3 / (n - 1)) (neighbouring differences share a count; checked by
    simulation in tests/unit/test_burstiness.py); infinite below two windows."""
    return math.sqrt(3.0 / (windows - 1.0)) if windows > 2.0 else math.inf


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
    # Work units over the tick's window (None: the engine does not export them, or no data).
    prompt_tokens_per_s: float | None = None  # every prompt token, cached or not
    prefill_tokens_per_s: float | None = None  # prompt tokens computed: after prefix-cache hits
    decode_tokens_per_s: float | None = None  # generated tokens
    prefix_cache_hit_ratio: float | None = None  # of the prompt tokens looked up, found in the cache

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
    # Replicas its forecast asks for one lead further (policy.replicas_ahead): the room a GPU
    # budget holds for it ahead of need; None when the policy says nothing of capacity.
    lead_replicas: int | None = None
    # Which regime set the level (absorbing bursts, following a trend, reacting to a sustained
    # change); None for decisions made without one (missing metrics, baselines).
    regime: Regime | None = None
