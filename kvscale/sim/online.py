"""The operator's online capacity search (issue 35, part 1): arrivals synthesized from what the
engines' metrics say of a recent window (the request rate, the burstiness counted per burst
window, the prompt and output length histograms), replayed through the simulated sizing search
that `plan --trace` runs (kvscale.sim.check.search_replicas) on the service's current plan.
The confirmed rate per replica is the replayed rate over the fewest warm replicas that meet
the SLO percentile on it.

Pure: plain values in, a value out; the operator times it and runs it in its search worker.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.autoscaling.observation import LengthHistogram, ObservedWorkload
from kvscale.sim.check import search_replicas, service_attainment
from kvscale.sim.engine import StepTimes
from kvscale.sim.fit import fit_trace
from kvscale.sim.policies import StaticPolicy
from kvscale.sim.report import attainment
from kvscale.sim.run import SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.load import ReplicaModel
from kvscale.sizing.workload import Slo, Workload

# Requests one search replays at most: a window with more is thinned at random to this many,
# over its whole span (`thinned`). Bounds the CPU per search: about 0.1-0.4 s on one core of the
# test machine (benchmarks/online_capacity.py).
MAX_REPLAY_REQUESTS = 1500
# The synthesized window (no counts read) holds at most this many times the replay before it is
# thinned: a busier window is synthesized over a shorter span at its rate.
MAX_SYNTHESIZED = 20
# Below this many observed requests in the window the search says too little: the analytic
# figure stays (one request is 1/200 of the sample: the p99 allows two misses).
MIN_REQUESTS = 200
# An open last bucket (le=+Inf) draws lengths from its lower bound up to this many times it.
OPEN_BUCKET_SPAN = 2.0
# The confirmed fleet's rate headroom (rate_headroom): at most this many times the observed rate
# (a replica carrying 1/MAX_SPEEDUP of its capacity is confirmed at MAX_SPEEDUP times its load),
# found to within this share.
MAX_SPEEDUP = 64.0
HEADROOM_TOLERANCE = 0.05
WINDOW_NOISE_SDS = 1.0  # a window's attainment may fall this many standard deviations short (search_capacity)


@dataclass(frozen=True)
class OnlineSearch:
    """One search's outcome. `confirmed_rate_per_s` is None when no fleet met the SLO on the
    replay (or there was too little to replay); `requests`: how many the search replayed."""

    requests: int
    observed_requests: float  # arrivals the window held (rate x window)
    replay_rate_per_s: float
    input_tokens: float  # the replay's mean lengths
    output_tokens: float
    analytic_rate_per_s: float  # the model's rate per replica on the replay's traffic (lengths, rate, burstiness)
    analytic_replicas: int
    replicas: int | None  # the fewest warm replicas meeting the SLO (None: none did, or not run)
    attainment: float | None
    confirmed_rate_per_s: float | None
    reason: str  # why it stands as it does, in a sentence


def _draw_length(rng: random.Random, histogram: LengthHistogram, cap: int) -> int:
    """One length from the histogram: a bucket drawn by its count, uniform within it."""
    pick = rng.random() * histogram.total
    lower = 0.0
    for bound, count in zip(histogram.upper_bounds, histogram.counts, strict=True):
        if pick < count or (count > 0 and bound == histogram.upper_bounds[-1]):
            upper = bound if math.isfinite(bound) else max(lower, 1.0) * OPEN_BUCKET_SPAN
            return max(1, min(cap, round(rng.uniform(lower, upper))))
        pick -= count
        lower = bound if math.isfinite(bound) else lower
    return max(1, min(cap, round(lower)))


def _lengths(
    rng: random.Random, n: int, histogram: LengthHistogram | None, mean: float | None, cap: int
) -> list[int] | None:
    """`n` lengths drawn from the histogram and scaled to the observed mean (the histogram's
    buckets are coarse: the mean counter is exact); the mean alone when there is no histogram;
    None when neither was read."""
    if histogram is not None and histogram.total > 0:
        drawn = [_draw_length(rng, histogram, cap) for _ in range(n)]
        if mean is not None and mean > 0 and drawn:
            factor = mean / (sum(drawn) / len(drawn))
            drawn = [max(1, min(cap, round(x * factor))) for x in drawn]
        return drawn
    if mean is not None and mean > 0:
        return [max(1, min(cap, round(mean)))] * n
    return None


def from_counts(counts: Sequence[float], step_s: float, rng: random.Random, max_requests: int) -> list[float]:
    """Arrival times from requests counted per `step_s` (oldest first): each step's count
    (rounded at random, keeping the expected total) placed uniformly within it; at most the
    thinned to `max_requests` (`thinned`), from the start of the first step they fall in."""
    times: list[float] = []
    for i, c in enumerate(counts):
        whole = math.floor(c) + (1 if rng.random() < c - math.floor(c) else 0)
        times.extend(sorted(rng.uniform(i * step_s, (i + 1) * step_s) for _ in range(whole)))
    times = thinned(times, max_requests, rng)
    if not times:
        return []
    first = math.floor(times[0] / step_s) * step_s  # the steps keep their edges
    return [t - first for t in times]


def thinned(times: list[float], most: int, rng: random.Random) -> list[float]:
    """At most `most` of the (sorted) arrival times, each kept alike at random, in order.
    Behind a Service a fleet of n replicas routes each arrival to one at random: each replica
    serves a random thinning of the traffic, so a thinned replay over the whole window sizes a
    replica as the full one does, where a contiguous stretch of as many requests would last a
    few seconds at a high rate and hide a queue that builds up over minutes. Behind a gateway it
    pools fewer replicas than the traffic would: it errs toward fewer requests per replica."""
    if len(times) <= most:
        return times
    return [times[i] for i in sorted(rng.sample(range(len(times)), most))]


def synthesize(
    workload: ObservedWorkload,
    max_context_tokens: int,
    seed: int = 0,
    max_requests: int = MAX_REPLAY_REQUESTS,
    counts: Sequence[float] | None = None,
    counts_step_s: float | None = None,
) -> list[TraceRequest]:
    """Arrivals like the window's, with prompt and output lengths drawn from the engines'
    histograms, thinned at random to `max_requests` over the window (`thinned`). With `counts`
    (requests per `counts_step_s` over the window, at scrape resolution) the arrivals follow
    them; without, the observed rate over the window (at most MAX_SYNTHESIZED x `max_requests`,
    over a shorter span at the same rate), in bursts as
    the burstiness counted them (a share of the arrivals in bursts of the observed size, each
    within one burst window; the rest Poisson). Empty when the rate (or the counts) or the
    lengths were not read, or the window held no request."""
    rng = random.Random(seed)
    if counts is not None and counts_step_s is not None and counts_step_s > 0 and sum(counts) >= 2:
        return _with_lengths(workload, from_counts(counts, counts_step_s, rng, max_requests), max_context_tokens, rng)
    rate = workload.requests_per_s
    if rate is None or not rate > 0 or not workload.window_s > 0:
        return []
    total = min(MAX_SYNTHESIZED * max_requests, math.floor(rate * workload.window_s))
    if total < 2:
        return []
    span_s = total / rate
    burst = workload.burstiness
    times: list[float] = []
    if burst is not None and burst.index_of_dispersion > 1.0:
        size = max(1, round(burst.companions_span + 1.0))
        bursty = round(total * burst.burst_share)
        bursts = max(1, bursty // size) if size > 1 else 0
        for _ in range(bursts if size > 1 else 0):
            start = rng.uniform(0.0, max(span_s - burst.window_s, 0.0))
            times.extend(start + rng.uniform(0.0, burst.window_s) for _ in range(size))
    alone = total - len(times)
    times.extend(rng.uniform(0.0, span_s) for _ in range(max(0, alone)))
    times.sort()
    return _with_lengths(workload, thinned(times[:total], max_requests, rng), max_context_tokens, rng)


def _with_lengths(
    workload: ObservedWorkload, times: list[float], max_context_tokens: int, rng: random.Random
) -> list[TraceRequest]:
    total = len(times)
    if total < 2:
        return []
    out_cap = max(1, max_context_tokens - 1)
    outputs = _lengths(rng, total, workload.output_lengths, workload.output_tokens_mean, out_cap)
    inputs = _lengths(rng, total, workload.prompt_lengths, workload.input_tokens_mean, out_cap)
    if inputs is None or outputs is None:
        return []
    # a request never asks more than the context holds: the prompt gives way
    return [
        TraceRequest(t, max(1, min(i, max_context_tokens - o)), o)
        for t, i, o in zip(times, inputs, outputs, strict=True)
    ]


def search_capacity(
    cfg: ServingConfig,
    slo: Slo,
    max_batch: int,
    model: SizingCapacity,
    replay: list[TraceRequest],
    observed_requests: float,
    routing: str = "service",
    most: int | None = None,
    min_requests: int = MIN_REQUESTS,
) -> OnlineSearch:
    """The simulated sizing search on `replay`, started from the model's count at the replay's
    rate: the fewest warm replicas meeting the SLO percentile behind `routing` (at most
    `most`), and the rate per replica that confirms. Fewer than `min_requests` observed (or a
    replay too short) runs nothing and says so."""
    n = len(replay)
    span = replay[-1].arrival_s - replay[0].arrival_s if n >= 2 else 0.0
    rate = n / span if span > 0 else 0.0
    inp = sum(r.input_tokens for r in replay) / n if n else 0.0
    out = sum(r.output_tokens for r in replay) / n if n else 0.0
    # The model on the replay's own traffic (its lengths, rate and burstiness), not the plan's
    # shape: the confirmed figure over this one is the model's error (ConfirmedCapacity)
    own = (
        SizingCapacity(
            model.cfg, model.slo, model.max_batch, fit_trace(replay).workload.at_rate(rate), model.least_loaded
        )
        if n >= 2 and rate > 0
        else model
    )
    modelled = own.rate_per_replica(inp, out, fleet_rate_per_s=rate) if n else 0.0
    if modelled > 0:
        analytic = max(1, math.ceil(rate / modelled))
    else:  # a model that gives this traffic no rate: the fewest its no-queueing capacity needs
        fewest = ReplicaModel(cfg, Workload(max(1, round(inp)), max(1, round(out)), rate)).capacity_rate_per_s(
            max_batch
        )
        analytic = max(1, math.ceil(rate / fewest)) if n and fewest > 0 else 1
    if most is not None:
        analytic = max(1, min(analytic, most))
    base = OnlineSearch(n, observed_requests, rate, inp, out, modelled, analytic, None, None, None, "")
    if observed_requests < min_requests or n < 2 or not rate > 0:
        why = (
            f"{observed_requests:.0f} request(s) observed in the window, fewer than the {min_requests} "
            "the search needs: the model's figure stands"
        )
        return replace(base, reason=why)
    setup = SimSetup(cfg, slo, max_batch, 0.0, analytic, routing=routing)
    steps = StepTimes(cfg)
    target = slo.percentile / 100.0

    def attain_on(arrivals: list[TraceRequest], k: int) -> float:
        if routing == "service":
            return service_attainment(setup, arrivals, k, steps)
        result = simulate(replace(setup, initial_replicas=k), Source(arrivals), StaticPolicy(k), steps=steps)
        return attainment(result, slo)

    seen: dict[int, float] = {}
    noise = math.sqrt(target * (1.0 - target) / n)
    # A window's attainment is a sample of the service's: a fleet meeting the percentile over
    # time misses it in about half its windows by up to a standard deviation. A window is met
    # within WINDOW_NOISE_SDS of them, or every window would be sized for its own worst draw.
    met_at = target - WINDOW_NOISE_SDS * noise
    replicas, met = search_replicas(lambda k: attain_on(replay, k), analytic, met_at, seen, most=most, noise=noise)
    reached = seen.get(replicas)
    if reached is None:
        reached = seen[replicas] = attain_on(replay, replicas)
    if not met:
        why = (
            f"no fleet up to {max(seen)} replica(s) meets p{slo.percentile:g} on the {n} replayed requests "
            f"(the closest, {replicas}, reaches {reached:.2%}): the model's figure stands"
        )
        return replace(base, replicas=replicas, attainment=reached, reason=why)
    scale = rate_headroom(lambda f: attain_on(faster(replay, f), replicas) >= met_at, replicas, seen)
    confirmed = scale * rate / replicas
    why = (
        f"{replicas} warm replica(s) meet p{slo.percentile:g} ({reached:.2%}) on {n} requests replayed at "
        f"{rate:.3g} req/s, and up to {scale * rate:.3g} req/s played faster; the model asked for {analytic}"
    )
    return replace(base, replicas=replicas, attainment=reached, confirmed_rate_per_s=confirmed, reason=why)


def faster(replay: list[TraceRequest], factor: float) -> list[TraceRequest]:
    """The replay played `factor` times faster: the same requests at `factor` times the rate."""
    return [TraceRequest(r.arrival_s / factor, r.input_tokens, r.output_tokens) for r in replay]


def rate_headroom(meets: Callable[[float], bool], replicas: int, seen: dict[int, float]) -> float:
    """How much faster the replay can play on the confirmed `replicas` and still meet the SLO:
    the fewest replicas of a quiet window (one, at a fraction of its capacity) say only that a
    replica carries at least the rate. Bracketed by the largest count that missed (n - 1 missed
    at the rate, so n replicas miss by n / (n - 1) or so) or, with none, by doubling up to
    MAX_SPEEDUP; bisected to within HEADROOM_TOLERANCE."""
    below = max((k for k in seen if k < replicas), default=0)
    lo, hi = 1.0, (replicas / below if below else None)
    if hi is None:
        f = 2.0
        while f <= MAX_SPEEDUP and meets(f):
            lo, f = f, 2 * f
        if f > MAX_SPEEDUP:
            return lo
        hi = f
    elif meets(hi):
        return hi
    while hi / lo > 1.0 + HEADROOM_TOLERANCE:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo
