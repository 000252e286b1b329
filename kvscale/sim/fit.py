"""The workload a trace implies: length distributions, rate profile and burstiness, and what
was assumed to get them (for `kvscale plan --trace` and the simulator's plan)."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from kvscale.sim.run import bucket_rates
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.workload import Burstiness, LengthDistribution, Workload

BURST_WINDOW_S = 5.0  # the index of dispersion is measured over windows this long
RATE_BUCKET_S = 60.0  # the rate profile: requests per minute
SIZING_RATE_QUANTILE = 0.9  # a fixed fleet is sized for the 90th percentile minute by default


@dataclass(frozen=True)
class FittedWorkload:
    """A trace summarized: the workload to plan for, and the figures it came from."""

    workload: Workload  # at the sizing rate, with the fitted lengths and burstiness
    mean_rate_per_s: float
    peak_minute_rate_per_s: float
    minute_rate_cv: float  # coefficient of variation of the per-minute rate
    prompt_mean_swing: float  # largest / smallest per-minute mean prompt (busy minutes only)
    requests: int
    span_s: float
    assumptions: tuple[str, ...]

    def describe(self) -> list[str]:
        w = self.workload
        i, o = w.inputs, w.outputs
        return [
            f"{self.requests} requests over {self.span_s / 60:.1f} min: mean {self.mean_rate_per_s:.2f} req/s, "
            f"busiest minute {self.peak_minute_rate_per_s:.2f} req/s, per-minute CV {self.minute_rate_cv:.2f}",
            f"prompt tokens: mean {i.mean:.0f}, p50 {i.quantile(0.5)}, p99 {i.quantile(0.99)}; "
            f"output tokens: mean {o.mean:.0f}, p50 {o.quantile(0.5)}, p99 {o.quantile(0.99)}",
            f"burstiness: index of dispersion {w.arrivals.index_of_dispersion:.1f} over "
            f"{w.arrivals.window_s:g}s windows (1 is Poisson)"
            + (
                f", {w.arrivals.burst_share:.0%} of requests in bursts of ~{w.arrivals.companions_span + 1:.0f}"
                if w.arrivals.burst_share < 1.0
                else ""
            )
            + f"; per-minute mean prompt moves {self.prompt_mean_swing:.1f}x",
            *self.assumptions,
        ]


def fit_trace(
    trace: list[TraceRequest], rate_quantile: float = SIZING_RATE_QUANTILE, sample: int = 20_000, seed: int = 0
) -> FittedWorkload:
    """Fits lengths (from up to `sample` requests), the per-minute rate profile and the
    index of dispersion over BURST_WINDOW_S from a trace."""
    if not trace:
        raise ValueError("the trace has no requests to fit a workload from")
    rng = random.Random(seed)
    picked = trace if len(trace) <= sample else rng.sample(trace, sample)
    inputs = LengthDistribution.from_samples(r.input_tokens for r in picked)
    outputs = LengthDistribution.from_samples(r.output_tokens for r in picked)
    times = [r.arrival_s for r in trace]
    span = max(times[-1] - times[0], 1.0)
    burst = Burstiness.from_arrivals(times, BURST_WINDOW_S)
    rates = bucket_rates(trace, RATE_BUCKET_S) or [len(trace) / span]
    busy = sorted(rates)
    sizing_rate = busy[min(len(busy) - 1, int(rate_quantile * len(busy)))]
    mean_rate = len(trace) / span
    cv = statistics.pstdev(rates) / statistics.fmean(rates) if len(rates) > 1 and statistics.fmean(rates) > 0 else 0.0
    swing = _prompt_swing(trace)
    workload = Workload.of(inputs, outputs, max(sizing_rate, mean_rate), burstiness=burst)
    assumptions = (
        f"sized for the {rate_quantile:.0%} busiest minute ({workload.requests_per_s:.2f} req/s); "
        "the autoscaler follows the rest",
        f"lengths fitted from {len(picked)} requests into {len(inputs.tokens)} prompt and "
        f"{len(outputs.tokens)} output length bins (the tail keeps its own bins)",
        "no prefix-cache hits assumed (the trace does not say which prompts share a prefix)",
    )
    return FittedWorkload(
        workload=workload,
        mean_rate_per_s=mean_rate,
        peak_minute_rate_per_s=max(rates),
        minute_rate_cv=cv,
        prompt_mean_swing=swing,
        requests=len(trace),
        span_s=span,
        assumptions=assumptions,
    )


def _prompt_swing(trace: list[TraceRequest]) -> float:
    """Largest over smallest per-minute mean prompt, over minutes with at least 10 requests."""
    sums: dict[int, list[int]] = {}
    for r in trace:
        sums.setdefault(int(r.arrival_s // RATE_BUCKET_S), []).append(r.input_tokens)
    means = [sum(v) / len(v) for v in sums.values() if len(v) >= 10]
    if len(means) < 2 or min(means) <= 0:
        return 1.0
    return max(means) / min(means)
