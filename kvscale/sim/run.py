"""Runs one policy over one load: arrivals, engine steps, policy ticks, the metrics each
policy sees, and the result every report is made of."""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvscale.autoscaling.observation import Observation
from kvscale.sim.engine import SimRequest, StepTimes
from kvscale.sim.fleet import Fleet, FleetSpec
from kvscale.sim.policies import SimPolicy
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo

TICK_S = 15.0  # the HPA controller's default sync period: every policy ticks alike
WINDOW_S = 60.0


@dataclass(frozen=True)
class SimSetup:
    cfg: ServingConfig
    slo: Slo
    max_batch: int
    cold_start_s: float
    initial_replicas: int
    tick_s: float = TICK_S
    window_s: float = WINDOW_S
    routing: str = "service"  # service | round-robin | gateway (kvscale.sim.fleet)
    seed: int = 0  # routing choices and cold-start jitter
    cold_start_jitter: float = 0.0

    def fleet_spec(self) -> FleetSpec:
        return FleetSpec(
            max_batch=self.max_batch,
            kv_capacity_tokens=self.cfg.memory.kv_capacity_tokens,
            token_budget=self.cfg.max_num_batched_tokens,
            gpus_per_replica=self.cfg.gpus,
            cold_start_s=self.cold_start_s,
            routing=self.routing,
            seed=self.seed,
            cold_start_jitter=self.cold_start_jitter,
        )


@dataclass(frozen=True)
class TimelinePoint:
    time_s: float
    arrival_rate_per_s: float
    desired: int
    ready: int
    ttft_p_s: float | None
    tpot_p_s: float | None


@dataclass
class SimResult:
    policy: str
    requests: list[SimRequest]
    gpu_hours: float
    cost_usd: float
    scale_events: int
    preemptions: int
    duration_s: float
    timeline: list[TimelinePoint] = field(default_factory=list)
    decisions: list[tuple[float, int, str]] = field(default_factory=list)
    routing: str = "service"
    token_gaps: Counter[float] = field(default_factory=Counter)  # per-token gap (s) -> tokens, all replicas
    # (started, stopped) of every replica, for GPU-hours over part of the run
    replica_spans: list[tuple[float, float]] = field(default_factory=list)


class _Window:
    """Values stamped with a time, of which the last `window_s` seconds are kept."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.items: deque[tuple[float, float]] = deque()

    def add(self, time_s: float, value: float) -> None:
        self.items.append((time_s, value))

    def values(self, now_s: float) -> list[float]:
        while self.items and self.items[0][0] < now_s - self.window_s:
            self.items.popleft()
        return [v for _, v in self.items]


def _percentile(values: list[float], percentile: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(percentile / 100 * len(ordered)) - 1))]


class Source:
    """Arrivals: an open-loop trace, or a closed loop of N users who each send the next
    request when the previous one finishes."""

    def __init__(
        self, trace: list[TraceRequest] | None = None, closed: tuple[int, int, int, float] | None = None
    ) -> None:
        self._heap: list[tuple[float, int, TraceRequest]] = []
        self._seq = 0
        self.closed = closed
        if trace is not None:
            for r in trace:
                self._push(r)
        elif closed is not None:
            users, inp, out, _ = closed
            for _ in range(users):
                self._push(TraceRequest(0.0, inp, out))

    def _push(self, r: TraceRequest) -> None:
        heapq.heappush(self._heap, (r.arrival_s, self._seq, r))
        self._seq += 1

    def next_time(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def pop(self) -> TraceRequest:
        return heapq.heappop(self._heap)[2]

    def finished(self, request: SimRequest) -> None:
        if self.closed is not None:
            _, inp, out, duration = self.closed
            if request.finish_s < duration:
                self._push(TraceRequest(request.finish_s, inp, out))


def simulate(
    setup: SimSetup,
    source: Source,
    policy: SimPolicy,
    progress: Callable[[float], None] | None = None,
    steps: StepTimes | None = None,
) -> SimResult:
    """`steps`: step times of setup.cfg cached by an earlier run (several runs of one
    configuration share them)."""
    fleet = Fleet(setup.fleet_spec(), steps if steps is not None and steps.cfg == setup.cfg else StepTimes(setup.cfg))
    fleet.start(setup.initial_replicas, 0.0, warm=True)
    requests: list[SimRequest] = []
    arrivals, inputs, outputs = _Window(setup.window_s), _Window(setup.window_s), _Window(setup.window_s)
    ttfts, tpots = _Window(setup.window_s), _Window(setup.window_s)
    timeline: list[TimelinePoint] = []
    decisions: list[tuple[float, int, str]] = []
    next_tick = setup.tick_s
    finished: list[SimRequest] = []
    done = 0

    def account(now_s: float) -> None:
        nonlocal done
        for r in finished:
            ttfts.add(r.first_token_s, r.ttft_s)
            if r.output_tokens > 1:
                tpots.add(r.finish_s, r.tpot_s)
            source.finished(r)
        done += len(finished)
        finished.clear()

    closed_loop = source.closed is not None
    while True:
        arrival_at = source.next_time()
        outstanding = len(requests) - done
        if math.isinf(arrival_at) and outstanding == 0:
            break
        now = min(arrival_at, next_tick)
        fleet.advance_to(now, finished, stop_after_finish=closed_loop)
        done += len(fleet.take_lost())  # cut at a drain's bound: ended, missed
        if closed_loop and finished:
            # A user sends the next request the moment the previous one finishes: release
            # it now (at its finish time), before any replica runs past that moment.
            account(now)
            continue
        if finished:
            account(now)
        if now == arrival_at:
            r = source.pop()
            request = SimRequest(len(requests), r.arrival_s, r.input_tokens, r.output_tokens)
            requests.append(request)
            arrivals.add(now, 1.0)
            inputs.add(now, r.input_tokens)
            outputs.add(now, r.output_tokens)
            fleet.route(request, now)
            continue
        obs = _observe(fleet, now, setup, arrivals, inputs, outputs, ttfts, tpots)
        decision = policy.decide(obs)
        if decision.replicas != fleet.desired_size():
            decisions.append((now, decision.replicas, decision.reason))
        fleet.scale_to(max(decision.replicas, 1 if outstanding else 0, 1), now)
        timeline.append(
            TimelinePoint(
                now, obs.arrival_rate_per_s or 0.0, fleet.desired_size(), obs.ready_replicas, obs.ttft_p_s, obs.tpot_p_s
            )
        )
        next_tick += setup.tick_s
        if progress is not None:
            progress(now)
    end = max([r.finish_s for r in requests if r.done] + [0.0])
    fleet.stop_all(end)
    gpu_hours = fleet.gpu_hours()
    return SimResult(
        policy=policy.name,
        requests=requests,
        gpu_hours=gpu_hours,
        cost_usd=gpu_hours * setup.cfg.gpu.price_usd_per_gpu_hour,
        scale_events=fleet.scale_events,
        preemptions=sum(r.preemptions for r in fleet.replicas),
        duration_s=end,
        timeline=timeline,
        decisions=decisions,
        routing=setup.routing,
        token_gaps=sum((r.token_gaps for r in fleet.replicas), Counter()),
        replica_spans=[(r.started_s, r.stopped_s if r.stopped_s is not None else end) for r in fleet.replicas],
    )


def _observe(
    fleet: Fleet,
    now: float,
    setup: SimSetup,
    arrivals: _Window,
    inputs: _Window,
    outputs: _Window,
    ttfts: _Window,
    tpots: _Window,
) -> Observation:
    serving = fleet.serving(now)
    elapsed = min(setup.window_s, now)
    ins, outs = inputs.values(now), outputs.values(now)
    return Observation(
        time_s=now,
        ready_replicas=len(serving),
        starting_replicas=len(fleet.starting(now)),
        arrival_rate_per_s=len(arrivals.values(now)) / elapsed if elapsed > 0 else 0.0,
        input_tokens_mean=sum(ins) / len(ins) if ins else None,
        output_tokens_mean=sum(outs) / len(outs) if outs else None,
        # work arriving (the engine's counters count it as computed; the same over a window)
        prefill_tokens_per_s=sum(ins) / elapsed if ins and elapsed > 0 else None,
        decode_tokens_per_s=sum(outs) / elapsed if outs and elapsed > 0 else None,
        ttft_p_s=_percentile(ttfts.values(now), setup.slo.percentile),
        tpot_p_s=_percentile(tpots.values(now), setup.slo.percentile),
        running=float(sum(len(r.running) for r in serving)),
        waiting=float(fleet.waiting(now)),
        kv_usage=sum(r.kv_usage for r in serving) / len(serving) if serving else None,
        waiting_max=float(fleet.waiting_max(now)),
        started_to_ready_s=fleet.became_ready(now - setup.tick_s, now),
    )


def bucket_rates(trace: list[TraceRequest], bucket_s: float) -> list[float]:
    """Arrival rate per bucket of the trace (requests/s)."""
    if not trace:
        return []
    times = [r.arrival_s for r in trace]
    buckets = math.ceil((times[-1] + 1e-9) / bucket_s) or 1
    edges = [i * bucket_s for i in range(buckets + 1)]
    return [
        (bisect.bisect_left(times, edges[i + 1]) - bisect.bisect_left(times, edges[i])) / bucket_s
        for i in range(buckets)
    ]
