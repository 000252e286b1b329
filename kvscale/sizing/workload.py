"""What the user asks for: a workload and a latency objective, in SI units.

A workload is a stream of requests whose prompt and output lengths follow distributions
(`LengthDistribution`: weighted representative lengths, the mean-value workload being one
point) and whose arrivals are more or less bursty than Poisson at short time scales
(`Burstiness`: the index of dispersion of arrival counts over a window). `Workload(input,
output, rate)` is still the mean-value workload: constant lengths, Poisson arrivals.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from statistics import NormalDist

# Probability edges of the bins a sample is summarized into: finer in the upper tail, where
# the SLO percentile lives (the last bins hold the top 1% and 0.2%).
SAMPLE_BIN_EDGES = (0.0, 0.2, 0.4, 0.6, 0.75, 0.85, 0.92, 0.96, 0.99, 0.998, 1.0)


@dataclass(frozen=True)
class LengthDistribution:
    """Token lengths as a discrete mixture: `tokens[i]` with probability `weights[i]`.

    Each point stands for a bin of requests (its mean length), so the mean is exact and the
    quantiles are those of the bins. `constant(n)` is the mean-value special case.

    `spans[i]` (optional): the shortest and longest length in point i's bin, where known (a
    sample's bins, a histogram's buckets). A share of requests beyond a length (the prompts
    whose own prefill exceeds the TTFT target) then moves continuously with that length
    (`pieces`), instead of in steps of a whole bin.
    """

    tokens: tuple[int, ...]
    weights: tuple[float, ...]
    spans: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("a length distribution needs at least one point")
        if len(self.tokens) != len(self.weights):
            raise ValueError(f"{len(self.tokens)} lengths but {len(self.weights)} weights: give one weight per length")
        if self.spans is not None and len(self.spans) != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} lengths but {len(self.spans)} spans: give one span per length")
        if any(t < 1 for t in self.tokens):
            raise ValueError(f"every length must be at least 1 token, got {min(self.tokens)}")
        if any(not (w >= 0 and math.isfinite(w)) for w in self.weights):
            raise ValueError("weights must be finite and non-negative")
        total = sum(self.weights)
        if not total > 0:
            raise ValueError("weights must not all be zero")
        spans = self.spans if self.spans is not None else tuple((t, t) for t in self.tokens)
        triples = sorted(zip(self.tokens, self.weights, spans, strict=True))
        merged: dict[int, float] = {}
        merged_spans: dict[int, tuple[int, int]] = {}
        for t, w, (lo, hi) in triples:
            if w > 0:
                merged[t] = merged.get(t, 0.0) + w / total
                # a span holds its mean: clamped to it, and joined with a merged point's
                lo, hi = min(max(1, int(lo)), t), max(int(hi), t)
                known = merged_spans.get(t)
                merged_spans[t] = (lo, hi) if known is None else (min(known[0], lo), max(known[1], hi))
        object.__setattr__(self, "tokens", tuple(merged))
        object.__setattr__(self, "weights", tuple(merged.values()))
        has_spread = self.spans is not None and any(lo < hi for lo, hi in merged_spans.values())
        object.__setattr__(self, "spans", tuple(merged_spans.values()) if has_spread else None)

    @classmethod
    def constant(cls, tokens: int) -> LengthDistribution:
        return cls((tokens,), (1.0,))

    @classmethod
    def from_samples(cls, samples: Iterable[int], edges: Sequence[float] = SAMPLE_BIN_EDGES) -> LengthDistribution:
        """Summarizes observed lengths: one point per probability bin (`edges`), at the bin's
        mean length, so the mean is preserved and the tail keeps its own points; each bin's
        shortest and longest sample are its span."""
        values = sorted(max(1, int(s)) for s in samples)
        if not values:
            raise ValueError("no samples to fit a length distribution from")
        n = len(values)
        tokens: list[int] = []
        weights: list[float] = []
        spans: list[tuple[int, int]] = []
        for lo, hi in itertools.pairwise(edges):
            a, b = round(lo * n), round(hi * n)
            if b <= a:
                continue
            chunk = values[a:b]
            tokens.append(max(1, round(sum(chunk) / len(chunk))))
            weights.append(len(chunk) / n)
            spans.append((chunk[0], chunk[-1]))
        return cls(tuple(tokens), tuple(weights), tuple(spans))

    @classmethod
    def from_histogram(cls, upper_bounds: Sequence[float], counts: Sequence[float]) -> LengthDistribution:
        """From a cumulative-free histogram (Prometheus buckets after differencing): bucket i
        holds counts[i] requests of length in (upper_bounds[i-1], upper_bounds[i]]; each is
        placed at its midpoint (the first bucket at half its bound, an infinite one at twice
        the last finite bound), its bounds its span."""
        if len(upper_bounds) != len(counts):
            raise ValueError("give one count per bucket bound")
        tokens: list[int] = []
        weights: list[float] = []
        spans: list[tuple[int, int]] = []
        lower = 0.0
        finite = [b for b in upper_bounds if math.isfinite(b)]
        for bound, count in zip(upper_bounds, counts, strict=True):
            top = bound if math.isfinite(bound) else 2.0 * (finite[-1] if finite else 1.0)
            if count > 0:
                tokens.append(max(1, round((lower + top) / 2.0)))
                weights.append(float(count))
                spans.append((max(1, math.floor(lower) + 1), max(1, math.floor(top))))
            lower = top
        if not tokens:
            raise ValueError("the histogram is empty")
        return cls(tuple(tokens), tuple(weights), tuple(spans))

    @property
    def mean(self) -> float:
        return sum(t * w for t, w in zip(self.tokens, self.weights, strict=True))

    @property
    def max(self) -> int:
        return self.tokens[-1]

    @property
    def is_constant(self) -> bool:
        return len(self.tokens) == 1 and self.spans is None

    @property
    def points(self) -> tuple[tuple[int, float], ...]:
        return tuple(zip(self.tokens, self.weights, strict=True))

    @cached_property
    def pieces(self) -> tuple[tuple[int, int, float], ...]:
        """The mixture as pieces of evenly spread lengths (shortest, longest, weight), in
        order: each point's bin as two, from its span's start to its mean and from its mean to
        the span's end, weighted so the bin's mean is kept (a share (end - mean) / (end -
        start) below the mean). The least a span and a mean say of the bin, and enough that
        the share beyond a length moves continuously with it. Without spans, the points."""
        if self.spans is None:
            return tuple((t, t, w) for t, w in self.points)
        out: list[tuple[int, int, float]] = []
        for t, w, (lo, hi) in zip(self.tokens, self.weights, self.spans, strict=True):
            if hi <= lo:
                out.append((t, t, w))
                continue
            below = (hi - t) / (hi - lo)  # a mean at an end of its span: all of it there
            if below > 0.0:
                out.append((lo, t, w * below))
            if below < 1.0:
                out.append((t, hi, w * (1.0 - below)))
        return tuple(out)

    def quantile(self, q: float) -> int:
        """The smallest length with at least q of the mass at or below it (q in [0, 1])."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        acc = 0.0
        for t, w in self.points:
            acc += w
            if acc >= q - 1e-12:
                return t
        return self.tokens[-1]

    def spread_quantile(self, q: float) -> int:
        """The length with a share q of the requests at or below it, read from the spread
        pieces (`pieces`: continuous in q where spans are known; `quantile` without them)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        acc = 0.0
        for lo, hi, w in self.pieces:
            if acc + w >= q - 1e-12:
                inside = min(1.0, max(0.0, (q - acc) / w)) if w > 0 else 1.0
                return max(1, math.ceil(lo + inside * (hi - lo) - 1e-9))
            acc += w
        return self.pieces[-1][1]

    def scaled(self, factor: float) -> LengthDistribution:
        """Every length times `factor` (at least 1 token): a length mix that drifted."""
        spans = (
            tuple((max(1, round(lo * factor)), max(1, round(hi * factor))) for lo, hi in self.spans)
            if self.spans is not None
            else None
        )
        return LengthDistribution(tuple(max(1, round(t * factor)) for t in self.tokens), self.weights, spans)


BURST_WINDOW_SDS = 3.0  # a window this many Poisson standard deviations above its minute's mean holds a burst
BURST_MAX_WINDOWS = 2  # a burst spans at most this many windows (a batch across one edge); longer is a surge
BURST_SHARE_MIN_DISPERSION = 1.5  # below this the arrivals are near Poisson: every request is taken as in a burst


@dataclass(frozen=True)
class Burstiness:
    """How bursty arrivals are at a short time scale: the index of dispersion (variance over
    mean) of the number of arrivals in windows of `window_s`. 1 is Poisson; batch
    submissions of N requests give about N; below 1 is smoother than Poisson."""

    index_of_dispersion: float = 1.0
    window_s: float = 5.0
    # Share of arrivals that come in bursts (the rest arrive alone): batch submissions over a
    # base load put a few requests in large bursts rather than every request in a small one.
    burst_share: float = 1.0
    # Requests in the burst a request of one belongs to (size-biased); 0: (D - 1) / share + 1.
    burst_requests: float = 0.0

    def __post_init__(self) -> None:
        if not (self.index_of_dispersion > 0 and math.isfinite(self.index_of_dispersion)):
            raise ValueError(f"index of dispersion must be positive, got {self.index_of_dispersion}")
        if not self.window_s > 0:
            raise ValueError(f"burstiness window must be positive, got {self.window_s}")
        if not 0.0 < self.burst_share <= 1.0:
            raise ValueError(f"burst share must be in (0, 1], got {self.burst_share}")
        if not (self.burst_requests >= 0.0 and math.isfinite(self.burst_requests)):
            raise ValueError(f"burst size must be a non-negative number of requests, got {self.burst_requests}")

    @property
    def companions_span(self) -> float:
        """Other requests a request of a burst may find ahead of it (placed uniformly around
        it): the fitted burst's others, else from the excess dispersion D - 1, which is the
        burst share times the (size-biased) burst: (D - 1) / share others."""
        if self.burst_requests > 0.0:
            return self.burst_requests - 1.0
        return max(0.0, self.index_of_dispersion - 1.0) / self.burst_share

    def beyond(self, extra_rate_per_s: float) -> Burstiness:
        """The bursts a fleet sized for `extra_rate_per_s` above the rate they were fitted at
        still sees: a burst's excess arrives within about one window, of which the spare
        rate carries extra x window requests as they come. Where the fleet is sized for the
        surge itself (the rate the policy holds is the peak the bursts rose to), little or
        nothing of the burst is left; at the fitted rate, the burst as fitted."""
        if not extra_rate_per_s > 0.0:
            return self
        return self._with_companions(self.companions_span - extra_rate_per_s * self.window_s)

    def at_most(self, requests: float) -> Burstiness:
        """Bursts of no more than `requests` (a span known to hold that few arrivals cannot
        hold a larger burst)."""
        return self._with_companions(requests - 1.0)

    def _with_companions(self, others: float) -> Burstiness:
        """The same bursts with at most `others` companions, the excess dispersion cut in
        proportion."""
        companions = self.companions_span
        # The tolerance: `at_most(n)` passes n - 1, which rounds below n - 1 in the last bit.
        if companions <= 0.0 or others >= companions - 1e-9 * max(1.0, companions):
            return self
        left = max(0.0, others)
        dispersion = 1.0 + (self.index_of_dispersion - 1.0) * left / companions
        size = 1.0 + left if self.burst_requests > 0.0 else 0.0
        return Burstiness(max(dispersion, 1e-9), self.window_s, self.burst_share, size)

    @classmethod
    def poisson(cls) -> Burstiness:
        return cls()

    @property
    def is_poisson(self) -> bool:
        return abs(self.index_of_dispersion - 1.0) < 1e-9

    def dispersion_at(self, window_s: float) -> float:
        """The index of dispersion over another window length. Bursts last about `window_s`:
        over longer windows whole bursts are counted and the excess over Poisson stays;
        over shorter ones a burst is cut and its excess shrinks in proportion."""
        excess = self.index_of_dispersion - 1.0
        if window_s >= self.window_s:
            return self.index_of_dispersion
        return 1.0 + excess * window_s / self.window_s

    def arrivals_at_percentile(self, rate_per_s: float, window_s: float, percentile: float) -> float:
        """Arrivals within `window_s` not exceeded in `percentile` % of windows: the mean
        rate x window plus z standard deviations, the variance being dispersion x mean."""
        mean = rate_per_s * window_s
        if mean <= 0:
            return 0.0
        z = NormalDist().inv_cdf(percentile / 100.0)
        return max(0.0, mean + z * math.sqrt(self.dispersion_at(window_s) * mean))

    @staticmethod
    def from_arrivals(times_s: Sequence[float], window_s: float = 5.0) -> Burstiness:
        """Fits the index of dispersion of arrival counts over windows of `window_s`.

        Windows are counted over the span of the arrivals; the slow drift of the rate is
        taken out by comparing each window with the mean of its minute, so a daily ramp
        does not read as burstiness."""
        if len(times_s) < 2:
            return Burstiness(1.0, window_s)
        start = min(times_s)
        span = max(times_s) - start
        n_windows = max(1, int(span // window_s) + 1)
        counts = [0] * n_windows
        for t in times_s:
            counts[min(n_windows - 1, int((t - start) // window_s))] += 1
        group = max(1, round(60.0 / window_s))
        weighted = 0.0
        weight = bursty = 0
        excess = [0.0] * n_windows  # arrivals above the minute's Poisson count, in bursty windows
        for g in range(0, n_windows, group):
            block = counts[g : g + group]
            arrivals = sum(block)
            if len(block) < 2 or arrivals == 0:
                continue
            mean = arrivals / len(block)
            var = sum((c - mean) ** 2 for c in block) / (len(block) - 1)
            weighted += var / mean * arrivals
            weight += arrivals
            far = mean + BURST_WINDOW_SDS * math.sqrt(mean) + 1.0
            for k, c in enumerate(block):
                if c > far:
                    bursty += c
                    excess[g + k] = c - mean
        if weight == 0:
            return Burstiness(1.0, window_s)
        dispersion = max(weighted / weight, 0.05)
        if dispersion < BURST_SHARE_MIN_DISPERSION or bursty == 0:
            return Burstiness(dispersion, window_s)
        # A burst: up to BURST_MAX_WINDOWS consecutive windows far above their minute's
        # Poisson count (a batch that straddles a window edge is counted whole), its size the
        # arrivals above that count. A longer run is the rate itself surging (a minute-scale
        # rise the rate measures and the policy follows): each pair of its windows is a burst
        # of its own, not one burst of the whole surge's excess (bursty-prefill's 90 s surges
        # read as bursts of ~1,100 requests and sized the fleet for one arriving at once).
        # The share of arrivals in bursts, and the burst a request of one finds: the
        # size-biased mean size.
        sizes: list[float] = []
        run = 0.0
        windows = 0
        for e in [*excess, 0.0]:
            if e > 0.0:
                run += e
                windows += 1
            if run > 0.0 and (e <= 0.0 or windows == BURST_MAX_WINDOWS):
                sizes.append(run)
                run = 0.0
                windows = 0
        size = sum(x * x for x in sizes) / sum(sizes)
        return Burstiness(dispersion, window_s, min(1.0, bursty / weight), max(1.0, size))


@dataclass(frozen=True)
class Workload:
    """Requests of `input_tokens` prompt and `output_tokens` output (the means) arriving at
    `requests_per_s`; optionally their length distributions and burstiness (see
    `Workload.of`). Without them: constant lengths and Poisson arrivals."""

    input_tokens: int
    output_tokens: int
    requests_per_s: float
    max_context_tokens: int | None = None  # default: input + output, at least what the model needs
    input_lengths: LengthDistribution | None = field(default=None, compare=True)
    output_lengths: LengthDistribution | None = field(default=None, compare=True)
    burstiness: Burstiness | None = None
    prefix_cache_hit_share: float = 0.0  # share of prompt tokens served from the prefix cache

    def __post_init__(self) -> None:
        if self.input_tokens < 1:
            raise ValueError(f"input tokens must be at least 1, got {self.input_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"output tokens must be at least 1, got {self.output_tokens}")
        if self.requests_per_s < 0:
            raise ValueError(f"requests per second cannot be negative, got {self.requests_per_s}")
        if self.max_context_tokens is not None and self.max_context_tokens < self.input_tokens + self.output_tokens:
            raise ValueError(
                f"max context {self.max_context_tokens} is shorter than input + output "
                f"({self.input_tokens + self.output_tokens}); raise it or shorten the request"
            )
        for name, dist, mean in (
            ("input", self.input_lengths, self.input_tokens),
            ("output", self.output_lengths, self.output_tokens),
        ):
            if dist is not None and abs(dist.mean - mean) > max(1.0, 0.01 * mean):
                raise ValueError(
                    f"{name} tokens {mean} differ from the mean of the {name} length distribution "
                    f"({dist.mean:.1f}); build the workload with Workload.of(...)"
                )
        if not 0.0 <= self.prefix_cache_hit_share < 1.0:
            raise ValueError(f"prefix-cache hit share must be in [0, 1), got {self.prefix_cache_hit_share}")

    @classmethod
    def of(
        cls,
        input_lengths: LengthDistribution,
        output_lengths: LengthDistribution,
        requests_per_s: float,
        max_context_tokens: int | None = None,
        burstiness: Burstiness | None = None,
        prefix_cache_hit_share: float = 0.0,
    ) -> Workload:
        """A workload from its length distributions (the means become input/output tokens)."""
        return cls(
            max(1, round(input_lengths.mean)),
            max(1, round(output_lengths.mean)),
            requests_per_s,
            max_context_tokens,
            input_lengths,
            output_lengths,
            burstiness,
            prefix_cache_hit_share,
        )

    @cached_property
    def inputs(self) -> LengthDistribution:
        """The prompt length distribution (constant at the mean when none was given)."""
        return self.input_lengths or LengthDistribution.constant(self.input_tokens)

    @cached_property
    def outputs(self) -> LengthDistribution:
        return self.output_lengths or LengthDistribution.constant(self.output_tokens)

    @cached_property
    def arrivals(self) -> Burstiness:
        return self.burstiness or Burstiness.poisson()

    @property
    def is_mean_value(self) -> bool:
        """Constant lengths, Poisson arrivals: today's single typical request."""
        return self.inputs.is_constant and self.outputs.is_constant and self.arrivals.is_poisson

    @property
    def context_tokens(self) -> int:
        """KV one typical request holds when it finishes."""
        return self.input_tokens + self.output_tokens

    @property
    def mean_decode_context_tokens(self) -> float:
        """Mean KV a decoding request reads over its life: input plus half the output."""
        return self.input_tokens + self.output_tokens / 2.0

    @property
    def engine_max_context_tokens(self) -> int:
        longest = self.inputs.max + self.outputs.max if not self.is_mean_value else self.context_tokens
        return self.max_context_tokens or max(longest, self.context_tokens)

    # Demand in work units -------------------------------------------------------------
    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens the fleet must compute per second (after prefix-cache hits)."""
        return self.requests_per_s * self.inputs.mean * (1.0 - self.prefix_cache_hit_share)

    @property
    def decode_tokens_per_s(self) -> float:
        """Output tokens the fleet must generate per second."""
        return self.requests_per_s * self.outputs.mean

    def at_rate(self, requests_per_s: float) -> Workload:
        """The same mix and burstiness at another request rate."""
        return Workload(
            self.input_tokens,
            self.output_tokens,
            requests_per_s,
            self.max_context_tokens,
            self.input_lengths,
            self.output_lengths,
            self.burstiness,
            self.prefix_cache_hit_share,
        )


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float
    percentile: float = 95.0

    def __post_init__(self) -> None:
        if not self.ttft_s > 0:
            raise ValueError(f"TTFT target must be positive, got {self.ttft_s}")
        if not self.tpot_s > 0:
            raise ValueError(f"TPOT target must be positive, got {self.tpot_s}")
        if not 50.0 <= self.percentile < 100.0:
            raise ValueError(f"percentile must be in [50, 100), got {self.percentile}")
