"""Many services, one GPU budget: one allocation per tick over every governed service.

Pure: the operator and `kvscale simulate --fleet` call the same function. Each service
brings what it wants (the policy's replica count, converted to each GPU type it accepts:
its options, cheapest feasible first), its floor (minReplicas) and its priority. The
allocator answers, per service, which option it runs on, how many replicas it got and why.

Order of the decision:

1. Floors first: every service's minReplicas, in priority order, on the option it runs on
   now when that has room, else on the first option that does; a floor the budget cannot
   hold gets what is left and says so (Grant.floor_short). A service with no gateway to hold
   its requests (`gateway` False: behind a plain Service a request finds no endpoint at
   zero) that the limit holds no replica of is refused (Grant.refused), except one already
   running per budget, which keeps one replica beyond the limit and says so
   (Grant.over_limit): a limit cut below the floors must not take such a service down, nor
   may a tenant escape its budget by creating more of them (issue 38).
2. Then what each wants, in priority order (higher first), and within one priority by SLO
   gap (observed over target; the service missing its target most goes first). Where the
   wants of one priority do not all fit, each is capped at a max-min fair share first
   (allocate -> _fair_caps), so the order only hands out the remainder. A service
   takes its whole want on the first option that holds it; when none does, the option that
   gives it the largest share of its want. Floors of lower priorities are moved to another
   GPU type they accept (their next-cheapest feasible plan) when that makes room for a
   higher priority, rather than left in its way.
3. Room ahead of need: once every service of a priority has its want, each of them is held
   room for the replicas its forecast asks for one lead further (Option.ahead: the policy's
   own lead over the cold start, kvscale.autoscaling.policy.replicas_ahead), before any lower
   priority's want. The room is reserved, not granted: the service scales into it when its
   want rises, without waiting for a lower priority to release GPUs first (issue 29: a
   diurnal rise waited for a preemption each time). Lower priorities' floors come first.
4. Never above a limit: per GPU type, and per namespace and type where the budget says.
   GPU types the budget does not list are not limited by it. Where several budgets govern
   one allocation, each option names the budget that bounds its type (Option.budget, one of
   `pools`), and the ledger counts each budget's types apart.

Hysteresis, so allocations do not flap from tick to tick:
- a service stays on the GPU type it runs on while that type holds its want (a move is a
  redeploy and a cold start); it returns to a preferred (cheaper) option only when that
  option holds its want with `return_margin` to spare; held everywhere, it moves whenever
  another option serves more of its want (issue 29: rag sat on 4 L40S while 4 H100 were
  idle, as a 25% margin on the share of a 100-replica want never qualified), counted in
  requests/s where the options say what a replica carries (a want capped at maxReplicas on
  both types is no measure of which serves more), by at least one replica of where it runs
  (a move costs a cold start; less than a replica's worth is within rounding);
- SLO gaps reorder services of one priority only when they differ by more than
  `gap_margin`; within that, last tick's order holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Option:
    """One way to run a service: a GPU type, GPUs per replica, and the replicas the service
    wants on it (the policy's count converted by per-replica capacity)."""

    gpu_type: str
    gpus_per_replica: int
    wanted: int
    # Requests/s one replica carries within the SLO here (the plan's); 0 when not known: then
    # options are compared by the share of their own want they hold.
    rate_per_replica: float = 0.0
    # Replicas beyond `wanted` its forecast asks for one lead further: room held for them
    # ahead of lower priorities' wants (kvscale.autoscaling.policy.replicas_ahead).
    ahead: int = 0
    # The budget whose limit bounds this GPU type for this service, a name in allocate's
    # `pools` ("": the budget allocate is given). Several budgets may select one service, each
    # type bounded by the tightest that limits it (kvscale.control.budget.governors).
    budget: str = ""

    def __post_init__(self) -> None:
        if not self.rate_per_replica >= 0:
            raise ValueError(f"rate_per_replica must be >= 0, got {self.rate_per_replica}")
        if self.gpus_per_replica < 1:
            raise ValueError(f"gpus_per_replica must be >= 1, got {self.gpus_per_replica}")
        if self.wanted < 0:
            raise ValueError(f"wanted must be >= 0, got {self.wanted}")
        if self.ahead < 0:
            raise ValueError(f"ahead must be >= 0, got {self.ahead}")


@dataclass(frozen=True)
class Demand:
    """What one governed service asks of the budget this tick."""

    name: str  # unique within the budget, e.g. namespace/name
    options: tuple[Option, ...]  # preferred first: the plan, then the next-cheapest feasible
    priority: int = 0  # higher first
    min_replicas: int = 0  # the floor, honoured before any want
    namespace: str = ""
    slo_gap: float = 0.0  # observed over target minus 1 (> 0: missing its SLO); 0 when unknown
    current_gpu_type: str | None = None  # what it runs on now (hysteresis)
    gateway: bool = True  # a gateway holds its requests at zero replicas
    # It has replicas now. Without a gateway, a running service whose floor the limit cannot
    # hold may keep one replica beyond it (one service per budget); a new one is refused.
    running: bool = False

    @property
    def floor(self) -> int:
        """The replicas it keeps before any want: minReplicas, and one without a gateway."""
        return self.min_replicas if self.gateway else max(self.min_replicas, 1)

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError(f"{self.name}: a demand needs at least one option")
        if self.min_replicas < 0:
            raise ValueError(f"{self.name}: min_replicas must be >= 0, got {self.min_replicas}")
        types = [o.gpu_type for o in self.options]
        if len(set(types)) != len(types):
            raise ValueError(f"{self.name}: one option per GPU type, got {types}")


@dataclass(frozen=True)
class Budget:
    """GPU limits per type, and optionally per namespace and type (within the global ones)."""

    name: str
    limits: Mapping[str, int]
    namespace_limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for gpu, n in self.limits.items():
            if n < 0:
                raise ValueError(f"budget {self.name}: the {gpu} limit must be >= 0, got {n}")
        for ns, per_type in self.namespace_limits.items():
            for gpu, n in per_type.items():
                if n < 0:
                    raise ValueError(f"budget {self.name}: the {gpu} limit of namespace {ns} must be >= 0, got {n}")


@dataclass(frozen=True)
class AllocatorConfig:
    gap_margin: float = 0.25  # SLO gaps closer than this count as equal within a priority
    return_margin: float = 0.25  # spare share of its want a preferred option needs before a move back


@dataclass(frozen=True)
class Grant:
    """What one service got, and why."""

    name: str
    priority: int
    gpu_type: str
    gpus_per_replica: int
    replicas: int
    wanted: int  # on the granted option
    min_replicas: int
    rank: int  # its place in this tick's order (0 first)
    moved: bool  # not on its first (cheapest) option
    reason: str
    floor_short: int = 0  # replicas of minReplicas the budget could not hold
    over_limit: int = 0  # replicas granted beyond the limit: the one a service without a gateway keeps
    ahead: int = 0  # replicas of room held for it beyond its grant, ahead of its forecast's rise
    budget: str = ""  # the budget whose limit bounds its GPU type (Option.budget, or allocate's)
    # No gateway holds its requests at zero and the limit holds none of its replicas: it gets
    # none, and the operator says so (it must not run beyond the limit: issue 38).
    refused: bool = False

    @property
    def floor_kept(self) -> bool:
        return self.floor_short == 0

    @property
    def held(self) -> bool:
        """Got fewer replicas than it wanted."""
        return self.replicas < self.wanted

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


@dataclass(frozen=True)
class Allocation:
    budget: str
    grants: tuple[Grant, ...]  # in rank order
    used: Mapping[str, int]  # GPUs granted per type (limited types and others)
    wanted: Mapping[str, int]  # GPUs each service wanted on its first option, summed per type
    reserved: Mapping[str, int] = field(default_factory=dict)  # GPUs held as room ahead of need, per type
    # GPUs granted per budget (Grant.budget) and type: what each budget's limits count.
    used_by_budget: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def grant(self, name: str) -> Grant:
        for g in self.grants:
            if g.name == name:
                return g
        raise KeyError(name)

    @property
    def by_name(self) -> dict[str, Grant]:
        return {g.name: g for g in self.grants}


Pool = tuple[str, str]  # (budget, GPU type): the GPUs one limit counts


class _Ledger:
    """Free GPUs per budget and type, globally and per namespace."""

    def __init__(self, budget: Budget, pools: Mapping[str, Budget]) -> None:
        self.budget = budget
        self.pools = pools
        self.used: dict[Pool, int] = {}
        self.ns_used: dict[tuple[str, str, str], int] = {}

    def bound(self, option: Option) -> Budget:
        """The budget whose limits bound this option."""
        if not option.budget:
            return self.budget
        if option.budget not in self.pools:
            raise ValueError(f"option {option.gpu_type} names budget {option.budget!r}, which pools does not hold")
        return self.pools[option.budget]

    def key(self, option: Option) -> Pool:
        return (self.bound(option).name, option.gpu_type)

    def free(self, namespace: str, option: Option) -> float:
        bound = self.bound(option)
        gpu = option.gpu_type
        room: float = math.inf
        if gpu in bound.limits:
            room = bound.limits[gpu] - self.used.get((bound.name, gpu), 0)
        ns_limits = bound.namespace_limits.get(namespace, {})
        if gpu in ns_limits:
            room = min(room, ns_limits[gpu] - self.ns_used.get((bound.name, namespace, gpu), 0))
        return room

    def fits(self, namespace: str, option: Option, replicas: int) -> int:
        """How many of `replicas` fit on this option now."""
        room = self.free(namespace, option)
        return replicas if math.isinf(room) else max(0, min(replicas, int(room // option.gpus_per_replica)))

    def take(self, namespace: str, option: Option, replicas: int) -> None:
        gpus = replicas * option.gpus_per_replica
        pool = self.key(option)
        self.used[pool] = self.used.get(pool, 0) + gpus
        ns_key = (pool[0], namespace, option.gpu_type)
        self.ns_used[ns_key] = self.ns_used.get(ns_key, 0) + gpus

    def give(self, namespace: str, option: Option, replicas: int) -> None:
        self.take(namespace, option, -replicas)


def _ranked(demands: Sequence[Demand], previous: Mapping[str, Grant], config: AllocatorConfig) -> list[Demand]:
    """Priority first; within a priority, SLO gap in steps of `gap_margin`, then last tick's
    rank (incumbency), then the name."""

    def key(d: Demand) -> tuple[float, float, float, str]:
        step = math.floor(max(d.slo_gap, 0.0) / config.gap_margin) if config.gap_margin > 0 else d.slo_gap
        prev = previous.get(d.name)
        return (-d.priority, -step, prev.rank if prev is not None else math.inf, d.name)

    return sorted(demands, key=key)


def _index(d: Demand, gpu_type: str | None) -> int | None:
    for i, o in enumerate(d.options):
        if o.gpu_type == gpu_type:
            return i
    return None


def allocate(
    budget: Budget,
    demands: Sequence[Demand],
    previous: Mapping[str, Grant] | None = None,
    config: AllocatorConfig | None = None,
    pools: Mapping[str, Budget] | None = None,
) -> Allocation:
    """One decision over every governed service (see the module's docstring): the wants in
    order, then, within each priority whose wants do not all fit, a fair share. `pools`: the
    other budgets an option may name (Option.budget), each with its own limits; an option
    that names none is bounded by `budget`."""
    pools = pools or {}

    uncapped = {d.name: d for d in demands}

    def run(ds: Sequence[Demand]) -> Allocation:
        return _in_order(budget, ds, previous, config, pools, uncapped)

    allocation = run(demands)
    caps: dict[str, int] = {}
    for priority in sorted({d.priority for d in demands}, reverse=True):
        group = [d.name for d in demands if d.priority == priority]
        if len(group) < 2 or not any(allocation.grant(n).held for n in group):
            continue
        caps = _fair_caps(run, demands, group, caps)
    if not caps:
        return allocation
    capped = run(_capped(demands, caps))
    # Its true want on the option it was granted (issue 38: read from the uncapped allocation,
    # which had it on another option, a service at its whole want here counted as held).
    by_name = {d.name: d for d in demands}
    grants = []
    for g in capped.grants:
        d = by_name[g.name]
        true_want = next(max(o.wanted, d.floor) for o in d.options if o.gpu_type == g.gpu_type)
        if g.name in caps and g.replicas < true_want and g.floor_kept and not g.refused:
            sharing = sum(1 for x in demands if x.priority == g.priority and x.name in caps)
            g = replace(
                g,
                wanted=max(g.wanted, true_want),
                reason=(
                    f"wanted {max(g.wanted, true_want)}, got {g.replicas} on {g.gpu_type} x{g.gpus_per_replica}: "
                    f"a fair share of budget {g.budget or budget.name}'s GPUs among {sharing} services of priority "
                    f"{g.priority} whose wants do not all fit (each up to {caps[g.name]})"
                ),
            )
        grants.append(g)
    return replace(capped, grants=tuple(grants), wanted=allocation.wanted)


def _capped(demands: Sequence[Demand], caps: Mapping[str, int]) -> list[Demand]:
    """The demands with each capped service's want, on every option, at most its cap (and no
    room ahead: a service held to a share has no room to spare)."""
    return [
        replace(d, options=tuple(replace(o, wanted=min(o.wanted, caps[d.name]), ahead=0) for o in d.options))
        if d.name in caps
        else d
        for d in demands
    ]


def _fair_caps(
    run: Callable[[Sequence[Demand]], Allocation],
    demands: Sequence[Demand],
    group: Sequence[str],
    caps: Mapping[str, int],
) -> dict[str, int]:
    """Max-min fair caps for one priority whose wants do not all fit (issue 29: two services
    of equal priority, both missing their SLO while their backlog drained, both wanted every
    GPU, and the one ranked first took five of six for good, while the other, starved, could
    never catch up). The largest cap every service of the group gets in full; then the
    remainder one replica at a time, round the group in its order (SLO gap, then incumbency):
    no service takes a second replica of the remainder before every other that can take one
    has (issue 38: eight services wanting 5 under a limit of 5 got [5, 0, ...])."""
    top = max(o.wanted for d in demands if d.name in group for o in d.options)

    def holds(trial_caps: Mapping[str, int]) -> bool:
        trial = run(_capped(demands, {**caps, **trial_caps})).by_name
        return all(trial[n].replicas >= min(trial[n].wanted, trial_caps[n]) for n in group)

    low, high = 0, top  # the largest cap every one of them gets in full, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        if holds(dict.fromkeys(group, mid)):
            low = mid
        else:
            high = mid - 1
    fair = dict.fromkeys(group, low)
    order = [g.name for g in run(_capped(demands, {**caps, **fair})).grants if g.name in fair]
    # Rounds until none can take one more. One that could not is not asked again (the others'
    # shares only grow); where a larger share moved another to a type it did not use, what
    # that frees goes to the priority's held services anyway (_in_order's top-up).
    stuck: set[str] = set()
    while len(stuck) < len(order):
        for name in order:
            if name in stuck:
                continue
            if fair[name] < top and holds({**fair, name: fair[name] + 1}):
                fair[name] += 1
            else:
                stuck.add(name)
    return {**caps, **fair}


def _in_order(
    budget: Budget,
    demands: Sequence[Demand],
    previous: Mapping[str, Grant] | None = None,
    config: AllocatorConfig | None = None,
    pools: Mapping[str, Budget] | None = None,
    uncapped: Mapping[str, Demand] | None = None,
) -> Allocation:
    """The wants in priority order, and within a priority by SLO gap and incumbency.
    `uncapped`: the demands before a fair share capped their wants (allocate)."""
    previous = previous or {}
    config = config or AllocatorConfig()
    names = [d.name for d in demands]
    if len(set(names)) != len(names):
        raise ValueError(f"budget {budget.name}: service names must be unique, got {sorted(names)}")
    order = _ranked(demands, previous, config)
    rank = {d.name: i for i, d in enumerate(order)}
    ledger = _Ledger(budget, pools or {})
    at: dict[str, int] = {}  # option index each service holds
    held: dict[str, int] = {}  # replicas it holds there
    over: dict[str, int] = {}  # the replica a service without a gateway keeps beyond the limit
    beyond: set[str] = set()  # budgets one of whose services already keeps its replica beyond the limit
    refused: set[str] = set()  # services without a gateway the limit holds no replica of
    ahead: dict[str, int] = {}  # replicas of room held for it ahead of its forecast

    # 1. Floors, in order.
    for d in order:
        floor = d.floor
        here = _index(d, d.current_gpu_type)
        tries = ([here] if here is not None else []) + [i for i in range(len(d.options)) if i != here]
        choice = next((i for i in tries if ledger.fits(d.namespace, d.options[i], floor) >= floor), None)
        if choice is None:  # floors placed before it that can go elsewhere make room
            placed = [x for x in order if x.name in at]
            for i in tries:
                saved = (dict(ledger.used), dict(ledger.ns_used), dict(at))
                _make_room(ledger, d, d.options[i], floor * d.options[i].gpus_per_replica, placed, at, held)
                if ledger.fits(d.namespace, d.options[i], floor) >= floor:
                    choice = i
                    break
                # Moves that made too little room are undone: floors that shuffle without
                # making room would move again next tick (a redeploy each time, for nothing).
                ledger.used, ledger.ns_used = saved[0], saved[1]
                at.update(saved[2])
        if choice is None:  # no option holds the whole floor: the most that fits
            choice = max(tries, key=lambda i: (ledger.fits(d.namespace, d.options[i], floor), -tries.index(i)))
        got = ledger.fits(d.namespace, d.options[choice], floor)
        if got == 0 and not d.gateway:
            # Nothing holds its requests at zero. One running service per budget keeps one
            # replica beyond the limit (a limit cut below the floors must not take it down),
            # kept off the ledger so that it takes nothing from the floors and wants ranked
            # before it; every other is refused: a replica each beyond the limit let a tenant
            # escape its budget by creating more services (issue 38).
            bound = ledger.bound(d.options[choice]).name
            if d.running and bound not in beyond:
                over[d.name] = 1
                beyond.add(bound)
            else:
                refused.add(d.name)
        ledger.take(d.namespace, d.options[choice], got)
        at[d.name], held[d.name] = choice, got

    # 2. Wants, in order; lower priorities' floors may move out of the way.
    for n, d in enumerate(order):
        ledger.give(d.namespace, d.options[at[d.name]], held[d.name])
        floor_got, floor_at = held[d.name], at[d.name]
        lower = [x for x in order[n + 1 :] if x.priority < d.priority]
        room = {i: _room(ledger, d, i, lower, at, held) for i in range(len(d.options))}
        choice = _choose(d, room, floor_got, config)
        opt = d.options[choice]
        want = max(opt.wanted, d.floor)
        before = (dict(ledger.used), dict(ledger.ns_used), dict(at), dict(held))
        _make_room(ledger, d, opt, want * opt.gpus_per_replica, lower, at, held)
        # What the floors moved for it freed goes first to those ranked before it (a higher
        # priority held on that type), its own floor kept aside.
        # Higher priorities held to a fair share take it up to their whole want: a share is of
        # what their own priority contends for, never a gift to those below (issue 38).
        above = {e.name: uncapped[e.name] for e in order[:n] if e.priority > d.priority} if uncapped else {}
        ledger.take(d.namespace, d.options[floor_at], floor_got)
        _fill(order[:n], ledger, at, held, above)
        ledger.give(d.namespace, d.options[floor_at], floor_got)
        got = ledger.fits(d.namespace, opt, want)
        if (got < floor_got or (got == 0 and not d.gateway)) and choice != floor_at:
            # Never below the floor it already had (and one kept beyond, or refused, stays
            # on the type its budget's slot counts).
            # ... and the floors moved for it go back: it stays where it was.
            ledger.used, ledger.ns_used = before[0], before[1]
            at.update(before[2])
            held.update(before[3])
            choice, opt = floor_at, d.options[floor_at]
            got = ledger.fits(d.namespace, opt, max(opt.wanted, d.floor))
        if got > 0:  # room for it within the limit after all
            over.pop(d.name, None)
            refused.discard(d.name)
        ledger.take(d.namespace, opt, got)
        at[d.name], held[d.name] = choice, got
        # What this turn freed elsewhere (a floor that moved) goes first to those before it.
        _fill(order[:n], ledger, at, held, above)
        if n + 1 == len(order) or order[n + 1].priority < d.priority:
            # Its priority's wants are all placed. What its fair shares left free on a type goes
            # to its services held there, up to their whole wants, before any lower priority:
            # a share is of what they contend for, never a gift to those below (issue 38: a
            # larger cap moved a service to another type, so its share stopped short and the
            # remainder went to a lower priority).
            if uncapped:
                _fill(order[: n + 1], ledger, at, held, uncapped)
            # Then room ahead of need, before lower priorities.
            _fill(order[: n + 1], ledger, at, held)
            for e in order[: n + 1]:
                if e.priority != d.priority or e.name in ahead:
                    continue
                eo = e.options[at[e.name]]
                spare = ledger.fits(e.namespace, eo, eo.ahead) if held[e.name] >= eo.wanted else 0
                ledger.take(e.namespace, eo, spare)
                ahead[e.name] = spare

    # 3. Reasons, once every grant is known.
    grants: list[Grant] = []
    for d in order:
        if held[d.name] > 0:  # room came free for it within the limit
            over.pop(d.name, None)
            refused.discard(d.name)
        opt = d.options[at[d.name]]
        got = held[d.name] + over.get(d.name, 0)
        want = max((uncapped or {}).get(d.name, d).options[at[d.name]].wanted, d.floor)  # its whole want
        short = max(0, d.min_replicas - got)
        reason = _reason(d, at[d.name], got, want, short, over.get(d.name, 0), order, at, held, ledger, ahead)
        if d.name in refused:
            reason += (
                f"; refused: no gateway (spec.routing.inferencePool or kedaHttp) holds its requests at zero and "
                f"budget {ledger.bound(opt).name} has no room for one replica ({opt.gpus_per_replica} {opt.gpu_type}) "
                "within its limit: raise the limit, lower another service's share, or give it a gateway"
            )
        grants.append(
            Grant(
                d.name,
                d.priority,
                opt.gpu_type,
                opt.gpus_per_replica,
                got,
                want,
                d.min_replicas,
                rank[d.name],
                at[d.name] != 0,
                reason,
                short,
                over.get(d.name, 0),
                ahead.get(d.name, 0),
                ledger.bound(opt).name,
                d.name in refused,
            )
        )
    wanted: dict[str, int] = {}
    for d in demands:
        first = d.options[0]
        wanted[first.gpu_type] = (
            wanted.get(first.gpu_type, 0) + max(first.wanted, d.min_replicas) * first.gpus_per_replica
        )
    for name, n in over.items():  # what runs beyond the limit is allocated all the same
        g = next(g for g in grants if g.name == name)
        pool = (g.budget, g.gpu_type)
        ledger.used[pool] = ledger.used.get(pool, 0) + n * g.gpus_per_replica
    reserved: dict[str, int] = {}
    for g in grants:
        if g.ahead:
            reserved[g.gpu_type] = reserved.get(g.gpu_type, 0) + g.ahead * g.gpus_per_replica
            ledger.used[(g.budget, g.gpu_type)] -= g.ahead * g.gpus_per_replica  # held as room, not granted
    used: dict[str, int] = {}
    by_budget: dict[str, dict[str, int]] = {}
    for (name, gpu), n in ledger.used.items():
        if n > 0:
            used[gpu] = used.get(gpu, 0) + n
            by_budget.setdefault(name, {})[gpu] = n
    return Allocation(budget.name, tuple(grants), used, wanted, reserved, by_budget)


def _fill(
    before: Sequence[Demand],
    ledger: _Ledger,
    at: dict[str, int],
    held: dict[str, int],
    wants: Mapping[str, Demand] | None = None,
) -> None:
    """Those ranked before, in order, take what is free on the option each holds, up to its want
    (its want in `wants` where given: its whole want before a fair share capped it)."""
    for e in before:
        eo = e.options[at[e.name]]
        wanted = (wants or {}).get(e.name, e).options[at[e.name]].wanted
        short = max(wanted, e.floor) - held[e.name]
        if short > 0:
            more = ledger.fits(e.namespace, eo, short)
            ledger.take(e.namespace, eo, more)
            held[e.name] += more


def _room(ledger: _Ledger, d: Demand, i: int, lower: list[Demand], at: dict[str, int], held: dict[str, int]) -> int:
    """Replicas of `d` option `i` could hold: what is free, plus what lower priorities' floors
    would free by moving to another option of theirs with room."""
    opt = d.options[i]
    free = ledger.free(d.namespace, opt)
    if math.isinf(free):
        return max(opt.wanted, d.min_replicas)
    movable = 0
    for x in lower:
        xo = x.options[at[x.name]]
        if ledger.key(xo) != ledger.key(opt) or held[x.name] == 0:
            continue
        if any(
            j != at[x.name] and ledger.fits(x.namespace, x.options[j], held[x.name]) >= held[x.name]
            for j in range(len(x.options))
        ):
            movable += held[x.name] * xo.gpus_per_replica
    return max(0, int((free + movable) // opt.gpus_per_replica))


def _choose(d: Demand, room: Mapping[int, int], floor_got: int, config: AllocatorConfig) -> int:
    """The option for `d`: where it runs now while that holds its want; else the first that
    holds its want (a preferred one only with `return_margin` to spare when leaving where it
    runs); else the one that serves the most of its want (never less than the floor it
    already has), where it runs unless another serves a replica's worth more."""
    here = _index(d, d.current_gpu_type)
    full = [i for i, o in enumerate(d.options) if room[i] >= max(o.wanted, d.min_replicas)]
    if here is not None and here in full:
        better = [
            i
            for i in full
            if i < here and room[i] >= math.ceil(max(d.options[i].wanted, 1) * (1 + config.return_margin))
        ]
        return better[0] if better else here
    if full:
        return full[0]
    eligible = [
        i for i in range(len(d.options)) if min(room[i], max(d.options[i].wanted, d.min_replicas)) >= floor_got
    ] or list(range(len(d.options)))

    def served(i: int, extra: int = 0) -> float:
        """What option i serves of the want, with `extra` replicas more: requests/s where
        every option knows its per-replica rate, else the share of its own want."""
        o = d.options[i]
        want = max(o.wanted, d.min_replicas)
        n = min(room[i], want) + extra
        return n * o.rate_per_replica if by_rate else n / max(want, 1)

    by_rate = all(o.rate_per_replica > 0 for o in d.options)
    best = max(eligible, key=lambda i: (served(i), i == here, -i))
    if here is not None and here in eligible and served(best) < served(here, extra=1):
        return here  # a move is a redeploy and a cold start: only for a replica's worth more
    return best


def _make_room(
    ledger: _Ledger,
    d: Demand,
    opt: Option,
    needed_gpus: int,
    movable: list[Demand],
    at: dict[str, int],
    held: dict[str, int],
) -> None:
    """Moves the floors of `movable` (lower priorities, or floors placed earlier) off `opt`'s
    GPU type, last first, until `needed_gpus` are free or none can move."""
    for x in reversed(movable):
        if ledger.free(d.namespace, opt) >= needed_gpus:
            return
        xo = x.options[at[x.name]]
        if ledger.key(xo) != ledger.key(opt) or held[x.name] == 0:
            continue
        for j, alt in enumerate(x.options):
            if j != at[x.name] and ledger.fits(x.namespace, alt, held[x.name]) >= held[x.name]:
                ledger.give(x.namespace, xo, held[x.name])
                ledger.take(x.namespace, alt, held[x.name])
                at[x.name] = j
                break


def _reason(
    d: Demand,
    i: int,
    got: int,
    want: int,
    floor_short: int,
    over_limit: int,
    order: list[Demand],
    at: dict[str, int],
    held: dict[str, int],
    ledger: _Ledger,
    ahead: Mapping[str, int],
) -> str:
    opt = d.options[i]
    where = f"{opt.gpu_type} x{opt.gpus_per_replica}"
    moved = ""
    if i != 0:
        first = d.options[0]
        moved = f" (its next-cheapest feasible plan: {first.gpu_type} has no room for it)"
    if over_limit:
        moved += (
            f"; {over_limit} replica beyond the {opt.gpu_type} limit: no gateway holds its requests at zero "
            "(spec.routing.inferencePool or kedaHttp), so it keeps one"
        )
    if ahead.get(d.name):
        moved += f"; room for {ahead[d.name]} more held ahead of its forecast"
    if got >= want:
        return f"wanted {want}, got {got} on {where}{moved}"
    budget = ledger.bound(opt)
    limit = budget.limits.get(opt.gpu_type)
    ns_limit = budget.namespace_limits.get(d.namespace, {}).get(opt.gpu_type)
    holders = [
        f"{x.name} (priority {x.priority}) {held[x.name] * x.options[at[x.name]].gpus_per_replica}"
        + (f" (+{ahead[x.name] * x.options[at[x.name]].gpus_per_replica} ahead)" if ahead.get(x.name) else "")
        for x in order
        if x.name != d.name and ledger.key(x.options[at[x.name]]) == ledger.key(opt) and held[x.name] > 0
    ]
    global_free = math.inf if limit is None else limit - ledger.used.get((budget.name, opt.gpu_type), 0)
    ns_free = (
        math.inf if ns_limit is None else ns_limit - ledger.ns_used.get((budget.name, d.namespace, opt.gpu_type), 0)
    )
    if ns_free < global_free:
        cap = f"namespace {d.namespace}'s {opt.gpu_type} limit of {ns_limit} GPUs"
    else:
        cap = f"the {opt.gpu_type} limit of {limit} GPUs"
    why = f"wanted {want}, got {got} on {where}: budget {budget.name} holds {cap}"
    if holders:
        why += (
            "; in priority order: "
            + ", ".join(holders[:5])
            + (f" and {len(holders) - 5} more" if len(holders) > 5 else "")
        )
    if floor_short:
        why += f"; minReplicas {d.min_replicas} does not fit ({floor_short} short)"
    return why + moved
