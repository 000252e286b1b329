"""The operator's online capacity search inside a replay (issue 35, part 1): what deploys.

The operator's search worker, every KVSCALE_CAPACITY_INTERVAL, reads the service's workload
window (KVSCALE_WORKLOAD_WINDOW: the request rate, the engines' prompt and output length
histograms and their mean counters, the arrivals per KVSCALE_BURST_WINDOW), synthesizes
arrivals like it and runs the simulated sizing search (kvscale.control.capacity.measure ->
kvscale.sim.online). `OnlineRefresh` does the same in the simulator, causally: at each interval
it reads the replay's own arrivals of the window just past, as the engines' metrics would
count them (vLLM's 1-2-5 length buckets, counts per burst window, exact means), and hands them
to the same synthesis and search. The policy then acts on the confirmed figure where it is above
the model's for that traffic, and on the model's otherwise, as the operator does
(kvscale.control.capacity.raises); too few requests, or no fleet meeting the SLO on the replay,
keep what it acted on. Before the first search it acts on what it was given (the model's figure,
or the plan's confirmed one).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvscale.autoscaling.capacity import ConfirmedCapacity, SizingCapacity
from kvscale.autoscaling.observation import LengthHistogram, ObservedWorkload
from kvscale.engines.buckets import vllm_token_buckets
from kvscale.sim.online import MIN_REQUESTS, OnlineSearch, search_capacity, synthesize
from kvscale.sim.run import SimSetup
from kvscale.sim.trace import TraceRequest

# The operator's defaults (kvscale.control.settings): KVSCALE_CAPACITY_INTERVAL,
# KVSCALE_WORKLOAD_WINDOW, KVSCALE_BURST_WINDOW.
INTERVAL_S = 300.0
WINDOW_S = 600.0
COUNTS_STEP_S = 30.0


def _histogram(lengths: Sequence[int], bounds: tuple[float, ...]) -> LengthHistogram:
    """The lengths as an engine's histogram counts them: per bucket (lo, hi], the last open."""
    uppers = (*bounds, float("inf"))
    counts = [0.0] * len(uppers)
    for n in lengths:
        counts[bisect.bisect_left(bounds, n)] += 1.0
    return LengthHistogram(uppers, tuple(counts))


def observed_window(
    trace: Sequence[TraceRequest],
    arrivals_s: Sequence[float],
    now_s: float,
    window_s: float,
    step_s: float,
    max_len: int,
) -> tuple[ObservedWorkload, list[float]]:
    """The window before `now_s` as the operator reads it from the engines' metrics: the rate,
    the mean lengths, the length histograms in vLLM's buckets, and arrivals per `step_s`
    (oldest first). `arrivals_s`: the trace's arrival times (sorted), for the window's bounds."""
    start_s = max(0.0, now_s - window_s)
    lo, hi = bisect.bisect_left(arrivals_s, start_s), bisect.bisect_left(arrivals_s, now_s)
    seen = trace[lo:hi]
    span_s = now_s - start_s
    steps = max(1, int(span_s // step_s))
    counts = [0.0] * steps
    first_s = now_s - steps * step_s
    for r in seen:
        i = int((r.arrival_s - first_s) // step_s)
        if 0 <= i < steps:
            counts[i] += 1.0
    n = len(seen)
    bounds = vllm_token_buckets(max_len)
    workload = ObservedWorkload(
        time_s=now_s,
        window_s=span_s,
        requests_per_s=n / span_s if span_s > 0 else None,
        input_tokens_mean=sum(r.input_tokens for r in seen) / n if n else None,
        output_tokens_mean=sum(r.output_tokens for r in seen) / n if n else None,
        prompt_lengths=_histogram([r.input_tokens for r in seen], bounds) if n else None,
        output_lengths=_histogram([r.output_tokens for r in seen], bounds) if n else None,
    )
    return workload, counts


@dataclass
class OnlineRefresh:
    """The operator's capacity worker for one simulated service. `due(now_s)` says whether a
    search is due; `search(now_s)` runs it on the window before `now_s` and returns the
    capacity to act on from now (None: keep the current one)."""

    setup: SimSetup
    model: SizingCapacity
    trace: Sequence[TraceRequest]
    interval_s: float = INTERVAL_S
    window_s: float = WINDOW_S
    step_s: float = COUNTS_STEP_S
    min_requests: int = MIN_REQUESTS
    next_s: float = INTERVAL_S
    searches: list[tuple[float, OnlineSearch]] = field(default_factory=list)  # (time, outcome), for reports
    _arrivals_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._arrivals_s = [r.arrival_s for r in self.trace]
        self.next_s = self.interval_s

    def due(self, now_s: float) -> bool:
        return now_s >= self.next_s

    def search(self, now_s: float) -> SizingCapacity | ConfirmedCapacity | None:
        self.next_s = now_s + self.interval_s
        max_len = self.setup.cfg.model.max_context_tokens
        workload, counts = observed_window(self.trace, self._arrivals_s, now_s, self.window_s, self.step_s, max_len)
        observed = sum(counts)
        seed = len(self.searches)  # each search draws its own synthesis, reproducibly
        replay = synthesize(workload, max_len, seed, counts=counts, counts_step_s=self.step_s)
        found = search_capacity(
            self.setup.cfg,
            self.setup.slo,
            self.setup.max_batch,
            self.model,
            replay,
            observed,
            self.setup.routing,
            min_requests=self.min_requests,
        )
        self.searches.append((now_s, found))
        if found.confirmed_rate_per_s is None:
            return None
        if not found.confirmed_rate_per_s > found.analytic_rate_per_s:
            return self.model  # the model's figure stands below it (kvscale.control.capacity.raises)
        return ConfirmedCapacity(
            self.model,
            found.confirmed_rate_per_s,
            found.input_tokens,
            found.output_tokens,
            found.replay_rate_per_s,
            found.analytic_rate_per_s,
        )

    def on(self, setup: SimSetup, model: SizingCapacity) -> None:
        """The service runs on another configuration from now (a fleet replay's move to another
        GPU type: kvscale.sim.budget_run): later searches replay on it, against its model, as
        the operator's search runs on the current plan. The interval's schedule and the
        searches made stand."""
        self.setup = setup
        self.model = model
