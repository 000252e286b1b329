"""The operator's own /metrics: desired and current replicas, targets, predicted vs observed
latency, decisions by kind, tick durations, errors."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry()
LABELS = ("namespace", "inferenceservice")

DESIRED = Gauge("kvscale_desired_replicas", "Replicas the policy asked for", LABELS, registry=REGISTRY)
CURRENT = Gauge("kvscale_current_replicas", "Replicas of the engine Deployment", LABELS, registry=REGISTRY)
READY = Gauge("kvscale_ready_replicas", "Engine replicas ready", LABELS, registry=REGISTRY)
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


def serve(port: int) -> None:
    start_http_server(port, registry=REGISTRY)


def decision_kind(reason: str) -> str:
    for kind in ("scale up", "scale down", "metrics missing", "hold"):
        if reason.startswith(kind) or kind in reason[:40]:
            return kind.replace(" ", "_")
    return "other"
