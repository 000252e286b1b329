"""The operator's adapter to the one tick (kvscale.autoscaling.tick): the Intent, status and
readings become plain values (observation, capacity, policy configuration and state, the idle
rule's figures), the tick runs its stages (policy, idle, budget, move) and the decision is
rendered as status, conditions and Events after each stage:

1. policy: rendered by kvscale.control.scaling.render;
2. idle (minReplicas 0): its inputs from kvscale.control.scale_zero.idle_view, rendered by
   kvscale.control.scale_zero.render;
3. budget: the tick's budget view here is the operator's budget book (`_Book`): asked for the
   service's want, it renders the decision so far and hands it to the GPUBudget that governs
   the service (kvscale.control.budget.govern: the want recorded, the grant taken, the scale
   capped);
4. move: whether that budget granted another GPU type (the handler re-plans on it, which
   reads the API server, and hands the result to `moved`).

`autoscale` returns the decision and the service's new memory; the handler applies the one
and stores the other."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from kvscale.api.intent import Intent
from kvscale.api.models import InferenceServiceStatus, PlanStatus
from kvscale.autoscaling.budget import Grant
from kvscale.autoscaling.observation import Observation
from kvscale.autoscaling.tick import BudgetAnswer, Idle, TickInput, Want, tick
from kvscale.control.budget import BudgetBook, govern, moving_to
from kvscale.control.capacity import acted_on
from kvscale.control.holding import holding_config
from kvscale.control.inventory import EnginePod
from kvscale.control.memory import ServiceMemory
from kvscale.control.reconcile import Resource, Result
from kvscale.control.scale_zero import idle_view
from kvscale.control.scale_zero import render as render_idle
from kvscale.control.scaling import Fleet, ScalerMemory, Tick, newly_ready, prepared
from kvscale.control.scaling import render as render_policy
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


class _Book:
    """The budget view of one service's tick: the operator's budget book. Its answer renders
    the tick so far (the policy's decision, then the idle rule's) and governs it; the rendered
    tick and the memory after it are kept for the adapter."""

    def __init__(
        self,
        intent: Intent,
        res: Resource,
        before: InferenceServiceStatus,
        start: Fleet,
        read: Readings,
        memory: ServiceMemory,
        scaler: ScalerMemory,
        idle: Idle | None,
        governor: Governor,
        now: dt.datetime,
    ) -> None:
        self.intent, self.res, self.before, self.start, self.read = intent, res, before, start, read
        self.memory, self.scaler, self.idle, self.governor, self.now = memory, scaler, idle, governor, now
        self.done: Tick | None = None

    def answer(self, wants: Sequence[Want]) -> list[BudgetAnswer]:
        (want,) = wants  # one service ticks at a time here; the book holds the others' wants
        intent, res, before, start, read, now = self.intent, self.res, self.before, self.start, self.read, self.now
        done = render_policy(intent, res, before, start, read.obs, read.missing, self.scaler, want.policy, now)
        cold_start_s = want.policy.cold_start_s or self.scaler.cold_start_s
        after = want.decision
        done = render_idle(intent, res, before, start, self.idle, done, after.replicas, after.reason, cold_start_s, now)
        held, self.memory = draining(self.memory, read.pods, start.plan)
        g = self.governor
        done = govern(g.book, res, g.labels, intent, before, start, read.obs, done, now, g.ttl_s, held)
        self.done = done
        replicas = done.result.scale_to if done.result.scale_to is not None else start.current
        return [BudgetAnswer(replicas, None, moving_to(g.book, res, g.labels, start.plan))]


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
    """The tick's decision through its stages, rendered, and the memory after it. The
    observation gains the start-to-ready times of pods newly ready (each counted once): the
    policy learns its cold start from them."""
    fresh, counted = newly_ready(read.pods, start.plan, memory.ready_pods)
    read = replace(read, obs=replace(read.obs, started_to_ready_s=fresh))
    memory = replace(memory, ready_pods=counted)
    model, config, scaler = prepared(intent, start.plan, memory.scaler, catalog, settings, read.learned)
    acting = acted_on(model, memory.capacity, intent, start.plan)  # status.capacity's figure (control.capacity)
    config = holding_config(config, settings.holding, memory.holding, intent, start.plan)  # status.holding's
    idle, active = idle_view(intent, res, start, read.obs, read.queue, memory.last_active_s, scaler.cold_start_s, now)
    book = _Book(intent, res, before, start, read, memory, scaler, idle, governor, now)
    decided = tick(TickInput(read.obs, acting, config, scaler.state, idle), book)
    assert book.done is not None  # the tick asked the book
    done = replace(book.done, memory=replace(scaler, state=decided.state))
    memory = replace(book.memory, scaler=done.memory, last_active_s=active)
    if decided.move is None:
        return Autoscaled(done, memory, fresh)
    return Autoscaled(done, memory, fresh, decided.move, governor.book.governing(res.namespace, governor.labels) or "")


def moved(scaled: Autoscaled, result: Result | None, plan: PlanStatus) -> Autoscaled:
    """The tick after the budget's move (`result`: the re-plan on the granted type, None when
    none fits there now: the tick stands): the pods of `plan` drain, their GPUs counted."""
    if result is None or scaled.move is None:
        return scaled
    decision = replace(scaled.tick.decision, replicas=scaled.move.replicas)
    memory = replace(scaled.memory, budget_draining=(plan.gpu_type, plan.tensor_parallel))
    return replace(scaled, tick=replace(scaled.tick, decision=decision, result=result), memory=memory)
