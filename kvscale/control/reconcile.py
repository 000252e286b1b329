"""Reconcile, as a value: (spec, observed cluster, status) -> what to apply, the new status,
the Events to post and how kopf should retry. Pure: the handlers apply the result.

- `reconcile`: plan and build the children (on create, spec change, resume, re-plan).
- `refresh`: the status tick: readiness, scheduling (why pods wait, in the scheduler's words),
  drift in the children, and a re-plan without a GPU type whose pods wait too long for free
  GPUs, or with the types left out earlier once their time is up (`exclusions`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kvscale.api import LABEL_GPU_TYPE, selector
from kvscale.api.intent import Intent, SpecError
from kvscale.api.models import Condition, InferenceServiceStatus, status_patch
from kvscale.control import children as owned
from kvscale.control import disaggregated as pd
from kvscale.control import exclusions
from kvscale.control import leader_worker_set as lws
from kvscale.control.inference_pool import CONDITION as POOL_CONDITION
from kvscale.control.inference_pool import PoolPlan, plan_pool
from kvscale.control.inventory import EnginePod, GpuPool
from kvscale.control.nearest import REASONS, nearest
from kvscale.control.planning import Planned, PoolsPlanned, Unplanned, plan_layout, plan_service, precheck
from kvscale.control.replan import (
    CONDITION,
    Before,
    Replan,
    Sizing,
    Steer,
    TypesReturned,
    Unschedulable,
    annotate,
    recorded_target,
    size,
)
from kvscale.control.resources import (
    EngineImageError,
    NotAllowed,
    deployment,
    labels,
    planned_launch,
    pod_disruption_budget,
    pod_labels,
    service,
)
from kvscale.control.settings import Settings
from kvscale.control.status import (
    condition,
    get_condition,
    plan_status,
    planned_workload,
    planned_workload_status,
    with_conditions,
    without_condition,
)
from kvscale.control.unschedulable import Diagnosis, diagnose
from kvscale.engines.args import PlannedLaunch
from kvscale.planner.search import DEFAULT_HEADROOM
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.checkpoints import CheckpointError
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.context_limit import ContextLimitError
from kvscale.sizing.workload import Workload

CHILD_KINDS = ("Service", "PodDisruptionBudget", "Deployment")  # the Deployment last: never without its Service
DEPLOYMENT = "Deployment"
NAME_CONFLICT = "NameConflict"
PINNED_TO_ZERO = "PinnedToZero"
POOL_FORBIDDEN = (
    "the operator may not read or manage inferencepools (inference.networking.k8s.io): "
    "install the chart with inferencePool.enabled=true; the engines are deployed without a pool"
)


@dataclass(frozen=True)
class Resource:
    """The InferenceService being reconciled."""

    namespace: str
    name: str
    uid: str
    generation: int | None


def engine_template(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod template of the engine workload's spec: a Deployment's, or a LeaderWorkerSet's
    leader template (the pod that serves)."""
    if "leaderWorkerTemplate" in spec:
        return (spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}
    return spec.get("template") or {}


@dataclass(frozen=True)
class DeploymentView:
    """The engine workload as the watch last saw it: a Deployment, or a LeaderWorkerSet whose
    replicas and ready replicas count groups (status.readyReplicas: groups whose pods are all
    ready) and whose image and args are its leader's."""

    replicas: int
    ready_replicas: int
    gpu_type: str | None
    image: str | None = None
    args: tuple[str, ...] = ()
    kind: str = DEPLOYMENT
    # The rollout's progress (a Deployment's and a LeaderWorkerSet's status alike): replicas on
    # the current template, all pods (old ones included), and whether the controller has seen
    # the latest spec (None: the object does not say).
    updated_replicas: int = 0
    pods: int = 0
    current_generation: bool | None = None
    replan_target: int | None = None  # kvscale.control.replan.TARGET_ANNOTATION

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> DeploymentView:
        spec, st = body.get("spec") or {}, body.get("status") or {}
        template = engine_template(spec)
        container = ((template.get("spec") or {}).get("containers") or [{}])[0]
        return cls(
            replicas=int(spec.get("replicas") or 0),
            ready_replicas=int(st.get("readyReplicas") or 0),
            gpu_type=((template.get("metadata") or {}).get("labels") or {}).get(LABEL_GPU_TYPE),
            image=container.get("image"),
            args=tuple(container.get("args") or ()),
            kind=lws.KIND if "leaderWorkerTemplate" in spec else DEPLOYMENT,
            updated_replicas=int(st.get("updatedReplicas") or 0),
            pods=int(st.get("replicas") or 0),
            current_generation=_current_generation(body),
            replan_target=recorded_target(body),
        )

    def rolled_out(self) -> bool:
        """Every replica runs the current template and is ready, and no old pod is left
        (kubectl rollout status's test: observedGeneration, updatedReplicas, replicas)."""
        n = self.replicas
        return (
            self.current_generation is not False
            and self.updated_replicas >= n
            and self.pods <= n
            and self.ready_replicas >= n
        )


def _current_generation(body: Mapping[str, Any]) -> bool | None:
    generation = (body.get("metadata") or {}).get("generation")
    seen = (body.get("status") or {}).get("observedGeneration")
    return None if generation is None or seen is None else int(seen) >= int(generation)


@dataclass(frozen=True)
class PoolView:
    """What the API server holds for spec.routing.inferencePool: whether the InferencePool API
    is served, the pool of that name if any, and whether the operator may look at all."""

    api_installed: bool
    existing: Mapping[str, Any] | None = None
    forbidden: bool = False


@dataclass(frozen=True)
class Observed:
    """The cluster as reconcile sees it: GPU pools (already without this resource's own pods),
    its Deployment, its engine pods, the Deployment body kvscale last applied, and the
    InferencePool view (None when not looked at). `children`: the objects of owned kinds under
    this resource's labels or its children's names, whoever owns them; `applied_children`: the
    bodies kvscale last applied (the status tick re-applies those missing or edited)."""

    pools: Mapping[str, GpuPool]
    deployment: DeploymentView | None = None
    pods: tuple[EnginePod, ...] = ()
    applied: Mapping[str, Any] | None = None
    pool: PoolView | None = None
    children: tuple[owned.ChildView, ...] = ()
    applied_children: tuple[Mapping[str, Any], ...] = ()
    leader_worker_set: DeploymentView | None = None
    # A disaggregated plan's pool Deployments by role (kvscale.control.disaggregated), as watched.
    pool_workloads: Mapping[str, DeploymentView] = field(default_factory=dict)

    def workload(self, multi_node: bool) -> DeploymentView | None:
        """The engine workload of the planned kind: a LeaderWorkerSet for a plan across nodes."""
        return self.leader_worker_set if multi_node else self.deployment


def multi_node(status: InferenceServiceStatus) -> bool:
    """Whether the recorded plan spans nodes (deployed as a LeaderWorkerSet, scaled in groups)."""
    return status.plan is not None and status.plan.nodes > 1


def workload_kind(status: InferenceServiceStatus) -> str:
    return lws.KIND if multi_node(status) else DEPLOYMENT


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Retry:
    """How kopf retries: `delay_s` None is permanent (until the spec changes)."""

    message: str
    delay_s: float | None = None


@dataclass(frozen=True)
class Result:
    status: InferenceServiceStatus
    apply: tuple[dict[str, Any], ...] = ()  # server-side applied in order
    delete: tuple[str, ...] = ()  # child kinds to delete
    delete_named: tuple[tuple[str, str], ...] = ()  # (kind, name) of children to delete: a disaggregated plan's pools
    scale_to: int | None = None  # the workload's replicas (groups of a LeaderWorkerSet), through its scale subresource
    scale_kind: str = DEPLOYMENT  # Deployment or LeaderWorkerSet
    # (kind, name, replicas) of children scaled by their own names: a disaggregated plan's pools
    scale_named: tuple[tuple[str, str, int], ...] = ()
    events: tuple[Event, ...] = ()
    retry: Retry | None = None
    applied_deployment: dict[str, Any] | None = field(default=None)  # for drift detection
    prune_pools: bool = False  # delete the InferencePools this resource owns, except keep_pool
    keep_pool: str | None = None


def _failed(
    status: InferenceServiceStatus,
    res: Resource,
    reason: str,
    message: str,
    retry_s: float | None = None,
    now: dt.datetime | None = None,
) -> Result:
    new = with_conditions(
        status,
        condition(status, "Planned", False, reason, message, res.generation, now),
        condition(status, "Ready", False, reason, "not deployed: see Planned", res.generation, now),
        phase="Failed" if retry_s is None else "Pending",
        observed_generation=res.generation,
    )
    return Result(new, events=(Event("Warning", reason, message[:1000]),), retry=Retry(message, retry_s))


def _with_nearest(
    outcome: Unplanned, intent: Intent, catalog: Catalog, pools: Mapping[str, GpuPool], excluded: tuple[str, ...]
) -> str:
    """Why no plan, with the nearest thing this cluster's free GPUs serve (kvscale.control.nearest).
    An SLO the catalog meets only with more replicas than the cluster holds is said in the
    cluster's terms instead of the planner's catalog-wide fleet (80 H100 on a cluster of 16)."""
    if outcome.reason not in REASONS:
        return outcome.message
    near = nearest(intent, catalog, pools, excluded)
    if near is None:
        return outcome.message
    if outcome.reason == "SLOInfeasible":
        return (
            f"spec.workload.requestsPerSecond {intent.workload.requests_per_s:g} cannot be met at spec.slo within "
            f"spec.scaling.maxReplicas {intent.scaling.max_replicas}; {near}"
        )
    return f"{outcome.message}; {near}"


def running_workload(intent: Intent, status: InferenceServiceStatus, observed: Observed) -> DeploymentView | None:
    """The running workload of a plan deployed earlier (mode auto), or None: a spec edit that
    cannot be planned leaves it serving instead of marking the service Failed."""
    if intent.scaling.mode != "auto" or status.plan is None or status.phase in (None, "Recommended"):
        return None
    return observed.workload(multi_node(status))


def _kept(
    intent: Intent,
    status: InferenceServiceStatus,
    res: Resource,
    observed: Observed,
    seen: DeploymentView,
    reason: str,
    message: str,
    retry_s: float | None,
    now: dt.datetime | None,
) -> Result:
    """A spec that cannot be planned while an earlier plan runs: the running plan keeps serving,
    and the scaling tick keeps scaling it within spec.scaling's bounds; Planned=False says what
    cannot be met (and the nearest thing this cluster can serve), Ready says what runs. One
    Warning when the reason is new. Retried after the backoff only where the cluster may
    change (no free GPUs); a spec that cannot be met waits for the next edit."""
    p = status.plan
    assert p is not None  # running_workload() holds
    scaling = intent.scaling
    running = f"{seen.replicas} x {p.gpu_type} TP{p.tensor_parallel} {p.precision}"
    kept = (
        f"{message}. The running plan ({running}) keeps serving, scaled within spec.scaling "
        f"({scaling.min_replicas}..{scaling.max_replicas})"
    )
    before = get_condition(status, "Planned")
    planned = condition(status, "Planned", False, reason, kept, res.generation, now)
    new = with_conditions(status, planned, observed_generation=res.generation)
    if new.phase in ("Failed", "Pending"):  # a status written before plans were kept: readiness below says
        new = new.model_copy(update={"phase": None})
    ready = _readiness(new, res, observed, seen, now or dt.datetime.now(dt.UTC), None, scaling.pinned_replicas)
    news = before is None or (before.status, before.reason) != ("False", reason)
    events = (Event("Warning", reason, kept[:1000]),) if news else ()
    ready = replace(
        ready,
        events=(*events, *ready.events),
        retry=Retry(kept, retry_s) if retry_s is not None else None,
    )
    return _within_bounds(ready, intent, observed, seen)


def _within_bounds(result: Result, intent: Intent, observed: Observed, seen: DeploymentView) -> Result:
    """The kept workload scaled down at once to a lower spec.scaling.maxReplicas or pin (the
    scaling tick holds without metrics, and a bound is no forecast). Up to a higher minimum is
    the scaling tick's, under the GPUBudget's governor: nothing here asks a budget."""
    scaling = intent.scaling
    target = scaling.pinned_replicas if scaling.pinned_replicas is not None else scaling.bounded(seen.replicas)
    if result.apply or target >= seen.replicas:  # drift reverted first: the next tick scales
        return result
    bound = (
        f"spec.scaling.replicas pins {target}"
        if scaling.pinned_replicas is not None
        else f"spec.scaling.maxReplicas is {scaling.max_replicas}"
    )
    applied = None
    if observed.applied is not None:  # the scale is kvscale's own: not drift to revert
        applied = {**observed.applied, "spec": {**(observed.applied.get("spec") or {}), "replicas": target}}
    status = result.status.model_copy(update={"replicas": target, "desired_replicas": target})
    event = Event("Normal", "Scaled", f"Scaled {seen.replicas} -> {target}: {bound}")
    return replace(
        result,
        status=status,
        scale_to=target,
        scale_kind=seen.kind,
        events=(*result.events, event),
        applied_deployment=applied,
    )


def _replicas(intent: Intent, planned: Planned, status: InferenceServiceStatus, existing: DeploymentView | None) -> int:
    """Pinned replicas win. An existing Deployment on the same GPU type keeps its size (the
    autoscaler owns it) unless the new plan needs more than the previous one did; otherwise
    the plan's count, within the bounds. (A re-plan that changes the pods is sized for the
    load instead: `_replan`.)"""
    scaling = intent.scaling
    if scaling.pinned_replicas is not None:
        return scaling.pinned_replicas
    wanted = scaling.bounded(planned.prediction.replicas)
    if existing is not None and existing.gpu_type == planned.chosen.gpu:
        kept = status.desired_replicas or existing.replicas or wanted
        previous = status.plan.replicas if status.plan is not None else None
        grows = previous is not None and planned.prediction.replicas > previous
        return max(kept, wanted) if grows else kept
    return wanted


def _pods_change(
    status: InferenceServiceStatus, planned: Planned, existing: DeploymentView, built: DeploymentView
) -> list[str]:
    """What a re-plan changes in the engine pods that run: GPU type, tensor parallelism, args."""
    changes = []
    if existing.gpu_type != planned.chosen.gpu:
        changes.append(f"GPU type {existing.gpu_type} -> {planned.chosen.gpu}")
    old_tp = status.plan.tensor_parallel if status.plan is not None else None
    if old_tp is not None and old_tp != planned.chosen.tensor_parallel:
        changes.append(f"TP {old_tp} -> {planned.chosen.tensor_parallel}")
    if existing.args and existing.args != built.args:  # () is a view that does not say
        changes.append("engine args")
    return changes


def _replan(
    intent: Intent,
    planned: Planned,
    status: InferenceServiceStatus,
    existing: DeploymentView | None,
    workload: dict[str, Any],
) -> tuple[dict[str, Any], Sizing | None, list[str]]:
    """A re-plan that changes running pods (a spec edit, an unschedulable type, workload drift,
    a budget's move) starts the new fleet at the load's size and keeps the old pods until new
    ones are ready (kvscale.control.replan); anything else is built as it is."""
    if existing is None or existing.replicas == 0 or intent.scaling.pinned_replicas is not None:
        return workload, None, []
    changes = _pods_change(status, planned, existing, DeploymentView.of(workload))
    if not changes:
        if not rolling_out(status) or existing.replan_target is None:
            return workload, None, []
        # Reconciled again while the old pods are being replaced (a resume, another edit that
        # leaves the pods alike): keep every running replica and the load's count for later.
        built = int(workload["spec"].get("replicas") or 0)
        kept = Sizing(existing.replan_target, max(built, existing.replicas), None, "")
        body = annotate(workload, kept.target)
        body["spec"] = {**body["spec"], "replicas": kept.applied}
        return body, kept, []
    observed = status.observed.requests_per_second if status.observed is not None else None
    before = Before(existing.replicas, observed, intent.workload.requests_per_s)
    sizing = size(
        before,
        planned.prediction.rate_per_replica_max,
        DEFAULT_HEADROOM,
        intent.scaling.bounded(planned.prediction.replicas),
        intent.scaling.max_replicas,
        moves_type=existing.gpu_type != planned.chosen.gpu,
    )
    body = annotate(workload, sizing.target)
    body["spec"] = {**body["spec"], "replicas": sizing.applied}
    return body, sizing, changes


def _replanning(
    status: InferenceServiceStatus,
    res: Resource,
    sizing: Sizing,
    changes: list[str],
    existing: DeploymentView,
    now: dt.datetime | None,
) -> Condition:
    need = "" if sizing.need_per_s is None else f" ({sizing.need_per_s:.3g} requests/s, from {sizing.basis})"
    if sizing.rolling:
        message = (
            f"{', '.join(changes)}: {existing.replicas} replicas ({existing.ready_replicas} ready) are replaced one "
            f"for one as new ones become ready; then {sizing.target} for the load{need}"
        )
    else:
        message = (
            f"{', '.join(changes)}: {existing.replicas} replicas ({existing.ready_replicas} ready) -> {sizing.target} "
            f"for the load{need}; old pods go only as new ones become ready"
        )
    return condition(status, CONDITION, True, "Rollout", message[:1000], res.generation, now)


def _summary(planned: Planned, replicas: int) -> str:
    c, p = planned.chosen, planned.prediction
    per_replica = p.cost_usd_per_hour / max(p.replicas, 1)
    planned_note = "" if replicas == p.replicas else f" (the plan needs {p.replicas} at spec.workload's rate)"
    if c.nodes > 1:
        cfg = c.config
        shape = (
            f"{replicas} group(s) of {cfg.nodes} nodes x {cfg.gpus_per_node} {c.gpu} "
            f"(TP{c.tensor_parallel} x PP{c.pipeline_parallel}{', EP' if c.expert_parallel else ''}, {c.precision})"
        )
    else:
        shape = (
            f"{replicas} x {c.config.gpus} {c.gpu} ({c.precision}{', expert parallel' if c.expert_parallel else ''})"
        )
    return f"{shape}, max batch {p.max_batch}, ${replicas * per_replica:.2f}/h{planned_note}"


def reconcile(
    intent: Intent | SpecError,
    res: Resource,
    status: InferenceServiceStatus,
    observed: Observed,
    catalog: Catalog,
    settings: Settings,
    now: dt.datetime | None = None,
) -> Result:
    """Plan from the spec, then build the children (mode auto) or only record the plan (mode
    recommend). `intent`: the spec as the handler parsed it, once (a SpecError becomes the
    Planned condition). The GPU types left out earlier stay out while their time lasts, and the
    observed workload a re-plan chose stays planned for while the spec is the same; what else
    changes a plan is a re-plan's reason (`replan`)."""
    return _plan_and_build(intent, res, status, observed, catalog, settings, now, Steer())


def replan(
    reason: Replan,
    intent: Intent | SpecError,
    res: Resource,
    status: InferenceServiceStatus,
    observed: Observed,
    catalog: Catalog,
    settings: Settings,
    now: dt.datetime,
) -> Result:
    """The one re-plan: the reason marks status, steers the planner (GPU types left out, the
    observed workload, a budget's GPU type), and says why in one Event, first; the plan and
    the children are reconcile's."""
    marked = reason.mark(status, res.generation, now)
    result = _plan_and_build(intent, res, marked, observed, catalog, settings, now, reason.steer())
    event = Event(reason.event_type, reason.reason, reason.says(status.plan, result.status.plan)[:1000])
    rest = (e for e in result.events if not (reason.quiet_plan and e.reason == "Planned"))
    return replace(result, events=(event, *rest))


def _plan_and_build(
    intent: Intent | SpecError,
    res: Resource,
    status: InferenceServiceStatus,
    observed: Observed,
    catalog: Catalog,
    settings: Settings,
    now: dt.datetime | None,
    steer: Steer,
) -> Result:
    if isinstance(intent, SpecError):
        return _failed(status, res, intent.reason, intent.message, now=now)
    refused = precheck(res.name, intent, catalog)
    if refused is not None:
        return _failed(status, res, refused.reason, refused.message, now=now)
    traffic = steer.traffic or kept_workload(status, res, intent.workload.max_context_tokens)
    if traffic is not None:
        intent = replace(intent, workload=traffic)
    planned_for = planned_workload_status(intent.workload, "spec" if traffic is None else "observed")
    excluded = steer.excluded
    if excluded is None:  # those left out earlier, while their time lasts
        excluded = exclusions.active(status, settings.gpu_exclusion_ttl_s, now or dt.datetime.now(dt.UTC))
    outcome = plan_layout(
        intent,
        catalog,
        observed.pools,
        excluded,
        plan_service(intent, catalog, observed.pools, excluded, steer.prefer_gpu),
    )
    if isinstance(outcome, PoolsPlanned):
        return _deploy_pools(intent, res, status, observed, outcome, planned_for, excluded, settings, now)
    if isinstance(outcome, Unplanned):
        delay = settings.retry_backoff_s if outcome.retry else None
        message = _with_nearest(outcome, intent, catalog, observed.pools, excluded)
        running = running_workload(intent, status, observed)
        if running is not None:
            return _kept(intent, status, res, observed, running, outcome.reason, message, delay, now)
        if intent.scaling.mode == "auto" and disaggregated(status) and observed.pool_workloads:
            return _kept_pools(status, res, observed, outcome.reason, message, delay, now)
        return _failed(status, res, outcome.reason, message, delay, now)
    try:
        launch = planned_launch(
            intent.spec,
            outcome.config,
            outcome.prediction.max_batch,
            outcome.prediction.kv_cache_tokens,
            settings.engine_port,
        )
    except (CheckpointError, ContextLimitError) as exc:
        return _failed(status, res, "Undeployable", str(exc), now=now)
    base = status.model_copy(
        update={
            "plan": plan_status(outcome, launch.context.max_model_len_tokens, excluded, planned_for),
            "observed_generation": res.generation,
            "selector": selector(res.name),
        }
    )
    if not excluded:
        base = without_condition(base, exclusions.CONDITION)
    base = without_condition(base, pd.SCALING_CONDITION)
    base, advised = _with_gateway_advice(base, status, outcome, res, now)
    planned = condition(status, "Planned", True, "Planned", outcome.chosen.reason, res.generation, now)
    if intent.scaling.mode == "recommend":
        not_ready = condition(
            status, "Ready", False, "RecommendOnly", "mode is recommend: nothing deployed", res.generation, now
        )
        new = with_conditions(without_condition(base, POOL_CONDITION), planned, not_ready, phase="Recommended")
        summary = _summary(outcome, outcome.prediction.replicas)
        event = Event("Normal", "Recommended", f"Recommend {summary}")
        candidates = CHILD_KINDS + ((lws.KIND,) if _had_set(status, observed) else ())
        mine = tuple(k for k in candidates if _owns(observed, res, k))  # never another team's object
        return Result(
            without_condition(new, NAME_CONFLICT),
            delete=mine,
            delete_named=_stale_pools(observed, res),
            events=(event, *advised),
            prune_pools=_had_pool(status),
        )
    multi = outcome.config.nodes > 1
    too_long = lws.name_problem(res.name) if multi else None
    if too_long is not None:
        return _failed(status, res, "InvalidName", too_long, now=now)
    existing = observed.workload(multi)
    replicas = _replicas(intent, outcome, status, existing)
    routing = _routing(intent, res, observed.pool, outcome.config, settings)
    try:
        workload = _workload(intent, res, outcome, launch, replicas, routing, settings)
    except EngineImageError as exc:
        return _failed(status, res, "NoEngineImage", str(exc), now=now)
    except NotAllowed as exc:  # a node path or image the settings refuse: nothing is applied
        return _failed(status, res, exc.reason, str(exc), now=now)
    except lws.MultiNodeUnsupported as exc:
        return _failed(status, res, "EngineUnsupported", str(exc), now=now)
    workload, sizing, changes = _replan(intent, outcome, status, existing, workload)
    if sizing is not None and existing is not None:
        replicas = sizing.applied
        if changes:
            base = with_conditions(base, _replanning(status, res, sizing, changes, existing, now))
    serving = service(res.name, settings.engine_port, lws.leader_labels(res.name) if multi else None)
    children = (serving, pod_disruption_budget(res.name, outcome.config.nodes), workload)
    # A plan that moved between one node and several changes the workload's kind: the old goes.
    if multi:
        stale: tuple[str, ...] = (DEPLOYMENT,) if observed.deployment is not None else ()
    else:
        stale = (lws.KIND,) if _had_set(status, observed) else ()
    stale = tuple(k for k in stale if not _foreign(observed, res, k))
    new = with_conditions(base, planned, phase="Deploying", replicas=replicas, desired_replicas=replicas)
    message = f"Deployed {_summary(outcome, replicas)}: {outcome.chosen.reason}"
    result = Result(
        new,
        apply=children,
        delete=stale,
        delete_named=_stale_pools(observed, res),  # back from a disaggregated plan: its pools go
        events=(Event("Normal", "Planned", message[:1000]), *advised),
        applied_deployment=workload,
    )
    taken = owned.foreign(children, observed.children, res.uid)
    if taken:
        return name_conflict(status, res, taken, now)
    return _with_routing(replace(result, status=without_condition(new, NAME_CONFLICT)), status, res, routing, now)


GATEWAY_CONDITION = "GatewayAdvised"
GATEWAY_FIX = (
    "set spec.routing.inferencePool (a Gateway API inference extension InferencePool, whose endpoint picker "
    "routes to the least-loaded pods) and kvscale plans and scales for that router"
)


def _with_gateway_advice(
    new: InferenceServiceStatus,
    before: InferenceServiceStatus,
    outcome: Planned,
    res: Resource,
    now: dt.datetime | None,
) -> tuple[InferenceServiceStatus, tuple[Event, ...]]:
    """The GatewayAdvised condition where the plan behind a plain Service costs markedly more
    than behind a gateway; an Event only when the advice is new (a re-plan does not repeat it)."""
    advice = outcome.gateway_advice()
    if advice is None:
        return without_condition(new, GATEWAY_CONDITION), ()
    message = advice.message(GATEWAY_FIX)
    advised = condition(before, GATEWAY_CONDITION, True, "FewerReplicasBehindGateway", message, res.generation, now)
    was = get_condition(before, GATEWAY_CONDITION)
    events = () if was is not None and was.status == "True" else (Event("Normal", GATEWAY_CONDITION, message[:1000]),)
    return with_conditions(new, advised), events


def _owns(observed: Observed, res: Resource, kind: str) -> bool:
    view = owned.find(observed.children, kind, owned.child_name(kind, res.name))
    return view is not None and view.owned_by(res.uid)


def _foreign(observed: Observed, res: Resource, kind: str) -> bool:
    view = owned.find(observed.children, kind, owned.child_name(kind, res.name))
    return view is not None and not view.owned_by(res.uid)


def name_conflict(
    status: InferenceServiceStatus,
    res: Resource,
    taken: tuple[owned.ChildView, ...],
    now: dt.datetime | None = None,
) -> Result:
    """Objects of the children's names that are not kvscale's: nothing is applied (another team's
    Service keeps its selector and gains no owner reference), the NameConflict condition names
    them and one Event (none when the condition already said so). No retry through kopf (it
    logged an ERROR every backoff for as long as the conflict lasted): the status tick looks
    again (`conflicted`, in `refresh`) and deploys once the object is gone."""
    message = owned.conflict_message(taken)
    before = get_condition(status, NAME_CONFLICT)
    new = with_conditions(
        status,
        condition(status, NAME_CONFLICT, True, "ForeignObject", message, res.generation, now),
        condition(
            status,
            "Ready",
            False,
            NAME_CONFLICT,
            f"not deployed: {owned.describe(taken)} is not kvscale's",
            res.generation,
            now,
        ),
        phase="Pending",
        observed_generation=res.generation,
    )
    said = before is not None and before.status == "True" and before.message == message
    events = () if said else (Event("Warning", NAME_CONFLICT, message[:1000]),)
    return Result(new, events=events)


def conflicted(status: InferenceServiceStatus) -> bool:
    """Whether nothing was deployed because a child's name is taken (the status tick re-checks)."""
    found = get_condition(status, NAME_CONFLICT)
    return status.phase == "Pending" and found is not None and found.status == "True"


def _had_set(status: InferenceServiceStatus, observed: Observed) -> bool:
    """Whether this resource may have a LeaderWorkerSet (only then does removal ask the API)."""
    return observed.leader_worker_set is not None or multi_node(status)


def _workload(
    intent: Intent,
    res: Resource,
    planned: Planned,
    launch: PlannedLaunch,
    replicas: int,
    routing: PoolPlan | None,
    settings: Settings,
) -> dict[str, Any]:
    """The engine workload: a Deployment of `replicas` pods, or for a plan across nodes a
    LeaderWorkerSet of `replicas` groups (EngineImageError, MultiNodeUnsupported)."""
    joined = routing.join_labels if routing is not None and routing.action == "join" else None
    if planned.config.nodes > 1:
        template_labels = {**pod_labels(res.name, res.uid, planned.config), **(joined or {})}
        return lws.leader_worker_set(
            res.name,
            intent.spec,
            planned.config,
            launch,
            planned.pool,
            replicas,
            settings.engine_port,
            template_labels,
            settings.extra_tolerations,
            policy=settings.pod_policy,
        )
    return deployment(
        res.name,
        res.uid,
        intent.spec,
        planned.model,
        planned.config,
        planned.chosen,
        planned.pool,
        replicas,
        settings.engine_port,
        settings.extra_tolerations,
        pool_labels=joined,
        policy=settings.pod_policy,
        launch=launch,
    )


def kept_workload(status: InferenceServiceStatus, res: Resource, max_context_tokens: int | None) -> Workload | None:
    """The observed workload a re-plan chose, kept while the spec is the one it was re-planned
    under (an operator restart, a GPU-type fallback); a spec change plans from spec.workload."""
    recorded = status.plan.workload if status.plan is not None else None
    if recorded is None or recorded.source != "observed" or status.observed_generation != res.generation:
        return None
    planned = get_condition(status, "Planned")
    if planned is not None and planned.status == "False":  # a kept plan (_kept): not one made under this spec
        return None
    return planned_workload(recorded, max_context_tokens)


def _had_pool(status: InferenceServiceStatus) -> bool:
    """Whether this resource owned an InferencePool (only then does removal look at the API)."""
    c = get_condition(status, POOL_CONDITION)
    return c is not None and c.reason == "Owned"


def _routing(
    intent: Intent, res: Resource, seen: PoolView | None, cfg: ServingConfig, settings: Settings
) -> PoolPlan | None:
    """What to do about spec.routing.inferencePool; None when not asked for. A missing API or
    missing RBAC becomes a condition; the engines deploy anyway."""
    wanted = intent.spec.routing.inference_pool if intent.spec.routing else None
    if wanted is None:
        return None
    if seen is not None and seen.forbidden:
        return PoolPlan("none", False, "Forbidden", POOL_FORBIDDEN)
    engine_labels = pod_labels(res.name, res.uid, cfg)
    installed = seen is not None and seen.api_installed
    existing = seen.existing if seen is not None else None
    # Across nodes only the leaders serve: the pool selects them, as the Service does. A
    # disaggregated plan's pool selects both roles (kvscale.control.disaggregated).
    selects = lws.leader_labels(res.name) if cfg.nodes > 1 else labels(res.name)
    return plan_pool(res.name, res.uid, wanted, selects, engine_labels, settings.engine_port, installed, existing)


def _with_routing(
    result: Result, before: InferenceServiceStatus, res: Resource, routing: PoolPlan | None, now: dt.datetime | None
) -> Result:
    """The owned pool joins the children; the InferencePool condition says what happened."""
    if routing is None:
        status = without_condition(result.status, POOL_CONDITION)
        return replace(result, status=status, prune_pools=_had_pool(before))
    keep = routing.pool["metadata"]["name"] if routing.pool is not None else None
    pool_condition = condition(before, POOL_CONDITION, routing.ok, routing.reason, routing.message, res.generation, now)
    events = result.events
    if not routing.ok:
        events = (*events, Event("Warning", f"InferencePool{routing.reason}", routing.message[:1000]))
    return replace(
        result,
        status=with_conditions(result.status, pool_condition),
        apply=result.apply + ((routing.pool,) if routing.pool is not None else ()),
        events=events,
        prune_pools=_had_pool(before),
        keep_pool=keep,
    )


def _waiting(status: InferenceServiceStatus, observed: Observed) -> tuple[list[EnginePod], int]:
    """The planned GPU type's pods the scheduler could not place, longest waiting first, and
    how many of its pods are placed."""
    gpu = status.plan.gpu_type if status.plan else None
    pods = [p for p in observed.pods if p.gpu_type == gpu and not p.deleting]
    stuck = sorted((p for p in pods if p.unschedulable_since is not None), key=lambda p: p.unschedulable_since or 0)
    return stuck, sum(1 for p in pods if p.node_name)


def diagnosis(status: InferenceServiceStatus, observed: Observed, stuck: list[EnginePod]) -> Diagnosis:
    """Why the pods wait: the first one held by something other than GPUs (a re-plan would not
    fix it), else the one waiting longest."""
    gpu = status.plan.gpu_type if status.plan else ""
    pool = observed.pools.get(gpu)
    found = [
        diagnose(
            p.unschedulable_message,
            gpu,
            pool.resource_name if pool else "",
            pool.nodes if pool else 0,
            pool.taints if pool else (),
            p.tolerations,
        )
        for p in stuck
    ]
    return next((d for d in found if not d.replan), found[0])


def replans(status: InferenceServiceStatus, observed: Observed, settings: Settings, now: dt.datetime) -> bool:
    """Whether the status tick re-plans: GPU types left out earlier are due back, or nothing of
    the planned GPU type is placed and its pods waited too long for free GPUs (the scheduler
    says so: a taint, a selector or a volume is no reason to move to another GPU type)."""
    if status.phase in (None, "Failed", "Pending", "Recommended") or status.plan is None:
        return False
    if exclusions.expired(status, settings.gpu_exclusion_ttl_s, now):
        return True
    stuck, placed = _waiting(status, observed)
    # Placed pods hold the type, except during a re-plan's rollout: the old fleet still serves
    # there, and a new type that places only part of the fleet would keep both for good.
    if not stuck or (placed and not rolling_out(status)) or not diagnosis(status, observed, stuck).replan:
        return False
    return (now - (stuck[0].unschedulable_since or now)).total_seconds() >= settings.unschedulable_timeout_s


def drift(applied: Mapping[str, Any] | None, seen: DeploymentView | None) -> list[str]:
    """How the workload differs from what kvscale applied: replicas, image, args."""
    if applied is None or seen is None or applied.get("kind", DEPLOYMENT) != seen.kind:
        return []
    spec = applied.get("spec") or {}
    container = ((engine_template(spec).get("spec") or {}).get("containers") or [{}])[0]
    out = []
    if int(spec.get("replicas") or 0) != seen.replicas:
        out.append(f"replicas {seen.replicas} -> {spec.get('replicas')}")
    if container.get("image") != seen.image:
        out.append(f"image {seen.image} -> {container.get('image')}")
    if tuple(container.get("args") or ()) != seen.args:
        out.append("engine args")
    return out


def settled(result: Result, before: InferenceServiceStatus, observed: Observed, res: Resource) -> bool:
    """Whether applying `result` would change nothing: the same status, no retry or deletion,
    and every child in place as built (owned, the Deployment without drift). Reconcile marks
    the phase Deploying as it applies; with nothing to apply a Ready service stays Ready (one pinned
    to 0 replicas stays Planned)."""
    after = result.status
    if before.phase in ("Ready", "Planned") and after.phase == "Deploying":
        after = after.model_copy(update={"phase": before.phase})
    if status_patch(before, after) or result.retry is not None or result.delete:
        return False
    found = owned.check(result.apply, observed.children, res.uid)
    if found.reapply or found.foreign:
        return False
    seen = observed.workload(multi_node(result.status))
    return result.applied_deployment is None or (seen is not None and not drift(result.applied_deployment, seen))


def refresh(
    intent: Intent | SpecError,
    res: Resource,
    status: InferenceServiceStatus,
    observed: Observed,
    catalog: Catalog,
    settings: Settings,
    now: dt.datetime,
) -> Result | None:
    """The status tick; None when there is nothing to look at (not deployed)."""
    if conflicted(status):  # a child's name was taken: deploy once it is free (reconcile says if not)
        return reconcile(intent, res, status, observed, catalog, settings, now=now)
    if status.phase in (None, "Failed", "Pending", "Recommended") or status.plan is None:
        return None
    gpu = status.plan.gpu_type
    ttl_s = settings.gpu_exclusion_ttl_s
    if exclusions.expired(status, ttl_s, now):
        back = ", ".join(status.plan.excluded_gpu_types)
        message = f"{back} left out for KVSCALE_GPU_EXCLUSION_TTL ({ttl_s:.0f}s): planning with every GPU type again"
        return replan(TypesReturned(message), intent, res, status, observed, catalog, settings, now)
    if replans(status, observed, settings, now):
        why = diagnosis(status, observed, _waiting(status, observed)[0])
        message = (
            f"pods on {gpu} waited {settings.unschedulable_timeout_s:.0f}s for free GPUs ({why.cause}; {why.says()}): "
            f"re-planning without {gpu}"
        )
        left_out = (*exclusions.active(status, ttl_s, now), gpu)
        stuck = Unschedulable(gpu, left_out, message, ttl_s)
        return replan(stuck, intent, res, status, observed, catalog, settings, now)
    if pool_api_missing(status) and observed.pool is not None and observed.pool.api_installed:
        return reconcile(intent, res, status, observed, catalog, settings, now=now)  # the CRD arrived
    found = owned.check(observed.applied_children, observed.children, res.uid)
    if found.reapply or found.foreign or get_condition(status, NAME_CONFLICT) is not None:
        return _restore(status, res, observed, found, now)
    if disaggregated(status):
        return _pools_readiness(status, res, observed, now, settings.unschedulable_timeout_s)
    seen = observed.workload(multi_node(status))
    if seen is None:
        return None
    pinned = None if isinstance(intent, SpecError) else intent.scaling.pinned_replicas
    ready = _readiness(status, res, observed, seen, now, settings.unschedulable_timeout_s, pinned)
    return _finish_replan(ready, res, observed, seen, now) if rolling_out(status) else ready


def rolling_out(status: InferenceServiceStatus) -> bool:
    """Whether a re-plan's new pods are still replacing the old ones (the Replanning condition)."""
    c = get_condition(status, CONDITION)
    return c is not None and c.status == "True"


def _finish_replan(ready: Result, res: Resource, observed: Observed, seen: DeploymentView, now: dt.datetime) -> Result:
    """Once every replica runs the new pods and is ready, the workload goes to the load's count
    (kept through the rollout so the old pods went only as new ones became ready)."""
    if ready.apply or not seen.rolled_out():  # drift reverted first, or new pods still coming
        return ready
    target = seen.replan_target
    status = ready.status
    before = get_condition(status, CONDITION)
    what = before.message.split(":")[0] if before is not None else "re-plan"  # the change, as Rollout said it
    if target is None or target == seen.replicas:
        message = f"{what}: rolled out, {seen.ready_replicas}/{seen.replicas} replicas ready on the new pods"
        done = condition(status, CONDITION, False, "RolledOut", message, res.generation, now)
        return replace(ready, status=with_conditions(status, done))
    # Down or up: up only now, so that the increase goes to the new ReplicaSet (kvscale.control.replan)
    message = (
        f"{what}: rolled out, {seen.replicas} replicas ready on the new pods; scaled to {target}, the load's count"
    )
    done = condition(status, CONDITION, False, "RolledOut", message, res.generation, now)
    new = with_conditions(status, done, replicas=target, desired_replicas=target)
    applied = None
    if observed.applied is not None:
        applied = {**observed.applied, "spec": {**(observed.applied.get("spec") or {}), "replicas": target}}
    event = Event("Normal", "Scaled", f"Scaled {seen.replicas} -> {target}: {message}"[:1000])
    if target > seen.replicas and applied is not None:
        # Growth is applied as the workload (not through the scale subresource), so that a
        # GPUBudget caps it as it caps any reconcile that grows a workload (the handler's
        # under_budget sees only what is applied).
        return replace(ready, status=new, apply=(applied,), events=(*ready.events, event), applied_deployment=applied)
    return replace(
        ready,
        status=new,
        scale_to=target,
        scale_kind=seen.kind,
        events=(*ready.events, event),
        applied_deployment=applied,
    )


def _restore(
    status: InferenceServiceStatus, res: Resource, observed: Observed, found: owned.ChildCheck, now: dt.datetime
) -> Result:
    """Children deleted or edited outside kvscale are applied again (the Deployment with the
    replicas it last had), and the Children condition and an Event say which; an object of a
    child's name that is not kvscale's is left alone and named in NameConflict."""
    order = {kind: i for i, kind in enumerate((*CHILD_KINDS, lws.KIND))}
    bodies = sorted(found.reapply, key=lambda b: order.get(str(b["kind"]), len(order)))
    notes = [f"{owned.describe([_view(b, res)])} (deleted outside kvscale)" for b in found.missing]
    notes += [f"{owned.describe([_view(b, res)])} (edited outside kvscale)" for b in found.edited]
    events: list[Event] = []
    new = status
    if notes:
        message = f"re-applied {'; '.join(notes)}"
        new = with_conditions(new, condition(new, "Children", True, "Restored", message, res.generation, now))
        events.append(Event("Warning", "ChildrenRestored", message[:1000]))
    if found.foreign:
        conflict = name_conflict(new, res, found.foreign, now)
        events.extend(conflict.events)
        new = with_conditions(new, *(c for c in conflict.status.conditions if c.type == NAME_CONFLICT))
    else:
        new = without_condition(new, NAME_CONFLICT)
    seen = observed.workload(multi_node(status))
    kind = workload_kind(status)
    gone = any(b["kind"] == kind for b in found.missing)
    if gone:
        message = f"the {kind} of {res.namespace}/{res.name} was deleted outside kvscale: re-created, 0 ready"
        new = with_conditions(
            new,
            condition(new, "Ready", False, "DeploymentMissing", message, res.generation, now),
            phase="Deploying",
            ready_replicas=0,
        )
    if seen is None or gone:
        return Result(new, apply=tuple(bodies), events=tuple(events))
    ready = _readiness(new, res, observed, seen, now)
    if found.foreign:  # serving, but a child (its Service, its PDB) is another's: not Ready
        taken = owned.describe(found.foreign)
        message = f"{taken} is not kvscale's: the engine runs, but kvscale cannot apply that child (see NameConflict)"
        ready = replace(
            ready,
            status=with_conditions(
                ready.status, condition(ready.status, "Ready", False, NAME_CONFLICT, message, res.generation, now)
            ),
        )
    return replace(ready, apply=tuple(bodies) + ready.apply, events=tuple(events) + ready.events)


def _view(body: Mapping[str, Any], res: Resource) -> owned.ChildView:
    return owned.ChildView(str(body["kind"]), res.namespace, str(body["metadata"]["name"]))


def pool_api_missing(status: InferenceServiceStatus) -> bool:
    """Deployed without its pool because the InferencePool CRD was missing: the status tick looks
    for the API (one discovery request) while this holds."""
    c = get_condition(status, POOL_CONDITION)
    return c is not None and c.reason == "APINotInstalled"


def _scheduled(
    status: InferenceServiceStatus, res: Resource, observed: Observed, now: dt.datetime, timeout_s: float | None
) -> tuple[Condition, tuple[Event, ...]]:
    """Scheduled, why pods wait (quoting the scheduler), and whether some wait while others
    serve. Partly placed past the unschedulable timeout, kvscale does not re-plan (that would
    move the pods that serve); the condition says so (PartiallyPlaced). A cause other than GPUs
    (a taint, a selector, a volume) never re-plans: the condition names it and the fix, with
    one Event when it becomes the cause."""
    gpu = status.plan.gpu_type if status.plan else ""
    stuck, placed = _waiting(status, observed)
    if not stuck:
        return condition(status, "Scheduled", True, "Scheduled", f"pods scheduled on {gpu}", res.generation, now), ()
    waited_s = (now - (stuck[0].unschedulable_since or now)).total_seconds()
    why = diagnosis(status, observed, stuck)
    before = get_condition(status, "Scheduled")
    if not why.replan:
        message = (
            f"{len(stuck)} pod(s) cannot be scheduled on {gpu} nodes: {why.cause}; {why.says()}. kvscale does not "
            "re-plan for this (another GPU type is not the fix)" + (f"; {why.fix}" if why.fix else "")
        )
        blocked = condition(status, "Scheduled", False, why.reason, message, res.generation, now)
        news = before is None or before.reason != why.reason
        return blocked, ((Event("Warning", why.reason, message[:1000]),) if news else ())
    moving = rolling_out(status)  # a re-plan's new pods: placed ones do not hold the type (`replans`)
    if placed and not moving and timeout_s is not None and waited_s >= timeout_s:
        message = (
            f"{placed} pod(s) serve on {gpu}; {len(stuck)} waited {waited_s:.0f}s for free {gpu} GPUs: kvscale keeps "
            "the placed pods and does not re-plan (a new GPU type would move them); free or add GPUs, or lower "
            "spec.scaling.maxReplicas"
        )
        partial = condition(status, "Scheduled", False, "PartiallyPlaced", message, res.generation, now)
        news = before is None or before.reason != "PartiallyPlaced"
        return partial, ((Event("Warning", "PartiallyPlaced", message[:1000]),) if news else ())
    then = (
        f"; kvscale re-plans without {gpu} after {timeout_s:.0f}s"
        if timeout_s is not None and (not placed or moving)
        else ""
    )
    message = f"{len(stuck)} pod(s) waiting for free {gpu} GPUs: {why.cause}; {why.says()}{then}"
    return condition(status, "Scheduled", False, why.reason, message, res.generation, now), ()


def _readiness(
    status: InferenceServiceStatus,
    res: Resource,
    observed: Observed,
    seen: DeploymentView,
    now: dt.datetime,
    timeout_s: float | None = None,
    pinned: Any = None,
) -> Result:
    """Ready, phase and Scheduled from the workload; `pinned`: spec.scaling.replicas as written."""
    wanted, ready = seen.replicas, seen.ready_replicas
    is_ready = ready >= wanted > 0
    scheduled, notices = _scheduled(status, res, observed, now, timeout_s)
    events: list[Event] = list(notices)
    fields: dict[str, Any] = {"replicas": wanted, "ready_replicas": ready}
    # Across nodes a replica is a LeaderWorkerSet group: ready when all of its pods are.
    unit = f"groups of {status.plan.nodes} nodes" if status.plan and multi_node(status) else "replicas"
    readiness = f"{ready}/{wanted} {unit} ready"
    reason = "ReplicasReady" if is_ready else "ReplicasNotReady"
    phase = "Ready" if is_ready else "Deploying"
    if pinned == 0 and wanted == 0:  # nothing is to run: not Deploying (the phase a pin to 0 showed)
        phase, reason = "Planned", PINNED_TO_ZERO
        readiness = (
            "spec.scaling.replicas pins 0 replicas: the plan is kept and nothing runs; raise or remove it to serve"
        )
    if phase != status.phase:
        fields["phase"] = phase
        notice = {"Ready": "Ready", "Deploying": "NotReady"}.get(phase, PINNED_TO_ZERO)
        events.append(Event("Normal", notice, readiness))
    new = with_conditions(
        status,
        condition(status, "Ready", is_ready, reason, readiness, res.generation, now),
        scheduled,
        **fields,
    )
    changed = drift(observed.applied, seen)
    if not changed or observed.applied is None:
        return Result(new, events=tuple(events))
    message = f"Reverted changes made outside kvscale: {', '.join(changed)}"
    restored = dict(observed.applied)
    return Result(
        new.model_copy(update={"replicas": int(restored["spec"]["replicas"])}),
        apply=(restored,),
        events=(*events, Event("Normal", "DriftReverted", message)),
        applied_deployment=restored,
    )


def disaggregated(status: InferenceServiceStatus) -> bool:
    """Whether the recorded plan is a prefill pool and a decode pool (kvscale.control.disaggregated)."""
    return status.plan is not None and status.plan.mode == "disaggregated"


def _stale_pools(observed: Observed, res: Resource) -> tuple[tuple[str, str], ...]:
    """The pool Deployments of an earlier disaggregated plan that are this service's."""
    out = []
    for role in pd.ROLES:
        name = pd.pool_name(res.name, role)
        view = owned.find(observed.children, DEPLOYMENT, name)
        if view is not None and not view.owned_by(res.uid):
            continue  # another's object of that name: left alone
        if view is not None or role in observed.pool_workloads:
            out.append((DEPLOYMENT, name))
    return tuple(out)


def _deploy_pools(
    intent: Intent,
    res: Resource,
    status: InferenceServiceStatus,
    observed: Observed,
    planned: PoolsPlanned,
    planned_for: Any,
    excluded: tuple[str, ...],
    settings: Settings,
    now: dt.datetime | None,
) -> Result:
    """A disaggregated plan's children: the Service (decode pods), the PodDisruptionBudget (every
    engine pod) and the two pool Deployments at the plan's counts within spec.scaling, which the
    PoolsAutoscaled condition says the autoscaler leaves there; the aggregated workload of an
    earlier plan goes. Recommend mode records the plan only."""
    spec = intent.spec
    problem = pd.engine_args_problem(spec)
    if problem is not None:
        return _failed(status, res, "InvalidArgs", problem, now=now)
    plan = planned.plan
    try:
        launched = pd.launches(spec, plan, settings.engine_port)
    except (CheckpointError, ContextLimitError) as exc:
        return _failed(status, res, "Undeployable", str(exc), now=now)
    pinned = intent.scaling.pinned_replicas
    replicas = pd.pool_replicas(plan, intent.scaling.bounded, pinned)
    if intent.scaling.mode == "auto" and pinned is None:
        # Pools the scale tick moved keep their counts through a re-apply (a restart, a re-plan):
        # the tick follows the load from there, as an aggregated re-plan rolls at the running count.
        running = observed.pool_workloads
        replicas = {
            r: int(intent.scaling.bounded(running[r].replicas)) if r in running else n for r, n in replicas.items()
        }
    base = status.model_copy(
        update={
            "plan": pd.plan_status(res.name, plan, planned.pools, launched, replicas, excluded, planned_for),
            "observed_generation": res.generation,
            "selector": selector(res.name),
        }
    )
    base = without_condition(base, GATEWAY_CONDITION)
    if not excluded:
        base = without_condition(base, exclusions.CONDITION)
    planned_condition = condition(status, "Planned", True, "Planned", plan.reason, res.generation, now)
    summary = pd.summary(plan, replicas)
    if intent.scaling.mode == "recommend":
        not_ready = condition(
            status, "Ready", False, "RecommendOnly", "mode is recommend: nothing deployed", res.generation, now
        )
        quiet = without_condition(without_condition(base, POOL_CONDITION), pd.SCALING_CONDITION)
        new = with_conditions(quiet, planned_condition, not_ready, phase="Recommended")
        candidates = CHILD_KINDS + ((lws.KIND,) if _had_set(status, observed) else ())
        return Result(
            without_condition(new, NAME_CONFLICT),
            delete=tuple(k for k in candidates if _owns(observed, res, k)),
            delete_named=_stale_pools(observed, res),
            events=(Event("Normal", "Recommended", f"Recommend {summary}"[:1000]),),
            prune_pools=_had_pool(status),
        )
    routing = _routing(intent, res, observed.pool, plan.decode.cfg, settings)
    joined = routing.join_labels if routing is not None and routing.action == "join" else None
    try:
        workloads = pd.pool_deployments(
            res.name,
            res.uid,
            spec,
            plan,
            planned.pools,
            launched,
            replicas,
            settings.engine_port,
            settings.extra_tolerations,
            pool_labels=joined,
            policy=settings.pod_policy,
            sidecar_image=settings.routing_sidecar_image,
        )
    except EngineImageError as exc:
        return _failed(status, res, "NoEngineImage", str(exc), now=now)
    except NotAllowed as exc:
        return _failed(status, res, exc.reason, str(exc), now=now)
    serving = service(res.name, settings.engine_port, pd.role_labels(res.name, pd.SERVING_ROLE))
    children = (serving, pod_disruption_budget(res.name), *workloads)
    earlier = ((DEPLOYMENT,) if observed.deployment is not None else ()) + (
        (lws.KIND,) if _had_set(status, observed) else ()
    )
    stale = tuple(k for k in earlier if not _foreign(observed, res, k))
    held = pd.scaling_message(plan, replicas, pinned)
    reason = pd.SCALING_REASON if pinned is not None else pd.AUTOSCALED_REASON
    scaling = condition(status, pd.SCALING_CONDITION, pinned is None, reason, held, res.generation, now)
    new = with_conditions(
        base,
        planned_condition,
        scaling,
        phase="Deploying",
        replicas=replicas[pd.SERVING_ROLE],
        desired_replicas=replicas[pd.SERVING_ROLE],
    )
    message = f"Deployed {summary}: {plan.reason}"
    result = Result(new, apply=children, delete=stale, events=(Event("Normal", "Planned", message[:1000]),))
    taken = owned.foreign(children, observed.children, res.uid)
    if taken:
        return name_conflict(status, res, taken, now)
    return _with_routing(replace(result, status=without_condition(new, NAME_CONFLICT)), status, res, routing, now)


def _pools_readiness(
    status: InferenceServiceStatus, res: Resource, observed: Observed, now: dt.datetime, timeout_s: float | None
) -> Result | None:
    """Ready when every worker of both pools is; status.replicas and readyReplicas are the
    decode pool's (the pods the Service serves from); None before either Deployment is seen."""
    views = observed.pool_workloads
    if not views:
        return None
    parts = []
    for role in pd.ROLES:
        view = views.get(role)
        parts.append(f"{role} {view.ready_replicas}/{view.replicas} ready" if view else f"{role}: no Deployment yet")
    counts = [views[r].replicas if r in views else 0 for r in pd.ROLES]
    is_ready = all(r in views and views[r].ready_replicas >= views[r].replicas > 0 for r in pd.ROLES)
    readiness = ", ".join(parts)
    phase, reason = ("Ready", "ReplicasReady") if is_ready else ("Deploying", "ReplicasNotReady")
    if len(views) == len(pd.ROLES) and not any(counts):
        phase, reason = "Planned", PINNED_TO_ZERO
        readiness = (
            "spec.scaling.replicas pins 0 workers: the plan is kept and nothing runs; raise or remove it to serve"
        )
    decode = views.get(pd.SERVING_ROLE)
    fields: dict[str, Any] = {
        "replicas": decode.replicas if decode else 0,
        "ready_replicas": decode.ready_replicas if decode else 0,
    }
    scheduled, events = _scheduled(status, res, observed, now, timeout_s)
    if phase != status.phase:
        fields["phase"] = phase
        notice = {"Ready": "Ready", "Deploying": "NotReady"}.get(phase, PINNED_TO_ZERO)
        events = (*events, Event("Normal", notice, readiness))
    ready = condition(status, "Ready", is_ready, reason, readiness, res.generation, now)
    new = with_conditions(status, ready, scheduled, **fields)
    # Edits outside kvscale (replicas, image, args) are reverted: nothing scales the pools.
    applied = {str(b["metadata"]["name"]): b for b in observed.applied_children if b.get("kind") == DEPLOYMENT}
    reverted, changes = [], []
    for kind in pd.ROLES:
        body, seen = applied.get(pd.pool_name(res.name, kind)), views.get(kind)
        changed = drift(body, seen)
        if body is not None and changed:
            reverted.append(dict(body))
            changes.append(f"{kind}: {', '.join(changed)}")
    if not reverted:
        return Result(new, events=events)
    message = f"Reverted changes made outside kvscale: {'; '.join(changes)}"
    return Result(new, apply=tuple(reverted), events=(*events, Event("Normal", "DriftReverted", message[:1000])))


def _kept_pools(
    status: InferenceServiceStatus,
    res: Resource,
    observed: Observed,
    reason: str,
    message: str,
    retry_s: float | None,
    now: dt.datetime | None,
) -> Result:
    """A spec that cannot be planned while a disaggregated plan runs: its pools keep serving at
    their counts (as `_kept` keeps an aggregated plan), Planned=False says why; one Warning when
    the reason is new."""
    kept = f"{message}. The running prefill and decode pools keep serving at their counts"
    before = get_condition(status, "Planned")
    planned = condition(status, "Planned", False, reason, kept, res.generation, now)
    new = with_conditions(status, planned, observed_generation=res.generation)
    if new.phase in ("Failed", "Pending"):
        new = new.model_copy(update={"phase": None})
    ready = _pools_readiness(new, res, observed, now or dt.datetime.now(dt.UTC), None)
    result = ready if ready is not None else Result(new)
    news = before is None or (before.status, before.reason) != ("False", reason)
    events = (Event("Warning", reason, kept[:1000]),) if news else ()
    return replace(
        result, events=(*events, *result.events), retry=Retry(kept, retry_s) if retry_s is not None else None
    )


POOLS_UNDER_BUDGET = "PoolsUnderBudget"


def pools_under_budget(
    status: InferenceServiceStatus,
    res: Resource,
    governed: Mapping[str, str],
    retry_s: float,
    now: dt.datetime | None = None,
) -> Result:
    """A disaggregated plan on GPU types a GPUBudget governs (`governed`: GPU type -> budget)
    whose free GPUs hold not one worker of each pool: nothing is deployed; retried, so that the
    pools deploy once the budget has room."""
    names = ", ".join(f"{gpu} by GPUBudget {budget}" for gpu, budget in sorted(governed.items()))
    message = (
        f"the disaggregated plan's GPU types are governed ({names}), and the budget has no room now for one prefill "
        "and one decode worker: nothing is deployed until it has; raise the limit, or set "
        "spec.serving.disaggregation to off to deploy aggregated replicas under the budget"
    )
    return _failed(status, res, POOLS_UNDER_BUDGET, message, retry_s, now)
