"""One InferenceService's Observation from Prometheus: what the policy sees each tick."""

from __future__ import annotations

from kvscale.autoscaling.observation import Observation
from kvscale.metrics.client import PrometheusClient, PrometheusError
from kvscale.metrics.engines import ENGINES
from kvscale.metrics.promql import queries


def observe(
    client: PrometheusClient,
    engine: str,
    namespace: str,
    name: str,
    percentile: float,
    ready_replicas: int,
    starting_replicas: int,
    now_s: float,
    window: str = "1m",
    stale_after_s: float = 120.0,
) -> tuple[Observation, str | None]:
    """The observation, and why metrics are missing (None when they are all there)."""
    built = queries(ENGINES[engine], namespace, name, percentile / 100.0, window)
    values: dict[str, float | None] = {}
    try:
        for key, promql in built.items():
            values[key] = client.scalar(promql)
    except PrometheusError as exc:
        return Observation(
            time_s=now_s, ready_replicas=ready_replicas, starting_replicas=starting_replicas, stale=True
        ), str(exc)
    age = values.get("age")
    stale = age is None or age > stale_after_s
    missing = [k for k in ("rate", "running", "waiting") if values.get(k) is None]
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
            arrival_rate_per_s=values.get("rate"),
            input_tokens_mean=values.get("input_tokens"),
            output_tokens_mean=values.get("output_tokens"),
            ttft_p_s=values.get("ttft"),
            tpot_p_s=values.get("tpot"),
            running=values.get("running"),
            waiting=values.get("waiting"),
            kv_usage=values.get("kv_usage"),
            stale=stale,
        ),
        why,
    )
