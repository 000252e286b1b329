"""`kvscale bench`'s pure part: the open-loop schedule it sends and the summary of what it
measured. No HTTP here (kvscale.cli.bench sends the requests)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvscale.sim.trace import TraceRequest


@dataclass(frozen=True)
class Arrival:
    at_s: float  # from the start of the run
    input_tokens: int
    output_tokens: int


def poisson_arrivals(
    rate_per_s: float, duration_s: float, input_tokens: int, output_tokens: int, seed: int
) -> list[Arrival]:
    """Open-loop Poisson arrivals at `rate_per_s` over [0, duration_s): exponential gaps from a
    seeded generator, so two runs with one seed send the same schedule."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        out.append(Arrival(t, input_tokens, output_tokens))
        t += rng.expovariate(rate_per_s)
    return out


def trace_arrivals(trace: Sequence[TraceRequest], duration_s: float | None) -> list[Arrival]:
    """A trace's own timestamps and lengths (its first request at 0), cut at `duration_s`."""
    return [
        Arrival(r.arrival_s, r.input_tokens, r.output_tokens)
        for r in trace
        if duration_s is None or r.arrival_s < duration_s
    ]


@dataclass
class Measured:
    """One request as the client saw it: when each streamed token arrived, in seconds from
    sending, or the error that ended it."""

    token_times_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def tpot_s(self) -> float | None:
        """(last - first) / (tokens - 1): the per-request mean, as vLLM's benchmark reports it."""
        t = self.token_times_s
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) >= 2 else None

    @property
    def gaps_s(self) -> list[float]:
        t = self.token_times_s
        return [b - a for a, b in itertools.pairwise(t)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation between order statistics (numpy's
    default, which vLLM's benchmark_serving uses); None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def summarize(
    results: Sequence[Measured],
    ttft_target_s: float | None = None,
    tpot_target_s: float | None = None,
    slo_percentile: float | None = None,
) -> dict[str, Any]:
    """The contract's keys (DESIGN.md, CLI contract: `kvscale bench`). A request that failed
    counts in `errors` and misses the SLO; the latencies are over the requests that succeeded.
    `slo_attainment` is None unless both targets are given."""
    ok = [r for r in results if r.error is None and r.token_times_s]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    gaps = [g for r in ok for g in r.gaps_s]
    attainment = None
    if ttft_target_s is not None and tpot_target_s is not None and results:
        met = sum(
            1 for r in ok if r.ttft_s is not None and r.ttft_s <= ttft_target_s and (r.tpot_s or 0.0) <= tpot_target_s
        )
        attainment = round(met / len(results), 5)
    out: dict[str, Any] = {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "ttft_p50_ms": _ms(percentile(ttfts, 50)),
        "ttft_p95_ms": _ms(percentile(ttfts, 95)),
        "ttft_p99_ms": _ms(percentile(ttfts, 99)),
        "tpot_p50_ms": _ms(percentile(tpots, 50)),
        "tpot_p99_ms": _ms(percentile(tpots, 99)),
        "itl_p99_ms": _ms(percentile(gaps, 99)),
        "slo_attainment": attainment,
        "output_tokens": sum(len(r.token_times_s) for r in ok),
    }
    if slo_percentile is not None:
        out["ttft_at_slo_percentile_ms"] = _ms(percentile(ttfts, slo_percentile))
        out["tpot_at_slo_percentile_ms"] = _ms(percentile(tpots, slo_percentile))
    return out
