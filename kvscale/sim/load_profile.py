"""One `--load` grammar for `kvscale simulate` and `kvscale sim serve`.

Two families of forms, accepted by both commands:

- the generators' `KIND:key=value,...` (poisson, bursty, diurnal, step, flash, batches, drift;
  `kvscale.sim.generators`): a seeded load of `duration` with drawn lengths;
- the profiles `constant:R`, `ramp:R0:R1:SECONDS`, `steps:R0@T0,R1@T1,...` (rates in req/s,
  times in s) and `trace:FILE`, optionally followed by `;lengths:IN/OUT@T,...` (from T seconds
  on, requests have IN prompt and OUT output tokens) and `;bursts:N@T,...` (from T seconds on,
  requests arrive N at a time at the same mean rate): Poisson arrivals at that rate with the
  command's lengths.

`sim serve` plays a profile until stopped and a generated load (or a trace) until its last
request; `simulate` plays a profile for its `--duration` (default 30m)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvscale.sim.generators import KINDS, LoadError, LoadSpec, generate, parse_load, rate_function
from kvscale.sim.trace import MAX_REQUESTS, MAX_SPAN_S, TraceError, TraceRequest, read_trace

PROFILE_KINDS = ("constant", "ramp", "steps", "trace")
# A profile's rates are at most this (req/s): more is a typo for a stand-in playing in real time.
MAX_PROFILE_RATE = 10_000.0
# A profile in `simulate` (and a generated load without `duration=`) lasts this long: the generators' default.
DEFAULT_DURATION_S = 1800.0


class ProfileError(LoadError):
    pass


@dataclass
class Arrivals:
    """Poisson arrivals with a time-varying rate (by thinning), or a trace replayed in real time."""

    rate_at: Callable[[float], float]
    peak_rate: float
    input_tokens: int
    output_tokens: int
    seed: int = 0
    trace: list[TraceRequest] | None = None
    # (from seconds, prompt tokens, output tokens), sorted: the length mix changing over time.
    lengths: tuple[tuple[float, int, int], ...] = ()
    # (from seconds, requests per batch), sorted: from then on requests arrive in batches of
    # that many at once, at the same mean rate (an index of dispersion of about the size).
    bursts: tuple[tuple[float, int], ...] = ()

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._candidate: float | None = None  # next candidate arrival of the thinned process
        self._last = 0.0
        self._index = 0

    def until(self, t_s: float) -> list[TraceRequest]:
        """Arrivals in (previous call, t_s]."""
        out: list[TraceRequest] = []
        if self.trace is not None:
            while self._index < len(self.trace) and self.trace[self._index].arrival_s <= t_s:
                out.append(self.trace[self._index])
                self._index += 1
            return out
        if self.peak_rate <= 0:
            return out
        while True:
            if self._candidate is None:
                self._candidate = self._last + self._rng.expovariate(self.peak_rate)
            if self._candidate > t_s:
                return out  # stays pending for the next window
            self._last, self._candidate = self._candidate, None
            size = self.batch_at(self._last)
            if self._rng.random() * self.peak_rate * size <= self.rate_at(self._last):
                out.extend(TraceRequest(self._last, *self.lengths_at(self._last)) for _ in range(size))

    def batch_at(self, t_s: float) -> int:
        """Requests per arrival at `t_s` (1: Poisson)."""
        current = 1
        for start, size in self.bursts:
            if t_s >= start:
                current = size
        return current

    def lengths_at(self, t_s: float) -> tuple[int, int]:
        """Prompt and output tokens of a request arriving at `t_s`."""
        current = (self.input_tokens, self.output_tokens)
        for start, prompt, output in self.lengths:
            if t_s >= start:
                current = (prompt, output)
        return current


def is_generated(text: str) -> bool:
    """A generators' form (KIND:key=value,...), not a profile."""
    return text.strip().partition(":")[0] in KINDS


def _defaults(input_tokens: int, output_tokens: int, duration_s: float | None) -> dict[str, str]:
    out = {"input": str(input_tokens), "output": str(output_tokens)}
    if duration_s is not None:
        out["duration"] = f"{duration_s:g}s"
    return out


def load_arrivals(
    text: str, input_tokens: int, output_tokens: int, seed: int = 0, duration_s: float | None = None
) -> Arrivals:
    """Either form as the stand-in's arrivals; a generated load replays as a trace (the
    workload's lengths and `duration_s`, when given, are its defaults)."""
    if is_generated(text):
        spec = parse_load(text, _defaults(input_tokens, output_tokens, duration_s))
        check_size(spec, seed)
        return Arrivals(lambda t: math.nan, 0.0, input_tokens, output_tokens, seed, generate(spec, seed))
    return parse_profile(text, input_tokens, output_tokens, seed)


def load_requests(text: str, input_tokens: int, output_tokens: int, seed: int, duration_s: float) -> list[TraceRequest]:
    """Either form as the requests of `duration_s` seconds (a generated load: its own `duration`
    when the text sets one; a trace: all of it), within the trace bounds."""
    if is_generated(text):
        spec = parse_load(text, _defaults(input_tokens, output_tokens, duration_s))
        check_size(spec, seed)
        return generate(spec, seed)
    arrivals = parse_profile(text, input_tokens, output_tokens, seed)
    if arrivals.trace is not None:
        return list(arrivals.trace)
    _check_span(text, duration_s, arrivals.peak_rate)
    requests = arrivals.until(duration_s)
    if not requests:
        raise ProfileError(f"--load {text!r}: no request arrives within {duration_s:g} s; raise a rate or the duration")
    return requests


def check_size(spec: LoadSpec, seed: int) -> None:
    """A generated load within the trace bounds (span, requests), checked before generating:
    `duration=100000h` or `rate=1e9` is a typo, not minutes of generation at GBs of memory."""
    _, peak_per_s = rate_function(spec, random.Random(seed))
    _check_span(spec.text, spec.duration_s, peak_per_s)


def _check_span(text: str, duration_s: float, peak_per_s: float) -> None:
    if duration_s > MAX_SPAN_S:
        raise LoadError(f"--load {text!r}: duration must be at most {MAX_SPAN_S / 86400:g} days, got {duration_s:g} s")
    if peak_per_s * duration_s > MAX_REQUESTS:
        raise LoadError(
            f"--load {text!r}: up to {peak_per_s * duration_s:,.0f} requests (peak {peak_per_s:g}/s for "
            f"{duration_s:g} s), more than {MAX_REQUESTS:,}; lower the rate or the duration"
        )


def parse_profile(text: str, input_tokens: int, output_tokens: int, seed: int = 0) -> Arrivals:
    """constant:R | ramp:R0:R1:SECONDS | steps:R0@T0,R1@T1,... | trace:FILE (rates in req/s,
    times in s), optionally followed by `;lengths:IN/OUT@T,IN/OUT@T,...`: from T seconds on,
    requests have IN prompt and OUT output tokens (before the first T, the workload's), and
    by `;bursts:N@T,...`: from T seconds on, requests arrive N at a time at the same mean rate
    (before the first T, one at a time)."""
    rates, *mods = text.split(";")
    arrivals = _rates(rates, input_tokens, output_tokens, seed)
    _check_numbers(text)
    for mod in mods:
        if arrivals.trace is not None:
            raise ProfileError(f"--load {text!r}: a trace has its own lengths and arrivals; drop ';{mod}'")
        if mod.startswith("bursts:"):
            arrivals.bursts = parse_bursts(text, mod)
        else:
            arrivals.lengths = parse_lengths(text, mod)
    return arrivals


MAX_BURST_REQUESTS = 10_000  # requests at once: more would stall the stand-in on one arrival


def parse_bursts(text: str, mod: str) -> tuple[tuple[float, int], ...]:
    """`bursts:N@T,...` as sorted (T, N); N at least 1 request, times >= 0."""
    usage = f"--load {text!r}: write ';bursts:REQUESTS@SECONDS,...', e.g. ';bursts:1@0,16@60'"
    out: list[tuple[float, int]] = []
    try:
        for item in mod.removeprefix("bursts:").split(","):
            size_text, _, at_text = item.partition("@")
            out.append((float(at_text), int(size_text)))
    except ValueError as exc:
        raise ProfileError(usage) from exc
    for at, size in out:
        if not (math.isfinite(at) and at >= 0) or not 1 <= size <= MAX_BURST_REQUESTS:
            raise ProfileError(f"{usage}; got {size}@{at:g} (1 to {MAX_BURST_REQUESTS} requests, times >= 0 s)")
    return tuple(sorted(out))


def parse_lengths(text: str, mix: str) -> tuple[tuple[float, int, int], ...]:
    """`lengths:IN/OUT@T,...` as sorted (T, IN, OUT); lengths at least 1 token, times >= 0."""
    kind, _, rest = mix.partition(":")
    usage = f"--load {text!r}: write ';lengths:PROMPT/OUTPUT@SECONDS,...', e.g. ';lengths:512/128@0,2048/128@60'"
    if kind != "lengths" or not rest:
        raise ProfileError(usage)
    out: list[tuple[float, int, int]] = []
    try:
        for item in rest.split(","):
            pair, _, at_text = item.partition("@")
            prompt_text, _, output_text = pair.partition("/")
            out.append((float(at_text), int(prompt_text), int(output_text)))
    except ValueError as exc:
        raise ProfileError(usage) from exc
    for at, prompt, output in out:
        if not (math.isfinite(at) and at >= 0) or prompt < 1 or output < 1:
            raise ProfileError(f"{usage}; got {prompt}/{output}@{at:g} (lengths >= 1 token, times >= 0 s)")
    return tuple(sorted(out))


def _rates(text: str, input_tokens: int, output_tokens: int, seed: int) -> Arrivals:
    kind, _, rest = text.partition(":")
    if kind not in PROFILE_KINDS:
        raise ProfileError(_usage(text))
    if kind == "steps":
        return _steps(text, rest, input_tokens, output_tokens, seed)
    try:
        parts = [float(p) for p in rest.split(":")] if kind != "trace" else []
    except ValueError as exc:
        raise ProfileError(f"--load {text!r}: numbers expected after {kind}:") from exc
    if kind == "constant" and len(parts) == 1:
        r = parts[0]
        return Arrivals(lambda t: r, r, input_tokens, output_tokens, seed)
    if kind == "ramp" and len(parts) == 3:
        r0, r1, span = parts
        return Arrivals(lambda t: r0 + (r1 - r0) * min(1.0, t / span), max(r0, r1), input_tokens, output_tokens, seed)
    if kind == "trace":
        try:
            trace = read_trace(Path(rest))
        except TraceError as exc:
            raise ProfileError(str(exc)) from exc
        return Arrivals(lambda t: math.nan, 0.0, input_tokens, output_tokens, seed, trace)
    raise ProfileError(_usage(text))


def _usage(text: str) -> str:
    return (
        f"--load {text!r}: use constant:R, ramp:R0:R1:SECONDS, steps:R0@T0,R1@T1, trace:FILE or "
        f"KIND:key=value,... with KIND one of {', '.join(KINDS)}"
    )


def _steps(text: str, rest: str, input_tokens: int, output_tokens: int, seed: int) -> Arrivals:
    try:
        points = sorted((float(t), float(r)) for r, t in (item.split("@") for item in rest.split(",")))
    except ValueError as exc:
        raise ProfileError(f"--load {text!r}: write steps:RATE@SECONDS,RATE@SECONDS,...") from exc

    def rate_at(t: float) -> float:
        current = 0.0
        for start, rate in points:
            if t >= start:
                current = rate
        return current

    return Arrivals(rate_at, max(r for _, r in points), input_tokens, output_tokens, seed)


def _check_numbers(text: str) -> None:
    """Rates and times finite and >= 0, a ramp's span positive: the shapes are read already; these
    are the numbers that would fail mid-run."""
    kind, _, rest = text.partition(";")[0].partition(":")
    if kind == "trace":
        return
    if kind == "steps":
        pairs = [item.split("@") for item in rest.split(",")]
        rates, times = [float(r) for r, _ in pairs], [float(t) for _, t in pairs]
    else:
        numbers = [float(p) for p in rest.split(":")]
        rates, times = (numbers[:2], numbers[2:]) if kind == "ramp" else (numbers, [])
    for rate in rates:
        if not (math.isfinite(rate) and 0 <= rate <= MAX_PROFILE_RATE):
            raise ProfileError(
                f"--load {text!r}: a rate must be a number of requests per second in [0, {MAX_PROFILE_RATE:g}], "
                f"got {rate:g}"
            )
    for t in times:
        if not (math.isfinite(t) and t >= 0):
            raise ProfileError(f"--load {text!r}: times must be finite seconds >= 0, got {t:g}")
    if kind == "ramp" and not times[0] > 0:
        raise ProfileError(f"--load {text!r}: the ramp's SECONDS must be positive, got {times[0]:g}")
