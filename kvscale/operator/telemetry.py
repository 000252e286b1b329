"""The operator's own /metrics: desired and current replicas, targets, predicted vs observed
latency, decisions by kind, tick durations, errors. A resource's series go with it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from kvscale.control.scaling import Gauges

REGISTRY = CollectorRegistry()
LABELS = ("namespace", "inferenceservice")

DESIRED = Gauge("kvscale_desired_replicas", "Replicas the policy asked for", LABELS, registry=REGISTRY)
CURRENT = Gauge("kvscale_current_replicas", "Replicas of the engine Deployment", LABELS, registry=REGISTRY)
READY = Gauge("kvscale_ready_replicas", "Engine replicas ready", LABELS, registry=REGISTRY)
NODES = Gauge(
    "kvscale_nodes_per_replica",
    "Nodes one replica spans: a LeaderWorkerSet group's size (replicas then count groups); 1 on one node",
    LABELS,
    registry=REGISTRY,
)
TTFT_TARGET = Gauge("kvscale_ttft_target_seconds", "TTFT target at the SLO percentile", LABELS, registry=REGISTRY)
TPOT_TARGET = Gauge("kvscale_tpot_target_seconds", "TPOT target at the SLO percentile", LABELS, registry=REGISTRY)
TTFT_OBSERVED = Gauge("kvscale_observed_ttft_seconds", "Observed TTFT at the SLO percentile", LABELS, registry=REGISTRY)
TPOT_OBSERVED = Gauge("kvscale_observed_tpot_seconds", "Observed TPOT at the SLO percentile", LABELS, registry=REGISTRY)
TTFT_PREDICTED = Gauge("kvscale_predicted_ttft_seconds", "Planned TTFT at the spec's load", LABELS, registry=REGISTRY)
TPOT_PREDICTED = Gauge("kvscale_predicted_tpot_seconds", "Planned TPOT at the spec's load", LABELS, registry=REGISTRY)
COST = Gauge("kvscale_cost_per_hour_usd", "GPU cost per hour of the current replicas", LABELS, registry=REGISTRY)
METRICS_AVAILABLE = Gauge(
    "kvscale_metrics_available", "1 when engine metrics are present and fresh", LABELS, registry=REGISTRY
)
DECISIONS = Counter("kvscale_decisions", "Policy decisions by kind", (*LABELS, "kind"), registry=REGISTRY)
ERRORS = Counter("kvscale_errors", "Reconcile and tick errors", ("stage",), registry=REGISTRY)
TICK_SECONDS = Histogram("kvscale_tick_duration_seconds", "Autoscaling tick duration", registry=REGISTRY)
RECONCILE_SECONDS = Histogram("kvscale_reconcile_duration_seconds", "Reconcile duration", registry=REGISTRY)
CAPACITY_SEARCH_CPU_SECONDS = Histogram(
    "kvscale_capacity_search_cpu_seconds",
    "CPU seconds of one service's simulated capacity search (status.capacity)",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
HOLDING_TUNE_CPU_SECONDS = Histogram(
    "kvscale_holding_tune_cpu_seconds",
    "CPU seconds of one service's holding tune: its candidates' replays (status.holding, KVSCALE_HOLDING=tuned)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0),
    registry=REGISTRY,
)

_PER_RESOURCE = (
    DESIRED,
    CURRENT,
    READY,
    NODES,
    TTFT_TARGET,
    TPOT_TARGET,
    TTFT_OBSERVED,
    TPOT_OBSERVED,
    TTFT_PREDICTED,
    TPOT_PREDICTED,
    COST,
    METRICS_AVAILABLE,
)
_kinds: dict[tuple[str, str], set[str]] = {}


class _PrometheusErrors(Collector):
    """kvscale_prometheus_errors_total{kind}: the async client's own error counts, read at scrape."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "kvscale_prometheus_errors", "Prometheus queries that gave no usable value, by kind", labels=("kind",)
        )
        for kind, count in sorted(self.counts.items()):
            family.add_metric((kind,), count)
        yield family


_prometheus_errors: _PrometheusErrors | None = None


def count_prometheus_errors(counts: Mapping[str, int]) -> None:
    """Export `counts` (the Prometheus client's errors by kind); replaces an earlier source."""
    global _prometheus_errors
    if _prometheus_errors is not None:
        REGISTRY.unregister(_prometheus_errors)
    _prometheus_errors = _PrometheusErrors(counts)
    REGISTRY.register(_prometheus_errors)


def serve(port: int, address: str = "127.0.0.1") -> None:
    """/metrics on `address` (loopback unless configured: its series name every tenant's services
    and their cost, and it has no auth)."""
    start_http_server(port, addr=address, registry=REGISTRY)


def _set(gauge: Gauge, labels: tuple[str, str], value: float | None) -> None:
    if value is None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)
    else:
        gauge.labels(*labels).set(value)


def export(namespace: str, name: str, g: Gauges) -> None:
    labels = (namespace, name)
    _set(DESIRED, labels, g.desired)
    _set(CURRENT, labels, g.current)
    _set(READY, labels, g.ready)
    _set(NODES, labels, g.nodes_per_replica)
    _set(TTFT_TARGET, labels, g.ttft_target_s)
    _set(TPOT_TARGET, labels, g.tpot_target_s)
    _set(TTFT_PREDICTED, labels, g.ttft_predicted_s)
    _set(TPOT_PREDICTED, labels, g.tpot_predicted_s)
    if g.ttft_observed_s is not None:
        TTFT_OBSERVED.labels(*labels).set(g.ttft_observed_s)
    if g.tpot_observed_s is not None:
        TPOT_OBSERVED.labels(*labels).set(g.tpot_observed_s)
    _set(COST, labels, g.cost_usd_per_hour)
    METRICS_AVAILABLE.labels(*labels).set(1 if g.metrics_available else 0)
    DECISIONS.labels(*labels, g.decision_kind).inc()
    _kinds.setdefault(labels, set()).add(g.decision_kind)


def exported(namespace: str, name: str) -> bool:
    """Whether series of `name` were exported (and not forgotten since)."""
    return (namespace, name) in _kinds


def forget(namespace: str, name: str) -> None:
    """Remove every series of a deleted InferenceService."""
    labels = (namespace, name)
    for gauge in _PER_RESOURCE:
        _set(gauge, labels, None)
    for kind in _kinds.pop(labels, set()):
        with contextlib.suppress(KeyError):
            DECISIONS.remove(*labels, kind)
