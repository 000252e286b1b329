"""One InferenceService's Observation from Prometheus: what the policy sees each tick.

`observe_async` runs the queries concurrently under one deadline. It is total: an answer that
cannot be read, a negative value, a timeout or an unreachable Prometheus gives a stale
Observation and the reason (what MetricsAvailable=False says), never an exception.
"""

from __future__ import annotations

import asyncio
import math

from kvscale.autoscaling.observation import LengthHistogram, Observation, ObservedWorkload
from kvscale.metrics.batch import Builder, FleetReader
from kvscale.metrics.client import AsyncPrometheusClient, Missing, MissingKind, Sample, prometheus_float
from kvscale.metrics.engines import ENGINES, EngineMetrics
from kvscale.metrics.promql import (
    PEAK_LOOKBACKS,
    Scope,
    queries,
    scoped_queries,
    scoped_workload_queries,
    workload_queries,
)

# Values each query may take below zero: the sample age may read slightly negative when
# clocks differ; every other quantity (rates, latencies, counts, usage) is non-negative.
_MINIMUM = {"age": -math.inf}


def prefill_tokens_per_s(prompt_tokens_per_s: float | None, hit_ratio: float | None) -> float | None:
    """Prompt tokens the engines compute: those not found in the prefix cache. A missing hit
    ratio (no counter, no lookups in the window) discounts nothing: more work, never less."""
    if prompt_tokens_per_s is None:
        return None
    return prompt_tokens_per_s * (1.0 - min(1.0, max(0.0, hit_ratio or 0.0)))


# What a NaN or an infinity means, per query: said instead of "no data" (the series are there).
_NOT_FINITE_WHY = {
    "age": "not an age in seconds: the engine samples cannot be dated",
    "rate": "an engine exposed NaN or an infinity in its request counter or queue gauge",
    "running": "an engine exposed NaN or an infinity as its running gauge",
    "waiting": "an engine exposed NaN or an infinity as its waiting gauge",
}


def _not_finite(values: dict[str, float | Missing], keys: list[str]) -> str | None:
    """Why the `keys` without a number have none, where any of them answered NaN or an
    infinity (Missing NOT_FINITE): the answer as it came, not "no data"; None otherwise."""
    odd = [k for k in keys if isinstance(v := values.get(k), Missing) and v.kind is MissingKind.NOT_FINITE]
    if not odd:
        return None
    said = []
    for key in odd:
        reading = values[key]
        assert isinstance(reading, Missing)
        answer = "NaN" if reading.value is None else prometheus_float(reading.value)
        said.append(f"{key} query answered {answer} ({_NOT_FINITE_WHY.get(key, 'NaN or an infinity')})")
    rest = [k for k in keys if k not in odd]
    return "; ".join(said) + (f"; no data for {', '.join(rest)}" if rest else "")


def _assemble(
    metrics: EngineMetrics,
    values: dict[str, float | Missing],
    ready_replicas: int,
    starting_replicas: int,
    now_s: float,
    stale_after_s: float,
) -> tuple[Observation, str | None]:
    errors = [f"{key}: {v.reason}" for key, v in values.items() if isinstance(v, Missing) and v.is_error]
    if errors:
        return Observation(
            time_s=now_s, ready_replicas=ready_replicas, starting_replicas=starting_replicas, stale=True
        ), errors[0] + (f" (and {len(errors) - 1} more queries)" if len(errors) > 1 else "")
    numbers = {k: v for k, v in values.items() if not isinstance(v, Missing)}
    age = numbers.get("age")
    stale = age is None or age > stale_after_s
    missing = [k for k in ("rate", "running", "waiting") if numbers.get(k) is None]
    # Without an inter-token fallback the TPOT quantile can only be the per-request one.
    per_request = bool(numbers.get("tpot_per_request")) or not metrics.itl_histogram
    why = None
    if stale:
        why = _not_finite(values, ["age"]) or (
            "no engine samples in Prometheus" if age is None else f"newest engine sample is {age:.0f}s old"
        )
    elif missing:
        why = _not_finite(values, missing) or f"no data for {', '.join(missing)}"
    return (
        Observation(
            time_s=now_s,
            ready_replicas=ready_replicas,
            starting_replicas=starting_replicas,
            arrival_rate_per_s=numbers.get("rate"),
            input_tokens_mean=numbers.get("input_tokens"),
            output_tokens_mean=numbers.get("output_tokens"),
            ttft_p_s=numbers.get("ttft"),
            tpot_p_s=numbers.get("tpot"),
            running=numbers.get("running"),
            waiting=numbers.get("waiting"),
            kv_usage=numbers.get("kv_usage"),
            stale=stale,
            tpot_source=None if numbers.get("tpot") is None else metrics.tpot_source(per_request),
            ttft_source=metrics.ttft_unavailable_reason,
            waiting_max=numbers.get("waiting_max"),
            prompt_tokens_per_s=numbers.get("prompt_tokens_rate"),
            prefill_tokens_per_s=prefill_tokens_per_s(
                numbers.get("prompt_tokens_rate"), numbers.get("prefix_cache_hit_ratio")
            ),
            decode_tokens_per_s=numbers.get("generation_tokens_rate"),
            prefix_cache_hit_ratio=numbers.get("prefix_cache_hit_ratio"),
        ),
        why,
    )


async def observe_async(
    client: AsyncPrometheusClient,
    engine: str,
    namespace: str,
    name: str,
    percentile: float,
    ready_replicas: int,
    starting_replicas: int,
    now_s: float,
    window: str = "1m",
    stale_after_s: float = 120.0,
    deadline_s: float | None = None,
) -> tuple[Observation, str | None]:
    """The observation and why metrics are missing, all queries at once, within
    `deadline_s` (default: the client's per-call timeout). Keep it shorter than the tick."""
    built = queries(ENGINES[engine], namespace, name, percentile / 100.0, window)
    budget = client.timeout_s if deadline_s is None else deadline_s
    keys = list(built)
    answers = await asyncio.gather(*(client.scalar(built[k], _MINIMUM.get(k, 0.0), timeout_s=budget) for k in keys))
    return _assemble(
        ENGINES[engine], dict(zip(keys, answers, strict=True)), ready_replicas, starting_replicas, now_s, stale_after_s
    )


def tick_queries(window: str) -> Builder:
    """The tick's queries for a batched reader; the group key is the SLO percentile."""

    def build(engine: EngineMetrics, scope: Scope, percentile: str) -> dict[str, str]:
        return scoped_queries(engine, scope, float(percentile) / 100.0, window)

    return build


async def observe_batched(
    reader: FleetReader,
    engine: str,
    namespace: str,
    name: str,
    percentile: float,
    ready_replicas: int,
    starting_replicas: int,
    now_s: float,
    stale_after_s: float,
    deadline_s: float,
) -> tuple[Observation, str | None]:
    """`observe_async` from the reader's batch (every service's answer from one query per key):
    the same Observation and reason as asking for this service alone."""
    got = await reader.answers(engine, f"{percentile:g}", namespace, deadline_s)
    if isinstance(got, Missing):
        values: dict[str, float | Missing] = {"batch": got}
    else:
        values = {k: got.value(k, (namespace, name), _MINIMUM.get(k, 0.0)) for k in got.queries}
    return _assemble(ENGINES[engine], values, ready_replicas, starting_replicas, now_s, stale_after_s)


def _histogram(reading: list[Sample] | Missing) -> LengthHistogram | None:
    """A length histogram from the answer's (le, cumulative rate) series; None when there is
    none or a series has no readable `le`."""
    if isinstance(reading, Missing):
        return None
    pairs = []
    for sample in reading:
        try:
            pairs.append((float(sample.labels["le"]), sample.value))
        except (KeyError, ValueError):
            return None
    return LengthHistogram.from_cumulative(pairs)


# The burstiness's reads: the heaviest (nested subqueries); one that fails leaves only its part unread.
BURST_KEYS = ("arrival_dispersion", "arrivals_in_bursts", "burst_requests")


def _number(value: float | Missing | None) -> float | None:
    return None if value is None or isinstance(value, Missing) else value


def _window_s(window: str) -> float:
    return float(window[:-1]) * {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}[window[-1]]


def assemble_workload(
    values: dict[str, float | Missing], histograms: dict[str, list[Sample] | Missing], now_s: float, window: str,
    peak_window: str, burst_window: str | None = None,
) -> tuple[ObservedWorkload | None, str | None]:  # fmt: skip
    """The observed workload from the answers, and why parts are missing (None: all there).
    Errors leave the workload out entirely (None): a re-plan never follows a half-read. The
    burstiness alone may fail (its nested subqueries are the heaviest read): it is then unread."""
    values = dict(values)
    burst = {k: values.pop(k, None) for k in BURST_KEYS}
    errors = [f"{k}: {v.reason}" for k, v in (values | histograms).items() if isinstance(v, Missing) and v.is_error]
    if errors:
        return None, errors[0] + (f" (and {len(errors) - 1} more queries)" if len(errors) > 1 else "")
    n = {k: v for k, v in values.items() if not isinstance(v, Missing)}
    ratio = n.get("prefix_cache_hit_ratio")
    ratio = None if ratio is None else min(1.0, ratio)
    discount = 1.0 - (ratio or 0.0)
    lookbacks = [lookback for lookback, _ in PEAK_LOOKBACKS]

    def scaled(key: str) -> float | None:
        value = n.get(key)
        return None if value is None else value * discount

    workload = ObservedWorkload(
        time_s=now_s,
        window_s=_window_s(window),
        requests_per_s=n.get("rate"),
        input_tokens_mean=n.get("input_tokens"),
        output_tokens_mean=n.get("output_tokens"),
        prompt_lengths=_histogram(histograms.get("prompt_lengths", Missing(MissingKind.EMPTY, ""))),
        output_lengths=_histogram(histograms.get("output_lengths", Missing(MissingKind.EMPTY, ""))),
        prompt_tokens_per_s=n.get("prompt_tokens_rate"),
        prefill_tokens_per_s=prefill_tokens_per_s(n.get("prompt_tokens_rate"), ratio),
        decode_tokens_per_s=n.get("generation_tokens_rate"),
        prefix_cache_hit_ratio=ratio,
        peak_window_s=_window_s(peak_window),
        peak_requests_per_s_1h=n.get(f"peak_requests_{lookbacks[0]}"),
        peak_requests_per_s_1d=n.get(f"peak_requests_{lookbacks[1]}"),
        # The window's hit ratio applied to the peak: the cache hits of the peak are not read.
        peak_prefill_tokens_per_s_1h=scaled(f"peak_prompt_tokens_{lookbacks[0]}"),
        peak_prefill_tokens_per_s_1d=scaled(f"peak_prompt_tokens_{lookbacks[1]}"),
        arrival_dispersion=_number(burst["arrival_dispersion"]),
        arrivals_in_bursts=_number(burst["arrivals_in_bursts"]),
        burst_requests=_number(burst["burst_requests"]),
        burst_window_s=None if burst_window is None else _window_s(burst_window),
    )
    missing = [k for k in ("rate", "input_tokens", "output_tokens") if k not in n]
    return workload, (f"no data for {', '.join(missing)}" if missing else None)


async def observe_workload_async(
    client: AsyncPrometheusClient,
    engine: str,
    namespace: str,
    name: str,
    now_s: float,
    window: str = "10m",
    peak_window: str = "1m",
    deadline_s: float | None = None,
    burst_window: str | None = None,
) -> tuple[ObservedWorkload | None, str | None]:
    """The workload over `window` with its hour and day peaks and its burstiness over
    `burst_window`, all queries at once within the deadline; never raises (a failed query
    leaves the workload None and says why)."""
    built = workload_queries(ENGINES[engine], namespace, name, window, peak_window, burst_window)
    budget = client.timeout_s if deadline_s is None else deadline_s
    vectors = [k for k in built if k.endswith("_lengths")]
    scalars = [k for k in built if k not in vectors]
    answers = await asyncio.gather(
        *(client.scalar(built[k], 0.0, timeout_s=budget) for k in scalars),
        *(client.vector(built[k], timeout_s=budget) for k in vectors),
    )
    values: dict[str, float | Missing] = {}
    for key, answer in zip(scalars, answers[: len(scalars)], strict=True):
        assert not isinstance(answer, list)
        values[key] = answer
    histograms: dict[str, list[Sample] | Missing] = {}
    for key, answer in zip(vectors, answers[len(scalars) :], strict=True):
        assert not isinstance(answer, float)
        histograms[key] = answer
    return assemble_workload(values, histograms, now_s, window, peak_window, burst_window)


def workload_reads(window: str, peak_window: str, burst_window: str | None) -> Builder:
    """The workload's queries for a batched reader (the windows are the operator's; no group key)."""

    def build(engine: EngineMetrics, scope: Scope, _group: str) -> dict[str, str]:
        return scoped_workload_queries(engine, scope, window, peak_window, burst_window)

    return build


async def observe_workload_batched(
    reader: FleetReader,
    engine: str,
    namespace: str,
    name: str,
    now_s: float,
    window: str,
    peak_window: str,
    deadline_s: float,
    burst_window: str | None = None,
) -> tuple[ObservedWorkload | None, str | None]:
    """`observe_workload_async` from the reader's batch (built by `workload_reads` with the same
    windows): one query per key for every service, each service's share read as its own."""
    got = await reader.answers(engine, "", namespace, deadline_s)
    if isinstance(got, Missing):
        return assemble_workload({"batch": got}, {}, now_s, window, peak_window, burst_window)
    service = (namespace, name)
    values = {k: got.value(k, service) for k in got.queries if not k.endswith("_lengths")}
    histograms: dict[str, list[Sample] | Missing] = {}
    for key in (k for k in got.queries if k.endswith("_lengths")):
        samples = got.samples_of(key, service)
        histograms[key] = samples or Missing(MissingKind.EMPTY, f"no data for {key}")  # as `vector` answers
    return assemble_workload(values, histograms, now_s, window, peak_window, burst_window)
