"""kopf handlers, registered at startup by `register` (nothing happens at import). Each one
reads the object and the watch indexes, calls one pure function (reconcile, refresh, the
scaling tick) and applies the value it returns (effects.apply)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import kopf

from kvscale.api import GROUP, LABEL_MANAGED_BY, MANAGED_BY, PLURAL, VERSION
from kvscale.api.intent import parse_intent
from kvscale.api.models import InferenceServiceStatus, parse_status
from kvscale.autoscaling.observation import Observation
from kvscale.metrics.client import PrometheusClient
from kvscale.metrics.observe import observe
from kvscale.operator import effects, telemetry
from kvscale.operator.inventory import EnginePod, NodeGpus, PodGpus, engine_pod, node_entry, pod_entry, pools
from kvscale.operator.k8s import Kube
from kvscale.operator.reconcile import (
    DeploymentView,
    Observed,
    PoolView,
    Resource,
    Result,
    pool_api_missing,
    reconcile,
    refresh,
    replans,
)
from kvscale.operator.scaling import Fleet, ScalerMemory, fleet, planned, tick
from kvscale.operator.settings import Settings
from kvscale.operator.status import mark_synced
from kvscale.sizing.catalog import Catalog

MANAGED = {LABEL_MANAGED_BY: MANAGED_BY}


@dataclass(frozen=True)
class Runtime:
    """What the handlers share, built once at startup."""

    settings: Settings
    catalog: Catalog
    kube: Kube
    prometheus: PrometheusClient | None

    @property
    def gpu_resources(self) -> frozenset[str]:
        return frozenset(g.resource_name for g in self.catalog.gpus.values())


def resource(meta: Mapping[str, Any], namespace: str | None, name: str) -> Resource:
    return Resource(namespace or "", name, str(meta.get("uid", "")), meta.get("generation"))


def _values(index: Any, key: Any) -> list[Any]:
    return list(index.get(key, ())) if index is not None else []


def _all(index: Any) -> Iterable[Any]:
    return (v for key in index for v in index[key])


def observed(res: Resource, memo: Any, indexes: Mapping[str, Any], pool: PoolView | None = None) -> Observed:
    key = (res.namespace, res.name)
    nodes: list[NodeGpus] = list(_all(indexes["gpu_nodes"]))
    held: list[PodGpus] = list(_all(indexes["gpu_pods"]))
    deployments: list[DeploymentView] = _values(indexes["engine_deployments"], key)
    pods: list[EnginePod] = _values(indexes["engine_pods"], key)
    return Observed(
        pools=pools(nodes, held, exclude_owner_uid=res.uid),
        deployment=deployments[0] if deployments else None,
        pods=tuple(pods),
        applied=memo.get("applied"),
        pool=pool,
    )


def register(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    """Every handler of the operator, bound to the runtime objects."""
    _indexes(registry, rt)
    _lifecycle(registry, rt)
    _timers(registry, rt)


def _indexes(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    resources = rt.gpu_resources

    @kopf.index("nodes", id="gpu_nodes", registry=registry)
    def gpu_nodes(body: kopf.Body, **_: Any) -> dict[str, NodeGpus]:
        entry = node_entry(rt.catalog, body)
        return {entry.name: entry} if entry else {}

    @kopf.index("pods", id="gpu_pods", registry=registry)
    def gpu_pods(body: kopf.Body, **_: Any) -> dict[str, PodGpus]:
        entry = pod_entry(body, resources)
        return {entry.node_name: entry} if entry else {}

    @kopf.index("pods", id="engine_pods", labels=MANAGED, registry=registry)
    def engine_pods(body: kopf.Body, **_: Any) -> dict[tuple[str, str], EnginePod]:
        entry = engine_pod(body)
        return {entry[0]: entry[1]} if entry else {}

    @kopf.index("deployments", id="engine_deployments", labels=MANAGED, registry=registry)
    def engine_deployments(
        body: kopf.Body, namespace: str | None, name: str | None, **_: Any
    ) -> dict[tuple[str, str], DeploymentView]:
        return {(namespace or "", name or ""): DeploymentView.of(body)}


@dataclass(frozen=True)
class Call:
    """One handler call: the object, kopf's patch and per-object memo, the watch indexes."""

    body: kopf.Body
    spec: Mapping[str, Any]
    patch: kopf.Patch
    memo: Any
    res: Resource
    before: InferenceServiceStatus
    indexes: Mapping[str, Any]

    @classmethod
    def of(cls, kw: Mapping[str, Any]) -> Call:
        res = resource(kw["meta"], kw["namespace"], kw["name"])
        return cls(kw["body"], kw["spec"], kw["patch"], kw["memo"], res, parse_status(kw["status"]), kw)

    def observed(self, rt: Runtime | None = None) -> Observed:
        """The watch indexes; with `rt`, also the InferencePool the spec asks for (API reads)."""
        return observed(self.res, self.memo, self.indexes, self._pool(rt) if rt is not None else None)

    def _pool(self, rt: Runtime) -> PoolView | None:
        routing = (self.spec.get("routing") or {}).get("inferencePool")
        if not isinstance(routing, Mapping):
            return None
        return rt.kube.pool_view(self.res.namespace, str(routing.get("name") or self.res.name))

    def apply(self, rt: Runtime, result: Result) -> None:
        if result.applied_deployment is not None:
            self.memo["applied"] = result.applied_deployment
        effects.apply(rt.kube, self.body, self.patch, self.before, result, self.res)


def _lifecycle(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        if rt.settings.metrics_port:
            telemetry.serve(rt.settings.metrics_port)

    @kopf.on.create(GROUP, VERSION, PLURAL, id="on_spec", registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, id="on_spec", field="spec", registry=registry)
    @kopf.on.resume(GROUP, VERSION, PLURAL, id="on_spec", registry=registry)
    def on_spec(**kwargs: Any) -> None:
        spec_changed(rt, Call.of(kwargs))

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="forget", optional=True, registry=registry)
    def forget(namespace: str | None, name: str, **_: Any) -> None:
        telemetry.forget(namespace or "", name)


def _timers(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    status_s, scale_s = rt.settings.status_interval_s, rt.settings.scale_interval_s

    @kopf.timer(GROUP, VERSION, PLURAL, id="refresh", interval=status_s, initial_delay=status_s, registry=registry)
    def refresh_timer(**kwargs: Any) -> None:
        status_tick(rt, Call.of(kwargs))

    @kopf.timer(GROUP, VERSION, PLURAL, id="autoscale", interval=scale_s, initial_delay=scale_s, registry=registry)
    def autoscale_timer(**kwargs: Any) -> None:
        scale_tick(rt, Call.of(kwargs))


def spec_changed(rt: Runtime, call: Call) -> None:
    """Create, spec change, resume: plan and build the children."""
    with telemetry.RECONCILE_SECONDS.time():
        result = reconcile(call.spec, call.res, call.before, call.observed(rt), rt.catalog, rt.settings)
    if result.retry is not None and result.retry.delay_s is None:
        telemetry.ERRORS.labels("reconcile").inc()
    call.apply(rt, result)


def status_tick(rt: Runtime, call: Call) -> None:
    """Readiness, scheduling, drift; a re-plan when the GPU type stays unschedulable."""
    try:
        now = dt.datetime.now(dt.UTC)
        seen = call.observed()
        if pool_api_missing(call.before) or replans(call.before, seen, rt.settings, now):
            seen = call.observed(rt)  # the InferencePool too: a reconcile follows
        result = refresh(call.spec, call.res, call.before, seen, rt.catalog, rt.settings, now)
    except Exception as exc:  # counted and shown in status; the timer runs again
        effects.timer_failed("refresh", call.body, call.patch, call.before, call.res, exc)
        return
    if result is not None:
        call.apply(rt, replace(result, status=mark_synced("refresh", result.status, call.res.generation)))


def scale_tick(rt: Runtime, call: Call) -> None:
    """Observe, ask the policy, scale (mode auto) or only recommend."""
    if not planned(call.before):
        return
    try:
        intent = parse_intent(call.spec)
        start = fleet(intent, call.before, call.observed().deployment)
        if isinstance(start, Fleet):
            with telemetry.TICK_SECONDS.time():
                obs, missing = _observe(rt, call.res, intent.engine, intent.slo.percentile, start)
                memory = call.memo.get("scaler", ScalerMemory())
                now = dt.datetime.now(dt.UTC)
                done = tick(intent, call.res, call.before, start, obs, missing, memory, rt.catalog, rt.settings, now)
    except Exception as exc:  # counted and shown in status; the timer runs again
        effects.timer_failed("autoscale", call.body, call.patch, call.before, call.res, exc)
        return
    if not isinstance(start, Fleet):
        if start is not None:  # pinned replicas: recorded, the policy is not asked
            call.apply(rt, start)
        return
    call.memo["scaler"] = done.memory
    telemetry.export(call.res.namespace, call.res.name, done.gauges)
    if done.result.scale_to is not None and call.memo.get("applied") is not None:
        call.memo["applied"]["spec"]["replicas"] = done.result.scale_to
    call.apply(rt, replace(done.result, status=mark_synced("autoscale", done.result.status, call.res.generation)))


def _observe(
    rt: Runtime, res: Resource, engine: str, percentile: float, start: Fleet
) -> tuple[Observation, str | None]:
    now = time.time()
    starting = max(0, start.current - start.ready)
    if rt.prometheus is None:
        obs = Observation(time_s=now, ready_replicas=start.ready, starting_replicas=starting, stale=True)
        return obs, "KVSCALE_PROMETHEUS_URL is not set"
    s = rt.settings
    return observe(
        rt.prometheus,
        engine,
        res.namespace,
        res.name,
        percentile,
        start.ready,
        starting,
        now,
        s.metrics_window,
        s.metrics_stale_after_s,
    )


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's own settings: progress in annotations under kvscale.io/, standalone."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvscale.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kvscale.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True
    # kopf keeps a finalizer while the per-object timers run, so it can stop them cleanly.
    settings.persistence.finalizer = "kvscale.io/finalizer"
