"""One InferenceService's Observation from Prometheus: what the policy sees each tick.

`observe_async` runs the queries concurrently under one deadline. It is total: an answer that
cannot be read, a negative value, a timeout or an unreachable Prometheus gives a stale
Observation and the reason (what MetricsAvailable=False says), never an exception.
"""

from __future__ import annotations

import asyncio
import math

from kvscale.autoscaling.observation import Observation
from kvscale.metrics.client import AsyncPrometheusClient, Missing
from kvscale.metrics.engines import ENGINES, EngineMetrics
from kvscale.metrics.promql import queries

# Values each query may take below zero: the sample age may read slightly negative when
# clocks differ; every other quantity (rates, latencies, counts, usage) is non-negative.
_MINIMUM = {"age": -math.inf}


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
        why = "no engine samples in Prometheus" if age is None else f"newest engine sample is {age:.0f}s old"
    elif missing:
        why = f"no data for {', '.join(missing)}"
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
