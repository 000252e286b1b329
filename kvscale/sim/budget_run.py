"""Several services under one GPU budget: each service's own arrivals, fleet and kvscale
policy, and every tick one allocation over all of them (kvscale.autoscaling.budget, the
allocator the operator runs).

Per tick: one call of the deployed tick (kvscale.autoscaling.tick.tick_all, the stages the
operator runs) over every service: each service's policy and idle rule say what it wants on
the GPU type it runs on; the want is converted to its other options (by their planned
per-replica capacity); the allocator grants replicas to all of them together; scale-downs are applied first, then scale-ups, and a replica starts only
when the budget has the GPUs free (a replica still draining holds its GPUs until its last
request ends), so GPUs in use never exceed a limit. A service moved to another GPU type
drains on the old one at once and starts on the new one: requests wait at the gateway
through the cold start (a move is made only when the old type is wanted by a higher
priority or holds much less of the service's want).

Preemption with a bound: when the budget grants a service fewer replicas than it wants and it
runs more, the replicas it releases leave routing at once and their in-flight requests have
`preemption_grace_s` to finish (what is left then is cut); behind the gateway their queue goes
back to the gateway. Their GPUs are free by then whatever the service's queue does, so a
release never waits for a queue that the remaining load keeps filling.

The run ends at the loads' end plus `drain_limit_s`: what a replica still holds then is cut and
what waits at the gateway is rejected (HTTP 429), each counted per service.

The operator's online capacity search (kvscale.sim.online_refresh, as `kvscale simulate` runs
it): each service's policy, every capacity interval, replays the window just past of its own
arrivals on the GPU type it runs on, and acts on the confirmed capacity where it is above the
model's (kvscale.control.capacity.raises). A move to another GPU type drops what was confirmed
on the old one (the operator keys it by configuration): the new type's model stands until a
search on it confirms more.

Scale to zero: a service with min_replicas 0 releases its last replica after `idle_window_s`
without arrivals; requests that arrive while it has none wait at the gateway (held) until a
replica is ready, and the policy sees them queued and scales back.

Disaggregated services (PoolsService): a prefill pool and a decode pool
(kvscale.sim.disaggregated_fleet.PoolsStepper) stepped in the same loop, kvscale's policy on
each pool; in the tick each pool is a seat of its own (`<name>-prefill`, `<name>-decode`, the
operator's budget book's names), and what the two are granted on one limited GPU type is split
by what they serve together (kvscale.sim.pool_policies.SplitPooled), as
kvscale.control.pool_budget does. A pool never goes below one worker; the start is the plan's
pools, or within the budget the split that serves the most (cap_pools' rule).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvscale.autoscaling.budget import Allocation, Budget, Demand, Grant, Option
from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.autoscaling.drain import DEFAULT_PREEMPTION_GRACE_S
from kvscale.autoscaling.observation import Observation
from kvscale.autoscaling.pool_capacity import split_pools
from kvscale.autoscaling.tick import Idle, Pooled, Seat, SeatOption, TickDecision, TickInput, grants, tick_all
from kvscale.autoscaling.tuning import policy_config
from kvscale.sim.disaggregated_fleet import DisaggregatedResult, DisaggregatedSetup, PoolsStepper, PoolsView
from kvscale.sim.engine import SimRequest, StepTimes
from kvscale.sim.fleet import Fleet
from kvscale.sim.online_refresh import OnlineRefresh
from kvscale.sim.policies import KvscalePolicy
from kvscale.sim.pool_policies import SplitPooled, kvscale_pools, pool_seats
from kvscale.sim.run import TICK_S, WINDOW_S, SimSetup, Source, _observe, _Window
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.workload import Workload

DRAIN_LIMIT_S = 300.0  # after the loads end, the run drains this long, then cuts and rejects the rest


@dataclass(frozen=True)
class ServiceOption:
    """One GPU type a service may run on: its simulation setup and planned capacity."""

    setup: SimSetup
    rate_per_replica: float  # requests/s one replica carries within the SLO (the plan's)

    @property
    def gpu_type(self) -> str:
        return self.setup.cfg.gpu.name

    @property
    def gpus_per_replica(self) -> int:
        return self.setup.cfg.gpus


@dataclass(frozen=True)
class FleetService:
    name: str
    options: tuple[ServiceOption, ...]  # cheapest feasible first
    trace: list[TraceRequest]
    priority: int = 0
    min_replicas: int = 1
    max_replicas: int = 100
    headroom: float = 0.10
    idle_window_s: float = 300.0  # with min_replicas 0: no arrivals this long releases the last replica


@dataclass(frozen=True)
class PoolsService:
    """A service replayed as a prefill pool and a decode pool (kvscale.sim.disaggregated_fleet,
    its plan's layout), kvscale's policy on each through the one tick; in the budget each pool
    is a want of its own (`<name>-prefill`, `<name>-decode`) with the service's priority and a
    floor of one worker, and what the two get on one limited GPU type is split by what they
    serve together (kvscale.sim.pool_policies.SplitPooled), as the operator's budget book
    does (kvscale.control.pool_budget)."""

    name: str
    setup: DisaggregatedSetup  # both pools as planned (routing: the gateway's, by role)
    trace: list[TraceRequest]
    shape: Workload | None = None  # the workload the plan was made for (each pool's capacity)
    step_target_s: float | None = None  # the decode step target the plan was sized for
    priority: int = 0
    min_replicas: int = 1  # each pool's floor (at least one worker: a pool at zero loses every request)
    max_replicas: int = 100  # each pool's
    headroom: float = 0.10
    layout: str = ""  # why the planner chose the pools
    planned_rates: tuple[float, float] | None = None  # the plan's requests/s per worker (the start's split)

    def pool(self, role: str) -> str:
        """The pool's name in the budget."""
        return f"{self.name}-{role}"


@dataclass(frozen=True)
class ServicePoint:
    time_s: float
    gpu_type: str
    granted: int
    wanted: int
    ready: int
    held: tuple[tuple[str, int], ...]  # GPUs its replicas hold per type (starting, serving, draining)

    @property
    def gpus(self) -> int:
        return sum(n for _, n in self.held)


@dataclass
class ServiceResult:
    service: FleetService
    requests: list[SimRequest]
    gpu_hours: float
    cost_usd: float
    timeline: list[ServicePoint] = field(default_factory=list)
    held_ticks: int = 0  # ticks the budget granted fewer replicas than wanted
    moves: int = 0  # changes of GPU type
    reasons: list[tuple[float, str]] = field(default_factory=list)  # each change of the grant's reason
    cold_starts_from_zero: int = 0
    first_request_ttfts_s: list[float] = field(default_factory=list)  # first request after each scale from zero
    preemptions: int = 0  # replicas released because the budget granted fewer than the service wanted
    grant_wait_s: float = 0.0  # time it ran fewer replicas than it wanted (held by the budget or its GPUs busy)

    def lost(self, kind: str) -> int:
        """Requests "cut" (on a replica at a drain's bound or the run's end) or "rejected"."""
        return sum(1 for r in self.requests if r.lost == kind)


@dataclass(frozen=True)
class PoolSplit:
    """A tick the budget held the pools below their wants: what each pool was held to."""

    prefill: int
    decode: int
    wanted_prefill: int
    wanted_decode: int
    gpus: int  # what the allocator granted the two pools together, the GPUs the split shares


@dataclass(frozen=True)
class PoolsPoint:
    time_s: float
    granted: tuple[int, int]  # (prefill, decode) workers the budget's split gives
    wanted: tuple[int, int]  # what each pool's policy wants
    ready: tuple[int, int]
    gpus: tuple[int, int]  # GPUs each pool holds (starting, serving, draining)


@dataclass
class PoolsResult:
    """A pools service's run in the fleet: the totals ServiceResult reports for an aggregated
    service, each pool's own (the replay's DisaggregatedResult) and the budget's splits."""

    service: PoolsService
    requests: list[SimRequest]
    gpu_hours: float = 0.0
    cost_usd: float = 0.0
    timeline: list[ServicePoint] = field(default_factory=list)  # both pools together
    pool_timeline: list[PoolsPoint] = field(default_factory=list)
    held_ticks: int = 0  # ticks either pool was granted fewer workers than it wanted
    pool_held_ticks: dict[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 0})
    splits: Counter[PoolSplit] = field(default_factory=Counter)  # ticks held at each split
    moves: int = 0  # always 0: a pool is not moved to another GPU type
    reasons: list[tuple[float, str]] = field(default_factory=list)
    cold_starts_from_zero: int = 0
    first_request_ttfts_s: list[float] = field(default_factory=list)
    preemptions: int = 0
    grant_wait_s: float = 0.0
    replay: DisaggregatedResult | None = None  # each pool's GPU-hours, replicas and the requests' latencies
    rates: tuple[float, float] = (0.0, 0.0)  # requests/s a prefill and a decode worker carry (their seats')

    def lost(self, kind: str) -> int:
        return sum(1 for r in self.requests if r.lost == kind)


@dataclass
class FleetResult:
    budget: Budget
    services: list[ServiceResult | PoolsResult]
    usage: list[tuple[float, dict[str, int]]]  # GPUs held per type at each tick, after it acted
    duration_s: float

    @property
    def max_gpus_used(self) -> dict[str, int]:
        peak: dict[str, int] = {}
        for _, used in self.usage:
            for gpu, n in used.items():
                peak[gpu] = max(peak.get(gpu, 0), n)
        return peak


class _ServiceRun:
    def __init__(self, svc: FleetService, tick_s: float, window_s: float, online: bool = True) -> None:
        self.svc = svc
        self.tick_s = tick_s
        self.window_s = window_s
        self.source = Source(svc.trace)
        self.requests: list[SimRequest] = []
        self.done = 0
        self.lanes: dict[int, Fleet] = {}
        self.active = 0
        self.capacities = [SizingCapacity(o.setup.cfg, o.setup.slo, o.setup.max_batch) for o in svc.options]
        inp = sum(r.input_tokens for r in svc.trace) / len(svc.trace) if svc.trace else 512.0
        out = sum(r.output_tokens for r in svc.trace) / len(svc.trace) if svc.trace else 256.0
        self.configs = [
            policy_config(  # the operator's constructor: the deployed policy, tuned alike
                ttft_target_s=o.setup.slo.ttft_s,
                tpot_target_s=o.setup.slo.tpot_s,
                input_tokens=inp,
                output_tokens=out,
                min_replicas=svc.min_replicas,
                max_replicas=svc.max_replicas,
                headroom=svc.headroom,
                cold_start_s=o.setup.cold_start_s,
                interval_s=tick_s,
                window_s=window_s,
                least_loaded_routing=o.setup.routing == "gateway",
            )
            for o in svc.options
        ]
        # The operator's capacity worker over this service's own arrivals (kvscale.sim.compare's
        # make_policies builds the single service's alike); it follows the GPU type (act_on).
        self.refresh = (
            OnlineRefresh(svc.options[0].setup, self.capacities[0], svc.trace) if online and svc.trace else None
        )
        self.policy = KvscalePolicy(self.capacities[0], self.configs[0], refresh=self.refresh)
        self.windows = {k: _Window(window_s) for k in ("arrivals", "inputs", "outputs", "ttfts", "tpots")}
        self.finished: list[SimRequest] = []
        self.last_arrival_s = -math.inf
        self.result = ServiceResult(svc, self.requests, 0.0, 0.0)
        self.previous_reason = ""
        self.from_zero_at: float | None = None  # when the fleet last had no replica while requests came
        self._first: SimRequest | None = None  # the request that found no replica
        self.wanted = 0  # the policy's want at the latest tick

    # -- as the fleet's loop steps every run (an aggregated service's or a pools service's) --

    @property
    def names(self) -> tuple[str, ...]:
        return (self.svc.name,)

    def opening(self) -> list[Demand]:
        """Its planned replicas at the start, as the budget allows."""
        svc = self.svc
        options = tuple(
            Option(o.gpu_type, o.gpus_per_replica, max(svc.min_replicas, o.setup.initial_replicas)) for o in svc.options
        )
        return [Demand(svc.name, options, svc.priority, svc.min_replicas)]

    def open(self, first: Allocation, budget: Budget) -> None:
        del budget
        grant = first.grant(self.svc.name)
        self.act_on(self.index_of(grant.gpu_type))
        self.lane(self.active).start(grant.replicas, 0.0, warm=True)

    def tick_inputs(self, now_s: float) -> list[TickInput]:
        return [self.tick_input(now_s)]

    def take(self, dones: Sequence[TickDecision], now_s: float) -> None:
        del now_s
        self.ticked(dones[0])

    def shrink_to(self, by_name: Mapping[str, Grant], now_s: float, grace_s: float) -> None:
        self.shrink(by_name[self.svc.name], now_s, grace_s)

    def record_at(self, now_s: float, by_name: Mapping[str, Grant]) -> None:
        self.record(now_s, by_name[self.svc.name])

    # -- the fleet of each GPU type it ran on ---------------------------------------------

    def lane(self, index: int) -> Fleet:
        if index not in self.lanes:
            setup = self.svc.options[index].setup
            self.lanes[index] = Fleet(replace(setup.fleet_spec(), seed=setup.seed + index), StepTimes(setup.cfg))
        return self.lanes[index]

    def held_gpus(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for i, fleet in self.lanes.items():
            n = sum(1 for r in fleet.replicas if r.stopped_s is None) * self.svc.options[i].gpus_per_replica
            if n:
                gpu = self.svc.options[i].gpu_type
                held[gpu] = held.get(gpu, 0) + n
        return held

    # -- events ---------------------------------------------------------------------------

    def next_arrival(self) -> float:
        return self.source.next_time()

    def outstanding(self) -> int:
        return len(self.requests) - self.done

    def advance_to(self, now_s: float) -> None:
        self._advance(now_s)
        if self.from_zero_at is not None:
            self.note_first_token()

    def _advance(self, now_s: float) -> None:
        for fleet in self.lanes.values():
            fleet.advance_to(now_s, self.finished)
            self.done += len(fleet.take_lost())  # cut at a drain's bound
            # Held at a fleet with no replica left (an old GPU type): to the active one.
            if fleet is not self.lanes.get(self.active) and fleet.unrouted and not fleet.serving(now_s):
                while fleet.unrouted:
                    self.lane(self.active).route(fleet.unrouted.popleft(), now_s)
        for r in self.finished:
            self.windows["ttfts"].add(r.first_token_s, r.ttft_s)
            if r.output_tokens > 1:
                self.windows["tpots"].add(r.finish_s, r.tpot_s)
        self.done += len(self.finished)
        self.finished.clear()

    def arrive(self, now_s: float) -> None:
        r = self.source.pop()
        request = SimRequest(len(self.requests), r.arrival_s, r.input_tokens, r.output_tokens)
        self.requests.append(request)
        self.windows["arrivals"].add(now_s, 1.0)
        self.windows["inputs"].add(now_s, r.input_tokens)
        self.windows["outputs"].add(now_s, r.output_tokens)
        self.last_arrival_s = now_s
        # Routed to the fleet that serves now: the old GPU type's until the new one is ready.
        serving = [i for i, f in self.lanes.items() if f.serving(now_s)]
        target = self.active if self.active in serving or not serving else serving[0]
        fleet = self.lane(target)
        if not fleet.serving(now_s) and fleet.desired_size() == 0 and self.from_zero_at is None:
            self.from_zero_at = now_s
            self.result.cold_starts_from_zero += 1
            self.result.first_request_ttfts_s.append(math.nan)  # filled when it has its first token
            self._first = request
        fleet.route(request, now_s)

    # -- ticks ----------------------------------------------------------------------------

    def observe(self, now_s: float) -> Observation:
        fleet = self.lane(self.active)
        opt = self.svc.options[self.active]
        setup = replace(opt.setup, tick_s=self.tick_s, window_s=self.window_s)
        w = self.windows
        obs = _observe(fleet, now_s, setup, w["arrivals"], w["inputs"], w["outputs"], w["ttfts"], w["tpots"])
        others = sum(f.waiting(now_s) for i, f in self.lanes.items() if i != self.active)
        return replace(obs, waiting=(obs.waiting or 0.0) + others) if others else obs

    def tick_input(self, now_s: float) -> TickInput:
        """The deployed tick's inputs (kvscale.autoscaling.tick): the observation, the idle
        rule's figures with min_replicas 0, and the service's seat in the budget."""
        obs = self.observe(now_s)
        idle = None
        if self.svc.min_replicas == 0:
            waiting = float(
                self.outstanding() - sum(len(r.running) for f in self.lanes.values() for r in f.serving(now_s))
            )
            idle = Idle(now_s - self.last_arrival_s, self.svc.idle_window_s, waiting)
        current = self.svc.options[self.active].gpu_type if self.lane(self.active).desired_size() else None
        seat = Seat(
            self.svc.name,
            tuple(SeatOption(o.gpu_type, o.gpus_per_replica, o.rate_per_replica) for o in self.svc.options),
            self.active,
            self.svc.priority,
            self.svc.min_replicas,
            self.svc.max_replicas,
            current,
        )
        return self.policy.tick_input(obs, idle, seat)

    def ticked(self, done: TickDecision) -> None:
        self.policy.ticked(done)
        self.wanted = min(self.svc.max_replicas, done.decision.replicas)

    def act_on(self, index: int) -> None:
        """The policy acts on option `index` from now: its model and tuning, and the capacity
        searches replay on it (what was confirmed on another GPU type is dropped)."""
        self.active = index
        self.policy.capacity = self.capacities[index]
        self.policy.config = self.configs[index]
        if self.refresh is not None:
            self.refresh.on(self.svc.options[index].setup, self.capacities[index])

    def index_of(self, gpu_type: str) -> int:
        return next(i for i, o in enumerate(self.svc.options) if o.gpu_type == gpu_type)

    def shrink(self, grant: Grant, now_s: float, grace_s: float = DEFAULT_PREEMPTION_GRACE_S) -> None:
        """Scale-downs of this tick: the granted fleet to at most its grant; other GPU types to
        none at once (their replicas drain: the GPUs they leave are another service's grant).
        A scale-down below what the service wants is a preemption: its replicas drain within
        `grace_s`; one the policy asked for drains within the fleet's own bound."""
        index = self.index_of(grant.gpu_type)
        if index != self.active:
            self.act_on(index)
            self.result.moves += 1
            self.policy.state = replace(self.policy.state, calibration=1.0, slo_factor=1.0, targets=())
        fleet = self.lane(index)
        if fleet.desired_size() > grant.replicas:
            preempted = grant.replicas < self.wanted
            released = fleet.scale_to(grant.replicas, now_s, grace_s if preempted else None)
            if preempted:
                self.result.preemptions += released
        for i, other in self.lanes.items():
            if i != index and other.desired_size():
                other.scale_to(0, now_s)  # drains now: its GPUs are someone else's grant

    def grow(self, grant: Grant, now_s: float, free: dict[str, float]) -> None:
        """Scale-ups of this tick, only into GPUs the budget has free now."""
        fleet = self.lane(self.active)
        more = grant.replicas - fleet.desired_size()
        if more <= 0:
            return
        room = free.get(grant.gpu_type, math.inf)
        fits = more if math.isinf(room) else min(more, int(room // grant.gpus_per_replica))
        if fits > 0:
            fleet.scale_to(fleet.desired_size() + fits, now_s)
            if grant.gpu_type in free:
                free[grant.gpu_type] -= fits * grant.gpus_per_replica

    def record(self, now_s: float, grant: Grant) -> None:
        if grant.held:
            self.result.held_ticks += 1
        if self.lane(self.active).desired_size() < self.wanted:
            self.result.grant_wait_s += self.tick_s
        if grant.reason != self.previous_reason:
            self.result.reasons.append((now_s, grant.reason))
            self.previous_reason = grant.reason
        fleet = self.lane(self.active)
        self.result.timeline.append(
            ServicePoint(
                now_s,
                grant.gpu_type,
                grant.replicas,
                grant.wanted,
                len(fleet.serving(now_s)),
                tuple(sorted(self.held_gpus().items())),
            )
        )

    def note_first_token(self) -> None:
        if self.from_zero_at is not None and self._first is not None and self._first.first_token_s >= 0:
            self.result.first_request_ttfts_s[-1] = self._first.ttft_s
            self.from_zero_at = None

    def finish(self, end_s: float) -> None:
        hours = cost = 0.0
        for i, fleet in self.lanes.items():
            fleet.advance_to(end_s, self.finished)
            fleet.end(end_s)  # cuts what replicas hold, rejects what waits at the gateway
            self.done += len(fleet.take_lost())
            h = fleet.gpu_hours()
            hours += h
            cost += h * self.svc.options[i].setup.cfg.gpu.price_usd_per_gpu_hour
        self.result.gpu_hours, self.result.cost_usd = hours, cost


class _PoolsRun:
    """A pools service in the fleet's loop: its replay (kvscale.sim.disaggregated_fleet.
    PoolsStepper), kvscale's policy on each pool (kvscale.sim.pool_policies.kvscale_pools), each
    pool seated in the budget under its own name."""

    def __init__(self, svc: PoolsService, tick_s: float, window_s: float) -> None:
        self.svc = svc
        self.tick_s = tick_s
        pool = replace(svc.setup.prefill, tick_s=tick_s, window_s=window_s)
        setup = replace(
            svc.setup,
            prefill=pool,
            decode=replace(svc.setup.decode, tick_s=tick_s, window_s=window_s),
            gpu_limits=None,  # the fleet's budget governs, not the setup's own
        )
        self.setup = setup
        self.replay = PoolsStepper(setup, Source(svc.trace))
        self.policy = kvscale_pools(setup, svc.shape, svc.max_replicas, svc.headroom, svc.step_target_s)
        self.seats = pool_seats(
            setup,
            self.policy,
            svc.shape,
            (svc.pool("prefill"), svc.pool("decode")),
            svc.priority,
            svc.min_replicas,
            svc.max_replicas,
        )
        self.fleets = (self.replay.prefill, self.replay.decode)
        self.gpus = (setup.prefill.cfg.gpus, setup.decode.cfg.gpus)
        self.result = PoolsResult(
            svc,
            self.replay.requests,
            rates=(self.seats[0].options[0].rate_per_replica, self.seats[1].options[0].rate_per_replica),
        )
        self.wanted = (1, 1)
        self.target = (1, 1)
        self.view: PoolsView | None = None
        self.previous_reason = ""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.svc.pool("prefill"), self.svc.pool("decode"))

    @property
    def requests(self) -> list[SimRequest]:
        return self.replay.requests

    def opening(self) -> list[Demand]:
        floor = max(1, self.svc.min_replicas)
        return [
            Demand(
                name, (Option(seat.options[0].gpu_type, gpus, max(floor, pool.initial_replicas)),), seat.priority, floor
            )
            for name, seat, gpus, pool in zip(
                self.names, self.seats, self.gpus, (self.setup.prefill, self.setup.decode), strict=True
            )
        ]

    def open(self, first: Allocation, budget: Budget) -> None:
        """The planned pools where the budget holds them; else what it grants split by what they
        serve together (kvscale.control.pool_budget.cap_pools' rule for new pools); with no room
        for one worker of each they start with none and wait for GPUs."""
        planned = (max(1, self.setup.prefill.initial_replicas), max(1, self.setup.decode.initial_replicas))
        got = tuple(first.grant(name).replicas for name in self.names)
        start = (got[0], got[1])
        gpu = self.setup.prefill.cfg.gpu.name
        if gpu == self.setup.decode.cfg.gpu.name and gpu in budget.limits and start != planned:
            total = start[0] * self.gpus[0] + start[1] * self.gpus[1]
            fits = total >= self.gpus[0] + self.gpus[1]
            rates = self.svc.planned_rates or self.result.rates
            start = split_pools(total, planned, rates, self.gpus) if fits else (0, 0)
        self.replay.start(start[0], start[1])
        self.target = (max(1, start[0]), max(1, start[1]))

    def held_gpus(self) -> dict[str, int]:
        return {gpu: n for gpu, n in self.replay.held().items() if n}

    def next_arrival(self) -> float:
        return self.replay.next_arrival()

    def outstanding(self) -> int:
        return self.replay.outstanding()

    def advance_to(self, now_s: float) -> None:
        self.replay.advance(now_s)

    def arrive(self, now_s: float) -> None:
        self.replay.arrive(now_s)

    def tick_inputs(self, now_s: float) -> list[TickInput]:
        self.view = self.replay.view(now_s)
        return self.policy.tick_inputs(self.view, self.seats)

    def take(self, dones: Sequence[TickDecision], now_s: float) -> None:
        done_p, done_d = dones
        cap = self.svc.max_replicas
        self.wanted = (
            max(1, min(cap, done_p.decision.replicas)),
            max(1, min(cap, done_d.decision.replicas)),
        )
        want_p, want_d = self.policy.ticked(done_p, done_d)
        self.replay.decided(now_s, want_p, want_d)
        self.target = (max(1, want_p.replicas), max(1, want_d.replicas))  # a pool never goes to zero

    def shrink_to(self, by_name: Mapping[str, Grant], now_s: float, grace_s: float) -> None:
        """Scale-downs: a pool above its split count drains to it; below what its policy wants it is
        a preemption (its replicas drain within `grace_s`)."""
        del by_name
        for fleet, target, wanted in zip(self.fleets, self.target, self.wanted, strict=True):
            if fleet.desired_size() > target:
                preempted = target < wanted
                released = fleet.scale_to(target, now_s, grace_s if preempted else None)
                if preempted:
                    self.result.preemptions += released

    def grow(self, grant: Grant, now_s: float, free: dict[str, float]) -> None:
        """One pool's scale-up to its split count, only into GPUs the budget has free now."""
        i = self.names.index(grant.name)
        fleet, gpus = self.fleets[i], self.gpus[i]
        more = self.target[i] - fleet.desired_size()
        if more <= 0:
            return
        room = free.get(grant.gpu_type, math.inf)
        fits = more if math.isinf(room) else min(more, int(room // gpus))
        if fits > 0:
            fleet.scale_to(fleet.desired_size() + fits, now_s)
            if grant.gpu_type in free:
                free[grant.gpu_type] -= fits * gpus

    def record_at(self, now_s: float, by_name: Mapping[str, Grant]) -> None:
        assert self.view is not None  # ticked
        self.replay.record(now_s, self.view)
        result = self.result
        held = [t < w for t, w in zip(self.target, self.wanted, strict=True)]
        for role, h in zip(("prefill", "decode"), held, strict=True):
            result.pool_held_ticks[role] += int(h)
        if any(held):
            result.held_ticks += 1
            granted = sum(by_name[name].replicas * g for name, g in zip(self.names, self.gpus, strict=True))
            result.splits[PoolSplit(self.target[0], self.target[1], self.wanted[0], self.wanted[1], granted)] += 1
        sizes = tuple(f.desired_size() for f in self.fleets)
        if any(n < w for n, w in zip(sizes, self.wanted, strict=True)):
            result.grant_wait_s += self.tick_s
        # The operator's HeldByBudget message for pools (kvscale.control.pool_budget.govern_pools)
        grants = [by_name[name] for name in self.names]
        reason = "; ".join(
            f"{role} wanted {w}, gets {t} on {g.gpu_type} x{g.gpus_per_replica}"
            for role, w, t, g in zip(("prefill", "decode"), self.wanted, self.target, grants, strict=True)
        )
        if any(t != g.replicas for t, g in zip(self.target, grants, strict=True)):
            total = sum(g.replicas * g.gpus_per_replica for g in grants)
            reason += f"; the {total} GPUs split to serve the most requests/s, not in proportion"
        if reason != self.previous_reason:
            result.reasons.append((now_s, reason))
            self.previous_reason = reason
        ready = tuple(len(f.serving(now_s)) for f in self.fleets)
        gpus = tuple(f.held() * g for f, g in zip(self.fleets, self.gpus, strict=True))
        result.pool_timeline.append(
            PoolsPoint(
                now_s,
                self.target,
                self.wanted,
                (ready[0], ready[1]),
                (gpus[0], gpus[1]),
            )
        )
        result.timeline.append(
            ServicePoint(
                now_s,
                self.setup.decode.cfg.gpu.name,
                sum(self.target),
                sum(self.wanted),
                sum(ready),
                tuple(sorted(self.held_gpus().items())),
            )
        )

    def finish(self, end_s: float) -> None:
        self.replay.cut(end_s)
        replay = self.replay.result("kvscale", end_s)
        self.result.replay = replay
        self.result.gpu_hours, self.result.cost_usd = replay.gpu_hours, replay.cost_usd


_Run = _ServiceRun | _PoolsRun


def simulate_fleet(
    budget: Budget,
    services: Sequence[FleetService | PoolsService],
    tick_s: float = TICK_S,
    window_s: float = WINDOW_S,
    progress: Callable[[float], None] | None = None,
    drain_limit_s: float = DRAIN_LIMIT_S,
    preemption_grace_s: float = DEFAULT_PREEMPTION_GRACE_S,
    online: bool = True,
) -> FleetResult:
    """Runs until every request ended, or `drain_limit_s` after the last arrival: then what
    replicas hold is cut and what waits at the gateway rejected (each counted, and missed).
    `preemption_grace_s`: how long a replica the budget takes from a service drains. `online`:
    each service's policy runs the operator's capacity search on its own past window (as
    `kvscale simulate` does: kvscale.sim.compare.make_policies); off, it acts on the model's."""
    runs: list[_Run] = [
        _PoolsRun(s, tick_s, window_s) if isinstance(s, PoolsService) else _ServiceRun(s, tick_s, window_s, online)
        for s in services
    ]
    last_arrival_s = max((r.arrival_s for s in services for r in s.trace), default=0.0)
    # The start: each service's planned replicas (each pools service's planned pools), as the budget allows, warm.
    first = grants(budget, [d for r in runs for d in r.opening()])
    for run in runs:
        run.open(first, budget)
    usage: list[tuple[float, dict[str, int]]] = [(0.0, _held(runs))]
    previous: dict[str, Grant] = first.by_name
    next_tick = tick_s
    while True:
        arrival_at = min((r.next_arrival() for r in runs), default=math.inf)
        if math.isinf(arrival_at) and (
            not any(r.outstanding() for r in runs) or next_tick > last_arrival_s + drain_limit_s
        ):
            break
        now = min(arrival_at, next_tick)
        # Between ticks services are independent: an arrival advances only its own service
        # (so each steps exactly as it would alone), a tick advances all.
        if now == arrival_at:
            run = next(r for r in runs if r.next_arrival() == arrival_at)
            run.advance_to(now)
            run.arrive(now)
            continue
        for run in runs:
            run.advance_to(now)
        allocation = _tick(budget, runs, previous, now, preemption_grace_s)
        previous = allocation.by_name
        usage.append((now, _held(runs)))
        next_tick += tick_s
        if progress is not None:
            progress(now)
    end = max([r.finish_s for run in runs for r in run.requests if r.done] + [0.0])
    if any(r.outstanding() for r in runs):
        end = min(max(end, next_tick - tick_s), last_arrival_s + drain_limit_s)
    for run in runs:
        run.finish(end)
    return FleetResult(budget, [r.result for r in runs], usage, end)


def _held(runs: Sequence[_Run]) -> dict[str, int]:
    held: dict[str, int] = {}
    for run in runs:
        for gpu, n in run.held_gpus().items():
            held[gpu] = held.get(gpu, 0) + n
    return held


def _tick(budget: Budget, runs: Sequence[_Run], previous: dict[str, Grant], now: float, grace_s: float) -> Allocation:
    inputs: list[TickInput] = []
    spans: list[slice] = []
    for run in runs:
        mine = run.tick_inputs(now)
        spans.append(slice(len(inputs), len(inputs) + len(mine)))
        inputs += mine
    # Each pools service's two wants are split by what they serve together (SplitPooled).
    pairs = [(span.start, span.start + 1) for span in spans if span.stop - span.start == 2]
    pooled = SplitPooled(budget, previous, pairs) if pairs else Pooled(budget, previous)
    dones = tick_all(inputs, pooled)
    for run, span in zip(runs, spans, strict=True):
        run.take(dones[span], now)
    allocation = pooled.allocation
    assert allocation is not None  # answered above
    by_name = allocation.by_name
    for run in runs:
        run.shrink_to(by_name, now, grace_s)
    held = _held(runs)
    free: dict[str, float] = {gpu: limit - held.get(gpu, 0) for gpu, limit in budget.limits.items()}
    owner = {name: run for run in runs for name in run.names}
    for grant in allocation.grants:  # in rank order: the first in line starts first
        owner[grant.name].grow(grant, now, free)
    for run in runs:
        run.record_at(now, by_name)
    return allocation
