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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvscale.autoscaling.budget import Allocation, Budget, Demand, Grant, Option
from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.autoscaling.drain import DEFAULT_PREEMPTION_GRACE_S
from kvscale.autoscaling.observation import Observation
from kvscale.autoscaling.tick import Idle, Pooled, Seat, SeatOption, TickDecision, TickInput, grants, tick_all
from kvscale.autoscaling.tuning import policy_config
from kvscale.sim.engine import SimRequest, StepTimes
from kvscale.sim.fleet import Fleet
from kvscale.sim.online_refresh import OnlineRefresh
from kvscale.sim.policies import KvscalePolicy
from kvscale.sim.run import TICK_S, WINDOW_S, SimSetup, Source, _observe, _Window
from kvscale.sim.trace import TraceRequest

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


@dataclass
class FleetResult:
    budget: Budget
    services: list[ServiceResult]
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


def simulate_fleet(
    budget: Budget,
    services: list[FleetService],
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
    runs = [_ServiceRun(s, tick_s, window_s, online) for s in services]
    last_arrival_s = max((r.arrival_s for s in services for r in s.trace), default=0.0)
    # The start: each service's planned replicas, as the budget allows, warm.
    first = grants(
        budget,
        [
            Demand(
                r.svc.name,
                tuple(
                    Option(o.gpu_type, o.gpus_per_replica, max(r.svc.min_replicas, o.setup.initial_replicas))
                    for o in r.svc.options
                ),
                r.svc.priority,
                r.svc.min_replicas,
            )
            for r in runs
        ],
    )
    for run in runs:
        grant = first.grant(run.svc.name)
        run.act_on(run.index_of(grant.gpu_type))
        run.lane(run.active).start(grant.replicas, 0.0, warm=True)
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


def _held(runs: list[_ServiceRun]) -> dict[str, int]:
    held: dict[str, int] = {}
    for run in runs:
        for gpu, n in run.held_gpus().items():
            held[gpu] = held.get(gpu, 0) + n
    return held


def _tick(
    budget: Budget, runs: list[_ServiceRun], previous: dict[str, Grant], now: float, grace_s: float
) -> Allocation:
    pooled = Pooled(budget, previous)
    for run, done in zip(runs, tick_all([r.tick_input(now) for r in runs], pooled), strict=True):
        run.ticked(done)
    allocation = pooled.allocation
    assert allocation is not None  # answered above
    by_name = allocation.by_name
    for run in runs:
        run.shrink(by_name[run.svc.name], now, grace_s)
    held = _held(runs)
    free: dict[str, float] = {gpu: limit - held.get(gpu, 0) for gpu, limit in budget.limits.items()}
    for grant in allocation.grants:  # in rank order: the first in line starts first
        run = next(r for r in runs if r.svc.name == grant.name)
        run.grow(grant, now, free)
    for run in runs:
        run.record(now, by_name[run.svc.name])
    return allocation
