"""The one tick: policy -> idle -> budget -> move, as one pure function of plain values. The
operator (kvscale.control.autoscale, an adapter from the Intent and status) and the simulators
(kvscale.sim.policies, kvscale.sim.budget_run) all call `tick` or `tick_all`, so a simulated
run composes the stages exactly as the deployed service does; neither calls a stage itself
(tests/unit/test_architecture.py fails when one does).

Stages, each taking the decision so far:

1. policy: kvscale.autoscaling.policy.decide on the observation, capacity and policy state;
2. idle: with minReplicas 0, the idle rule (kvscale.autoscaling.idle): the last replica goes
   after the idle window, and a wake is sized by the gateway's queue;
3. budget: the budget view answers the service's want (None: no budget governs it). A view
   answers every service of one tick at once: the simulator allocates all of them together;
   the operator's view is its budget book, asked for one service;
4. move: whether the budget granted another GPU type (the caller re-plans or moves on it).

No kvscale.api or Kubernetes type: the caller renders conditions, status and Events after it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from kvscale.autoscaling.budget import Allocation, Budget, Demand, Grant, Option, allocate
from kvscale.autoscaling.idle import idle_replicas, wake_replicas
from kvscale.autoscaling.observation import Decision, Observation
from kvscale.autoscaling.policy import Capacity, PolicyConfig, PolicyState, decide


@dataclass(frozen=True)
class Wake:
    """What sizes a wake from zero (kvscale.autoscaling.idle.wake_replicas): the queue drains
    within the cold start plus the TTFT target."""

    rate_per_s: float | None  # requests arriving
    per_replica_per_s: float  # what one replica carries (0: unknown, a wake starts one)
    ttft_target_s: float
    max_replicas: int
    cold_start_s: float  # until the policy has learned its own (the decision's)


@dataclass(frozen=True)
class Idle:
    """The idle rule's inputs (minReplicas 0); None in TickInput: the rule does not apply."""

    idle_s: float | None  # since the last request arrived or waited (None: unknown)
    window_s: float
    waiting: float | None  # requests waiting for a replica (at the gateway; None: unknown)
    ready: int | None = None  # replicas ready now
    wake: Wake | None = None  # None: a wake starts one replica
    # Why the rule cannot run (no signal of waiting requests while none runs): one replica is
    # kept instead, and this is the reason.
    refused: str | None = None


@dataclass(frozen=True)
class SeatOption:
    """One GPU type a service may run on, as a budget sees it."""

    gpu_type: str
    gpus_per_replica: int
    rate_per_replica: float  # requests/s one replica carries within the SLO there


@dataclass(frozen=True)
class Seat:
    """How one service sits in a budget that allocates every service of a tick together: the
    plain terms its Demand is made of (the want is converted to its other GPU types by their
    per-replica capacity)."""

    name: str
    options: tuple[SeatOption, ...]  # cheapest feasible first
    active: int  # the option it runs on
    priority: int
    min_replicas: int
    max_replicas: int
    current_gpu_type: str | None  # what it runs on now (None: nothing runs)


@dataclass(frozen=True)
class TickInput:
    obs: Observation
    capacity: Capacity
    config: PolicyConfig
    state: PolicyState
    idle: Idle | None = None
    seat: Seat | None = None  # for a view that allocates from seats (Pooled)


@dataclass(frozen=True)
class Want:
    """The service's want after the policy and the idle rule: what a budget view answers."""

    policy: Decision  # the policy's own
    decision: Decision  # the policy's, with the idle rule's count and reason when it changed
    idle_reason: str | None  # why the idle rule changed the count (None: unchanged)
    lead_replicas: int  # what its forecast asks for one lead further (0: none)
    slo_gap: float  # observed over target minus 1, the worse of TTFT and TPOT (0: unknown)
    seat: Seat | None


@dataclass(frozen=True)
class BudgetAnswer:
    replicas: int  # what the service may run now
    grant: Grant | None = None  # the allocator's grant, when the view has one to hand back
    move: Grant | None = None  # a grant on another GPU type than it runs on


class BudgetView(Protocol):
    """A budget as the tick sees it: the wants of the services ticking now in, one answer each."""

    def answer(self, wants: Sequence[Want]) -> Sequence[BudgetAnswer]: ...


@dataclass(frozen=True)
class TickDecision:
    policy: Decision  # the policy's own decision
    want: Want  # after the idle rule
    wake: int  # replicas a wake from zero starts
    replicas: int  # what the service runs after every stage
    budget: BudgetAnswer | None  # None: no budget governs it
    state: PolicyState  # the policy's new state

    @property
    def decision(self) -> Decision:
        """The decision after the idle rule (the budget's cut is `replicas`)."""
        return self.want.decision

    @property
    def move(self) -> Grant | None:
        return self.budget.move if self.budget is not None else None


def slo_gap(obs: Observation, config: PolicyConfig) -> float:
    """The worse of observed TTFT and TPOT over target, minus 1 (0 when neither is known or both are within)."""
    gaps = [0.0]
    if obs.ttft_p_s is not None:
        gaps.append(obs.ttft_p_s / config.ttft_target_s - 1)
    if obs.tpot_p_s is not None:
        gaps.append(obs.tpot_p_s / config.tpot_target_s - 1)
    return max(gaps)


def idled(decision: Decision, idle: Idle | None) -> tuple[Decision, str | None, int]:
    """Stage 2 alone: the decision after the idle rule, why it changed, and the wake's size."""
    if idle is None:
        return decision, None, 1
    if idle.refused is not None:
        if decision.replicas >= 1:
            return decision, None, 1
        return replace(decision, replicas=1, reason=idle.refused), idle.refused, 1
    wake = 1
    if idle.wake is not None:
        w = idle.wake
        drain_s = (decision.cold_start_s or w.cold_start_s) + w.ttft_target_s
        wake = wake_replicas(idle.waiting or 0.0, w.rate_per_s, w.per_replica_per_s, drain_s, w.max_replicas)
    target, why = idle_replicas(decision.replicas, 0, idle.idle_s, idle.window_s, idle.waiting, wake, idle.ready)
    if target == decision.replicas:
        return decision, why, wake
    return replace(decision, replicas=target, reason=why or decision.reason), why, wake


def _wanted(inp: TickInput) -> tuple[Decision, Want, int, PolicyState]:
    """Stages 1 and 2: the policy, then the idle rule."""
    decision, state = decide(inp.obs, inp.state, inp.capacity, inp.config)
    after, why, wake = idled(decision, inp.idle)
    want = Want(decision, after, why, decision.lead_replicas or 0, slo_gap(inp.obs, inp.config), inp.seat)
    return decision, want, wake, state


def tick_all(inputs: Sequence[TickInput], budget: BudgetView | None = None) -> list[TickDecision]:
    """Every service of one tick through the stages, the budget answering all their wants at
    once (the services of one budget are allocated together)."""
    wanted = [_wanted(inp) for inp in inputs]
    if budget is None:
        return [TickDecision(d, w, wake, w.decision.replicas, None, s) for d, w, wake, s in wanted]
    answers = budget.answer([w for _, w, _, _ in wanted])
    return [TickDecision(d, w, wake, a.replicas, a, s) for (d, w, wake, s), a in zip(wanted, answers, strict=True)]


def tick(inp: TickInput, budget: BudgetView | None = None) -> TickDecision:
    """One service's tick: policy, idle, budget, move."""
    return tick_all([inp], budget)[0]


# -- a budget that allocates the seats of one tick together (the simulator's fleet) ---------


def demand(want: Want, seat: Seat) -> Demand:
    """The seat's Demand for the want: the want on the GPU type it runs on, converted to its
    other types by their per-replica capacity, each at most maxReplicas, with room ahead of
    need for what its forecast asks one lead further (none while idle)."""
    wanted = want.decision.replicas
    ahead = max(wanted, want.lead_replicas) if wanted else 0
    base_rate = seat.options[seat.active].rate_per_replica
    options = []
    for i, o in enumerate(seat.options):
        n, m = (
            (wanted, ahead)
            if i == seat.active
            else (math.ceil(x * base_rate / o.rate_per_replica - 1e-9) for x in (wanted, ahead))
        )
        n, m = min(seat.max_replicas, n), min(seat.max_replicas, m)
        options.append(Option(o.gpu_type, o.gpus_per_replica, n, o.rate_per_replica, m - n))
    return Demand(
        seat.name,
        tuple(options),
        seat.priority,
        seat.min_replicas,
        slo_gap=want.slo_gap,
        current_gpu_type=seat.current_gpu_type,
    )


def grants(budget: Budget, demands: Sequence[Demand], previous: Mapping[str, Grant] | None = None) -> Allocation:
    """The allocator over demands made outside a tick (a fleet's opening grant)."""
    return allocate(budget, demands, previous)


class Pooled:
    """A budget view that allocates the seats of every want together (kvscale.autoscaling.
    budget.allocate) against last tick's grants; `allocation` keeps the latest answer's."""

    def __init__(self, budget: Budget, previous: Mapping[str, Grant]) -> None:
        self.budget = budget
        self.previous = previous
        self.allocation: Allocation | None = None

    def answer(self, wants: Sequence[Want]) -> list[BudgetAnswer]:
        seats = [w.seat for w in wants]
        if any(s is None for s in seats):
            raise ValueError("a pooled budget answers only wants with a seat")
        self.allocation = allocate(
            self.budget, [demand(w, s) for w, s in zip(wants, seats, strict=True) if s], self.previous
        )
        by_name = self.allocation.by_name
        out = []
        for s in seats:
            assert s is not None
            g = by_name[s.name]
            out.append(BudgetAnswer(g.replicas, g, g if g.gpu_type != s.options[s.active].gpu_type else None))
        return out
