"""PromQL for one InferenceService's pods. Every label value is escaped."""

from __future__ import annotations

import re

from kvscale.metrics.engines import EngineMetrics


def escape_label_value(value: str) -> str:
    """A string safe inside a double-quoted PromQL label matcher."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def pod_selector(namespace: str, name: str) -> str:
    """The engine pods of one InferenceService: its Deployment's pods are <name>-<hash>-<id>."""
    pods = re.escape(name) + "-[a-z0-9]+-[a-z0-9]+"
    return f'namespace="{escape_label_value(namespace)}",pod=~"{escape_label_value(pods)}"'


def _first(names: tuple[str, ...], build: str) -> str:
    """`build` for each alternative metric name, joined with `or` (older engine names)."""
    return " or ".join(build.format(m=m) for m in names)


def histogram_quantile(names: tuple[str, ...], selector: str, quantile: float, window: str) -> str:
    return _first(
        names,
        f'histogram_quantile({quantile}, sum by (le) (rate({{{{__name__="{{m}}_bucket",{selector}}}}}[{window}])))',
    )


def gauge_sum(names: tuple[str, ...], selector: str) -> str:
    return _first(names, f'sum({{{{__name__="{{m}}",{selector}}}}})')


def gauge_avg(names: tuple[str, ...], selector: str) -> str:
    return _first(names, f'avg({{{{__name__="{{m}}",{selector}}}}})')


def mean_from_histogram(names: tuple[str, ...], selector: str, window: str) -> str:
    return _first(
        names,
        f'sum(rate({{{{__name__="{{m}}_sum",{selector}}}}}[{window}])) / sum(rate({{{{__name__="{{m}}_count",{selector}}}}}[{window}]))',
    )


def arrival_rate(engine: EngineMetrics, selector: str, window: str) -> str:
    """Completions per second plus the queue's growth: arrivals, even when the fleet lags."""
    done = _first(engine.success_counter, f'sum(rate({{{{__name__="{{m}}",{selector}}}}}[{window}]))')
    growth = _first(engine.waiting_gauge, f'sum(deriv({{{{__name__="{{m}}",{selector}}}}}[{window}]))')
    return f"({done}) + clamp_min(({growth}), 0)"


def freshness(engine: EngineMetrics, selector: str) -> str:
    """Age in seconds of the newest sample of the running gauge."""
    return _first(engine.running_gauge, f'time() - max(timestamp({{{{__name__="{{m}}",{selector}}}}}))')


def queries(engine: EngineMetrics, namespace: str, name: str, quantile: float, window: str) -> dict[str, str]:
    """PromQL per observation key. TPOT reads the per-request histogram and falls back to
    inter-token latency (`or`); `tpot_per_request` says whether the per-request one had data.
    No `ttft` key for an engine without a TTFT histogram (TGI)."""
    sel = pod_selector(namespace, name)
    out = {
        "tpot": histogram_quantile(engine.tpot_histogram + engine.itl_histogram, sel, quantile, window),
        "running": gauge_sum(engine.running_gauge, sel),
        "waiting": gauge_sum(engine.waiting_gauge, sel),
        "rate": arrival_rate(engine, sel, window),
        "input_tokens": mean_from_histogram(engine.prompt_tokens_histogram, sel, window),
        "output_tokens": mean_from_histogram(engine.generation_tokens_histogram, sel, window),
        "age": freshness(engine, sel),
    }
    if engine.ttft_histogram:
        out["ttft"] = histogram_quantile(engine.ttft_histogram, sel, quantile, window)
    if engine.itl_histogram:
        out["tpot_per_request"] = _first(
            engine.tpot_histogram, f'count(rate({{{{__name__="{{m}}_count",{sel}}}}}[{window}]) > 0)'
        )
    if engine.kv_usage_gauge:
        out["kv_usage"] = gauge_avg(engine.kv_usage_gauge, sel)
    return out
