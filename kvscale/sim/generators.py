"""Synthetic loads with a seed: the shapes traffic takes that two trace files do not cover.

`--load KIND:key=value,key=value,...`, rates in requests/s, times as durations ('90s', '5m',
or plain seconds). Kinds and their keys (defaults in brackets):

- `poisson`: `rate` [5]: a constant-rate Poisson process.
- `bursty`: `base` [0.2], `peak` [40], `on` [60s], `off` [240s], `rise` [20s]: on/off
  arrivals (a Markov-modulated Poisson process): idle periods at `base` alternate with
  bursts at `peak`, each period's length drawn from an exponential with that mean; a burst
  ramps up over `rise`.
- `diurnal`: `low` [1], `high` [10], `period` [30m]: a day compressed into `period`, the
  rate a raised cosine from `low` (t=0) up to `high` (half a period) and back.
- `step`: `before` [2], `after` [10], `at` [5m]: the rate jumps once.
- `flash`: `base` [2], `peak` [30], `at` [5m], `rise` [30s], `decay` [5m]: a flash crowd,
  a linear rise to `peak`, then an exponential decay (time constant `decay`) back to `base`.
- `batches`: `base` [1], `every` [2m], `size` [200], `spread` [3s]: batch submissions over a
  Poisson base load: at random times (exponential gaps of mean `every`) `size` requests
  arrive within `spread` (an index of dispersion of about `size` over a few seconds).
- `spikes`: `base` [2], `peak` [40], `every` [3m], `length` [30s]: bursts shorter than a
  cold start at random intervals: a Poisson base load, and bursts of `length` at `peak` (no
  ramp) starting after exponential gaps of mean `every` (each counted from the previous
  burst's end). A burst over before a replica started for it is ready can only be absorbed
  by warm capacity (issue 27).
- `drift`: `rate` [5], `swing` [2.5], `every` [1m]: a constant request rate whose mean
  prompt moves between minutes: each `every`, the mean is `input` x swing^(u - 1/2), u
  uniform, so it changes up to `swing`-fold from one period to the next.

Every kind also takes `duration` [30m], and the lengths: `input` [512] and `output` [256]
(mean tokens), `lengths` [spread]: `fixed` (every request the mean), `spread` (lognormal,
sigma 0.5), or `heavy` (Pareto with shape 1.5, the long tail of real prompt and output
lengths), capped at `max_input` [32768] and `max_output` [4096] tokens; `output_lengths`
[as `lengths`] sets the outputs' shape alone (short heavy-tailed outputs: `output=20,
output_lengths=heavy`).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvscale.sim.trace import TraceRequest
from kvscale.sizing.units import UnitError, parse_duration_s

LENGTHS = ("fixed", "spread", "heavy")
PARETO_SHAPE = 1.5
LOGNORMAL_SIGMA = 0.5

_COMMON: dict[str, str] = {
    "duration": "30m",
    "input": "512",
    "output": "256",
    "lengths": "spread",
    "max_input": "32768",
    "max_output": "4096",
}
KINDS: dict[str, dict[str, str]] = {
    "poisson": {"rate": "5"},
    "bursty": {"base": "0.2", "peak": "40", "on": "60s", "off": "240s", "rise": "20s"},
    "diurnal": {"low": "1", "high": "10", "period": "30m"},
    "step": {"before": "2", "after": "10", "at": "5m"},
    "flash": {"base": "2", "peak": "30", "at": "5m", "rise": "30s", "decay": "5m"},
    "batches": {"base": "1", "every": "2m", "size": "200", "spread": "3s"},
    "drift": {"rate": "5", "swing": "2.5", "every": "1m"},
    "spikes": {"base": "2", "peak": "40", "every": "3m", "length": "30s"},
}
_TIMES = {"duration", "on", "off", "rise", "period", "at", "decay", "every", "spread", "length"}
_COUNTS = {"size", "swing"}  # numbers that are neither rates nor times
_TOKENS = {"input", "output", "max_input", "max_output"}


class LoadError(ValueError):
    """A --load that cannot be read; the message names the key and what it accepts."""


@dataclass(frozen=True)
class LoadSpec:
    """A parsed --load: the kind, its numbers (rates in req/s, times in s, tokens), the lengths."""

    kind: str
    values: dict[str, float]
    lengths: str
    text: str
    output_lengths: str | None = None  # None: as `lengths`

    @property
    def duration_s(self) -> float:
        return self.values["duration"]


def usage() -> str:
    kinds = "; ".join(f"{kind}:{','.join(f'{k}={v}' for k, v in keys.items())}" for kind, keys in KINDS.items())
    return f"write KIND:key=value,... with KIND one of {', '.join(KINDS)} (defaults: {kinds})"


def parse_load(text: str, defaults: Mapping[str, str] | None = None) -> LoadSpec:
    """`defaults` replaces the common defaults (`duration`, `input`, `output`, ...): the command's
    own options; keys in `text` win over both."""
    kind, _, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise LoadError(f"--load {text!r}: unknown kind {kind!r}; {usage()}")
    raw = {**_COMMON, **(defaults or {}), "output_lengths": "", **KINDS[kind]}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not value.strip():
            raise LoadError(f"--load {text!r}: {item!r} is not key=value; {usage()}")
        if key not in raw:
            known = ", ".join(sorted(raw))
            raise LoadError(f"--load {text!r}: {kind} has no key {key!r}; its keys are {known}")
        raw[key] = value.strip()
    lengths = raw.pop("lengths")
    output_lengths = raw.pop("output_lengths") or None
    for key, shape in (("lengths", lengths), ("output_lengths", output_lengths or lengths)):
        if shape not in LENGTHS:
            raise LoadError(f"--load {text!r}: {key}={shape!r}; choose one of {', '.join(LENGTHS)}")
    values: dict[str, float] = {}
    for key, value in raw.items():
        values[key] = _number(text, key, value)
    _check(text, kind, values)
    return LoadSpec(kind, values, lengths, text, output_lengths)


def _number(text: str, key: str, value: str) -> float:
    if key in _TIMES:
        try:
            return parse_duration_s(value, field=f"--load {text!r}: {key}")
        except UnitError as exc:
            raise LoadError(str(exc)) from exc
    try:
        number = float(value)
    except ValueError:
        unit = "tokens" if key in _TOKENS else "requests/s"
        raise LoadError(f"--load {text!r}: {key}={value!r} is not a number ({unit})") from None
    if not math.isfinite(number) or number < 0:
        raise LoadError(f"--load {text!r}: {key}={value!r} must be a finite number >= 0")
    if key in _TOKENS and number < 1:
        raise LoadError(f"--load {text!r}: {key}={value!r} must be at least 1 token")
    return number


def _check(text: str, kind: str, v: dict[str, float]) -> None:
    pairs = {
        "bursty": ("base", "peak"),
        "diurnal": ("low", "high"),
        "flash": ("base", "peak"),
        "spikes": ("base", "peak"),
    }
    if kind in pairs:
        lo, hi = pairs[kind]
        if v[lo] > v[hi]:
            raise LoadError(f"--load {text!r}: {lo} ({v[lo]:g}) must not exceed {hi} ({v[hi]:g})")
    if kind == "batches" and v["size"] < 1:
        raise LoadError(f"--load {text!r}: size={v['size']:g} must be at least 1 request")
    if kind == "drift" and v["swing"] < 1:
        raise LoadError(f"--load {text!r}: swing={v['swing']:g} must be at least 1 (1: no drift)")
    rates = [v[k] for k in KINDS[kind] if k not in _TIMES and k not in _COUNTS]
    if not any(r > 0 for r in rates):
        raise LoadError(f"--load {text!r}: every rate is 0, so no request would arrive")
    if v["input"] > v["max_input"] or v["output"] > v["max_output"]:
        raise LoadError(f"--load {text!r}: the mean length exceeds its cap (max_input / max_output)")


def rate_function(spec: LoadSpec, rng: random.Random) -> tuple[Callable[[float], float], float]:
    """The arrival rate against time, and its maximum (for thinning). Random choices (the
    bursty periods) come from `rng`, so a seed fixes them."""
    v = spec.values
    if spec.kind in ("poisson", "drift"):
        return (lambda t: v["rate"]), v["rate"]
    if spec.kind == "batches":
        return (lambda t: v["base"]), v["base"]
    if spec.kind == "step":
        return (lambda t: v["before"] if t < v["at"] else v["after"]), max(v["before"], v["after"])
    if spec.kind == "diurnal":
        low, high, period = v["low"], v["high"], v["period"]
        return (lambda t: low + (high - low) * (1 - math.cos(2 * math.pi * t / period)) / 2), high
    if spec.kind == "flash":
        base, peak, at, rise, decay = v["base"], v["peak"], v["at"], v["rise"], v["decay"]

        def flash(t: float) -> float:
            if t < at:
                return base
            if t < at + rise:
                return base + (peak - base) * (t - at) / rise
            return base + (peak - base) * math.exp(-(t - at - rise) / decay)

        return flash, peak
    if spec.kind == "spikes":
        return _spikes(spec, rng)
    # bursty: alternating periods, drawn once up front
    base, peak, rise = v["base"], v["peak"], v["rise"]
    bursts: list[tuple[float, float]] = []  # (start, end) of each burst
    t = rng.expovariate(1 / v["off"]) if v["off"] > 0 else 0.0
    while t < spec.duration_s:
        length = rng.expovariate(1 / v["on"]) if v["on"] > 0 else 0.0
        bursts.append((t, t + length))
        t += length + (rng.expovariate(1 / v["off"]) if v["off"] > 0 else 0.0)
        if v["on"] <= 0 and v["off"] <= 0:
            break
    starts = [b[0] for b in bursts]

    def bursty(time_s: float) -> float:
        i = bisect.bisect_right(starts, time_s) - 1
        if i < 0 or time_s >= bursts[i][1]:
            return base
        ramp = 1.0 if rise <= 0 else min(1.0, (time_s - bursts[i][0]) / rise)
        return base + (peak - base) * ramp

    return bursty, max(base, peak)


def _spikes(spec: LoadSpec, rng: random.Random) -> tuple[Callable[[float], float], float]:
    """Bursts of a fixed length at `peak`, exponential gaps of mean `every` between them."""
    v = spec.values
    base, peak, length, every = v["base"], v["peak"], v["length"], v["every"]
    starts: list[float] = []
    t = rng.expovariate(1 / every) if every > 0 else 0.0
    while t < spec.duration_s and length > 0:
        starts.append(t)
        t += length + (rng.expovariate(1 / every) if every > 0 else 0.0)

    def spikes(time_s: float) -> float:
        i = bisect.bisect_right(starts, time_s) - 1
        return peak if i >= 0 and time_s < starts[i] + length else base

    return spikes, max(base, peak)


def _length(rng: random.Random, mean: float, cap: float, shape: str) -> int:
    if shape == "fixed":
        value = mean
    elif shape == "spread":
        value = rng.lognormvariate(math.log(mean) - LOGNORMAL_SIGMA**2 / 2, LOGNORMAL_SIGMA)
    else:
        scale = mean * (PARETO_SHAPE - 1) / PARETO_SHAPE  # a Pareto with this mean before the cap
        value = scale * rng.paretovariate(PARETO_SHAPE)
    return max(1, min(int(cap), round(value)))


def generate(spec: LoadSpec, seed: int = 0) -> list[TraceRequest]:
    """The requests of one load: a non-homogeneous Poisson process sampled by thinning, and
    lengths drawn per request. Same spec and seed, same requests."""
    rng = random.Random(seed)
    rate_at, peak = rate_function(spec, rng)
    v = spec.values
    out_shape = spec.output_lengths or spec.lengths
    prompt_mean = _prompt_mean(spec, rng)

    def request(t: float) -> TraceRequest:
        return TraceRequest(
            t,
            _length(rng, prompt_mean(t), v["max_input"], spec.lengths),
            _length(rng, v["output"], v["max_output"], out_shape),
        )

    out: list[TraceRequest] = []
    t = 0.0
    while peak > 0:
        t += rng.expovariate(peak)
        if t >= spec.duration_s:
            break
        if rng.random() * peak <= rate_at(t):
            out.append(request(t))
    if spec.kind == "batches" and v["every"] > 0:
        start = rng.expovariate(1 / v["every"])
        while start < spec.duration_s:
            times = sorted(start + rng.uniform(0, v["spread"]) for _ in range(round(v["size"])))
            out.extend(request(x) for x in times if x < spec.duration_s)
            start += rng.expovariate(1 / v["every"])
        out.sort(key=lambda r: r.arrival_s)
    if not out:
        raise LoadError(f"--load {spec.text!r}: no request arrives within the duration; raise a rate or the duration")
    return out


def _prompt_mean(spec: LoadSpec, rng: random.Random) -> Callable[[float], float]:
    """The mean prompt against time: `input`, or for `drift` a new level every period."""
    v = spec.values
    if spec.kind != "drift" or v["every"] <= 0:
        return lambda t: v["input"]
    periods = math.ceil(spec.duration_s / v["every"]) + 1
    levels = [min(v["max_input"], v["input"] * v["swing"] ** (rng.random() - 0.5)) for _ in range(periods)]
    return lambda t: levels[min(len(levels) - 1, int(t // v["every"]))]
