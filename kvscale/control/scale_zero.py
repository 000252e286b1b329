"""Scale to zero and back, on a tick: with minReplicas 0 the last replica goes after
spec.scaling.idleWindow without requests, and comes back when requests wait at the gateway.

The signal that exists while no replica runs is the endpoint picker's flow-control queue of
the service's InferencePool: `inference_extension_flow_control_queue_size` (a gauge, labels
fairness_id, priority, inference_pool, model_name, target_model_name), defined in
sigs.k8s.io/gateway-api-inference-extension v1.3.0, pkg/epp/metrics/metrics.go
(flowControlQueueSize, Subsystem "inference_extension"). The llm-d router re-exports the
picker's metrics under its own prefix (llm_d_epp_*); that name was not checked against its
source (the Go module proxy refused the llm-d module here), so it is not read.

Or, with spec.routing.kedaHttp, the KEDA HTTP add-on's interceptor: it holds a request until
the target has a replica (KEDA_CONDITION_WAIT_TIMEOUT) and counts it, from arrival until its
response ends, per HTTPScaledObject: `interceptor_pending_request_count` (an OpenTelemetry
Int64UpDownCounter, exported to Prometheus as a gauge, attribute `host` = the
HTTPScaledObject's "<namespace>/<name>"), defined in github.com/kedacore/http-add-on v0.8.0,
interceptor/metrics/prommetrics.go (RecordPendingRequestCount, called from
interceptor/middleware/counting.go with k8s.NamespacedNameFromObject(httpso).String()) and
served on the interceptor's KEDA_HTTP_OTEL_PROM_EXPORTER_PORT (2223; interceptor/config/
metrics.go). The same count, per host, is what its external scaler hands KEDA
(scaler/handlers.go GetMetrics, count.Concurrency). Later add-on versions were refused by the
Go module proxy here (403), so v0.8.0 is the version checked.

Behind a plain Service nothing holds a request while no replica runs: minReplicas 0 there is
refused with a condition (ScaleToZero False, NoQueueSignal) and one replica is kept.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from kvscale.api.intent import Intent
from kvscale.api.models import InferenceServiceStatus
from kvscale.autoscaling.observation import Observation
from kvscale.autoscaling.tick import Idle, Wake, idled
from kvscale.control.reconcile import Event, Resource
from kvscale.control.scaling import Fleet, Tick
from kvscale.control.status import condition, now_rfc3339, with_conditions, without_condition
from kvscale.metrics.promql import escape_label_value

CONDITION = "ScaleToZero"
QUEUE_METRIC = "inference_extension_flow_control_queue_size"
KEDA_PENDING_METRIC = "interceptor_pending_request_count"


def _s(seconds: float) -> str:
    return f"{seconds:.0f}s"


def pool_name(intent: Intent, res: Resource) -> str | None:
    return intent.routing.pool(res.name)


def queue_promql(namespace: str, pool: str) -> str:
    """Requests the pool's endpoint picker holds now (all priorities and fairness groups).

    `inference_pool` is the pool's bare name (the picker's --pool-name; v1.3.0
    pkg/epp/flowcontrol/controller/controller.go passes req.InferencePoolName()), so one pool
    name in two namespaces is one label value: the namespace tells them apart. The picker runs
    in its pool's namespace (config/charts/inferencepool/templates/epp-deployment.yaml deploys
    it beside the pool with --pool-namespace {{ .Release.Namespace }}; endpointPickerRef is a
    local reference), and a pod scrape's target label `namespace` is the picker pod's. The
    picker exports no `namespace` of its own, so a scrape that lets target labels win
    (honor_labels false, the default) leaves no other tenant able to write this one."""
    ns, name = escape_label_value(namespace), escape_label_value(pool)
    return f'sum({QUEUE_METRIC}{{namespace="{ns}",inference_pool="{name}"}})'


def keda_promql(namespace: str, http_scaled_object: str) -> str:
    """Requests the KEDA HTTP add-on's interceptors hold or forward now for the HTTPScaledObject
    (summed over interceptor replicas). The interceptor runs in KEDA's namespace, not the
    service's, so the service's namespace is named in `host` ("<namespace>/<name>", one label
    value, escaped), not in `namespace`. A target label does not override `host`: the chart's
    engine PodMonitor drops interceptor_* series an engine pod exposes for that reason."""
    host = escape_label_value(f"{namespace}/{http_scaled_object}")
    return f'sum({KEDA_PENDING_METRIC}{{host="{host}"}})'


def queue_queries(intent: Intent, res: Resource) -> tuple[str, ...]:
    """The PromQL of every gateway queue the service's routing provides (none: a plain Service)."""
    queries = []
    pool = pool_name(intent, res)
    if pool is not None:
        queries.append(queue_promql(res.namespace, pool))
    keda = intent.routing.scaled_object(res.name)
    if keda is not None:
        queries.append(keda_promql(res.namespace, keda))
    return tuple(queries)


def gateway_queue(readings: list[float | None]) -> float | None:
    """The requests waiting at the gateways, or None when any of them was not read (a missing
    metric never releases the last replica)."""
    if not readings or any(r is None for r in readings):
        return None
    return float(sum(r for r in readings if r is not None))


def wants_zero(intent: Intent) -> bool:
    return intent.scaling.min_replicas == 0 and intent.scaling.mode == "auto" and intent.scaling.pinned_replicas is None


REFUSED = "minReplicas 0 refused (no gateway queue): keeping one replica"


def idle_view(
    intent: Intent,
    res: Resource,
    fleet_: Fleet,
    obs: Observation,
    queue: float | None,
    last_active_s: float | None,
    cold_start_s: float,
    now: dt.datetime,
) -> tuple[Idle | None, float | None]:
    """The idle rule's inputs for the tick (None: minReplicas is not 0), and when requests last
    arrived or waited (`last_active_s`, moved on to now while they do). `cold_start_s`: the
    wake's drain time until the policy has learned its own."""
    if not wants_zero(intent):
        return None, last_active_s
    window_s = intent.scaling.idle_window_s
    if not queue_queries(intent, res):
        return Idle(None, window_s, queue, fleet_.ready, refused=REFUSED), last_active_s
    now_s = now.timestamp()
    # Unknown traffic is never idle: a missing metric never releases the last replica.
    rate = obs.arrival_rate_per_s
    active = queue is None or queue > 0 or (fleet_.current > 0 and (rate is None or rate > 0))
    if active or last_active_s is None:
        last_active_s = now_s
    # A wake is sized by the queue and the arrival rate, not one replica: the policy sees no
    # engine queue while no replica runs (issue 29: 50 waiting, one replica for 40 s).
    wake = Wake(rate, fleet_.plan.rate_per_replica, intent.slo.ttft_s, intent.scaling.max_replicas, cold_start_s)
    return Idle(now_s - last_active_s, window_s, queue, fleet_.ready, wake), last_active_s


def render(
    intent: Intent,
    res: Resource,
    before: InferenceServiceStatus,
    fleet_: Fleet,
    idle: Idle | None,
    done: Tick,
    target: int,
    why: str,
    cold_start_s: float,
    now: dt.datetime,
) -> Tick:
    """The tick (`done`: the policy's, rendered) after the idle rule chose `target` for `why`:
    the ScaleToZero condition, and the scale and Event when the rule changed the count.
    `cold_start_s`: how long the next request waits at the gateway after a release."""
    status = done.result.status
    if idle is None:
        if any(c.type == CONDITION for c in status.conditions):
            return replace(done, result=replace(done.result, status=without_condition(status, CONDITION)))
        return done
    current, decided = fleet_.current, done.decision.replicas
    if idle.refused is not None:
        message = (
            "minReplicas 0 needs a signal of waiting requests while no replica runs, and behind a plain Service the "
            "first request would fail: route through spec.routing.inferencePool (its endpoint picker holds requests "
            f"and reports {QUEUE_METRIC}) or spec.routing.kedaHttp (the KEDA HTTP add-on's interceptor holds them "
            f"and reports {KEDA_PENDING_METRIC}); keeping at least one replica"
        )
        cond = condition(status, CONDITION, False, "NoQueueSignal", message, res.generation, now)
    else:
        idle_s = idle.idle_s or 0.0
        state = "at zero" if current == 0 else f"idle {_s(idle_s)}"
        queue = idle.waiting
        message = (
            f"releases the last replica after {_s(intent.scaling.idle_window_s)} without requests; the "
            f"next request then waits at the gateway about {_s(cold_start_s)} (the cold start); "
            f"{state}; gateway queue {'unknown' if queue is None else f'{queue:.0f}'}"
        )
        cond = condition(status, CONDITION, True, "Enabled", message, res.generation, now)
    new = with_conditions(status, cond)
    if target == decided:
        return replace(done, result=replace(done.result, status=new))
    done = replace(done, decision=replace(done.decision, replicas=target, reason=why))
    events = [e for e in done.result.events if e.reason != "Scaled"]
    scale_to = target if target != current else None
    if scale_to is None:
        new = new.model_copy(
            update={
                "replicas": before.replicas,
                "last_scale_time": before.last_scale_time,
                "last_scale_reason": before.last_scale_reason,
                "desired_replicas": target,
            }
        )
    else:
        events.append(Event("Normal", "Scaled", f"Scaled {current} -> {target}: {why}"[:1000]))
        new = new.model_copy(
            update={
                "replicas": target,
                "desired_replicas": target,
                "last_scale_time": now_rfc3339(now),
                "last_scale_reason": why[:500],
            }
        )
    result = replace(done.result, status=new, scale_to=scale_to, events=tuple(events))
    return replace(done, result=result)


def scale_zero(
    intent: Intent,
    res: Resource,
    before: InferenceServiceStatus,
    fleet_: Fleet,
    obs: Observation,
    queue: float | None,
    done: Tick,
    last_active_s: float | None,
    cold_start_s: float,
    now: dt.datetime,
) -> tuple[Tick, float | None]:
    """The idle stage alone on a rendered policy tick (unchanged unless minReplicas is 0), and
    when requests last arrived or waited. `cold_start_s`: the wake's drain time. The operator
    runs every stage in one tick (kvscale.control.autoscale); this shows one stage's effect."""
    idle, active = idle_view(intent, res, fleet_, obs, queue, last_active_s, cold_start_s, now)
    after, _, _ = idled(replace(done.decision, cold_start_s=cold_start_s), idle)
    return render(intent, res, before, fleet_, idle, done, after.replicas, after.reason, cold_start_s, now), active
