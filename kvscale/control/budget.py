"""GPU budgets in the operator: the GPUBudgets it watches, each governed service's latest
want, and one allocation (kvscale.autoscaling.budget, the simulator's allocator) over all of
a budget's services whenever one of them ticks.

Each service's autoscale tick records what its policy wants (with its floor, priority and
SLO gap) and the GPUs its workload holds, then takes its own grant from the allocation over
the latest wants of every service the budget governs. A scale-up goes only into GPUs the
budget has free now (what the other governed services' workloads hold counts, draining or
not; within the service's namespace too where the budget limits it), so neither a type's
limit nor a namespace's is exceeded while another service has yet to scale down at its own
tick. The service's status says what it got and why (condition HeldByBudget), with one Event
per change; the budget's own status (allocated, wanted, each service's grant) is written by
its timer.

A reconcile that creates or grows a governed service's workload (a new service, a spec
change, a re-plan) starts it with no more replicas than the budget has free then, and records
its GPUs at once (cap_deploy), so services created together do not each count the same free
GPUs before their first tick.

Moves: a service's demand lists every GPU type its plan's alternatives cover (the want
converted by per-replica capacity), the planner's choice first. When the allocation grants it
another type (its own is wanted by a higher priority, or has no room), its tick re-plans on
that type (reconcile with prefer_gpu) at the granted replicas within what that type has free,
marks the plan with the type it left (status.plan.budgetMovedFrom, so that type stays its
first option and it moves back when that has room), and posts a MovedByBudget Event. The
Deployment rolls over: the pods on the old type go as the new ones become ready, and until
they are gone their GPUs count against the old type. (The simulator drains the old type at
once.) A spec change re-plans from the planner's choice; the next tick moves it again if the
budget still says so.

Floors: a limit cut below the services' floors keeps each minReplicas in priority order as
far as the limit allows; the service whose floor is not kept says so (HeldByBudget, reason
FloorNotKept) and so does the budget (condition FloorsKept). A service with no gateway to
hold its requests (no spec.routing.inferencePool or kedaHttp: behind a plain Service a
request at zero replicas finds no endpoint) that the limit holds no replica of is refused
(reason RefusedByBudget, naming the budget and what to do), except one already running per
budget, which keeps one replica beyond the limit (reason KeptBeyondLimit).

Several budgets: each GPU type a service accepts is bounded by the tightest matching budget
that limits it (governors); one allocation runs over every service that shares a budget with
it, transitively, each option naming its budget. The book has one owner (BudgetBook, locked);
the functions here read its snapshot (BookView), and a budget's status is computed from one
without changing what the next tick's allocation remembers.

Pins: spec.scaling.replicas (`kubectl scale`) is a want like any other: it counts against
the budget, is held to its grant (govern_pin on the tick, cap_deploy on a reconcile), says
so (HeldByBudget, reason PinHeldByBudget), and the budget's status lists the service.

Without a GPUBudget limiting one of a service's GPU types nothing here changes its tick.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvscale.api.budget import BudgetServiceStatus, GPUBudgetSpec, GPUBudgetStatus, budget_of, service_key
from kvscale.api.intent import Intent
from kvscale.api.models import InferenceServiceStatus, PlanStatus
from kvscale.autoscaling.budget import Allocation, Budget, Demand, Grant, Option, allocate
from kvscale.autoscaling.observation import DecisionKind, Observation
from kvscale.control import leader_worker_set as lws
from kvscale.control.reconcile import DEPLOYMENT, DeploymentView, Event, Resource, Result, workload_kind
from kvscale.control.replan import annotate, recorded_target
from kvscale.control.scale_zero import queue_queries
from kvscale.control.scaling import Fleet, Tick
from kvscale.control.status import condition, now_rfc3339, with_conditions, without_condition

CONDITION = "HeldByBudget"
FLOORS = "FloorsKept"  # the budget's condition: every governed service's minReplicas within its limits
WITHIN = ""  # BudgetBook.posted: the last Event said the service is within its budget


@dataclass(frozen=True)
class Entry:
    budget: str  # a budget that governed it when recorded (informational: the allocation reads the specs)
    demand: Demand
    namespace: str
    name: str
    held_gpus: int  # GPUs its workload holds now
    gpu_type: str
    seen_s: float
    draining: tuple[tuple[str, int], ...] = ()  # GPUs per type its pods of a former plan still hold (a move)
    labels: tuple[tuple[str, str], ...] = ()  # the InferenceService's labels (which budgets select it)

    def holds(self, gpu_type: str) -> int:
        return (self.held_gpus if self.gpu_type == gpu_type else 0) + sum(n for t, n in self.draining if t == gpu_type)

    @property
    def key(self) -> str:
        return service_key(self.namespace, self.name)


@dataclass(frozen=True)
class BookView:
    """A snapshot of the book: what the pure functions below read (the book's owner may change
    the book meanwhile; a snapshot never does)."""

    specs: Mapping[str, GPUBudgetSpec] = field(default_factory=dict)
    entries: Mapping[str, Entry] = field(default_factory=dict)  # by namespace/name
    previous: Mapping[str, Grant] = field(default_factory=dict)  # by namespace/name: the last grant
    posted: Mapping[str, str] = field(default_factory=dict)

    def governors(self, namespace: str, labels: Mapping[str, str], gpu_types: Iterable[str]) -> dict[str, str]:
        return governors(self.specs, namespace, labels, gpu_types)

    def live(self, now_s: float, ttl_s: float) -> list[Entry]:
        """The services with a want recorded within `ttl_s` (older: deleted, or no longer ticking)."""
        return [e for e in self.entries.values() if now_s - e.seen_s <= ttl_s]

    def pools_of(self, e: Entry) -> dict[str, str]:
        """GPU type -> the budget that bounds it for this service, over the types it accepts."""
        return self.governors(e.namespace, dict(e.labels), [o.gpu_type for o in e.demand.options] + [e.gpu_type])


class BudgetBook:
    """The operator's view of every GPUBudget and of the services they govern (in memory;
    after a restart it fills again within one scale interval). One owner: every change goes
    through a method here, under one lock (the kopf loop, kvscale's workers and kopf's sync
    handler threads all write it), and readers take a snapshot (view) that no writer changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, GPUBudgetSpec] = {}
        self._entries: dict[str, Entry] = {}
        self._previous: dict[str, Grant] = {}
        # The HeldByBudget message last posted as an Event, by service: a tick handed a body that
        # predates the previous tick's status write (a loaded API server) must not post it again.
        self._posted: dict[str, str] = {}

    def view(self) -> BookView:
        with self._lock:
            return BookView(dict(self._specs), dict(self._entries), dict(self._previous), dict(self._posted))

    @property
    def specs(self) -> Mapping[str, GPUBudgetSpec]:
        return self.view().specs

    @property
    def entries(self) -> Mapping[str, Entry]:
        return self.view().entries

    @property
    def previous(self) -> Mapping[str, Grant]:
        return self.view().previous

    def set_budget(self, name: str, spec: GPUBudgetSpec | None) -> None:
        with self._lock:
            if spec is None:
                self._specs.pop(name, None)
            else:
                self._specs[name] = spec

    def record(self, entry: Entry, now_s: float | None = None, ttl_s: float | None = None) -> None:
        """A service's latest want (and, given `now_s` and `ttl_s`, the wants too old to count dropped)."""
        with self._lock:
            self._entries[entry.key] = entry
            if now_s is not None and ttl_s is not None:
                for key in [k for k, e in self._entries.items() if now_s - e.seen_s > ttl_s]:
                    del self._entries[key]

    def remember(self, allocation: Allocation) -> None:
        """The grants of a tick's allocation: the next allocation's hysteresis reads them."""
        with self._lock:
            self._previous.update(allocation.by_name)

    def post(self, key: str, message: str) -> None:
        with self._lock:
            self._posted[key] = message

    def forget(self, namespace: str, name: str) -> None:
        """The service's want, grant and Event memory; its disaggregated pools' wants too
        (kvscale.control.pool_budget: `<name>-prefill`, `<name>-decode`)."""
        with self._lock:
            for key in (service_key(namespace, n) for n in (name, f"{name}-prefill", f"{name}-decode")):
                self._entries.pop(key, None)
                self._posted.pop(key, None)
                self._previous.pop(key, None)

    def governing(self, namespace: str, labels: Mapping[str, str], gpu_type: str | None = None) -> str | None:
        return governing(self.view().specs, namespace, labels, gpu_type)

    def shadowed(self, budget: str) -> list[tuple[str, str, str]]:
        return shadowed(self.view(), budget)

    def allocation(self, budget: str, now_s: float, ttl_s: float) -> Allocation:
        """The allocation over the budget's services now (read only: it remembers nothing)."""
        return budget_allocation(self.view(), budget, now_s, ttl_s)[0]


def _type_limit(spec: GPUBudgetSpec, namespace: str, gpu_type: str) -> int | None:
    """The GPUs of a type a budget allows a service in `namespace` (None: it does not limit the type)."""
    found = [
        n for n in (spec.limits.get(gpu_type), spec.namespace_limits.get(namespace, {}).get(gpu_type)) if n is not None
    ]
    return min(found) if found else None


def governors(
    specs: Mapping[str, GPUBudgetSpec], namespace: str, labels: Mapping[str, str], gpu_types: Iterable[str]
) -> dict[str, str]:
    """Per GPU type, the budget that bounds it for a service: of the budgets whose selector
    matches it and that limit the type (globally or for its namespace), the tightest (the fewest
    GPUs of that type; by name on a tie). A budget without a limit for a type does not govern
    that type (issue 38: a catch-all `{H100-SXM: 2}`, tightest by its sum, took every team's A100
    services from their budgets, which then limited nothing). Types no budget limits: absent."""
    matching = [n for n, s in specs.items() if s.selector.selects(namespace, labels)]
    out: dict[str, str] = {}
    for gpu in dict.fromkeys(gpu_types):
        limited = [(lim, n) for n in matching if (lim := _type_limit(specs[n], namespace, gpu)) is not None]
        if limited:
            out[gpu] = min(limited)[1]
    return out


def governing(
    specs: Mapping[str, GPUBudgetSpec], namespace: str, labels: Mapping[str, str], gpu_type: str | None = None
) -> str | None:
    """The budget that bounds `gpu_type` for a service (see governors); without a type, of the
    budgets that match it and limit some type, the one with the fewest GPUs (by name on a tie):
    the one named where a single budget is asked for (its preemption grace, an Event)."""
    if gpu_type is not None:
        return governors(specs, namespace, labels, [gpu_type]).get(gpu_type)
    names = [n for n, s in specs.items() if s.selector.selects(namespace, labels)]
    return min(names, key=lambda n: (sum(specs[n].limits.values()), n)) if names else None


def shadowed(view: BookView, budget: str) -> list[tuple[str, str, str]]:
    """Services the budget selects whose GPU type, one it limits, a tighter budget bounds:
    (service, GPU type, that budget)."""
    spec = view.specs.get(budget)
    if spec is None:
        return []
    out = []
    for key, e in view.entries.items():
        if not spec.selector.selects(e.namespace, dict(e.labels)):
            continue
        for gpu, by in view.pools_of(e).items():
            if by != budget and _type_limit(spec, e.namespace, gpu) is not None:
                out.append((key, gpu, by))
    return sorted(out)


def _component(view: BookView, live: Sequence[Entry], seed: Callable[[Entry, dict[str, str]], bool]) -> list[Entry]:
    """The services whose allocation is one: those the seed picks, and every service that shares a
    budget with one of them, transitively (services under disjoint budgets do not interact)."""
    pools = {e.key: set(view.pools_of(e).values()) for e in live}
    budgets: set[str] = set()
    chosen = {e.key for e in live if seed(e, view.pools_of(e))}
    for key in chosen:
        budgets |= pools[key]
    grew = True
    while grew:
        grew = False
        for e in live:
            if e.key not in chosen and pools[e.key] & budgets:
                chosen.add(e.key)
                budgets |= pools[e.key]
                grew = True
    return [e for e in live if e.key in chosen]


def _allocate(view: BookView, members: Sequence[Entry]) -> tuple[Allocation, dict[str, Demand]]:
    """One allocation over these services, each option bounded by the budget governing its type."""
    demands: dict[str, Demand] = {}
    used: set[str] = set()
    for e in members:
        gov = view.pools_of(e)
        used |= set(gov.values())
        demands[e.key] = replace(
            e.demand, options=tuple(replace(o, budget=gov.get(o.gpu_type, "")) for o in e.demand.options)
        )
    pools = {b: budget_of(b, view.specs[b]) for b in used}
    previous = {k: g for k, g in view.previous.items() if k in demands}
    return allocate(Budget("", {}), list(demands.values()), previous, pools=pools), demands


def service_allocation(view: BookView, key: str, now_s: float, ttl_s: float) -> Allocation:
    """The allocation the service `key` (recorded in the view) takes its grant from."""
    members = _component(view, view.live(now_s, ttl_s), lambda e, _: e.key == key)
    return _allocate(view, members)[0]


def budget_allocation(view: BookView, budget: str, now_s: float, ttl_s: float) -> tuple[Allocation, dict[str, Demand]]:
    """The allocation over every service a budget bounds on some type (and those sharing another budget with them)."""
    members = _component(view, view.live(now_s, ttl_s), lambda _, pools: budget in pools.values())
    return _allocate(view, members)


def free_gpus(view: BookView, key: str, namespace: str, labels: Mapping[str, str], gpu_type: str) -> float:
    """GPUs of a type the budget that bounds it for the service `key` has free now (its own not
    counted): the limit, and the namespace's where the budget sets one, less what the other
    services it bounds on that type hold (draining or not). A type no budget limits: infinity."""
    budget = view.governors(namespace, labels, [gpu_type]).get(gpu_type)
    if budget is None:
        return math.inf
    spec = view.specs[budget]
    others = [
        e
        for k, e in view.entries.items()
        if k != key
        and e.holds(gpu_type)
        and view.governors(e.namespace, dict(e.labels), [gpu_type]).get(gpu_type) == budget
    ]
    rooms = [math.inf]
    limit = spec.limits.get(gpu_type)
    if limit is not None:
        rooms.append(limit - sum(e.holds(gpu_type) for e in others))
    ns_limit = spec.namespace_limits.get(namespace, {}).get(gpu_type)
    if ns_limit is not None:
        rooms.append(ns_limit - sum(e.holds(gpu_type) for e in others if e.namespace == namespace))
    return min(rooms)


def _within_free(
    view: BookView,
    key: str,
    namespace: str,
    labels: Mapping[str, str],
    gpu_type: str,
    gpr: int,
    current: int,
    target: int,
) -> int:
    free = free_gpus(view, key, namespace, labels, gpu_type) - current * gpr
    if math.isinf(free):
        return target
    return current + max(0, min(target - current, math.floor(free / gpr)))


def options(plan: PlanStatus, wanted: int, max_replicas: int, lead: int = 0) -> tuple[Option, ...]:
    """The ways the service can run, preferred first: the planner's choice (the GPU type a
    budget moved it off, if one did), then the best alternative on each other GPU type its
    spec accepts, the cheapest per request/s first, as the plan's alternatives recorded them.
    The policy's want is converted between types by per-replica capacity, and so is `lead`
    (Decision.lead_replicas: the room held ahead of need is what it asks beyond the want)."""
    lead = max(lead, wanted)

    def per_rate(cost_per_hour: float | None, replicas: int | None, rate: float | None) -> float:
        if not cost_per_hour or not replicas or not rate:
            return math.inf
        return cost_per_hour / replicas / rate

    gpr = plan.tensor_parallel * max(plan.nodes, 1) * plan.data_parallel
    by_type = {
        plan.gpu_type: (
            per_rate(plan.cost_per_hour, plan.replicas, plan.rate_per_replica),
            Option(
                plan.gpu_type, gpr, wanted, max(plan.rate_per_replica, 0.0), max(0, min(max_replicas, lead) - wanted)
            ),
        )
    }
    for alt in plan.alternatives:
        if (
            alt.gpu_type in by_type
            or not alt.rate_per_replica
            or not alt.gpus_per_replica
            or plan.rate_per_replica <= 0
        ):
            continue
        n, m = (
            min(max_replicas, math.ceil(x * plan.rate_per_replica / alt.rate_per_replica - 1e-9))
            for x in (wanted, lead)
        )
        cost = per_rate(alt.cost_per_hour, alt.replicas, alt.rate_per_replica)
        by_type[alt.gpu_type] = (
            cost,
            Option(alt.gpu_type, alt.gpus_per_replica, n, alt.rate_per_replica, max(0, m - n)),
        )
    first = plan.budget_moved_from if plan.budget_moved_from in by_type else plan.gpu_type
    rest = sorted((v for t, v in by_type.items() if t != first), key=lambda v: v[0])
    return (by_type[first][1], *(o for _, o in rest))


def moving_to(book: BudgetBook, res: Resource, labels: Mapping[str, str], plan: PlanStatus) -> Grant | None:
    """The service's latest grant when it is on another GPU type than its plan's (a move to
    make), else None."""
    view = book.view()
    if governing(view.specs, res.namespace, labels) is None:
        return None
    grant = view.previous.get(service_key(res.namespace, res.name))
    if grant is None or grant.gpu_type == plan.gpu_type or grant.replicas == 0 or grant.refused:
        return None
    return grant


def slo_gap(obs: Observation, intent: Intent) -> float:
    gaps = [0.0]
    if obs.ttft_p_s is not None:
        gaps.append(obs.ttft_p_s / intent.slo.ttft_s - 1)
    if obs.tpot_p_s is not None:
        gaps.append(obs.tpot_p_s / intent.slo.tpot_s - 1)
    return max(gaps)


def govern(
    book: BudgetBook,
    res: Resource,
    labels: Mapping[str, str],
    intent: Intent,
    before: InferenceServiceStatus,
    fleet_: Fleet,
    obs: Observation,
    done: Tick,
    now: dt.datetime,
    ttl_s: float,
    draining: Mapping[str, int] | None = None,
) -> Tick:
    """The tick under the budgets that bound the service's GPU types (unchanged without one):
    its want recorded, its grant taken, the scale capped, the HeldByBudget condition and Event.
    `draining`: GPUs per type the service's pods of a former plan still hold (after a move)."""
    status = done.result.status
    plan = fleet_.plan
    gpr = plan.tensor_parallel * max(plan.nodes, 1) * plan.data_parallel
    wanted = done.decision.replicas
    key = service_key(res.namespace, res.name)
    view = book.view()
    before_entry = view.entries.get(key)
    if done.decision.kind == DecisionKind.MISSING_METRICS and before_entry is not None:
        # Holding on missing metrics means "what it had": its want, not the budget's cut.
        wanted = max(wanted, before_entry.demand.options[0].wanted)
    choices = options(plan, wanted, intent.scaling.max_replicas, done.decision.lead_replicas or 0)
    pools = view.governors(res.namespace, labels, [o.gpu_type for o in choices])
    if not pools or intent.scaling.mode != "auto":
        if any(c.type == CONDITION for c in status.conditions):
            return replace(done, result=replace(done.result, status=without_condition(status, CONDITION)))
        return done
    now_s = now.timestamp()
    demand = Demand(
        key,
        choices,
        intent.scaling.priority,
        intent.scaling.min_replicas,
        res.namespace,
        slo_gap(obs, intent),
        plan.gpu_type,
        has_gateway(intent, res),
        fleet_.current > 0,
    )
    entry = Entry(
        pools.get(plan.gpu_type) or min(pools.values()),
        demand,
        res.namespace,
        res.name,
        fleet_.current * gpr,
        plan.gpu_type,
        now_s,
        tuple(sorted((t, n) for t, n in (draining or {}).items() if n > 0)),
        tuple(sorted(labels.items())),
    )
    book.record(entry, now_s, ttl_s)
    view = book.view()
    allocation = service_allocation(view, key, now_s, ttl_s)
    book.remember(allocation)
    grant = allocation.grant(key)
    budget = grant.budget or entry.budget  # the one bounding its granted type ("": a type none limits)
    target = grant.replicas
    if grant.gpu_type != plan.gpu_type and not grant.refused:  # a move: the handler re-plans (moving_to)
        target = fleet_.current
    elif target > fleet_.current:  # only into GPUs free now, globally and in the namespace
        target = _within_free(view, key, res.namespace, labels, plan.gpu_type, gpr, fleet_.current, target)
        if grant.over_limit:  # no gateway, and the limit has no room for its replica: waiting frees none
            target = max(target, 1)
    if target > fleet_.current:
        # Counted at once at the size it scales to: a service created or ticking before this
        # one's next tick would otherwise see these GPUs free and start on them too (the limit
        # overshot by a tick). A scale-down keeps counting what runs: its pods drain first.
        book.record(replace(entry, held_gpus=target * gpr))
    held = target < wanted
    message = (
        grant.reason
        if target >= grant.replicas
        else (f"{grant.reason}; {grant.replicas - target} more once other services release their GPUs")
    )
    cond = condition(
        status,
        CONDITION,
        held or grant.over_limit > 0 or grant.refused,
        _held_reason(grant, held),
        f"budget {budget}: {message}",
        res.generation,
        now,
    )
    previous = next((c for c in before.conditions if c.type == CONDITION), None)
    events = list(done.result.events)
    new = with_conditions(status, cond)
    scale_to = done.result.scale_to
    if target != done.decision.replicas:  # the budget, not the policy, sets the count
        scale_to = target if target != fleet_.current else None
        events = [e for e in events if e.reason != "Scaled"]
        if scale_to is not None:
            events.append(
                Event("Normal", "Scaled", f"Scaled {fleet_.current} -> {target}: budget {budget}: {message}"[:1000])
            )
            new = new.model_copy(
                update={
                    "replicas": target,
                    "last_scale_time": now_rfc3339(now),
                    "last_scale_reason": f"budget {budget}: {message}"[:500],
                }
            )
        else:  # the policy's scale, undone: the status keeps what runs
            new = new.model_copy(
                update={
                    "replicas": before.replicas,
                    "last_scale_time": before.last_scale_time,
                    "last_scale_reason": before.last_scale_reason,
                }
            )
    was_held = previous is not None and previous.status == "True"
    # What this operator last posted decides; the status handed in only after a restart.
    last = view.posted.get(key)
    if held or grant.refused:
        said_before = previous.message if was_held and previous is not None else None
        if cond.message != (last if last is not None else said_before):
            events.append(Event("Warning", CONDITION, cond.message[:1000]))
            book.post(key, cond.message)
    elif (last != WITHIN) if last is not None else was_held:
        events.append(Event("Normal", "WithinBudget", cond.message[:1000]))
        book.post(key, WITHIN)
    return replace(done, result=replace(done.result, status=new, scale_to=scale_to, events=tuple(events)))


def has_gateway(intent: Intent, res: Resource) -> bool:
    """A gateway holds the service's requests while no replica runs (an InferencePool's
    endpoint picker, or the KEDA HTTP add-on's interceptor; kvscale.control.scale_zero)."""
    return bool(queue_queries(intent, res))


REFUSED = "RefusedByBudget"


def _held_reason(grant: Grant, held: bool) -> str:
    if grant.refused:
        return REFUSED
    if grant.floor_short > 0:
        return "FloorNotKept"
    if grant.over_limit > 0:
        return "KeptBeyondLimit"
    return "BudgetLimit" if held else "WithinBudget"


def floors_condition(allocation: Allocation, budget: str | None = None) -> dict[str, str]:
    """The budget's FloorsKept condition: False naming each service whose minReplicas the limits
    do not hold, each refused (no gateway, and no room for one replica), and the one kept beyond
    a limit. `budget`: only the grants that budget bounds."""
    grants = [g for g in allocation.grants if budget is None or g.budget == budget]
    refused = [f"{g.name} (priority {g.priority})" for g in grants if g.refused]
    short = [
        f"{g.name} (priority {g.priority}) minReplicas {g.min_replicas}, {g.floor_short} short"
        for g in grants
        if g.floor_short and not g.refused
    ]
    over = [
        f"{g.name} (priority {g.priority}) {g.over_limit} replica beyond the {g.gpu_type} limit"
        for g in grants
        if g.over_limit
    ]
    if not short and not over and not refused:
        return {
            "type": FLOORS,
            "status": "True",
            "reason": "AllFloorsKept",
            "message": "every minReplicas is within the limits",
        }
    parts = []
    if refused:
        parts.append(
            "refused, no gateway holding their requests at zero and no room for one replica within the limits "
            "(raise a limit, or give them spec.routing.inferencePool or kedaHttp): " + ", ".join(refused[:20])
        )
    if short:
        parts.append("minReplicas not kept, in priority order: " + ", ".join(short[:20]))
    if over:
        parts.append("kept beyond the limit, no gateway holding their requests at zero: " + ", ".join(over[:20]))
    reason = REFUSED if refused else "FloorNotKept" if short else "KeptBeyondLimit"
    return {"type": FLOORS, "status": "False", "reason": reason, "message": "; ".join(parts)[:1000]}


def budget_status(book: BudgetBook, name: str, now_s: float, ttl_s: float, generation: int | None) -> dict[str, Any]:
    """The GPUBudget's status: what is allocated on the types it limits, to whom, and what is
    wanted there. Read only: writing it changes nothing the allocation remembers."""
    view = book.view()
    spec = view.specs[name]
    allocation, demands = budget_allocation(view, name, now_s, ttl_s)
    services = []
    for g in allocation.grants:
        if all(o.budget != name for o in demands[g.name].options):  # it bounds none of its types
            continue
        namespace, _, svc = g.name.partition("/")
        services.append(
            BudgetServiceStatus(
                namespace=namespace,
                name=svc,
                priority=g.priority,
                gpu_type=g.gpu_type,
                gpus_per_replica=g.gpus_per_replica,
                replicas=g.replicas,
                wanted=g.wanted,
                reason=g.reason,
            )
        )
    wanted: dict[str, int] = {}
    for d in demands.values():
        first = d.options[0]
        if first.budget == name:
            wanted[first.gpu_type] = (
                wanted.get(first.gpu_type, 0) + max(first.wanted, d.min_replicas) * first.gpus_per_replica
            )
    status = GPUBudgetStatus(
        observed_generation=generation,
        allocated={**{gpu: 0 for gpu in spec.limits}, **allocation.used_by_budget.get(name, {})},
        wanted=wanted,
        services=services,
    )
    out = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    out["conditions"] = [floors_condition(allocation, name)]
    return out


def cap_deploy(
    book: BudgetBook,
    res: Resource,
    labels: Mapping[str, str],
    intent: Intent,
    result: Result,
    existing: DeploymentView | None,
    now: dt.datetime,
) -> Result:
    """A reconcile under a budget: a workload it creates or grows gets no more replicas than
    the budget has GPUs free now (the autoscaler's next tick takes the service's grant), and
    the service's GPUs are recorded at once, so services created together do not each count
    the same free GPUs. A pin (spec.scaling.replicas) is capped the same way. A running service
    with no gateway keeps one replica at least. Unchanged without a budget or in recommend mode."""
    plan = result.status.plan
    workload = next((o for o in result.apply if o.get("kind") in (DEPLOYMENT, lws.KIND)), None)
    if plan is None or workload is None or intent.scaling.mode != "auto":
        return result
    view = book.view()
    budget = view.governors(res.namespace, labels, [plan.gpu_type]).get(plan.gpu_type)
    if budget is None:  # no budget limits the type it runs on
        return result
    pin = intent.scaling.pinned_replicas
    gpr = plan.tensor_parallel * max(plan.nodes, 1) * plan.data_parallel
    current = existing.replicas if existing is not None and existing.gpu_type == plan.gpu_type else 0
    replicas = int((workload.get("spec") or {}).get("replicas") or 0)
    key = service_key(res.namespace, res.name)
    free = free_gpus(view, key, res.namespace, labels, plan.gpu_type) - current * gpr
    capped = (
        replicas
        if replicas <= current
        else _within_free(view, key, res.namespace, labels, plan.gpu_type, gpr, current, replicas)
    )
    gateway = has_gateway(intent, res)
    if not gateway and existing is not None and existing.replicas > 0:
        # Running behind a plain Service (a re-plan onto another GPU type, say): nothing would
        # hold its requests at zero, so it keeps one replica whatever is free. A new one starts
        # within what is free; its tick adds the replica beyond the limit if the floors fill it.
        capped = max(capped, min(replicas, 1))
    prior = view.entries.get(key)
    if prior is not None and replicas <= current:
        return result  # nothing grows: the autoscale tick's record stands
    demand = Demand(
        key,
        (Option(plan.gpu_type, gpr, replicas),),
        intent.scaling.priority,
        intent.scaling.min_replicas,
        res.namespace,
        prior.demand.slo_gap if prior is not None else 0.0,
        plan.gpu_type,
        gateway,
        current > 0,
    )
    draining: dict[str, int] = {}
    if prior is not None:  # a new GPU type: what it held on the old one drains (counted until the next tick)
        for t, n in (*prior.draining, (prior.gpu_type, prior.held_gpus if prior.gpu_type != plan.gpu_type else 0)):
            draining[t] = draining.get(t, 0) + n
    book.record(
        Entry(
            budget,
            demand,
            res.namespace,
            res.name,
            capped * gpr,
            plan.gpu_type,
            now.timestamp(),
            tuple(sorted((t, n) for t, n in draining.items() if n > 0)),
            tuple(sorted(labels.items())),
        )
    )
    if capped == replicas:
        return result
    wanted = f"spec.scaling.replicas pins {replicas}" if pin is not None else f"wanted {replicas}"
    message = (
        f"budget {budget}: {wanted}, starts with {capped} on {plan.gpu_type} x{gpr} (the budget has "
        f"{max(free, 0):.0f} {plan.gpu_type} GPUs free now beyond what it holds); its next autoscale tick takes its "
        "grant"
    )
    status = result.status
    reason = "PinHeldByBudget" if pin is not None else "BudgetLimit"
    cond = condition(status, CONDITION, True, reason, message, res.generation, now)
    new = with_conditions(status, cond).model_copy(update={"replicas": capped, "desired_replicas": capped})
    sized = {**workload, "spec": {**workload["spec"], "replicas": capped}}
    apply = tuple(sized if o is workload else o for o in result.apply)
    applied = sized if result.applied_deployment is workload else result.applied_deployment
    events = (*result.events, Event("Warning", CONDITION, message[:1000]))
    return replace(result, status=new, apply=apply, applied_deployment=applied, events=events)


MOVED = "MovedByBudget"


def moved(result: Result, before: PlanStatus, grant: Grant) -> Result | None:
    """A re-plan for a budget's move (kvscale.control.reconcile.replan with a BudgetMove, whose
    Event says it) as the tick applies it: the workload on the granted type at the granted
    replicas, the plan marked with the type the planner chose (the service moves back when that
    has room). None when no plan on the granted type fits the cluster now (the service stays)."""
    plan = result.status.plan
    workload = next((o for o in result.apply if o.get("kind") in (DEPLOYMENT, lws.KIND)), None)
    if result.retry is not None or plan is None or plan.gpu_type != grant.gpu_type or workload is None:
        return None
    origin = before.budget_moved_from or before.gpu_type
    marked = plan.model_copy(update={"budget_moved_from": None if plan.gpu_type == origin else origin})
    # A move that rolls the pods (the re-plan annotated the load's count: kvscale.control.replan)
    # writes the new template at no more than the count running now, and records the grant as
    # the count the rollout's end grows to: replicas and template changed in one write would give
    # the increase to the old ReplicaSet, on the type being left (issue 38, finding 5).
    rolling = recorded_target(workload) is not None
    running = int(workload["spec"].get("replicas") or 0)
    applied = min(grant.replicas, running) if rolling and running > 0 else grant.replicas
    body = annotate(workload, grant.replicas) if rolling else workload
    sized = {**body, "spec": {**body["spec"], "replicas": applied}}
    status = result.status.model_copy(update={"plan": marked, "replicas": applied, "desired_replicas": grant.replicas})
    return replace(
        result,
        status=status,
        apply=tuple(sized if o is workload else o for o in result.apply),
        applied_deployment=sized if result.applied_deployment is workload else result.applied_deployment,
        scale_to=None,
    )


def govern_pin(
    book: BudgetBook,
    res: Resource,
    labels: Mapping[str, str],
    intent: Intent,
    result: Result,
    seen: DeploymentView | None,
    now: dt.datetime,
    ttl_s: float,
) -> Result:
    """A pinned service's tick under its budget (the policy is not asked): the pin recorded as
    its want, so it counts against the budget and the budget's status lists it; the workload
    held to the pin's grant (only into GPUs free now when it grows); HeldByBudget says whether
    the budget holds the pin. Unchanged without a budget or in recommend mode."""
    plan = result.status.plan
    pin = intent.scaling.pinned_replicas
    budget = None if plan is None else book.governing(res.namespace, labels, plan.gpu_type)
    if budget is None or plan is None or pin is None or intent.scaling.mode != "auto":
        if any(c.type == CONDITION for c in result.status.conditions):  # no budget holds it any more
            return replace(result, status=without_condition(result.status, CONDITION))
        return result
    gpr = plan.tensor_parallel * max(plan.nodes, 1) * plan.data_parallel
    current = seen.replicas if seen is not None and seen.gpu_type == plan.gpu_type else 0
    key = service_key(res.namespace, res.name)
    gateway = has_gateway(intent, res)
    # A pin is not moved to another GPU type: its one option is the plan's.
    demand = Demand(
        key,
        (Option(plan.gpu_type, gpr, pin),),
        intent.scaling.priority,
        0,
        res.namespace,
        0.0,
        plan.gpu_type,
        gateway,
        current > 0,
    )
    now_s = now.timestamp()
    book.record(
        Entry(
            budget,
            demand,
            res.namespace,
            res.name,
            current * gpr,
            plan.gpu_type,
            now_s,
            (),
            tuple(sorted(labels.items())),
        ),
        now_s,
        ttl_s,
    )
    view = book.view()
    allocation = service_allocation(view, key, now_s, ttl_s)
    book.remember(allocation)
    grant = allocation.grant(key)
    target = min(pin, grant.replicas)
    if target > current:
        target = _within_free(view, key, res.namespace, labels, plan.gpu_type, gpr, current, target)
    if grant.over_limit:  # the one running service its budget keeps beyond the limit (no gateway)
        target = max(target, min(pin, 1))
    held = target < pin
    message = f"budget {budget}: spec.scaling.replicas pins {pin}; {grant.reason}"
    if held:
        message += f"; the pin is held to {target}"
    status = result.status
    reason = REFUSED if grant.refused else "PinHeldByBudget" if held else "WithinBudget"
    cond = condition(status, CONDITION, held, reason, message, res.generation, now)
    new = with_conditions(status, cond, desired_replicas=target)
    events = list(result.events)
    last = view.posted.get(key)
    if held and cond.message != last:
        events.append(Event("Warning", CONDITION, cond.message[:1000]))
        book.post(key, cond.message)
    elif not held and last is not None and last != WITHIN:
        events.append(Event("Normal", "WithinBudget", cond.message[:1000]))
        book.post(key, WITHIN)
    scale_to = target if target != current else None
    if scale_to is not None:
        events.append(Event("Normal", "Scaled", f"Scaled {current} -> {target}: {message}"[:1000]))
        new = new.model_copy(
            update={
                "replicas": target,
                "desired_replicas": target,
                "last_scale_time": now_rfc3339(now),
                "last_scale_reason": message[:500],
            }
        )
    return replace(result, status=new, scale_to=scale_to, scale_kind=workload_kind(status), events=tuple(events))
