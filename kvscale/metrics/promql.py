"""PromQL for the engine pods of one InferenceService, or of every service in some namespaces
at once, one series per service (the operator's batched reads). Every label value is escaped.

Each builder takes a `Scope`: which pods, and how the answer is grouped. A service's scope gives
exactly the single-service query (`sum(...)`); a fleet scope tags each series with its service
(from the pod name, as the Deployment names its pods) and aggregates `by (namespace, service)`,
so one query answers for every service. A builder written with `Scope.agg` batches for free.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kvscale.autoscaling.observation import MIN_BURST_WINDOWS
from kvscale.metrics.engines import EngineMetrics
from kvscale.sizing.units import parse_duration_s
from kvscale.sizing.workload import BURST_WINDOW_SDS

SERVICE_LABEL = "kvscale_service"  # the InferenceService a series belongs to, in batched answers
# A Deployment's pods are <name>-<pod-template-hash>-<suffix>; the name is what comes before.
POD_NAME_SUFFIX = "-[a-z0-9]+-[a-z0-9]+"


def escape_label_value(value: str) -> str:
    """A string safe inside a double-quoted PromQL label matcher."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def pod_selector(namespace: str, name: str) -> str:
    """The engine pods of one InferenceService: its Deployment's pods are <name>-<hash>-<id>."""
    pods = re.escape(name) + POD_NAME_SUFFIX
    return f'namespace="{escape_label_value(namespace)}",pod=~"{escape_label_value(pods)}"'


def escaped(name: str) -> str:
    """A metric name as it is stored when the scrape asked for escaped names. vLLM serves
    /metrics with prometheus_client (vllm/entrypoints/openai/api_server.py `mount_metrics`:
    make_asgi_app), which picks the format from the scraper's Accept header
    (prometheus_client 0.26 exposition.py `choose_encoder`): Prometheus 3 asks for
    `escaping=allow-utf-8` and stores `vllm:num_requests_running`; a Prometheus 2 (OpenMetrics
    without an escaping parameter) or a scrape with `metric_name_validation_scheme: legacy`
    gets the "underscores" escaping, and its samples read `vllm_num_requests_running`."""
    return name.replace(":", "_")


@dataclass(frozen=True)
class Scope:
    """The pods a query reads (`matchers`) and the labels its answer is grouped by (none: one
    service, one value)."""

    matchers: str
    by: tuple[str, ...] = ()

    @classmethod
    def service(cls, namespace: str, name: str) -> Scope:
        return cls(pod_selector(namespace, name))

    @classmethod
    def fleet(cls, namespaces: tuple[str, ...]) -> Scope:
        """Every engine pod in `namespaces`, answered per (namespace, service)."""
        names = "|".join(re.escape(n) for n in sorted(set(namespaces)))
        pods = ".+" + POD_NAME_SUFFIX
        return cls(
            f'namespace=~"{escape_label_value(names)}",pod=~"{escape_label_value(pods)}"', ("namespace", SERVICE_LABEL)
        )

    def series(self, metric: str) -> str:
        """The vector selector of `metric` within the scope."""
        return f'{{__name__="{metric}",{self.matchers}}}'

    def agg(self, op: str, inner: str, by: tuple[str, ...] = ()) -> str:
        """`op` over the instant vector `inner`, grouped by `by` and, batched, by service."""
        labels = (*by, *self.by)
        if self.by:
            inner = f'label_replace({inner}, "{SERVICE_LABEL}", "$1", "pod", "(.+){POD_NAME_SUFFIX}")'
        return f"{op} by ({', '.join(labels)}) ({inner})" if labels else f"{op}({inner})"


Selector = Scope | str  # a bare string: label matchers of one service (pod_selector)


def _scope(selector: Selector) -> Scope:
    return selector if isinstance(selector, Scope) else Scope(selector)


def _each(names: tuple[str, ...], build: Callable[[str], str]) -> str:
    """`build(metric)` for each alternative metric name, joined with `or` (older engine names):
    per service in a batched answer, the first name that has data wins. Each name as served
    and as escaped (see `escaped`)."""
    alternatives = dict.fromkeys(n for m in names for n in (m, escaped(m)))
    return " or ".join(build(m) for m in alternatives)


def histogram_quantile(names: tuple[str, ...], selector: Selector, quantile: float, window: str) -> str:
    sc = _scope(selector)

    def one(m: str) -> str:
        buckets = sc.agg("sum", f"rate({sc.series(m + '_bucket')}[{window}])", ("le",))
        return f"histogram_quantile({quantile}, {buckets})"

    return _each(names, one)


def gauge_sum(names: tuple[str, ...], selector: Selector) -> str:
    sc = _scope(selector)
    return _each(names, lambda m: sc.agg("sum", sc.series(m)))


def gauge_avg(names: tuple[str, ...], selector: Selector) -> str:
    sc = _scope(selector)
    return _each(names, lambda m: sc.agg("avg", sc.series(m)))


def gauge_max(names: tuple[str, ...], selector: Selector) -> str:
    """The largest value of one pod (the longest per-pod queue)."""
    sc = _scope(selector)
    return _each(names, lambda m: sc.agg("max", sc.series(m)))


def counter_rate(names: tuple[str, ...], selector: Selector, window: str) -> str:
    """A counter's per-second rate, summed over the pods (and over any label the engine adds)."""
    sc = _scope(selector)
    return _each(names, lambda m: sc.agg("sum", f"rate({sc.series(m)}[{window}])"))


def token_rate(counter: tuple[str, ...], histogram: tuple[str, ...], selector: Selector, window: str) -> str:
    """Tokens per second from the engine's token counter, else from its length histogram's
    `_sum` (which counts a request only when it finishes)."""
    return counter_rate(counter + tuple(f"{m}_sum" for m in histogram), selector, window)


def prefix_cache_hit_ratio(engine: EngineMetrics, selector: Selector, window: str) -> str | None:
    """Prompt tokens found in the prefix cache over those looked up (every prompt token where
    the engine counts no lookups); None when the engine exports no hit counter."""
    if not engine.prefix_cache_hits_counter:
        return None
    looked_up = engine.prefix_cache_queries_counter or engine.prompt_tokens_counter
    if not looked_up:
        return None
    hits = counter_rate(engine.prefix_cache_hits_counter, selector, window)
    return f"({hits}) / ({counter_rate(looked_up, selector, window)})"


def length_histogram(names: tuple[str, ...], selector: Selector, window: str) -> str:
    """Requests per second by length bucket (cumulative, one series per `le`)."""
    sc = _scope(selector)
    return _each(names, lambda m: sc.agg("sum", f"rate({sc.series(m + '_bucket')}[{window}])", ("le",)))


def peak(expr: str, over: str, step: str) -> str:
    """The highest value `expr` (a rate over a short window) took over the last `over`,
    evaluated every `step` (a subquery)."""
    return f"max_over_time(({expr})[{over}:{step}])"


def mean_from_histogram(names: tuple[str, ...], selector: Selector, window: str) -> str:
    sc = _scope(selector)

    def one(m: str) -> str:
        total = sc.agg("sum", f"rate({sc.series(m + '_sum')}[{window}])")
        count = sc.agg("sum", f"rate({sc.series(m + '_count')}[{window}])")
        return f"{total} / {count}"

    return _each(names, one)


def arrival_rate(engine: EngineMetrics, selector: Selector, window: str) -> str:
    """Completions per second plus the queue's growth: arrivals, even when the fleet lags."""
    sc = _scope(selector)
    done = counter_rate(engine.success_counter, sc, window)
    growth = _each(engine.waiting_gauge, lambda m: sc.agg("sum", f"deriv({sc.series(m)}[{window}])"))
    return f"({done}) + clamp_min(({growth}), 0)"


def freshness(engine: EngineMetrics, selector: Selector) -> str:
    """Age in seconds of the newest sample of the running gauge."""
    sc = _scope(selector)
    return _each(engine.running_gauge, lambda m: f"time() - {sc.agg('max', f'timestamp({sc.series(m)})')}")


def requests_counted(names: tuple[str, ...], selector: Selector, window: str) -> str:
    """How many pods counted requests in the histogram over the window (0 or absent: none)."""
    sc = _scope(selector)
    return _each(names, lambda m: sc.agg("count", f"rate({sc.series(m + '_count')}[{window}]) > 0"))


def queries(engine: EngineMetrics, namespace: str, name: str, quantile: float, window: str) -> dict[str, str]:
    """PromQL per observation key for one service (see `scoped_queries`)."""
    return scoped_queries(engine, Scope.service(namespace, name), quantile, window)


def scoped_queries(engine: EngineMetrics, sel: Scope, quantile: float, window: str) -> dict[str, str]:
    """PromQL per observation key. TPOT reads the per-request histogram and falls back to
    inter-token latency (`or`); `tpot_per_request` says whether the per-request one had data.
    No `ttft` key for an engine without a TTFT histogram (TGI)."""
    out = {
        "tpot": histogram_quantile(engine.tpot_histogram + engine.itl_histogram, sel, quantile, window),
        "running": gauge_sum(engine.running_gauge, sel),
        "waiting": gauge_sum(engine.waiting_gauge, sel),
        "waiting_max": gauge_max(engine.waiting_gauge, sel),
        "rate": arrival_rate(engine, sel, window),
        "input_tokens": mean_from_histogram(engine.prompt_tokens_histogram, sel, window),
        "output_tokens": mean_from_histogram(engine.generation_tokens_histogram, sel, window),
        "age": freshness(engine, sel),
    }
    if engine.ttft_histogram:
        out["ttft"] = histogram_quantile(engine.ttft_histogram, sel, quantile, window)
    if engine.itl_histogram:
        out["tpot_per_request"] = requests_counted(engine.tpot_histogram, sel, window)
    if engine.kv_usage_gauge:
        out["kv_usage"] = gauge_avg(engine.kv_usage_gauge, sel)
    out.update(work_queries(engine, sel, window))
    return out


def work_queries(engine: EngineMetrics, sel: Selector, window: str) -> dict[str, str]:
    """Work units: prompt and generated tokens per second and the prefix-cache hit ratio."""
    out = {
        "prompt_tokens_rate": token_rate(engine.prompt_tokens_counter, engine.prompt_tokens_histogram, sel, window),
        "generation_tokens_rate": token_rate(
            engine.generation_tokens_counter, engine.generation_tokens_histogram, sel, window
        ),
    }
    ratio = prefix_cache_hit_ratio(engine, sel, window)
    if ratio is not None:
        out["prefix_cache_hit_ratio"] = ratio
    return out


# The short window of the peak rates and the subquery step per lookback: a step finer than
# the window would only re-read the same scrapes.
PEAK_LOOKBACKS = (("1h", "30s"), ("1d", "2m"))


def _ms(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def arrivals_per_pod(engine: EngineMetrics, selector: Selector, burst: str) -> str:
    """Requests that arrived at each pod over the last `burst`, from its samples at scrape
    resolution: its completions plus the growth of its requests in flight (running and
    waiting): every request the engine took in, whether it finished yet or not. No rate():
    exact differences of scraped values, no extrapolation. Clamped at zero (a restart resets
    the counter and the gauges at once)."""

    sc = _scope(selector)

    def per_pod(names: tuple[str, ...], offset: str) -> str:
        off = f" offset {offset}" if offset else ""
        return "(" + _each(names, lambda m: f"sum by (namespace, pod) ({sc.series(m)}{off})") + ")"

    terms = [
        f"{per_pod(names, '')} - {per_pod(names, burst)}"
        for names in (engine.success_counter, engine.running_gauge, engine.waiting_gauge)
    ]
    return f"clamp_min({' + '.join(terms)}, 0)"


def burst_queries(engine: EngineMetrics, selector: Selector, window: str, burst: str) -> dict[str, str]:
    """The arrivals' burstiness over `window`, from the requests arriving per `burst`
    (evaluated at steps of `burst`, so the counts are of disjoint windows; `burst` must be at
    least twice the scrape interval):
    - `arrival_dispersion`: the index of dispersion, as
      kvscale.autoscaling.observation.dispersion_of_counts computes it: the mean squared
      difference of neighbouring windows' counts (idelta over two points of a subquery) over
      twice their mean;
    - `arrivals_in_bursts`: the share of the arrivals in windows far above the mean of the
      windows before them (BURST_WINDOW_SDS Poisson standard deviations and one more above
      the last BURST_MEAN_SPAN_S's mean, as Burstiness.from_arrivals judges a window against
      its minute); no answer when no window is;
    - `burst_requests`: those windows' arrivals above that mean, size-biased (sum of squares
      over sum): the burst a request of one finds (a burst split by a window edge counts as
      two here, where from_arrivals joins the run)."""
    b = parse_duration_s(burst)
    count = f"({_scope(selector).agg('sum', arrivals_per_pod(engine, selector, burst))})"
    change = f"idelta({count}[{_ms(2 * b)}:{burst}])"
    local = f"avg_over_time({count}[{_ms(max(BURST_MEAN_SPAN_S, 4 * b))}:{burst}])"
    far = f"({count} > ({local} + {BURST_WINDOW_SDS:g} * sqrt({local}) + 1))"
    excess = f"({far} - {local})"
    return {
        "arrival_dispersion": f"avg_over_time(({change} ^ 2)[{window}:{burst}]) / (2 * avg_over_time({count}[{window}:{burst}]))",
        "arrivals_in_bursts": f"sum_over_time({far}[{window}:{burst}]) / sum_over_time({count}[{window}:{burst}])",
        "burst_requests": f"sum_over_time(({excess} ^ 2)[{window}:{burst}]) / sum_over_time({excess}[{window}:{burst}])",
    }


BURST_MEAN_SPAN_S = 120.0  # a burst window is judged against the mean of this long before it (at least 4 windows)


def workload_queries(
    engine: EngineMetrics, namespace: str, name: str, window: str, peak_window: str, burst_window: str | None = None
) -> dict[str, str]:
    """PromQL per key for one service's observed workload (see `scoped_workload_queries`)."""
    return scoped_workload_queries(engine, Scope.service(namespace, name), window, peak_window, burst_window)


def scoped_workload_queries(
    engine: EngineMetrics, sel: Scope, window: str, peak_window: str, burst_window: str | None = None
) -> dict[str, str]:
    """PromQL per key for the observed workload over `window` (minutes): completions/s, mean
    lengths, token rates, the prefix-cache hit ratio, the peaks over the last hour and day
    of the request and prompt-token rates over `peak_window`, and the arrivals' index of
    dispersion over `burst_window` (when the window holds MIN_BURST_WINDOWS of them). The
    `*_lengths` keys answer a vector (one series per bucket bound); the others one value
    (per service, batched)."""
    out = {
        "rate": counter_rate(engine.success_counter, sel, window),
        "input_tokens": mean_from_histogram(engine.prompt_tokens_histogram, sel, window),
        "output_tokens": mean_from_histogram(engine.generation_tokens_histogram, sel, window),
        "prompt_lengths": length_histogram(engine.prompt_tokens_histogram, sel, window),
        "output_lengths": length_histogram(engine.generation_tokens_histogram, sel, window),
        **work_queries(engine, sel, window),
    }
    short = {
        "requests": counter_rate(engine.success_counter, sel, peak_window),
        "prompt_tokens": token_rate(engine.prompt_tokens_counter, engine.prompt_tokens_histogram, sel, peak_window),
    }
    for lookback, step in PEAK_LOOKBACKS:
        for key, expr in short.items():
            out[f"peak_{key}_{lookback}"] = peak(expr, lookback, step)
    if burst_window is not None and parse_duration_s(window) >= MIN_BURST_WINDOWS * parse_duration_s(burst_window):
        out.update(burst_queries(engine, sel, window, burst_window))
    return out


def in_flight_by_pod(engine: EngineMetrics, namespace: str, name: str) -> str:
    """Requests in flight on each engine pod of one service (running plus queued in the engine),
    by pod: what a scale-down's pod-deletion-cost is made of (kvscale.autoscaling.drain). One
    name matcher over the gauges as served and as escaped (a scrape stores one of them)."""
    names = dict.fromkeys(n for m in (*engine.running_gauge, *engine.waiting_gauge) for n in (m, escaped(m)))
    pattern = "|".join(re.escape(n) for n in names)
    return f'sum by (pod) ({{__name__=~"{escape_label_value(pattern)}",{pod_selector(namespace, name)}}})'
