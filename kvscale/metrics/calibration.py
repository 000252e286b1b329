"""Calibration's reads: per-engine windows (kvscale.calibration.fit.Window) from a Prometheus
into which the engines are scraped, by range queries (one point per window, each over the
window before it, so the windows do not overlap).

The query builders and the matrix-to-windows step are pure; `read_windows` is the one call
that goes over HTTP (the Prometheus HTTP API's /api/v1/query_range,
https://prometheus.io/docs/prometheus/latest/querying/api/#range-queries).

Per engine (series grouped by namespace, pod and instance: one engine per pod) and window:
- the mean inter-token gap: increase of the ITL histogram's `_sum` over its `_count`; where an
  engine exports no ITL histogram, vllm:request_decode_time_seconds's sum over the gaps of
  the same finished requests (generated tokens less one per request);
- the mean prefill time and the mean prompt of the same finished requests (both histograms
  are observed at a request's finish);
- the running batch per engine step: generated tokens (vllm:generation_tokens_total) over
  steps (vllm:iteration_tokens_total's count), else the running gauge's mean;
- the mean KV tokens per running sequence: the KV usage gauge's mean times the cache's tokens
  (vllm:cache_config_info's num_gpu_blocks x block_size, else the catalog's estimate) over
  the running gauge's mean.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kvscale.calibration.fit import Window
from kvscale.metrics.engines import EngineMetrics
from kvscale.metrics.promql import escape_label_value, escaped

if TYPE_CHECKING:
    from kvscale.metrics.client import AsyncPrometheusClient

GROUP = ("namespace", "pod", "instance")  # one engine per pod (per target where no pod label)
Key = tuple[str, ...]
Series = dict[tuple[Key, float], float]  # (engine, window end) -> value


class SelectorError(ValueError):
    """A --selector that is not a list of PromQL label matchers."""


_MATCHER = re.compile(r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')


def matchers(namespace: str | None, selector: str | None) -> str:
    """The label matchers of the series to read: `namespace="N"` and the user's own
    (`pod=~"llama-.*",job="vllm"`, braces optional)."""
    parts: list[str] = []
    if namespace:
        parts.append(f'namespace="{escape_label_value(namespace)}"')
    if selector and selector.strip():
        inner = selector.strip().removeprefix("{").removesuffix("}")
        rest = inner
        while rest.strip():
            m = _MATCHER.match(rest)
            if m is None:
                raise SelectorError(
                    f"--selector {selector!r}: expected PromQL label matchers such as "
                    'pod=~"llama-.*",job="vllm" (name, one of = != =~ !~, a double-quoted value)'
                )
            rest = rest[m.end() :]
            if rest.strip().startswith(","):
                rest = rest.strip()[1:]
            elif rest.strip():
                raise SelectorError(f"--selector {selector!r}: separate the matchers with commas")
        parts.append(inner.strip().rstrip(","))
    return ",".join(parts)


def _alternatives(names: tuple[str, ...], suffix: str, build: Callable[[str], str]) -> str:
    """`build(series selector)` for each name (and its escaped form: a Prometheus 2 scrape
    stores `vllm_...`), joined with `or`: the first name with data wins, per engine."""
    forms = dict.fromkeys(n + suffix for m in names for n in (m, escaped(m)))
    return " or ".join(build(f) for f in forms)


def window_queries(engine: EngineMetrics, where: str, window: str) -> dict[str, str]:
    """Range queries, one value per engine and window; empty alternatives left out."""
    by = ", ".join(GROUP)
    sel = f",{where}" if where else ""

    def increase(names: tuple[str, ...], suffix: str = "") -> str:
        return _alternatives(names, suffix, lambda n: f'sum by ({by}) (increase({{__name__="{n}"{sel}}}[{window}]))')

    def mean(names: tuple[str, ...]) -> str:
        return _alternatives(names, "", lambda n: f'avg by ({by}) (avg_over_time({{__name__="{n}"{sel}}}[{window}]))')

    wanted = {
        "gap_sum": increase(engine.itl_histogram, "_sum"),
        "gap_count": increase(engine.itl_histogram, "_count"),
        "decode_sum": increase(engine.decode_time_histogram, "_sum"),
        "decode_count": increase(engine.decode_time_histogram, "_count"),
        "generated_sum": increase(engine.generation_tokens_histogram, "_sum"),
        "prefill_sum": increase(engine.prefill_time_histogram, "_sum"),
        "prefill_count": increase(engine.prefill_time_histogram, "_count"),
        "prompt_sum": increase(engine.prompt_tokens_histogram, "_sum"),
        "prompt_count": increase(engine.prompt_tokens_histogram, "_count"),
        "steps": increase(engine.iteration_tokens_histogram, "_count"),
        "generated": increase(engine.generation_tokens_counter),
        "running": mean(engine.running_gauge),
        "kv_usage": mean(engine.kv_usage_gauge),
    }
    return {k: q for k, q in wanted.items() if q}


def info_queries(engine: EngineMetrics, where: str) -> dict[str, str]:
    """Instant queries: the model each engine serves, and its KV cache's size."""
    sel = f",{where}" if where else ""
    by = ", ".join(GROUP)
    out = {
        "models": _alternatives(
            engine.running_gauge, "", lambda n: f'count by ({by}, model_name) ({{__name__="{n}"{sel}}})'
        )
    }
    if engine.cache_config_info:
        out["cache"] = _alternatives(
            engine.cache_config_info,
            "",
            lambda n: f'max by ({by}, num_gpu_blocks, block_size) ({{__name__="{n}"{sel}}})',
        )
    return out


def key_of(labels: dict[str, str]) -> Key:
    return tuple(labels.get(label, "") for label in GROUP)


def matrix(body: dict[str, Any]) -> Series:
    """A range query's answer as (engine, time) -> value; ValueError when it is not a matrix."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise ValueError("not a Prometheus matrix answer")
    out: Series = {}
    for series in data["result"]:
        key = key_of(series.get("metric") or {})
        for ts, value in series.get("values") or []:
            number = float(value)
            if math.isfinite(number):
                out[(key, float(ts))] = number
    return out


def cache_tokens(cache: list[dict[str, str]]) -> dict[Key, float]:
    """KV cache tokens per engine from vllm:cache_config_info's labels."""
    out: dict[Key, float] = {}
    for labels in cache:
        try:
            out[key_of(labels)] = float(labels["num_gpu_blocks"]) * float(labels["block_size"])
        except (KeyError, ValueError):
            continue
    return out


def windows(series: dict[str, Series], kv_tokens: Callable[[Key], float]) -> list[Window]:
    """One Window per engine and window end that saw any decode or prefill."""

    def get(name: str, point: tuple[Key, float]) -> float:
        return series.get(name, {}).get(point, 0.0)

    points = sorted({p for name in ("gap_count", "decode_count", "prefill_count") for p in series.get(name, {})})
    out: list[Window] = []
    for point in points:
        key, ts = point
        gaps, gap_total = get("gap_count", point), get("gap_sum", point)
        if gaps <= 0:  # no ITL histogram: the finished requests' decode time over their gaps
            requests = get("decode_count", point)
            gaps, gap_total = get("generated_sum", point) - requests, get("decode_sum", point)
        prefills, prompts = get("prefill_count", point), get("prompt_count", point)
        steps, running = get("steps", point), get("running", point)
        batch = get("generated", point) / steps if steps > 0 and get("generated", point) > 0 else running
        context = get("kv_usage", point) * kv_tokens(key) / running if running > 0 else 0.0
        when = datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S")
        out.append(
            Window(
                batch=batch,
                context_tokens=context,
                gaps=max(gaps, 0.0),
                gap_s=gap_total / gaps if gaps > 0 else math.nan,
                prefills=prefills,
                prefill_s=get("prefill_sum", point) / prefills if prefills > 0 else math.nan,
                prompt_tokens=get("prompt_sum", point) / prompts if prompts > 0 else 0.0,
                steps=steps if steps > 0 else None,
                label=f"{key[1] or key[2]} @ {when}",
            )
        )
    return out


@dataclass(frozen=True)
class Reading:
    series: dict[str, Series]
    cache: dict[Key, float]  # KV cache tokens per engine, from vllm:cache_config_info
    models: set[str]  # model_name labels seen

    @property
    def engines(self) -> int:
        """Engines (pods) that reported."""
        return len({key for s in self.series.values() for key, _ in s})

    @property
    def kv_from_engine(self) -> bool:
        return bool(self.cache)

    def windows(self, kv_fallback_tokens: float) -> list[Window]:
        """The windows, with the catalog's KV capacity for engines that do not say theirs."""
        return windows(self.series, lambda key: self.cache.get(key, kv_fallback_tokens))


def read_windows(
    url: str,
    engine: EngineMetrics,
    where: str,
    start_s: float,
    end_s: float,
    window_s: float,
    timeout_s: float = 30.0,
) -> Reading:
    """The windows between start and end; PrometheusError (kvscale.metrics.client) when
    Prometheus cannot answer."""
    import httpx

    from kvscale.metrics.client import MissingKind, PrometheusError, parse_response

    base = url.rstrip("/")
    window = f"{round(window_s)}s"
    series: dict[str, Series] = {}
    with httpx.Client(timeout=timeout_s) as http:
        for name, promql in window_queries(engine, where, window).items():
            params: dict[str, str | float] = {
                "query": promql,
                "start": start_s + window_s,
                "end": end_s,
                "step": window,
            }
            try:
                response = http.get(f"{base}/api/v1/query_range", params=params)
            except httpx.HTTPError as exc:
                raise PrometheusError(f"Prometheus at {base} unreachable: {exc}") from exc
            try:
                body = response.json()
            except ValueError:
                body = None
            if response.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
                error = body.get("error") if isinstance(body, dict) else response.text[:200]
                raise PrometheusError(
                    f"Prometheus at {base} refused a range query (HTTP {response.status_code}): {error}",
                    MissingKind.REJECTED,
                )
            try:
                series[name] = matrix(body)
            except ValueError as exc:
                raise PrometheusError(f"Prometheus at {base}: {exc}", MissingKind.MALFORMED) from exc
        info: dict[str, list[dict[str, str]]] = {}
        for name, promql in info_queries(engine, where).items():
            try:
                response = http.get(f"{base}/api/v1/query", params={"query": promql, "time": end_s})
            except httpx.HTTPError as exc:
                raise PrometheusError(f"Prometheus at {base} unreachable: {exc}") from exc
            info[name] = [s.labels for s in parse_response(promql, response.status_code, response.content)]
    models = {labels.get("model_name", "") for labels in info.get("models", [])} - {""}
    return Reading(series, cache_tokens(info.get("cache", [])), models)


async def read_windows_async(
    client: AsyncPrometheusClient, engine: EngineMetrics, where: str, start_s: float, end_s: float, window_s: float
) -> Reading:
    """read_windows through the operator's async client (its deadline per query): the same
    queries, no thread held while Prometheus answers."""
    from kvscale.metrics.client import MissingKind, PrometheusError

    window = f"{round(window_s)}s"
    series: dict[str, Series] = {}
    for name, promql in window_queries(engine, where, window).items():
        body = await client.query_range(promql, start_s + window_s, end_s, window_s)
        try:
            series[name] = matrix(body)
        except ValueError as exc:
            raise PrometheusError(f"Prometheus at {client.base_url}: {exc}", MissingKind.MALFORMED) from exc
    info = {
        name: [s.labels for s in await client.query(promql)] for name, promql in info_queries(engine, where).items()
    }
    models = {labels.get("model_name", "") for labels in info.get("models", [])} - {""}
    return Reading(series, cache_tokens(info.get("cache", [])), models)
