"""The arrivals of one service's recent window at scrape resolution: the requests its engines
took in per step (kvscale.metrics.promql.arrivals_per_pod summed over its pods), read with one
range query. What the online capacity search replays (kvscale.sim.online.synthesize)."""

from __future__ import annotations

import math
from typing import Any

from kvscale.metrics.client import AsyncPrometheusClient, PrometheusError
from kvscale.metrics.engines import EngineMetrics
from kvscale.metrics.promql import arrivals_per_pod, pod_selector


def arrival_counts_query(engine: EngineMetrics, namespace: str, name: str, step_s: float) -> str:
    """Requests the service's engines took in over each `step_s` (at least twice the scrape interval)."""
    return f"sum({arrivals_per_pod(engine, pod_selector(namespace, name), f'{round(step_s)}s')})"


def counts_of(body: dict[str, Any], start_s: float, step_s: float, steps: int) -> list[float] | None:
    """The counts per step from a range query's answer, oldest first, `steps` of them from
    `start_s` (a step without a sample counts none: no engine answered then); None when the
    answer is not a matrix or holds no sample."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        return None
    counts = [0.0] * steps
    seen = False
    for series in data["result"]:
        for ts, value in series.get("values") or []:
            i = round((float(ts) - start_s) / step_s)
            number = float(value)
            if 0 <= i < steps and math.isfinite(number) and number >= 0:
                counts[i] += number
                seen = True
    return counts if seen else None


async def arrival_counts(
    client: AsyncPrometheusClient,
    engine: EngineMetrics,
    namespace: str,
    name: str,
    now_s: float,
    window_s: float,
    step_s: float,
) -> list[float] | None:
    """Requests per `step_s` over the last `window_s`, oldest first; None when Prometheus has
    none to give (unreachable, refused, no series): the caller synthesizes from the window's
    rate and burstiness instead."""
    steps = max(1, math.floor(window_s / step_s))
    start_s = now_s - (steps - 1) * step_s
    try:
        body = await client.query_range(arrival_counts_query(engine, namespace, name, step_s), start_s, now_s, step_s)
    except PrometheusError:
        return None
    return counts_of(body, start_s, step_s, steps)
