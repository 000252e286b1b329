"""The plan checked before it is deployed: a sample of the workload replayed through the
simulator on the chosen configuration, beside the analytic prediction."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvscale.planner.search import Feasible
from kvscale.sim.engine import StepTimes
from kvscale.sim.policies import StaticPolicy
from kvscale.sim.report import attainment
from kvscale.sim.run import SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.workload import Slo

SAMPLE_SPAN_S = 600.0  # the busiest stretch of the trace this long is replayed
SAMPLE_MAX_REQUESTS = 3000  # fewer when the rate is high, so the check stays a few seconds
MAX_EXTRA_SHARE = 1.0  # more headroom is tried up to twice the planned replicas


@dataclass(frozen=True)
class PlanCheck:
    """What the simulator says about a plan: attainment on the sample with the planned
    replicas and, when that misses the SLO percentile, the replicas that reach it."""

    requests: int
    span_s: float
    rate_per_s: float
    planned_replicas: int
    planned_attainment: float
    replicas: int  # the fewest tried that reach the target (the planned count when it does)
    attainment: float
    target: float
    met: bool

    def describe(self, slo: Slo) -> str:
        head = (
            f"simulated check: {self.requests} requests ({self.span_s / 60:.1f} min at {self.rate_per_s:.2f} req/s, the "
            f"trace's busiest stretch scaled to the planned rate) on {self.planned_replicas} replica(s): "
            f"{self.planned_attainment:.2%} meet p{slo.percentile:g} TTFT/TPOT (target {self.target:.0%})"
        )
        if self.replicas == self.planned_replicas:
            return head
        if self.met:
            return f"{head}; missed, so more headroom: {self.replicas} replica(s) reach {self.attainment:.2%}"
        return f"{head}; missed, and even {self.replicas} replica(s) reach only {self.attainment:.2%}"


def sample(trace: list[TraceRequest], rate_per_s: float) -> list[TraceRequest]:
    """The busiest SAMPLE_SPAN_S of the trace (its bursts and length mix kept), its clock
    scaled so that its mean rate is `rate_per_s`, at most SAMPLE_MAX_REQUESTS long."""
    if not trace:
        return []
    times = [r.arrival_s for r in trace]
    best_start, best_count, j = 0, 0, 0
    for i, t in enumerate(times):
        while times[j] < t - SAMPLE_SPAN_S:
            j += 1
        if i - j + 1 > best_count:
            best_count, best_start = i - j + 1, j
    window = trace[best_start : best_start + best_count][:SAMPLE_MAX_REQUESTS]
    start = window[0].arrival_s
    span = max(window[-1].arrival_s - start, 1.0)
    factor = (len(window) / span) / rate_per_s if rate_per_s > 0 else 1.0  # > 1: play slower
    return [TraceRequest((r.arrival_s - start) * factor, r.input_tokens, r.output_tokens) for r in window]


def check_plan(chosen: Feasible, slo: Slo, replay: list[TraceRequest], routing: str = "service") -> PlanCheck:
    """Replays `replay` on the chosen configuration with its replicas warm; when the share of
    requests meeting both targets is below the SLO percentile, finds the fewest replicas (up
    to MAX_EXTRA_SHARE more) that reach it: the most first (when even they miss, that is the
    answer), then by bisection between the planned count and the most."""
    planned = chosen.prediction.replicas
    setup = SimSetup(chosen.config, slo, chosen.prediction.max_batch, 0.0, planned, routing=routing)
    target = slo.percentile / 100.0
    runs: dict[int, float] = {}
    steps = StepTimes(chosen.config)  # every run's step times: one configuration

    def run(n: int) -> float:
        if n not in runs:
            result = simulate(replace(setup, initial_replicas=n), Source(replay), StaticPolicy(n), steps=steps)
            runs[n] = attainment(result, slo)
        return runs[n]

    first = run(planned)
    n, got = planned, first
    if got < target:
        top = planned + max(1, round(planned * MAX_EXTRA_SHARE))
        n, got = top, run(top)
        lo = planned  # misses; n meets (when the most does)
        while got >= target and n - lo > 1:
            mid = (lo + n) // 2
            if run(mid) >= target:
                n, got = mid, runs[mid]
            else:
                lo = mid
    span = replay[-1].arrival_s - replay[0].arrival_s if replay else 0.0
    return PlanCheck(
        requests=len(replay),
        span_s=span,
        rate_per_s=len(replay) / span if span > 0 else 0.0,
        planned_replicas=planned,
        planned_attainment=first,
        replicas=n,
        attainment=got,
        target=target,
        met=got >= target,
    )
