"""The autoscaling tick, as a value: (intent, status, Deployment, observation, memory) ->
(new status, replicas to scale to, Events, the operator's own gauges, new memory). Pure:
the observation is read by the handler before, and the result applied after.

The policy runs inside kvscale.autoscaling.tick, the tick the simulator runs; this module
prepares its inputs (`prepared`) and renders its decision (`render`). Its state lives in the
operator's memory per object; after a restart it starts empty, which only delays
scale-downs (they need a full stabilization window of history).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace

from kvscale.api.intent import Intent, policy_config, serving_config
from kvscale.api.models import InferenceServiceStatus, PlanStatus
from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.autoscaling.observation import Decision, Observation
from kvscale.autoscaling.policy import PolicyConfig, PolicyState
from kvscale.autoscaling.tick import TickInput
from kvscale.autoscaling.tick import tick as run_tick
from kvscale.control.inventory import EnginePod
from kvscale.control.reconcile import DeploymentView, Event, Resource, Result, rolling_out, workload_kind
from kvscale.control.settings import Settings
from kvscale.control.status import (
    condition,
    now_rfc3339,
    observed_status,
    planned_workload,
    predicted_tpot_s,
    predicted_ttft_s,
    steady,
    with_conditions,
)
from kvscale.engines.args import requested_source
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.checkpoints import CheckpointError, replica_cold_start
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.units import format_duration


@dataclass(frozen=True)
class ScalerMemory:
    """Per-object memory of the autoscaler (kept in kopf's memo): the capacity model of the
    planned configuration and the policy's state, reset when the plan or the SLO changes."""

    key: tuple[object, ...] | None = None
    capacity: SizingCapacity | None = None
    cold_start_s: float = 60.0
    state: PolicyState = field(default_factory=PolicyState)


@dataclass(frozen=True)
class Fleet:
    """The Deployment's replicas as the tick starts."""

    current: int
    ready: int
    plan: PlanStatus


@dataclass(frozen=True)
class Gauges:
    """The operator's own metrics for one InferenceService after a tick. Running figures
    (current, ready, cost) are None in recommend mode: nothing runs."""

    desired: int
    current: int | None
    ready: int | None
    ttft_target_s: float
    tpot_target_s: float
    ttft_predicted_s: float
    tpot_predicted_s: float
    ttft_observed_s: float | None
    tpot_observed_s: float | None
    cost_usd_per_hour: float | None
    metrics_available: bool
    decision_kind: str
    nodes_per_replica: int = 1  # > 1: replicas are LeaderWorkerSet groups of this many nodes


@dataclass(frozen=True)
class Tick:
    result: Result
    memory: ScalerMemory
    decision: Decision
    gauges: Gauges


def planned(status: InferenceServiceStatus) -> bool:
    """Whether there is a plan to scale (not failed, not waiting for capacity)."""
    return status.plan is not None and status.phase not in (None, "Failed", "Pending")


def fleet(
    intent: Intent, status: InferenceServiceStatus, seen: DeploymentView | None, generation: int | None = None
) -> Fleet | Result | None:
    """What the tick starts from; None (nothing to do) before a plan or without a Deployment in
    mode auto; a Result when the replicas are pinned (the policy is not asked, metrics are not
    read: MetricsAvailable says so instead of keeping an older tick's message)."""
    plan = status.plan
    if plan is None or not planned(status):
        return None
    pinned = intent.scaling.pinned_replicas
    if pinned is not None:
        message = f"spec.scaling.replicas pins {pinned} replicas: the autoscaler does not read metrics"
        unread = condition(status, "MetricsAvailable", None, "Pinned", message, generation)
        return Result(with_conditions(status, unread, desired_replicas=pinned))
    if intent.scaling.mode == "auto" and seen is None:
        return None
    if seen is not None:
        # What the workload says, 0 included (scaled to zero, or a GPUBudget had no GPUs free
        # when it was created): reading 0 as the plan's count skipped the budget's check for
        # free GPUs, and reading it as status.desiredReplicas left it at 0 for good.
        return Fleet(seen.replicas, seen.ready_replicas, plan)
    current = status.desired_replicas or plan.replicas
    return Fleet(current, seen.ready_replicas if seen else 0, plan)


def configuration_key(intent: Intent, plan: PlanStatus) -> tuple[object, ...]:
    """What a replica's capacity depends on: the planned configuration, the model, the SLO and
    the routing (not the workload: the capacity is measured on it)."""
    return (
        plan.gpu_type,
        plan.tensor_parallel,
        plan.pipeline_parallel,
        plan.expert_parallel,
        plan.data_parallel,
        plan.precision,
        plan.max_batch,
        intent.model,
        intent.kv_cache_precision,
        intent.slo,
        intent.routing.least_loaded,
    )


def capacity(
    memory: ScalerMemory, intent: Intent, plan: PlanStatus, catalog: Catalog, learned: tuple[float, ...] = ()
) -> tuple[SizingCapacity, ScalerMemory]:
    """A capacity model for this plan and SLO, and the memory holding it (with a fresh policy
    state when the plan or the SLO changed, starting from the start-to-ready times `learned`
    from other replicas of this model on this GPU type). The model sizes for the workload the
    plan was made for (status.plan.workload: its length distributions and burstiness, scaled
    to each tick's observed means); a re-plan that changed only that workload keeps the state."""
    configuration = configuration_key(intent, plan)
    key = (*configuration, plan.workload)
    if memory.key == key and memory.capacity is not None:
        return memory.capacity, memory
    cfg = serving_config(intent, plan, catalog)
    shape = planned_workload(plan.workload, intent.workload.max_context_tokens) if plan.workload else None
    # Behind an InferencePool the endpoint picker sends a request to the least-loaded replica.
    model = SizingCapacity(cfg, intent.slo, plan.max_batch, shape, least_loaded=intent.routing.least_loaded)
    if memory.key is not None and memory.key[:-1] == configuration:
        return model, ScalerMemory(key, model, memory.cold_start_s, memory.state)
    return model, ScalerMemory(key, model, default_cold_start_s(intent, cfg), PolicyState(cold_start_samples=learned))


def cold_start_key(intent: Intent, plan: PlanStatus) -> tuple[str, str, int, str]:
    """Replicas that start alike: one model (name or shapes), GPU type, tensor parallelism and precision."""
    return (intent.model.key, plan.gpu_type, plan.tensor_parallel * plan.data_parallel, plan.precision)


def newly_ready(
    pods: tuple[EnginePod, ...], plan: PlanStatus, counted: frozenset[str]
) -> tuple[tuple[float, ...], frozenset[str]]:
    """Start-to-ready seconds of the planned GPU type's pods not counted before, and the pods
    counted now (pods gone are forgotten)."""
    ready = {p.name: p.started_to_ready_s for p in pods if p.started_to_ready_s is not None and not p.deleting}
    fresh = tuple(s for name, s in sorted(ready.items()) if name not in counted and _on(pods, name, plan.gpu_type))
    return fresh, frozenset(ready)


def _on(pods: tuple[EnginePod, ...], name: str, gpu_type: str) -> bool:
    return any(p.name == name and p.gpu_type == gpu_type for p in pods)


def default_cold_start_s(intent: Intent, cfg: ServingConfig) -> float:
    """The policy's cold start until it has observed one: the checkpoint's download (each new
    pod downloads it unless spec.model.cache keeps it) plus engine start and shard load."""
    m = intent.model
    try:
        start = replica_cold_start(
            cfg.model,
            cfg.precision,
            cfg.tensor_parallel * cfg.data_parallel,
            cfg.engine,
            requested_source(m.name, m.source, cfg.precision.name),
            cached=m.weights_cached,
        )
    except CheckpointError:  # refused at planning; keep the engine-only estimate
        return cfg.cold_start_s
    return start.total_s


# Why a deployed service's tick read nothing: it has no engine pods (a reason of its own, so the
# first real reading replaces this message: a tick condition keeps its message while its reason holds).
NO_ENGINE_PODS = "no engine pods: no metrics to read"


def decision_kind(decision: Decision) -> str:
    """The decision's kind for telemetry: the policy's own, never parsed from its prose."""
    return decision.kind.value


def _gauges(intent: Intent, plan: PlanStatus, fleet_: Fleet, obs: Observation, decision: Decision, ok: bool) -> Gauges:
    running = intent.scaling.mode == "auto"
    return Gauges(
        desired=decision.replicas,
        current=fleet_.current if running else None,
        ready=fleet_.ready if running else None,
        ttft_target_s=intent.slo.ttft_s,
        tpot_target_s=intent.slo.tpot_s,
        ttft_predicted_s=predicted_ttft_s(plan),
        tpot_predicted_s=predicted_tpot_s(plan),
        ttft_observed_s=obs.ttft_p_s,
        tpot_observed_s=obs.tpot_p_s,
        cost_usd_per_hour=fleet_.current * plan.cost_per_hour / max(plan.replicas, 1) if running else None,
        metrics_available=ok,
        decision_kind=decision_kind(decision),
        nodes_per_replica=plan.nodes,
    )


def _conditions(
    intent: Intent,
    res: Resource,
    status: InferenceServiceStatus,
    obs: Observation,
    missing: str | None,
    now: dt.datetime,
) -> InferenceServiceStatus:
    met = (
        None
        if obs.ttft_p_s is None or obs.tpot_p_s is None
        else (obs.ttft_p_s <= intent.slo.ttft_s and obs.tpot_p_s <= intent.slo.tpot_s)
    )
    seen = "no latency samples yet"
    if obs.ttft_p_s is not None and obs.tpot_p_s is not None:
        seen = f"observed TTFT {format_duration(obs.ttft_p_s)}, TPOT {format_duration(obs.tpot_p_s)}"
    available = missing is None
    return with_conditions(
        status,
        condition(
            status,
            "MetricsAvailable",
            available,
            "MetricsAvailable" if available else ("NoEnginePods" if missing == NO_ENGINE_PODS else "MetricsMissing"),
            missing or "engine metrics present and fresh",
            res.generation,
            now,
        ),
        condition(
            status,
            "SLOMet",
            met,
            "Unknown" if met is None else ("WithinTarget" if met else "OverTarget"),
            seen,
            res.generation,
            now,
        ),
    )


def prepared(
    intent: Intent,
    plan: PlanStatus,
    memory: ScalerMemory,
    catalog: Catalog,
    settings: Settings,
    learned: tuple[float, ...] = (),
) -> tuple[SizingCapacity, PolicyConfig, ScalerMemory]:
    """The tick's capacity model and policy configuration for this plan, and the memory
    holding the model (kvscale.control.scaling.capacity)."""
    model, memory = capacity(memory, intent, plan, catalog, learned)
    config = policy_config(intent, memory.cold_start_s, settings.scale_interval_s, settings.metrics_window_s)
    return model, config, memory


def render(
    intent: Intent,
    res: Resource,
    status: InferenceServiceStatus,
    fleet_: Fleet,
    obs: Observation,
    missing: str | None,
    memory: ScalerMemory,
    decision: Decision,
    now: dt.datetime,
) -> Tick:
    """The policy's decision as the operator shows and applies it: status (conditions, the
    observed figures, the desired count), the scale (mode auto) or only what it would do (mode
    recommend), the Event and the gauges. `memory`: the scaler's memory after the tick."""
    plan = fleet_.plan
    new = steady(
        status,
        _conditions(intent, res, status, obs, missing, now).model_copy(
            update={"observed": observed_status(obs, decision), "desired_replicas": decision.replicas}
        ),
    )
    gauges = _gauges(intent, plan, fleet_, obs, decision, missing is None)
    current, target = fleet_.current, decision.replicas
    # While a re-plan's new pods replace the old ones the count holds: a scale-down would take
    # old pods before new ones are ready, and a scale-up would be shared out in proportion to the
    # ReplicaSets' sizes (the Deployment controller's proportional scaling), most of it to the old
    # pods' ReplicaSet, on the GPU type being left. The rollout's end scales to the load's count
    # (kvscale.control.replan), and the next tick follows the load from there.
    if target == current or rolling_out(status):
        return Tick(Result(new), memory, decision, gauges)
    if intent.scaling.mode == "recommend":
        event = Event("Normal", "Recommendation", f"Would scale {current} -> {target}: {decision.reason}"[:1000])
        return Tick(Result(new, events=(event,)), memory, decision, gauges)
    scaled = new.model_copy(
        update={"replicas": target, "last_scale_time": now_rfc3339(now), "last_scale_reason": decision.reason[:500]}
    )
    event = Event("Normal", "Scaled", f"Scaled {current} -> {target}: {decision.reason}"[:1000])
    result = Result(scaled, scale_to=target, scale_kind=workload_kind(status), events=(event,))
    return Tick(result, memory, decision, gauges)


def tick(
    intent: Intent,
    res: Resource,
    status: InferenceServiceStatus,
    fleet_: Fleet,
    obs: Observation,
    missing: str | None,
    memory: ScalerMemory,
    catalog: Catalog,
    settings: Settings,
    now: dt.datetime,
    learned: tuple[float, ...] = (),
) -> Tick:
    """The tick without an idle rule or a budget (kvscale.autoscaling.tick), rendered: ask the
    policy; scale (mode auto) or only say what it would do (mode recommend). `learned`:
    start-to-ready times seen for this model and GPU type, for a fresh policy state. The
    operator's handler runs every stage through kvscale.control.autoscale."""
    model, config, memory = prepared(intent, fleet_.plan, memory, catalog, settings, learned)
    done = run_tick(TickInput(obs, model, config, memory.state))
    return render(intent, res, status, fleet_, obs, missing, replace(memory, state=done.state), done.policy, now)
