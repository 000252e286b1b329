"""The scale tick of a disaggregated plan's two pools, as a value: each pool is ticked by the one
tick (kvscale.autoscaling.tick.tick_all, the two pools as two services, as the simulator ticks
them: kvscale.sim.pool_policies) on its own observation and its own capacity
(kvscale.autoscaling.pool_capacity):

- the prefill pool on its pods' metrics: requests and prompt tokens arriving, the requests
  waiting and running there, and the TTFT those pods report (their wait + prefill) against the
  prefill pool's share of the TTFT target (status.plan.prefill.ttftTargetSeconds);
- the decode pool on its pods' metrics: running sequences, KV cache use, inter-token latency and
  TPOT against the SLO, and the TTFT those pods report (slot wait + first step) against the
  decode pool's share.

Pure: the handler reads each pool's observation before (kvscale.operator.handlers) and applies
the result after (each pool's Deployment through its scale subresource). A missing reading never
scales a pool down: the policy holds on a stale observation, as it does for an aggregated
service. Pinned (spec.scaling.replicas) and recommend mode leave the pools where reconcile put
them (the PoolsAutoscaled condition says so).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvscale.api.intent import Intent, pool_serving_config
from kvscale.api.models import InferenceServiceStatus, PlanStatus, PoolPlanStatus
from kvscale.autoscaling.observation import Decision, Observation
from kvscale.autoscaling.policy import Capacity, PolicyConfig, PolicyState
from kvscale.autoscaling.pool_capacity import DecodeCapacity, PrefillCapacity, pool_policy_config
from kvscale.autoscaling.tick import BudgetAnswer, TickDecision, TickInput, Want, tick_all
from kvscale.control import disaggregated as pd
from kvscale.control.budget import BudgetBook
from kvscale.control.pool_budget import PoolsGoverned, govern_pools
from kvscale.control.reconcile import DEPLOYMENT, DeploymentView, Event, Resource, Result
from kvscale.control.scaling import Gauges, decision_kind, default_cold_start_s
from kvscale.control.settings import Settings
from kvscale.control.status import condition, now_rfc3339, planned_workload, with_conditions
from kvscale.planner.disaggregated import Role
from kvscale.sizing.catalog import Catalog


@dataclass(frozen=True)
class PoolReading:
    """What the handler read for one pool this tick."""

    obs: Observation
    missing: str | None  # why the pool's metrics were not read (None: they were)
    view: DeploymentView  # the pool's Deployment as the watch saw it


@dataclass(frozen=True)
class PoolModel:
    """One pool's capacity model and policy configuration, kept while its configuration holds."""

    capacity: Capacity
    config: PolicyConfig


@dataclass(frozen=True)
class PoolsMemory:
    """Both pools' models and policy states (in the service's memory), reset when the plan's
    pools, the SLO or the bounds change."""

    key: tuple[object, ...] | None = None
    models: Mapping[str, PoolModel] = field(default_factory=dict)
    states: Mapping[str, PolicyState] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolsGovernor:
    """The GPUBudgets as the pools' tick sees them (kvscale.control.pool_budget)."""

    book: BudgetBook
    labels: Mapping[str, str]  # the service's labels (a budget's selector reads them)
    ttl_s: float  # how long a want counts without a tick
    before: InferenceServiceStatus  # the status the tick started from (the last HeldByBudget said)


class _PoolsBook:
    """The tick's budget stage for the two pools: both wants answered at once by the budget
    book (kvscale.control.pool_budget.govern_pools); its result kept for the rendering."""

    def __init__(
        self,
        governor: PoolsGovernor,
        intent: Intent,
        res: Resource,
        status: InferenceServiceStatus,
        pools: Mapping[Role, PoolPlanStatus],
        current: Mapping[Role, int],
        roles: Sequence[Role],
        now: dt.datetime,
    ) -> None:
        self.governor, self.intent, self.res, self.status = governor, intent, res, status
        self.pools, self.current, self.roles, self.now = pools, current, roles, now
        self.done: PoolsGoverned | None = None

    def answer(self, wants: Sequence[Want]) -> list[BudgetAnswer]:
        asked = {role: want.decision.replicas for role, want in zip(self.roles, wants, strict=True)}
        g = self.governor
        self.done = govern_pools(
            g.book,
            self.res,
            g.labels,
            self.intent,
            g.before,
            self.status,
            self.pools,
            self.current,
            asked,
            self.now,
            g.ttl_s,
        )
        return [BudgetAnswer(self.done.counts[role]) for role in self.roles]


@dataclass(frozen=True)
class PoolsTick:
    result: Result
    memory: PoolsMemory
    decisions: Mapping[str, Decision]
    scaled: Mapping[str, int]  # the pools scaled this tick (Deployment name -> replicas)
    # The operator's own metrics per pool, each as a service named after its Deployment
    # (`<name>-prefill`, `<name>-decode`): the dashboards' per-service panels show each pool.
    gauges: Mapping[str, Gauges] = field(default_factory=dict)


def autoscaled(intent: Intent) -> bool:
    """Whether the scale tick scales the pools: mode auto and no pinned count."""
    return intent.scaling.mode == "auto" and intent.scaling.pinned_replicas is None


def _pools(plan: PlanStatus) -> dict[Role, PoolPlanStatus]:
    assert plan.prefill is not None and plan.decode is not None  # a disaggregated plan's status
    return {"prefill": plan.prefill, "decode": plan.decode}


def ttft_targets(intent: Intent, plan: PlanStatus) -> dict[str, float]:
    """Each pool's share of the TTFT target as the plan split it; a status written before the
    split was recorded: the prefill pool gets TTFT less the transfer, the decode pool all of it."""
    transfer_s = (plan.kv_transfer_ms or 0.0) / 1e3
    fallback = {"prefill": max(intent.slo.ttft_s - transfer_s, 1e-3), "decode": intent.slo.ttft_s}
    return {
        role: pool.ttft_target_seconds if pool.ttft_target_seconds is not None else fallback[role]
        for role, pool in _pools(plan).items()
    }


def step_target_s(intent: Intent) -> float:
    """The longest decode step: TPOT, or the inter-token bound when tighter (PlanRequest.step_target_s)."""
    return intent.slo.tpot_s if intent.max_itl_s is None else min(intent.slo.tpot_s, intent.max_itl_s)


def models(intent: Intent, plan: PlanStatus, memory: PoolsMemory, catalog: Catalog, settings: Settings) -> PoolsMemory:
    """Both pools' models for this plan (kept from `memory` while its key holds)."""
    pools = _pools(plan)
    targets = ttft_targets(intent, plan)
    key = (
        tuple(
            (role, p.gpu_type, p.tensor_parallel, p.precision, p.max_batch, p.max_num_batched_tokens)
            for role, p in pools.items()
        ),
        tuple(sorted(targets.items())),
        intent.model,
        intent.kv_cache_precision,
        intent.slo,
        intent.max_itl_s,
        intent.scaling.min_replicas,
        intent.scaling.max_replicas,
        intent.scaling.scale_down_stabilization_s,
        plan.workload,
    )
    if memory.key == key and set(memory.models) == set(pools):
        return memory
    shape = planned_workload(plan.workload, intent.workload.max_context_tokens) if plan.workload else None
    built: dict[str, PoolModel] = {}
    for role, pool in pools.items():
        cfg = pool_serving_config(intent, plan, pool, catalog)
        capacity: Capacity
        if role == "prefill":
            capacity = PrefillCapacity(cfg, intent.slo, targets[role], pool.max_batch, shape)
        else:
            capacity = DecodeCapacity(cfg, intent.slo, step_target_s(intent), pool.max_batch, shape)
        config = pool_policy_config(
            role,
            ttft_target_s=targets[role],
            tpot_target_s=intent.slo.tpot_s,
            input_tokens=intent.workload.input_tokens,
            output_tokens=intent.workload.output_tokens,
            min_replicas=max(1, intent.scaling.min_replicas),  # a pool at zero would lose every request
            max_replicas=intent.scaling.max_replicas,
            cold_start_s=default_cold_start_s(intent, cfg),
            interval_s=settings.scale_interval_s,
            window_s=settings.metrics_window_s,
            scale_down_stabilization_s=intent.scaling.scale_down_stabilization_s,
        )
        built[role] = PoolModel(capacity, config)
    # The same pools with other bounds or targets keep what the policy learned.
    states = memory.states if memory.key is not None and memory.key[0] == key[0] else {}
    return PoolsMemory(key, built, states)


def tick_pools(
    intent: Intent,
    res: Resource,
    status: InferenceServiceStatus,
    readings: Mapping[str, PoolReading],
    memory: PoolsMemory,
    catalog: Catalog,
    settings: Settings,
    now: dt.datetime,
    governor: PoolsGovernor | None = None,
) -> PoolsTick:
    """Both pools through the one tick (its budget stage: the GPUBudgets that govern the pools'
    GPU types, through `governor`); the result scales each pool whose count changed and says
    why in status (PoolsAutoscaled, HeldByBudget, each pool's replicas) and in a Scaled Event."""
    plan = status.plan
    assert plan is not None and plan.prefill is not None and plan.decode is not None
    memory = models(intent, plan, memory, catalog, settings)
    roles: list[Role] = [r for r in pd.ROLES if r in readings]
    book = None
    if governor is not None and len(roles) == len(pd.ROLES):
        current = {r: readings[r].view.replicas for r in roles}
        book = _PoolsBook(governor, intent, res, status, _pools(plan), current, roles, now)
    inputs = [
        TickInput(
            readings[r].obs,
            memory.models[r].capacity,
            memory.models[r].config,
            memory.states.get(r, PolicyState()),
        )
        for r in roles
    ]
    done: dict[str, TickDecision] = dict(zip(roles, tick_all(inputs, book), strict=True))
    budget_events: tuple[Event, ...] = ()
    if book is not None and book.done is not None:
        status, budget_events = book.done.status, book.done.events
    decisions: dict[str, Decision] = {r: d.decision for r, d in done.items()}
    states = {**memory.states, **{r: d.state for r, d in done.items()}}
    memory = PoolsMemory(memory.key, memory.models, states)

    scaled: dict[str, int] = {}
    events: list[Event] = []
    parts: list[str] = []
    pools = _pools(plan)
    for role in roles:
        running, target = readings[role].view.replicas, done[role].replicas
        why = decisions[role].reason
        missing = readings[role].missing
        if missing is not None:
            why = f"{why} (metrics not read: {missing})"
        if target < decisions[role].replicas:
            why = f"{why}; the budget holds it to {target} (HeldByBudget)"
        if target != running:
            scaled[pd.pool_name(res.name, role)] = target
            events.append(Event("Normal", "Scaled", f"Scaled {role} pool {running} -> {target}: {why}"[:1000]))
            parts.append(f"{role} {running} -> {target}: {why}")
        else:
            parts.append(f"{role} {running}: {why}")
        pools[role] = pools[role].model_copy(update={"replicas": target})
    message = "; ".join(parts)
    new_plan = plan.model_copy(update={"prefill": pools["prefill"], "decode": pools["decode"]})
    decode = done.get(pd.SERVING_ROLE)
    fields: dict[str, object] = {"plan": new_plan}
    if decode is not None:
        fields["desired_replicas"] = decode.replicas
    if scaled:
        fields.update(last_scale_time=now_rfc3339(now), last_scale_reason=message[:500])
    cond = condition(status, pd.SCALING_CONDITION, True, pd.AUTOSCALED_REASON, message[:1000], res.generation, now)
    new = with_conditions(status, cond, **fields)
    result = Result(
        new,
        scale_named=tuple((DEPLOYMENT, name, n) for name, n in scaled.items()),
        events=(*events, *budget_events),
    )
    targets = ttft_targets(intent, plan)
    gauges = {
        pd.pool_name(res.name, role): Gauges(
            desired=done[role].replicas,
            current=readings[role].view.replicas,
            ready=readings[role].view.ready_replicas,
            ttft_target_s=targets[role],
            tpot_target_s=intent.slo.tpot_s,
            ttft_predicted_s=targets[role],  # each pool is sized to its share of the target
            tpot_predicted_s=plan.predicted_tpot_seconds or intent.slo.tpot_s,
            ttft_observed_s=readings[role].obs.ttft_p_s,
            tpot_observed_s=readings[role].obs.tpot_p_s if role == "decode" else None,
            cost_usd_per_hour=readings[role].view.replicas * pools[role].cost_per_hour / max(pools[role].workers, 1),
            metrics_available=readings[role].missing is None,
            decision_kind=decision_kind(decisions[role]),
        )
        for role in roles
    }
    return PoolsTick(result, memory, decisions, scaled, gauges)
