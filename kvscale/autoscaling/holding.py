"""Burst-aware holding (issue 27): how much capacity to keep warm for bursts a cold start
cannot chase.

A burst shorter than the cold start is over before a replica started for it is ready: warm
capacity absorbs it or nothing does. So on bursty arrivals the policy holds a fleet sized for
the work that arrives in windows of the cold start's length, a high quantile over the recent
past with decay (a burst counts in full for `burst_hold_s`, then fades to nothing at
`burst_memory_s`), through the capacity model; it scales up at once only for a change that
has lasted a whole cold start (the rate in each of the last non-overlapping metric windows
spanning it), and down only after the bursts' recurrence interval has passed.

Everything here reads the rate history the operator observes (one trailing-window mean per
tick, kvscale.autoscaling.observation.Observation.arrival_rate_per_s); no simulation.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from enum import StrEnum

Rates = tuple[tuple[float, float], ...]  # (time, mean arrival rate over the trailing window)


class Regime(StrEnum):
    """What a decision's level follows; its reason begins with these words."""

    ABSORBING_BURSTS = "absorbing bursts"  # bursts shorter than a cold start: hold for them
    FOLLOWING_TREND = "following a trend"  # smooth traffic: the forecast one cold start ahead
    SUSTAINED_CHANGE = "reacting to a sustained change"  # a change that outlasted a cold start


@dataclass(frozen=True)
class Holding:
    """The level the held fleet is sized for, in requests/s, and why."""

    level: float  # the decayed quantile of per-window rates (windows of the cold start)
    sustained: float  # the lowest rate of the metric windows spanning the last cold start
    recurrence_s: float | None  # the median interval between the bursts seen (None: < 3 bursts)
    window_s: float

    @property
    def regime(self) -> Regime:
        return Regime.SUSTAINED_CHANGE if self.sustained > self.level else Regime.ABSORBING_BURSTS

    @property
    def rate(self) -> float:
        return max(self.level, self.sustained)


def window_rates(history: Rates, window_s: float, rate_window_s: float) -> list[tuple[float, float]]:
    """The mean arrival rate over the `window_s` ending at each sample: the mean of the
    samples within the last window_s - rate_window_s (each covers its own trailing
    `rate_window_s`, so together they span the window). A window no longer than the metric's
    is the sample itself: the rate history cannot resolve less."""
    span = max(0.0, window_s - rate_window_s)
    out: list[tuple[float, float]] = []
    first, total = 0, 0.0
    for i, (t, r) in enumerate(history):
        total += r
        while history[first][0] < t - span - 1e-9:
            total -= history[first][1]
            first += 1
        out.append((t, total / (i - first + 1)))
    return out


def decayed_quantile(
    samples: list[tuple[float, float]], now_s: float, quantile: float, hold_s: float, memory_s: float
) -> float:
    """The `quantile` of the samples, each weighed by its age: in full for `hold_s`, then
    fading linearly to nothing at `memory_s` (an old peak counts less, not at all after)."""
    fade_s = max(memory_s - hold_s, 1e-9)
    weighed = []
    for t, value in samples:
        age = now_s - t
        if age > memory_s:
            continue
        weight = 1.0 if age <= hold_s else max(0.0, 1.0 - (age - hold_s) / fade_s)
        weighed.append(value * weight)
    if not weighed:
        return 0.0
    weighed.sort()
    return weighed[min(len(weighed) - 1, max(0, math.ceil(quantile * len(weighed)) - 1))]


def burst_starts(history: Rates, threshold: float) -> list[float]:
    """When the rate rose through `threshold` (the first sample of each run above it)."""
    starts, above = [], True  # a run already above at the start of the memory is not counted
    for t, r in history:
        if r > threshold and not above:
            starts.append(t)
        above = r > threshold
    return starts


def burst_threshold(history: Rates) -> float:
    """What counts as a burst: the rate above the midpoint between its median and its maximum."""
    rates = sorted(r for _, r in history)
    return (rates[len(rates) // 2] + rates[-1]) / 2


def burst_lengths_s(history: Rates, threshold: float) -> list[float]:
    """How long each finished run of the rate above `threshold` lasted (its first sample above
    to its first sample back at or below). A run already above at the start of the history,
    or still above now, is not counted: its length is not known."""
    lengths: list[float] = []
    began: float | None = None
    above = True
    for t, r in history:
        if r > threshold and not above:
            began = t
        elif r <= threshold and above and began is not None:
            lengths.append(t - began)
            began = None
        above = r > threshold
    return lengths


def bursts_outlast(history: Rates, chase_s: float) -> bool:
    """Whether the finished bursts of the history lasted, at the median, longer than
    `chase_s`: capacity started when such a burst began would have served most of it, so it is
    a change to follow, not a burst to hold capacity for. False while none has finished."""
    if len(history) < 3:
        return False
    lengths = sorted(burst_lengths_s(history, burst_threshold(history)))
    return bool(lengths) and lengths[len(lengths) // 2] > chase_s


def recurrence_interval_s(history: Rates) -> float | None:
    """The median interval between bursts: runs of the rate above the midpoint between its
    median and its maximum. None until three bursts were seen."""
    if len(history) < 3:
        return None
    starts = burst_starts(history, burst_threshold(history))
    if len(starts) < 3:
        return None
    gaps = sorted(b - a for a, b in itertools.pairwise(starts))
    return gaps[len(gaps) // 2]


def sustained_rate(history: Rates, now_s: float, span_s: float, rate_window_s: float) -> float:
    """The lowest rate of the non-overlapping metric windows that end now and every
    `rate_window_s` before, as many as span `span_s` (rounded, at least one): a rate each of
    them shows has lasted about that long, where a burst shorter than `span_s` raises at
    most one or two of them. 0 while the history does not reach back that far."""
    windows = max(1, round(span_s / rate_window_s))
    if not history or history[0][0] > now_s - (windows - 1) * rate_window_s + 1e-9:
        return 0.0
    times = [t for t, _ in history]
    lowest = math.inf
    for k in range(windows):
        i = bisect.bisect_right(times, now_s - k * rate_window_s + 1e-9) - 1
        lowest = min(lowest, history[i][1])
    return lowest


def holding(
    history: Rates,
    now_s: float,
    cold_start_s: float,
    rate_window_s: float,
    quantile: float,
    hold_s: float,
    memory_s: float,
) -> Holding:
    """The held level over windows of the cold start, the rate sustained over one cold start,
    and the bursts' recurrence interval."""
    recent = tuple((t, r) for t, r in history if t >= now_s - memory_s)
    windows = window_rates(recent, cold_start_s, rate_window_s)
    return Holding(
        level=decayed_quantile(windows, now_s, quantile, hold_s, memory_s),
        sustained=sustained_rate(recent, now_s, max(cold_start_s, rate_window_s), rate_window_s),
        recurrence_s=recurrence_interval_s(recent),
        window_s=cold_start_s,
    )
