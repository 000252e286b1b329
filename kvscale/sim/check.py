"""The plan checked before it is deployed, and sized by that check: a sample of the workload
replayed through the simulator on the chosen configuration (the same routing), searching
below and above the analytic replica count for the fewest that meet the SLO percentile."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from kvscale.planner.search import Feasible, Plan, PlanRequest, SimulatedSizing, ranked_by_checks, with_check
from kvscale.sim.engine import Replica, SimRequest, StepTimes
from kvscale.sim.policies import StaticPolicy
from kvscale.sim.report import attainment
from kvscale.sim.run import SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.load import ReplicaModel
from kvscale.sizing.workload import Slo, Workload

SAMPLE_SPAN_S = 600.0  # the busiest stretch of the trace this long is replayed
SAMPLE_MAX_REQUESTS = 3000  # fewer when the rate is high, so the check stays a few seconds
# The search. Each run replays the whole sample (0.2-0.6 s on this project's 2-core machine),
# so it takes few: below the analytic count it steps down to DOWN of the last count that met,
# above it doubles up to MAX_UP times the analytic count, then bisects until the bracket is
# within TOLERANCE of its top (the aim is a plan within 1.1x the cheapest fixed fleet).
DOWN = 0.7
MAX_UP = 4
TOLERANCE = 0.05
# A doubling that closes less than this share of the gap to the target: the misses are not
# queueing (prompts whose own prefill exceeds the TTFT target, a TPOT no spreading fixes), so
# no fleet will meet the SLO and the search stops.
PLATEAU = 0.25
# An analytic count more than twice this many times the fewest replicas the load needs (at
# their no-queueing capacity) is not where the search starts: it starts at this many times
# that fewest, and goes up.
FAR = 16
# The knee (the closest fleet when none meets the target) is bisected to within this share:
# attainments this close to the best differ by a few requests, finer steps buy nothing.
KNEE_TOLERANCE = 0.25
# Candidates of the analytic ranking replayed by plan --trace (the chosen one first): the
# simulator may reorder what the analytic model ranks close (its count is per percentile of
# every term at once, the replay's per request).
CHECKED_CANDIDATES = 6

Routing = Literal["service", "gateway"]


def sample(trace: list[TraceRequest], rate_per_s: float) -> list[TraceRequest]:
    """The busiest SAMPLE_SPAN_S of the trace (its bursts and length mix kept), its clock
    scaled so that its mean rate is `rate_per_s`, at most SAMPLE_MAX_REQUESTS long."""
    if not trace:
        return []
    times = [r.arrival_s for r in trace]
    best_start, best_count, j = 0, 0, 0
    for i, t in enumerate(times):
        while times[j] < t - SAMPLE_SPAN_S:
            j += 1
        if i - j + 1 > best_count:
            best_count, best_start = i - j + 1, j
    window = trace[best_start : best_start + best_count][:SAMPLE_MAX_REQUESTS]
    start = window[0].arrival_s
    span = max(window[-1].arrival_s - start, 1.0)
    factor = (len(window) / span) / rate_per_s if rate_per_s > 0 else 1.0  # > 1: play slower
    return [TraceRequest((r.arrival_s - start) * factor, r.input_tokens, r.output_tokens) for r in window]


def search_replicas(
    attain: Callable[[int], float],
    analytic: int,
    target: float,
    seen: dict[int, float] | None = None,
    meets: Callable[[int], bool] | None = None,
    most: int | None = None,
    start: int | None = None,
    noise: float = 0.0,
) -> tuple[int, bool]:
    """The fewest replicas whose attainment (`attain(n)`) reaches `target`, searched from
    `start` (default: the analytic count) both ways, and whether one does. When none up to
    MAX_UP x analytic (or `most`, a limit such as --max-replicas or the free GPUs, when lower)
    does, the closest fleet: the knee, the fewest whose attainment is within `noise` (a share)
    of the best any fleet tried reaches. `seen` collects every count whose attainment was
    measured; `meets(n)` (default: attain(n) >= target) answers only whether n meets, which
    may cost less (a replay stopped at its first miss too many).

    Each step's first guess takes misses as inversely proportional to replicas (queueing
    misses fall faster, so the guess errs toward more replicas): from n replicas missing m
    of an allowance a, n x m / a; below, at most DOWN x n; above, at most twice n. Above,
    a doubling that gains less than PLATEAU of the gap, or less than `noise`, ends it: more
    replicas stopped helping."""
    seen = {} if seen is None else seen
    first = analytic if start is None else max(1, start)
    allowed = max(1.0 - target, 1e-9)

    def at(n: int) -> float:
        if n not in seen:
            seen[n] = attain(n)
        return seen[n]

    answers: dict[int, bool] = {}

    def ok(n: int) -> bool:
        if n in seen:
            return seen[n] >= target
        if n not in answers:
            answers[n] = meets(n) if meets is not None else at(n) >= target
        return answers[n]

    def guess(n: int) -> int:
        return math.ceil(n * (1.0 - at(n)) / allowed)

    lo, hi = 0, first  # lo misses (or is 0), hi meets
    if at(first) >= target:
        while hi > 1:
            probe = max(1, min(math.floor(hi * DOWN), guess(hi) if hi in seen else hi - 1, hi - 1))
            if not ok(probe):
                lo = probe
                break
            hi = probe
    else:
        lo, met = first, False
        top = analytic * MAX_UP if most is None else max(first, min(most, analytic * MAX_UP))
        while lo < top:
            nxt = min(top, max(lo + 1, min(2 * lo, guess(lo) if lo == first else 2 * lo)))
            if at(nxt) >= target:
                hi, met = nxt, True
                break
            gap, closed, doubled = target - at(lo), at(nxt) - at(lo), nxt >= 2 * lo
            lo = nxt
            # Only a doubling judges a plateau: a step of a few replicas is within the
            # replay's noise (one request is 0.05% of a 2,000-request sample).
            if doubled and closed < max(PLATEAU * gap, noise):
                break
        if not met:
            return _knee(at, seen, noise), False
    while hi - lo > max(1.0, TOLERANCE * hi):
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi, True


def _knee(at: Callable[[int], float], seen: dict[int, float], noise: float) -> int:
    """The closest fleet when none meets the target: the fewest replicas whose attainment is
    within `noise` of the best seen, bisected down from the fewest such count tried (the
    replicas past the knee buy attainment the sample cannot tell from noise)."""
    best = max(seen.values())
    knee = min(n for n, a in seen.items() if a >= best - noise)
    if noise <= 0:
        return knee
    lo = max((n for n in seen if n < knee), default=0)  # below the knee: outside the noise
    while knee - lo > max(1.0, KNEE_TOLERANCE * knee):
        mid = (lo + knee) // 2
        if at(mid) >= best - noise:
            knee = mid
        else:
            lo = mid
    return knee


def service_attainment(setup: SimSetup, replay: list[TraceRequest], replicas: int, steps: StepTimes) -> float:
    """The attainment of a static fleet of `replicas` warm replicas behind a plain Service,
    as kvscale.sim.run.simulate gives it, in time that does not grow with idle replicas.

    Behind a Service the fleet routes each arrival at random (kvscale.sim.fleet.Fleet.route:
    one draw of the fleet's seeded generator over every serving replica), whatever the
    replicas hold; a static warm fleet never changes, so each replica serves its own share
    alone. simulate() advances every replica to every event (each arrival, each tick), and a
    busy replica's bulk of decode steps is cut there (its step time is re-read at the cut):
    each replica here is advanced to the same events while it is busy, and skips them while
    it is idle (where advancing only moves its clock), so its steps are the same."""
    rng = random.Random(setup.seed)
    shares: dict[int, list[SimRequest]] = {}
    for i, r in enumerate(replay):
        shares.setdefault(rng.randrange(replicas), []).append(
            SimRequest(i, r.arrival_s, r.input_tokens, r.output_tokens)
        )
    # The run's events up to the last arrival: arrivals and ticks (summed as simulate() sums them).
    events = [r.arrival_s for r in replay]
    last = events[-1] if events else 0.0
    tick = setup.tick_s
    while tick <= last:
        events.append(tick)
        tick += setup.tick_s
    events.sort()
    spec = setup.fleet_spec()
    slo = setup.slo
    met = 0
    for index, mine in shares.items():
        replica = Replica(index, steps, spec.max_batch, spec.kv_capacity_tokens, spec.token_budget, 0.0, 0.0)
        finished: list[SimRequest] = []
        for request in mine:
            i = bisect.bisect_right(events, replica.clock)
            while not replica.idle and i < len(events) and events[i] < request.arrival_s:
                replica.advance_to(events[i], finished)
                i += 1
            replica.advance_to(request.arrival_s, finished)
            replica.enqueue(request)
        i = bisect.bisect_right(events, replica.clock)
        while not replica.idle and i < len(events):
            replica.advance_to(events[i], finished)
            i += 1
        after = tick
        while not replica.idle:  # past the last arrival, only ticks
            replica.advance_to(after, finished)
            after += setup.tick_s
        met += sum(1 for r in mine if r.done and r.ttft_s <= slo.ttft_s and r.tpot_s <= slo.tpot_s)
    return met / len(replay) if replay else 1.0


class Replays:
    """The attainments of the full replays one command has run. A configuration replayed at n
    warm replicas behind a routing on one sample gives one answer (the routing is seeded), so
    a second check of the same candidate reads it instead of replaying it: plan --trace's
    unpinned alternative to an infeasible --tp pin checks the pinned configuration again."""

    def __init__(self) -> None:
        self._known: list[tuple[SimSetup, list[TraceRequest], dict[int, float]]] = []

    def of(self, setup: SimSetup, replay: list[TraceRequest]) -> dict[int, float]:
        """Replicas -> attainment of `setup` (its initial_replicas aside) on this `replay`."""
        setup = replace(setup, initial_replicas=0)
        for known_setup, known_replay, known in self._known:
            if known_replay is replay and known_setup == setup:
                return known
        runs: dict[int, float] = {}
        self._known.append((setup, replay, runs))
        return runs


class _TooManyMisses(Exception):
    """A replay has missed more requests than the percentile allows: it cannot meet it."""


class _Counting(Source):
    """The sample as a source that stops the replay at its first miss beyond `allowed`
    (unfinished requests count as misses too, so the answer is already no)."""

    def __init__(self, replay: list[TraceRequest], slo: Slo, allowed: int) -> None:
        super().__init__(replay)
        self.slo, self.allowed, self.misses = slo, allowed, 0

    def finished(self, request: SimRequest) -> None:
        if not (request.ttft_s <= self.slo.ttft_s and request.tpot_s <= self.slo.tpot_s):
            self.misses += 1
            if self.misses > self.allowed:
                raise _TooManyMisses


def check_plan(
    chosen: Feasible,
    slo: Slo,
    replay: list[TraceRequest],
    routing: Routing = "service",
    most: int | None = None,
    workload: Workload | None = None,
    replays: Replays | None = None,
) -> SimulatedSizing:
    """Replays `replay` on the chosen configuration with fixed fleets of warm replicas and
    returns the fewest that meet the SLO percentile (search_replicas), beside the analytic
    count and its attainment, with why the two differ.

    With the planned `workload`, a search whose analytic count is more than FAR times the
    fewest replicas the replay's rate needs (its no-queueing capacity) starts at FAR times
    that instead (a replay's cost grows with the fleet: thousands of replicas take seconds
    each); the analytic count is then replayed only if the search reaches it. `replays`: the
    attainments of full replays an earlier check in the same command ran (this one adds to them)."""
    analytic = chosen.prediction.replicas
    setup = SimSetup(chosen.config, slo, chosen.prediction.max_batch, 0.0, analytic, routing=routing)
    target = slo.percentile / 100.0
    steps = StepTimes(chosen.config)  # every run's step times: one configuration
    runs: dict[int, float] = {}
    allowed = math.floor((1.0 - target) * len(replay) + 1e-9)
    span = replay[-1].arrival_s - replay[0].arrival_s if replay else 0.0
    start = None
    if workload is not None and span > 0:
        capacity = ReplicaModel(chosen.config, workload).capacity_rate_per_s(chosen.prediction.max_batch)
        fewest = math.ceil(len(replay) / span / capacity) if capacity > 0 else analytic
        # within 2x of FAR x fewest, the analytic count is the better first guess
        start = FAR * max(1, fewest) if analytic > 2 * FAR * max(1, fewest) else None
    # One standard error of the attainment share over the sample: gains below it are noise.
    noise = math.sqrt(target * (1.0 - target) / max(1, len(replay))) if replay else 0.0

    known = (replays if replays is not None else Replays()).of(setup, replay)

    def attain(n: int) -> float:
        if n not in known:
            if routing == "service":
                known[n] = service_attainment(setup, replay, n, steps)
            else:
                result = simulate(replace(setup, initial_replicas=n), Source(replay), StaticPolicy(n), steps=steps)
                known[n] = attainment(result, slo)
        return known[n]

    def meets(n: int) -> bool:
        if routing == "service":  # a full replay costs no more than the run stopped early
            runs[n] = attain(n)
            return runs[n] >= target
        try:
            result = simulate(
                replace(setup, initial_replicas=n), _Counting(replay, slo, allowed), StaticPolicy(n), steps=steps
            )
        except _TooManyMisses:
            return False
        runs[n] = known[n] = attainment(result, slo)  # replayed in full: its attainment is known
        return runs[n] >= target

    replicas, met = search_replicas(attain, analytic, target, runs, meets, most, start, noise)
    if replicas not in runs:
        runs[replicas] = attain(replicas)
    check = SimulatedSizing(
        analytic_replicas=analytic,
        analytic_attainment=runs.get(analytic),
        replicas=replicas,
        attainment=runs[replicas],
        target=target,
        met=met,
        requests=len(replay),
        span_s=span,
        routing=routing,
        tried=tuple(runs.items()),
    )
    return replace(check, why=why(check, most))


def why(check: SimulatedSizing, limit: int | None = None) -> str:
    """Why the simulator's count differs from the model's, in a sentence ("" when equal);
    `limit`: the most replicas the request allows (--max-replicas, the free GPUs)."""
    a, n = check.analytic_replicas, check.replicas
    pct = f"{check.target:.0%}" if check.target * 100 == round(check.target * 100) else f"{check.target:.1%}"
    if not check.met:
        most = max(k for k, _ in check.tried)
        if limit is not None and most >= limit and limit < MAX_UP * a:
            stop = f"the request allows at most {limit} (the replica limit or the free GPUs)"
        elif most >= MAX_UP * a:
            stop = f"the search stops at {MAX_UP}x the analytic count"
        else:
            stop = "more replicas stopped helping"
        best_n, best = max(check.tried, key=lambda t: (t[1], -t[0]))
        knee = (
            f"the closest, {n}, reaches {check.attainment:.2%} of {pct}"
            if best_n == n
            else (
                f"the best, {best_n}, reaches {best:.2%} of {pct}, and the closest fleet, {n}, reaches "
                f"{check.attainment:.2%}: within the sample's noise of it (the knee: more replicas stop helping)"
            )
        )
        return (
            f"no fleet up to {most} replica(s) meets the target in the simulator: {knee}; {stop}: the misses are "
            "mostly not queueing (prompts whose own prefill exceeds the TTFT target, short outputs stretched by "
            "another prompt's chunks wherever they land)"
        )
    first, reached = check.tried[0] if check.tried else (a, check.attainment)
    if n < a:
        analytic = (
            f"{check.analytic_attainment:.2%}"
            if check.analytic_attainment is not None
            else f"not replayed: over {FAR}x the fewest the load needs, so the search started at {first}"
        )
        return (
            f"the simulator confirms fewer: {n} replica(s) reach {check.attainment:.2%} (target {pct}); the "
            f"analytic model, sized for the percentile of every term at once, asked for {a} ({analytic})"
        )
    if n > a:
        analytic = (
            f"the analytic {a} replica(s) reach only {check.analytic_attainment:.2%}"
            if check.analytic_attainment is not None
            else f"from {first} replica(s) ({reached:.2%}) the search passed the analytic {a} without replaying it"
        )
        return (
            f"the simulator needs more: {analytic} (target {pct}) on the sample's bursts and length mix; "
            f"{n} reach {check.attainment:.2%}"
        )
    return ""


def _limit(request: PlanRequest, candidate: Feasible) -> int | None:
    """The most replicas the request allows `candidate`: --max-replicas, and the free GPUs of
    its type in whole replicas."""
    limits = [request.max_replicas] if request.max_replicas is not None else []
    if request.gpu_limits is not None:
        limits.append(request.gpu_limits.get(candidate.gpu, 0) // candidate.config.gpus)
    return min(limits) if limits else None


def _fewer_cost(best_usd_per_hour: float, price_usd_per_hour: float) -> int:
    """The most replicas at `price_usd_per_hour` each that cost less than `best_usd_per_hour`
    (at the planner's rounding)."""
    most = math.floor(best_usd_per_hour / price_usd_per_hour)
    while most >= 1 and round(most * price_usd_per_hour, 6) >= round(best_usd_per_hour, 6):
        most -= 1
    return most


def check_and_size(
    planned: Plan,
    replay: list[TraceRequest],
    routing: Routing = "service",
    advise: bool = True,
    replays: Replays | None = None,
) -> Plan:
    """`planned` sized and ranked by the simulated check: the first CHECKED_CANDIDATES of the
    analytic ranking are replayed in turn, each (once one has passed) only up to the replicas
    that would still cost less than the cheapest passing so far; the cheapest that passes
    wins (planner.ranked_by_checks; for the latency objective, the first that passes).

    When none passes, the plan is infeasible with the analytic choice's closest fleet and
    what would make it feasible: a lower percentile (the closest fleet's attainment), the
    gateway (its attainment there, when behind a Service), another GPU (the analytic
    runner-up on another type); `advise` False leaves those out (they cost a replay behind
    the gateway). `replays`: kept across the checks of one command (Replays)."""
    chosen = planned.chosen
    if chosen is None or not replay:
        return planned
    request = planned.request
    slo = request.slo
    checks: list[SimulatedSizing | None] = []
    best_usd_per_hour = math.inf
    for candidate in (chosen, *planned.alternatives):
        if sum(c is not None for c in checks) >= CHECKED_CANDIDATES:
            break
        limit = _limit(request, candidate)
        if math.isfinite(best_usd_per_hour):
            if request.objective != "cost":
                break  # the fastest that passes: the first, in the analytic order
            cheaper = _fewer_cost(best_usd_per_hour, candidate.config.price_usd_per_hour)
            if cheaper < 1:  # one replica already costs as much: it cannot win
                checks.append(None)
                continue
            limit = cheaper if limit is None else min(limit, cheaper)
        check = check_plan(candidate, slo, replay, routing, limit, request.workload, replays)
        checks.append(check)
        if check.met:
            best_usd_per_hour = min(best_usd_per_hour, check.replicas * candidate.config.price_usd_per_hour)
    ranked = ranked_by_checks(planned, tuple(checks))
    if ranked is not None:
        return ranked
    first = checks[0]
    assert first is not None
    return with_check(planned, first, _feasible_if(planned, chosen, first, replay, routing) if advise else ())


def _feasible_if(
    planned: Plan, chosen: Feasible, check: SimulatedSizing, replay: list[TraceRequest], routing: Routing
) -> tuple[str, ...]:
    slo = planned.request.slo
    knobs = planned.request.knobs
    reached = math.floor(check.attainment * 1000) / 10  # a percentile the closest fleet meets
    out = []
    if reached >= 50.0:
        out.append(
            f"a lower percentile: {check.replicas} replica(s) meet p{reached:g} in the simulated check "
            f"({knobs.percentile} {reached:g} instead of {slo.percentile:g})"
        )
    if routing == "service":
        # One replay, on the smallest fleet the check tried (a replay behind the gateway steps
        # every replica at every event, so the smallest is the cheapest run): whether the
        # router alone turns the misses around; planning behind it sizes anew.
        n = min(k for k, _ in check.tried) if check.tried else check.replicas
        setup = SimSetup(chosen.config, slo, chosen.prediction.max_batch, 0.0, n, routing="gateway")
        result = simulate(setup, Source(replay), StaticPolicy(n), steps=StepTimes(chosen.config))
        behind = attainment(result, slo)
        verdict = "meet the target" if behind >= check.target else "still miss it"
        out.append(
            f"the gateway: behind a least-loaded router {n} replica(s) reach {behind:.2%} and "
            f"{verdict} ({knobs.routing}, which sizes the fleet for that router)"
        )
    others = [a for a in planned.alternatives if a.gpu != chosen.gpu]
    if others:
        other = others[0]
        out.append(
            f"another GPU: {other.prediction.replicas} x {other.tensor_parallel} {other.gpu} is the analytic "
            f"runner-up on another type ({knobs.gpu} {other.gpu}); a GPU with faster prefill shortens the longest prompts"
        )
    else:
        out.append(
            f"another GPU: a type with faster prefill (more compute per replica: a larger {knobs.tensor_parallel}, or "
            f"{knobs.gpu} naming a faster type) shortens the longest prompts"
        )
    return tuple(out)
