"""The scale tick as one pure function of what the handler read: named stages, each taking the
tick's decision so far and returning it (as llm-d's workload-variant-autoscaler chains
collector -> analyzer -> optimizer -> limiter -> actuator):

1. `policy`: the autoscaling policy's decision (kvscale.control.scaling.tick);
2. `to_zero`: the idle rule with minReplicas 0 (kvscale.control.scale_zero);
3. `budget`: the GPUBudget that governs the service (kvscale.control.budget.govern);
4. `move`: whether that budget granted another GPU type (the handler re-plans on it, which
   reads the API server, and hands the result to `moved`).

`autoscale` returns the decision and the service's new memory; the handler applies the one
and stores the other."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvscale.api.intent import Intent
from kvscale.api.models import InferenceServiceStatus, PlanStatus
from kvscale.autoscaling.budget import Grant
from kvscale.autoscaling.observation import Observation
from kvscale.control.budget import BudgetBook, govern, moving_to
from kvscale.control.inventory import EnginePod
from kvscale.control.memory import ServiceMemory
from kvscale.control.reconcile import Resource, Result
from kvscale.control.scale_zero import scale_zero
from kvscale.control.scaling import Fleet, Tick, newly_ready, tick
from kvscale.control.settings import Settings
from kvscale.sizing.catalog import Catalog


@dataclass(frozen=True)
class Readings:
    """What the handler read for this tick."""

    obs: Observation
    missing: str | None  # why the engines' metrics were not read (None: they were)
    queue: float | None  # requests waiting at the gateway (None: not read, or no gateway)
    learned: tuple[float, ...]  # start-to-ready seconds other replicas of this model showed
    pods: tuple[EnginePod, ...]  # the service's engine pods, from the informers


@dataclass(frozen=True)
class Governor:
    """The GPUBudgets as this service's tick sees them."""

    book: BudgetBook
    labels: Mapping[str, str]  # the service's labels (a budget's selector reads them)
    ttl_s: float  # how long a want counts without a tick


@dataclass(frozen=True)
class Autoscaled:
    tick: Tick
    memory: ServiceMemory
    fresh: tuple[float, ...] = ()  # start-to-ready seconds of pods newly ready (for the other services)
    move: Grant | None = None  # a budget's grant on another GPU type: the handler re-plans on it
    budget: str = ""  # the governing GPUBudget's name, for the move's Event


def policy(
    intent: Intent,
    res: Resource,
    before: InferenceServiceStatus,
    start: Fleet,
    read: Readings,
    memory: ServiceMemory,
    catalog: Catalog,
    settings: Settings,
    now: dt.datetime,
) -> tuple[Tick, ServiceMemory]:
    """The policy's decision (its state kept in the memory)."""
    done = tick(intent, res, before, start, read.obs, read.missing, memory.scaler, catalog, settings, now, read.learned)
    return done, replace(memory, scaler=done.memory)


def to_zero(
    intent: Intent,
    res: Resource,
    before: InferenceServiceStatus,
    start: Fleet,
    read: Readings,
    done: Tick,
    memory: ServiceMemory,
    now: dt.datetime,
) -> tuple[Tick, ServiceMemory]:
    cold_start_s = done.decision.cold_start_s or done.memory.cold_start_s
    out, active = scale_zero(
        intent, res, before, start, read.obs, read.queue, done, memory.last_active_s, cold_start_s, now
    )
    return out, replace(memory, last_active_s=active)


def draining(
    memory: ServiceMemory, pods: tuple[EnginePod, ...], plan: PlanStatus
) -> tuple[dict[str, int], ServiceMemory]:
    """GPUs the service's pods of the plan before a budget's move still hold, per type (the
    memory forgets that plan once none of its pods is left)."""
    if memory.budget_draining is None:
        return {}, memory
    gpu, per_pod = memory.budget_draining
    left = sum(1 for p in pods if p.gpu_type == gpu and gpu != plan.gpu_type)
    if left == 0:
        memory = replace(memory, budget_draining=None)
    return {gpu: left * int(per_pod)}, memory


def budget(
    intent: Intent,
    res: Resource,
    before: InferenceServiceStatus,
    start: Fleet,
    read: Readings,
    done: Tick,
    memory: ServiceMemory,
    governor: Governor,
    now: dt.datetime,
) -> tuple[Tick, ServiceMemory]:
    held, memory = draining(memory, read.pods, start.plan)
    g = governor
    return govern(g.book, res, g.labels, intent, before, start, read.obs, done, now, g.ttl_s, held), memory


def autoscale(
    intent: Intent,
    res: Resource,
    before: InferenceServiceStatus,
    start: Fleet,
    read: Readings,
    memory: ServiceMemory,
    governor: Governor,
    catalog: Catalog,
    settings: Settings,
    now: dt.datetime,
) -> Autoscaled:
    """The tick's decision through the stages, and the memory after it. The observation gains
    the start-to-ready times of pods newly ready (each counted once): the policy learns its
    cold start from them."""
    fresh, counted = newly_ready(read.pods, start.plan, memory.ready_pods)
    read = replace(read, obs=replace(read.obs, started_to_ready_s=fresh))
    memory = replace(memory, ready_pods=counted)
    done, memory = policy(intent, res, before, start, read, memory, catalog, settings, now)
    done, memory = to_zero(intent, res, before, start, read, done, memory, now)
    done, memory = budget(intent, res, before, start, read, done, memory, governor, now)
    move = moving_to(governor.book, res, governor.labels, start.plan)
    if move is None:
        return Autoscaled(done, memory, fresh)
    return Autoscaled(done, memory, fresh, move, governor.book.governing(res.namespace, governor.labels) or "")


def moved(scaled: Autoscaled, result: Result | None, plan: PlanStatus) -> Autoscaled:
    """The tick after the budget's move (`result`: the re-plan on the granted type, None when
    none fits there now: the tick stands): the pods of `plan` drain, their GPUs counted."""
    if result is None or scaled.move is None:
        return scaled
    decision = replace(scaled.tick.decision, replicas=scaled.move.replicas)
    memory = replace(scaled.memory, budget_draining=(plan.gpu_type, plan.tensor_parallel))
    return replace(scaled, tick=replace(scaled.tick, decision=decision, result=result), memory=memory)
