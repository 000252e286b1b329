"""Load profiles for the serving stand-in: request rate as a function of time."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvscale.sim.trace import TraceError, TraceRequest, read_trace


class ProfileError(ValueError):
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
            if self._rng.random() * self.peak_rate <= self.rate_at(self._last):
                out.append(TraceRequest(self._last, *self.lengths_at(self._last)))

    def lengths_at(self, t_s: float) -> tuple[int, int]:
        """Prompt and output tokens of a request arriving at `t_s`."""
        current = (self.input_tokens, self.output_tokens)
        for start, prompt, output in self.lengths:
            if t_s >= start:
                current = (prompt, output)
        return current


def parse_profile(text: str, input_tokens: int, output_tokens: int, seed: int = 0) -> Arrivals:
    """constant:R | ramp:R0:R1:SECONDS | steps:R0@T0,R1@T1,... | trace:FILE (rates in req/s,
    times in s), optionally followed by `;lengths:IN/OUT@T,IN/OUT@T,...`: from T seconds on,
    requests have IN prompt and OUT output tokens (before the first T, the workload's)."""
    rates, sep, mix = text.partition(";")
    arrivals = _rates(rates, input_tokens, output_tokens, seed)
    if sep:
        if arrivals.trace is not None:
            raise ProfileError(f"--load {text!r}: a trace has its own lengths; drop ';lengths:...'")
        arrivals.lengths = parse_lengths(text, mix)
    return arrivals


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
    raise ProfileError(f"--load {text!r}: use constant:R, ramp:R0:R1:SECONDS, steps:R0@T0,R1@T1 or trace:FILE")


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
