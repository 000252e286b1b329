"""kopf handlers: validate -> pure planning and builders -> apply -> patch status.

Invalid or unusable specs get a condition and an Event naming the field and the fix, and a
PermanentError (kopf retries when the spec changes). No plan fitting the cluster is a
TemporaryError with a backoff. Nothing here sleeps; nothing returns values.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.api.models import InferenceServiceSpec, parse_spec
from kvscale.metrics.client import PrometheusClient
from kvscale.operator import k8s, telemetry
from kvscale.operator.autoscaler import ScalerMemory, observed_status, tick
from kvscale.operator.inference_pool import CONDITION as POOL_CONDITION
from kvscale.operator.inference_pool import KIND as POOL_KIND
from kvscale.operator.inference_pool import PoolPlan, owned_by, plan_pool, pool_name
from kvscale.operator.inventory import gpu_inventory
from kvscale.operator.planning import PlanningResult, plan_service
from kvscale.operator.resources import (
    deployment,
    labels,
    planned_launch,
    pod_disruption_budget,
    pod_labels,
    selector,
    service,
)
from kvscale.operator.settings import Settings
from kvscale.operator.status import condition, merge_conditions, now_rfc3339, plan_status
from kvscale.sizing.catalog import Catalog, load_catalog
from kvscale.sizing.units import parse_duration_s

SETTINGS = Settings.from_env()
CATALOG: Catalog = load_catalog(*SETTINGS.catalog_overlays)
CHILD_KINDS = ("Deployment", "Service", "PodDisruptionBudget")
POOL_FORBIDDEN = (
    "the operator may not read or manage inferencepools (inference.networking.k8s.io): "
    "install the chart with inferencePool.enabled=true; the engines are deployed without a pool"
)
PROMETHEUS = PrometheusClient(SETTINGS.prometheus_url) if SETTINGS.prometheus_url else None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    if SETTINGS.metrics_port:
        telemetry.serve(SETTINGS.metrics_port)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvscale.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kvscale.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True
    # kopf keeps a finalizer while the per-object status timer runs, so it can stop it cleanly.
    settings.persistence.finalizer = "kvscale.io/finalizer"


def _errors(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        where = "spec." + ".".join(str(p) for p in e["loc"])
        parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)


def _fail(
    body: Any, patch: kopf.Patch, status: dict[str, Any], reason: str, message: str, generation: int | None
) -> None:
    conditions = merge_conditions(
        status.get("conditions"),
        condition("Planned", False, reason, message, generation, status.get("conditions")),
        condition("Ready", False, reason, "not deployed: see Planned", generation, status.get("conditions")),
    )
    patch.status["conditions"] = conditions
    patch.status["phase"] = "Failed"
    patch.status["observedGeneration"] = generation
    kopf.warn(body, reason=reason, message=message[:1000])


def _excluded(status: dict[str, Any]) -> tuple[str, ...]:
    return tuple((status.get("plan") or {}).get("excludedGpuTypes") or ())


def reconcile(
    body: Any,
    spec: dict[str, Any],
    meta: Any,
    status: dict[str, Any],
    patch: kopf.Patch,
    namespace: str,
    name: str,
    excluded: tuple[str, ...] | None = None,
) -> None:
    generation = meta.get("generation")
    try:
        parsed = parse_spec(dict(spec))
    except ValidationError as exc:
        _fail(body, patch, status, "InvalidSpec", _errors(exc), generation)
        raise kopf.PermanentError(f"invalid spec: {_errors(exc)}") from exc
    excluded = _excluded(status) if excluded is None else excluded
    uid = meta.get("uid", "")
    pools = gpu_inventory(CATALOG, k8s.list_nodes(), k8s.list_gpu_pods(), exclude_owner_uid=uid)
    result = plan_service(parsed, CATALOG, pools, excluded)
    if result.outcome == "unusable":
        _fail(body, patch, status, result.reason, result.message, generation)
        raise kopf.PermanentError(result.message)
    if result.outcome == "no-capacity":
        _fail(body, patch, status, result.reason, result.message, generation)
        patch.status["phase"] = "Pending"
        raise kopf.TemporaryError(result.message, delay=SETTINGS.retry_backoff_s)
    _deploy(body, parsed, result, pools, status, patch, namespace, name, uid, generation, excluded)


def _deploy(
    body: Any,
    spec: InferenceServiceSpec,
    result: PlanningResult,
    pools: Any,
    status: dict[str, Any],
    patch: kopf.Patch,
    namespace: str,
    name: str,
    uid: str,
    generation: int | None,
    excluded: tuple[str, ...],
) -> None:
    chosen, plan, model = result.chosen, result.plan, result.model
    assert chosen is not None and plan is not None and model is not None
    pool = pools[chosen.gpu]
    cfg = chosen.config
    launch = planned_launch(
        spec, cfg, chosen.prediction.max_batch, chosen.prediction.kv_cache_tokens, SETTINGS.engine_port
    )
    patch.status["plan"] = plan_status(plan, pool, launch.context.max_model_len_tokens, excluded)
    patch.status["observedGeneration"] = generation
    patch.status["selector"] = selector(name)
    planned = condition("Planned", True, "Planned", chosen.reason, generation, status.get("conditions"))
    summary = (
        f"{chosen.prediction.replicas} x {chosen.tensor_parallel} {chosen.gpu} ({chosen.precision}), "
        f"max batch {chosen.prediction.max_batch}, ${chosen.prediction.cost_usd_per_hour:.2f}/h"
    )
    if spec.scaling.mode == "recommend":
        for kind in CHILD_KINDS:
            k8s.delete_if_present(kind, namespace, name)
        _remove_owned_pools(namespace, name, uid, keep=None, previous=status.get("conditions"))
        patch.status["phase"] = "Recommended"
        patch.status["conditions"] = merge_conditions(
            _without(status.get("conditions"), POOL_CONDITION),
            planned,
            condition(
                "Ready",
                False,
                "RecommendOnly",
                "mode is recommend: nothing deployed",
                generation,
                status.get("conditions"),
            ),
        )
        kopf.event(body, type="Normal", reason="Recommended", message=f"Recommend {summary}")
        return
    replicas = _replicas(spec, namespace, name, chosen.gpu, chosen.prediction.replicas)
    routing = _plan_routing(spec, namespace, name, uid, pod_labels(name, uid, cfg))
    children = [
        deployment(
            name,
            uid,
            spec,
            model,
            cfg,
            chosen,
            pool,
            replicas,
            SETTINGS.engine_port,
            SETTINGS.extra_tolerations,
            pool_labels=routing.join_labels if routing and routing.action == "join" else None,
        ),
        service(name, SETTINGS.engine_port),
        pod_disruption_budget(name),
    ]
    if routing is not None and routing.pool is not None:
        children.append(routing.pool)
    kopf.adopt(children, owner=body)
    for child in children:
        if child["kind"] == POOL_KIND:
            k8s.apply_inference_pool(child)
        else:
            k8s.apply(child)
    wanted_pool = routing.pool["metadata"]["name"] if routing is not None and routing.pool is not None else None
    _remove_owned_pools(namespace, name, uid, keep=wanted_pool, previous=status.get("conditions"))
    previous = status.get("conditions")
    if routing is None:
        conditions = merge_conditions(_without(previous, POOL_CONDITION), planned)
    else:
        pool_condition = condition(POOL_CONDITION, routing.ok, routing.reason, routing.message, generation, previous)
        conditions = merge_conditions(previous, planned, pool_condition)
        if not routing.ok:
            kopf.warn(body, reason=f"InferencePool{routing.reason}", message=routing.message[:1000])
    patch.status["replicas"] = replicas
    patch.status["phase"] = "Deploying"
    patch.status["conditions"] = conditions
    kopf.event(body, type="Normal", reason="Planned", message=f"Deployed {summary}: {chosen.reason}"[:1000])


def _without(conditions: list[dict[str, Any]] | None, type_: str) -> list[dict[str, Any]]:
    return [c for c in conditions or [] if c.get("type") != type_]


def _plan_routing(
    spec: InferenceServiceSpec, namespace: str, name: str, uid: str, engine_labels: dict[str, str]
) -> PoolPlan | None:
    """What to do about spec.routing.inferencePool, from what the API server holds: None when
    not asked for. A missing API or missing RBAC becomes a condition; the engines deploy anyway."""
    wanted = spec.routing.inference_pool
    if wanted is None:
        return None
    try:
        installed = k8s.inference_pool_api_installed()
        existing = k8s.read_inference_pool(namespace, pool_name(name, wanted)) if installed else None
    except ApiException as exc:
        if exc.status != 403:
            raise
        return PoolPlan("none", False, "Forbidden", POOL_FORBIDDEN)
    return plan_pool(name, uid, wanted, labels(name), engine_labels, SETTINGS.engine_port, installed, existing)


def _remove_owned_pools(
    namespace: str, name: str, uid: str, keep: str | None, previous: list[dict[str, Any]] | None
) -> None:
    """Deletes the pools this service owns except `keep` (spec.routing.inferencePool removed or
    renamed, or recommend mode). Only services that had a pool look: the rest never touch the API."""
    had_pool = any(c.get("type") == POOL_CONDITION and c.get("reason") == "Owned" for c in previous or [])
    if not had_pool:
        return
    if not k8s.inference_pool_api_installed():
        return
    for pool in k8s.list_inference_pools(namespace, selector(name)):
        pool_name_ = pool.get("metadata", {}).get("name")
        if pool_name_ != keep and owned_by(pool, uid):
            k8s.delete_inference_pool(namespace, pool_name_)


def _replicas(spec: InferenceServiceSpec, namespace: str, name: str, gpu_type: str, planned: int) -> int:
    """Pinned replicas win; an existing Deployment on the same GPU type keeps its size (the
    autoscaler owns it); otherwise the plan's count, within the bounds."""
    s = spec.scaling
    if s.replicas is not None:
        return s.replicas
    existing = k8s.read_deployment(namespace, name)
    if existing is not None:
        labels = existing.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
        if labels.get("kvscale.io/gpu-type") == gpu_type:
            return int(existing.get("spec", {}).get("replicas") or planned)
    return max(s.min_replicas, min(s.max_replicas, planned))


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_spec(
    *, body: Any, spec: Any, meta: Any, status: Any, patch: kopf.Patch, namespace: str | None, name: str, **_: Any
) -> None:
    assert namespace is not None  # the resource is namespaced
    with telemetry.RECONCILE_SECONDS.time():
        try:
            reconcile(body, dict(spec), meta, dict(status), patch, namespace, name)
        except kopf.TemporaryError:
            raise
        except Exception:
            telemetry.ERRORS.labels("reconcile").inc()
            raise


def _pool_api_arrived(status: dict[str, Any]) -> bool:
    """A service deployed without its pool because the InferencePool CRD was missing gets it once
    the CRD is installed: the refresh timer looks (one discovery request) while the condition says so."""
    missing = any(
        c.get("type") == POOL_CONDITION and c.get("reason") == "APINotInstalled" for c in status.get("conditions") or []
    )
    return missing and k8s.inference_pool_api_installed()


def _unschedulable_since(pod: dict[str, Any]) -> dt.datetime | None:
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            stamp = c.get("lastTransitionTime") or pod.get("metadata", {}).get("creationTimestamp")
            return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None
    return None


@kopf.timer(GROUP, VERSION, PLURAL, interval=SETTINGS.status_interval_s, initial_delay=SETTINGS.status_interval_s)
def refresh(
    *, body: Any, spec: Any, meta: Any, status: Any, patch: kopf.Patch, namespace: str | None, name: str, **_: Any
) -> None:
    """Readiness from the Deployment; re-plan without a GPU type whose pods stay unschedulable."""
    assert namespace is not None
    status = dict(status)
    if status.get("phase") in (None, "Failed", "Pending", "Recommended") or not status.get("plan"):
        return
    generation = meta.get("generation")
    gpu_type = status["plan"]["gpuType"]
    now = dt.datetime.now(dt.UTC)
    pods = [
        p
        for p in k8s.list_pods(namespace, selector(name))
        if p.get("metadata", {}).get("labels", {}).get("kvscale.io/gpu-type") == gpu_type
    ]
    stuck = [since for p in pods if (since := _unschedulable_since(p)) is not None]
    placed = [p for p in pods if p.get("spec", {}).get("nodeName")]
    # Only a type on which nothing can be placed is abandoned; pods beyond what the nodes
    # hold (a scale-out past capacity) just wait, and the Scheduled condition says so.
    if stuck and not placed and (now - min(stuck)).total_seconds() >= SETTINGS.unschedulable_timeout_s:
        excluded = (*_excluded(status), gpu_type)
        message = (
            f"pods on {gpu_type} stayed unschedulable for {SETTINGS.unschedulable_timeout_s:.0f}s: "
            f"re-planning without {gpu_type}"
        )
        kopf.warn(body, reason="GPUTypeUnschedulable", message=message)
        patch.status["conditions"] = merge_conditions(
            status.get("conditions"),
            condition("Scheduled", False, "GPUTypeUnschedulable", message, generation, status.get("conditions")),
        )
        status["conditions"] = patch.status["conditions"]
        reconcile(body, dict(spec), meta, status, patch, namespace, name, excluded=excluded)
        return
    if _pool_api_arrived(status):
        reconcile(body, dict(spec), meta, status, patch, namespace, name)
        return
    existing = k8s.read_deployment(namespace, name)
    if existing is None:
        return
    wanted = int(existing.get("spec", {}).get("replicas") or 0)
    ready = int(existing.get("status", {}).get("readyReplicas") or 0)
    is_ready = ready >= wanted and wanted > 0
    patch.status["replicas"] = wanted
    patch.status["readyReplicas"] = ready
    if is_ready != (status.get("phase") == "Ready"):
        patch.status["phase"] = "Ready" if is_ready else "Deploying"
        kopf.event(
            body, type="Normal", reason="Ready" if is_ready else "NotReady", message=f"{ready}/{wanted} replicas ready"
        )
    patch.status["conditions"] = merge_conditions(
        status.get("conditions"),
        condition(
            "Ready",
            is_ready,
            "ReplicasReady" if is_ready else "ReplicasNotReady",
            f"{ready}/{wanted} replicas ready",
            generation,
            status.get("conditions"),
        ),
        condition(
            "Scheduled",
            not stuck,
            "WaitingForGPUs" if stuck else "Scheduled",
            f"{len(stuck)} pod(s) waiting for free {gpu_type} GPUs" if stuck else f"pods scheduled on {gpu_type}",
            generation,
            status.get("conditions"),
        ),
    )


@kopf.timer(GROUP, VERSION, PLURAL, interval=SETTINGS.scale_interval_s, initial_delay=SETTINGS.scale_interval_s)
def autoscale(
    *,
    body: Any,
    spec: Any,
    status: Any,
    meta: Any,
    patch: kopf.Patch,
    memo: Any,
    namespace: str | None,
    name: str,
    **_: Any,
) -> None:
    """Observe, ask the policy, scale (mode auto) or only record (mode recommend). Missing
    metrics hold the current size; a pinned spec.scaling.replicas overrides the policy."""
    assert namespace is not None
    status = dict(status)
    plan = status.get("plan")
    if not plan or status.get("phase") in (None, "Failed", "Pending"):
        return
    parsed = parse_spec(dict(spec))
    generation = meta.get("generation")
    if parsed.scaling.replicas is not None:
        patch.status["desiredReplicas"] = parsed.scaling.replicas
        return
    existing = k8s.read_deployment(namespace, name)
    if parsed.scaling.mode == "auto" and existing is None:
        return
    current = int((existing or {}).get("spec", {}).get("replicas") or status.get("desiredReplicas") or plan["replicas"])
    ready = int((existing or {}).get("status", {}).get("readyReplicas") or 0)
    memory = memo.setdefault("scaler", ScalerMemory())
    with telemetry.TICK_SECONDS.time():
        decision, obs, missing = tick(
            memory,
            parsed,
            plan,
            CATALOG,
            PROMETHEUS,
            namespace,
            name,
            current,
            ready,
            SETTINGS.scale_interval_s,
            SETTINGS.metrics_window,
            SETTINGS.metrics_stale_after_s,
        )
    _export(namespace, name, parsed, plan, current, ready, decision, obs, missing)
    previous = status.get("conditions")
    met = (
        None
        if obs.ttft_p_s is None or obs.tpot_p_s is None
        else (
            obs.ttft_p_s <= parse_duration_s(parsed.slo.time_to_first_token)
            and obs.tpot_p_s <= parse_duration_s(parsed.slo.time_per_output_token)
        )
    )
    patch.status["observed"] = observed_status(obs, decision)
    patch.status["desiredReplicas"] = decision.replicas
    patch.status["conditions"] = merge_conditions(
        previous,
        condition(
            "MetricsAvailable",
            missing is None,
            "MetricsAvailable" if missing is None else "MetricsMissing",
            missing or "engine metrics present and fresh",
            generation,
            previous,
        ),
        condition(
            "SLOMet",
            met,
            "Unknown" if met is None else ("WithinTarget" if met else "OverTarget"),
            "no latency samples yet"
            if met is None
            else f"observed TTFT {patch.status['observed']['ttft']}, TPOT {patch.status['observed']['tpot']}",
            generation,
            previous,
        ),
    )
    if decision.replicas == current:
        return
    if parsed.scaling.mode == "recommend":
        kopf.event(
            body,
            type="Normal",
            reason="Recommendation",
            message=f"Would scale {current} -> {decision.replicas}: {decision.reason}"[:1000],
        )
        return
    k8s.scale_deployment(namespace, name, decision.replicas)
    patch.status["replicas"] = decision.replicas
    patch.status["lastScaleTime"] = now_rfc3339()
    patch.status["lastScaleReason"] = decision.reason[:500]
    kopf.event(
        body,
        type="Normal",
        reason="Scaled",
        message=f"Scaled {current} -> {decision.replicas}: {decision.reason}"[:1000],
    )


def _export(
    namespace: str,
    name: str,
    spec: InferenceServiceSpec,
    plan: dict[str, Any],
    current: int,
    ready: int,
    decision: Any,
    obs: Any,
    missing: str | None,
) -> None:
    labels = (namespace, name)
    telemetry.DESIRED.labels(*labels).set(decision.replicas)
    telemetry.CURRENT.labels(*labels).set(current)
    telemetry.READY.labels(*labels).set(ready)
    telemetry.TTFT_TARGET.labels(*labels).set(parse_duration_s(spec.slo.time_to_first_token))
    telemetry.TPOT_TARGET.labels(*labels).set(parse_duration_s(spec.slo.time_per_output_token))
    telemetry.TTFT_PREDICTED.labels(*labels).set(parse_duration_s(plan["predictedTtft"]))
    telemetry.TPOT_PREDICTED.labels(*labels).set(parse_duration_s(plan["predictedTpot"]))
    if obs.ttft_p_s is not None:
        telemetry.TTFT_OBSERVED.labels(*labels).set(obs.ttft_p_s)
    if obs.tpot_p_s is not None:
        telemetry.TPOT_OBSERVED.labels(*labels).set(obs.tpot_p_s)
    telemetry.COST.labels(*labels).set(current * float(plan["costPerHour"]) / max(int(plan["replicas"]), 1))
    telemetry.METRICS_AVAILABLE.labels(*labels).set(1 if missing is None else 0)
    telemetry.DECISIONS.labels(*labels, telemetry.decision_kind(decision.reason)).inc()
