"""A disaggregated fleet: a prefill pool and a decode pool, and the KV transfer between them.

A request goes through both pools as vLLM 0.11.0's P/D with its NixlConnector runs it:

1. Prefill. The request reaches the least-loaded prefill replica that could admit it now (the
   endpoint picker behind a gateway: kvscale.sim.fleet's `gateway` routing, the Gateway API
   inference extension's least-loaded choice, as llm-d's P/D scheduler picks a prefill pod
   first). A prefill replica is the aggregated engine (kvscale.sim.engine.Replica) on a copy of
   the request that emits one token: the proxy sends it with max_tokens 1 and
   `do_remote_decode`, it finishes FINISHED_LENGTH_CAPPED after its (chunked, batched by
   max_num_batched_tokens) prefill, and its blocks are kept for the decode side to read
   (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, request_finished). The
   proxy drops that token: the user's first token comes from the decode side (below).
2. KV transfer. The prompt's uncached tokens' KV (one prefill GPU's shard, every GPU sending
   at once) over the path between the pools: kvscale.sizing.disaggregation.kv_transfer_s, the
   planner's figure, per request at its own prompt length. The request then reaches the decode
   pool. (vLLM's decode side allocates the blocks first and reads the KV while the request
   waits in WAITING_FOR_REMOTE_KVS: the wait for a slot and the transfer are added either
   way; here the blocks are not held during the transfer.)
3. Decode. The least-loaded decode replica with a free batch slot and KV for the prompt admits
   it (the gateway holds it until one has room). Once the KV has arrived vLLM's scheduler sets
   `num_computed_tokens` to the prompt less one token (vllm/v1/core/sched/scheduler.py,
   _update_waiting_for_remote_kv: "if num_computed_tokens == request.num_tokens:
   num_computed_tokens -= 1"), so the decode replica computes the prompt's last token in its
   next step, beside its running decodes, and that step emits the first token. A decode
   replica's steps carry no prompt chunk: its admission counts one token of the step's budget
   per new request, and KV memory limits admissions (and preempts the newest, which then
   recomputes its prompt there) as in the aggregated engine.

TTFT = waiting at prefill + prefill + transfer + waiting for a decode slot + the first decode
step; TPOT from the decode replica's steps. Each pool has its own cold start, replicas and
GPU-hours; both are scaled each tick by a `PoolsPolicy` (kvscale.sim.pool_policies): kvscale's
through the one tick (kvscale.autoscaling.tick.tick_all, the two pools as two services), or a
baseline. Step times are the aggregated engine's (kvscale.sim.engine.StepTimes) for each
pool's own configuration: no new physics.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from kvscale.autoscaling.observation import Decision, DecisionKind, Observation
from kvscale.planner.disaggregated import DisaggregatedPlan
from kvscale.sim.engine import Replica, SimRequest, StepTimes
from kvscale.sim.fleet import Fleet
from kvscale.sim.run import SimResult, SimSetup, Source, TimelinePoint, _observe, _percentile, _Window
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.disaggregation import KvTransferPath, kv_transfer_s

ROLES = ("prefill", "decode")
DECODE_SEED_OFFSET = 7  # the decode pool's routing is seeded apart from the prefill pool's


class DecodeReplica(Replica):
    """A decode-only replica: a request arrives with its prompt's KV; its first token is the
    step that computes the prompt's last token beside the running decodes."""

    def _step_tokens(self, request: SimRequest, need: int) -> int:
        """A request whose KV came from the prefill pool takes one token of the step's budget,
        not its prompt; one preempted here recomputes it all (its KV is gone)."""
        return 1 if request.preemptions == 0 else need

    def _prefill(self, admitted: list[SimRequest], finished: list[SimRequest]) -> None:
        recompute = [r for r in admitted if r.preemptions > 0]
        fresh = [r for r in admitted if r.preemptions == 0]
        if recompute:  # preempted here: its KV is gone, the decode replica recomputes the prompt itself
            super()._prefill(recompute, finished)
        if fresh:
            self._first_step(fresh, finished)

    def _first_step(self, fresh: list[SimRequest], finished: list[SimRequest]) -> None:
        n = len(self.running)
        batch = n + len(fresh)
        context = (self.kv_used + sum(r.input_tokens for r in fresh)) / batch
        step_s = self.steps.decode(batch, context)
        for request in fresh:
            if math.isnan(request.scheduled_s):
                request.scheduled_s = self.clock
        self.iterations[batch] += 1
        # the engine's per-request intake (HTTP, admission), serial with its steps, as in the aggregated engine
        self.clock += step_s + self.steps.cfg.engine.request_overhead_s * len(fresh)
        if n:
            self._record_gaps(step_s, n)
            self.step += 1
        for request in fresh:
            self._start_decoding(request)
        self._pop_finished(finished)
        self._relieve_kv_pressure()


class PoolFleet(Fleet):
    """One pool's replicas: kvscale.sim.fleet.Fleet (cold starts, drains, GPU-hours, the
    gateway's least-loaded routing) with decode-only replicas for the decode pool.

    The engine computes a step whole when it starts it, so a replica in the middle of a prefill
    already counts its prompts as finished (a prefill replica's request leaves with its one
    token) while its clock is still ahead. The endpoint picker here counts them as the engine's
    metrics do until that time (vllm:num_requests_running includes a prefilling request, and
    its KV is held): in flight on that replica, a slot and the prompt's KV taken. Without it,
    a prefill replica mid-prompt looks idle and the picker stacks prompts on it."""

    def __init__(self, setup: SimSetup, role: str) -> None:
        super().__init__(setup.fleet_spec(), StepTimes(setup.cfg))
        self.role = role
        if role == "decode":
            self.replica_type = DecodeReplica
        self._in_flight: dict[int, list[SimRequest]] = {}  # replica id -> requests it finished ahead of now

    def _advance_replicas(self, now_s: float, finished: list[SimRequest], stop_after_finish: bool = False) -> None:
        before = len(finished)
        super()._advance_replicas(now_s, finished, stop_after_finish)
        for request in finished[before:]:
            if request.finish_s > now_s:
                self._in_flight.setdefault(request.replica, []).append(request)

    def _ahead(self, replica: Replica, now_s: float) -> list[SimRequest]:
        kept = [r for r in self._in_flight.get(replica.id, ()) if r.finish_s > now_s]
        self._in_flight[replica.id] = kept
        return kept

    def _gateway_send(self, now_s: float) -> None:
        """kvscale.sim.fleet.Fleet._gateway_send with the requests in flight counted."""
        serving = self.serving(now_s)
        by_id = {r.id: r for r in serving}
        loads, rooms = {}, {}
        for r in serving:
            ahead = self._ahead(r, now_s)
            slots, kv = self._room(r)
            rooms[r.id] = (slots - len(ahead), kv - sum(q.input_tokens + q.generated for q in ahead))
            loads[r.id] = r.load + len(ahead)
        while self.unrouted and rooms:
            request = self.unrouted[0]
            need = request.input_tokens + request.generated + 1
            fits = [i for i, (slots, kv) in rooms.items() if slots > 0 and kv >= need]
            if not fits:
                idle = [i for i in rooms if loads[i] == 0]
                if not idle:
                    return
                fits = idle[:1]
            chosen = min(fits, key=lambda i: (loads[i], -rooms[i][1], i))
            by_id[chosen].enqueue(self.unrouted.popleft())
            slots, kv = rooms[chosen]
            rooms[chosen] = (slots - 1, kv - need)
            loads[chosen] += 1

    def held(self) -> int:
        """Replicas holding GPUs now (starting, serving or draining)."""
        return sum(1 for r in self.replicas if r.stopped_s is None)


@dataclass(frozen=True)
class DisaggregatedSetup:
    """Both pools (each a SimSetup: its configuration, batch limit, cold start, starting
    workers; the routing is the gateway's) and the path between them."""

    prefill: SimSetup
    decode: SimSetup
    path: KvTransferPath
    prefix_cache_hit_share: float = 0.0
    # what TTFT leaves each pool (the plan's split): the targets each pool's policy scales for
    prefill_ttft_target_s: float = math.inf
    decode_ttft_target_s: float = math.inf
    gpu_limits: dict[str, int] | None = None  # GPUs per type both pools may hold at once (None: no limit)

    def transfer_s(self, input_tokens: int) -> float:
        """One request's KV transfer at its own prompt (its uncached tokens)."""
        cfg = self.prefill.cfg
        tokens = input_tokens * (1.0 - self.prefix_cache_hit_share)
        return kv_transfer_s(cfg.model, cfg.kv, cfg.tensor_parallel, tokens, self.path)


@dataclass(frozen=True)
class PoolsView:
    """What a pools policy sees at a tick: each pool's observation (as the aggregated
    simulator's, over that pool's own arrivals and latencies) and the totals since the start
    (requests, prompt and output tokens arrived), from which rates over any interval follow."""

    time_s: float
    prefill: Observation
    decode: Observation
    arrived: int
    input_tokens: float
    output_tokens: float


class PoolsPolicy(Protocol):
    name: str

    def decide(self, view: PoolsView) -> tuple[Decision, Decision]: ...


def setup_from_disaggregated(
    plan: DisaggregatedPlan,
    cold_start_s: float | None = None,
    seed: int = 0,
    gpu_limits: dict[str, int] | None = None,
    path: KvTransferPath | None = None,
    routing: str = "gateway",
) -> DisaggregatedSetup:
    """Both pools as planned (configuration, batch limit, workers), behind `routing` (the
    gateway's least-loaded picker by default; `plan --trace` replays the plan's routing); each
    pool's TTFT target is the plan's split: the prefill pool the share it was sized for (TTFT
    less the transfer, the decode slot wait and first step), the decode pool what TTFT leaves
    after the prefill pool at its planned load and the transfer. `path`: another transfer path
    (the plan's by default). The decode pool's routing is seeded apart from the prefill's."""
    slo = plan.request.slo

    def pool(cfg: ServingConfig, max_batch: int, workers: int, pool_seed: int) -> SimSetup:
        start_s = cold_start_s if cold_start_s is not None else cfg.cold_start_s
        return SimSetup(cfg, slo, max_batch, start_s, workers, routing=routing, seed=pool_seed)

    return DisaggregatedSetup(
        prefill=pool(plan.prefill.cfg, plan.prefill.max_batch, plan.prefill.workers, seed),
        decode=pool(plan.decode.cfg, plan.decode.max_batch, plan.decode.workers, seed + DECODE_SEED_OFFSET),
        path=path if path is not None else plan.path,
        prefix_cache_hit_share=plan.request.workload.prefix_cache_hit_share,
        prefill_ttft_target_s=plan.prefill_ttft_target_s,
        decode_ttft_target_s=plan.decode_ttft_target_s,
        gpu_limits=gpu_limits,
    )


@dataclass
class StaticPools:
    """The workers given in each pool, always (the plan's pools fixed; `plan --trace`'s check)."""

    prefill_workers: int
    decode_workers: int
    name: str = "static"

    def decide(self, view: PoolsView) -> tuple[Decision, Decision]:
        del view
        return (
            Decision(self.prefill_workers, f"static: always {self.prefill_workers}", DecisionKind.STATIC),
            Decision(self.decode_workers, f"static: always {self.decode_workers}", DecisionKind.STATIC),
        )


@dataclass(frozen=True)
class PoolPoint:
    time_s: float
    prefill_desired: int
    decode_desired: int
    prefill_ready: int
    decode_ready: int
    gpus_held: dict[str, int] = field(default_factory=dict)  # per GPU type: starting, serving and draining replicas


@dataclass
class PoolStats:
    role: str
    gpu: str
    tensor_parallel: int
    gpus_per_replica: int
    gpu_hours: float
    cost_usd: float
    replicas_max: int
    replicas_start: int
    preemptions: int


@dataclass
class DisaggregatedResult(SimResult):
    """A run of both pools: SimResult's totals (GPU-hours and cost of both pools, the requests
    with TTFT measured from arrival to the decode side's first token) and each pool's own."""

    pools: dict[str, PoolStats] = field(default_factory=dict)
    pool_timeline: list[PoolPoint] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)  # per request, in request order
    prefill_done_s: list[float] = field(default_factory=list)  # when each request's prefill ended (nan: never)


class _Windows:
    def __init__(self, window_s: float) -> None:
        self.arrivals, self.inputs, self.outputs = _Window(window_s), _Window(window_s), _Window(window_s)
        self.ttfts, self.tpots = _Window(window_s), _Window(window_s)

    def arrive(self, now_s: float, request: SimRequest, output_tokens: int) -> None:
        self.arrivals.add(now_s, 1.0)
        self.inputs.add(now_s, request.input_tokens)
        self.outputs.add(now_s, output_tokens)

    def observe(self, fleet: Fleet, now_s: float, setup: SimSetup) -> Observation:
        return _observe(fleet, now_s, setup, self.arrivals, self.inputs, self.outputs, self.ttfts, self.tpots)


class PoolsStepper:
    """Both pools through one replay, stepped by its caller: `simulate_disaggregated`'s loop for
    one service, kvscale.sim.budget_run's for a service among others under one GPU budget.
    Between steps: `advance` to a time, then `arrive` (the source's next request) or a tick
    (`view`, the caller scales the pools, `record`)."""

    def __init__(self, setup: DisaggregatedSetup, source: Source) -> None:
        if source.closed is not None:
            raise ValueError("a disaggregated fleet replays open-loop arrivals (a trace or a generated load)")
        self.setup, self.source = setup, source
        ps, ds = setup.prefill, setup.decode
        self.prefill, self.decode = PoolFleet(ps, "prefill"), PoolFleet(ds, "decode")
        self.pw, self.dw = _Windows(ps.window_s), _Windows(ds.window_s)
        self.requests: list[SimRequest] = []
        self.proxies: dict[int, SimRequest] = {}  # prefill copy id -> the user's request
        self.entered: dict[int, float] = {}  # request id -> when it reached the decode pool
        self.transfers: list[float] = []
        self.prefill_done: list[float] = []
        self.in_transfer: list[tuple[float, int, SimRequest]] = []
        self.p_finished: list[SimRequest] = []
        self.d_finished: list[SimRequest] = []
        self.arrived, self.input_total, self.output_total = 0, 0.0, 0.0
        self.timeline: list[TimelinePoint] = []
        self.pool_timeline: list[PoolPoint] = []
        self.decisions: list[tuple[float, int, str]] = []
        self.ttft_all, self.tpot_all = _Window(ps.window_s), _Window(ps.window_s)
        self.done = 0

    def start(self, prefill_workers: int, decode_workers: int) -> None:
        """The pools at the start, warm."""
        self.prefill.start(prefill_workers, 0.0, warm=True)
        self.decode.start(decode_workers, 0.0, warm=True)

    def next_arrival(self) -> float:
        return self.source.next_time()

    def outstanding(self) -> int:
        return len(self.requests) - self.done

    def _account_lost(self) -> int:
        n = 0
        for proxy in self.prefill.take_lost():
            original = self.proxies[proxy.id]
            original.lost = proxy.lost
            n += 1
        return n + len(self.decode.take_lost())

    def advance(self, now_s: float) -> None:
        # Prefill first: every prefill that ends by now_s is known (an entry at or before now_s
        # comes from a prefill that ended before it), then the decode pool in order of entries.
        self.prefill.advance_to(now_s, self.p_finished)
        for proxy in self.p_finished:
            original = self.proxies.pop(proxy.id)
            self.pw.ttfts.add(proxy.first_token_s, proxy.ttft_s)
            self.prefill_done[original.id] = proxy.finish_s
            move_s = self.setup.transfer_s(original.input_tokens)
            self.transfers[original.id] = move_s
            heapq.heappush(self.in_transfer, (proxy.finish_s + move_s, original.id, original))
        self.p_finished.clear()
        while self.in_transfer and self.in_transfer[0][0] <= now_s:
            at, _, original = heapq.heappop(self.in_transfer)
            self.decode.advance_to(at, self.d_finished)
            self.entered[original.id] = at
            self.dw.arrive(at, original, original.output_tokens)
            self.decode.route(original, at)
        self.decode.advance_to(now_s, self.d_finished)
        for r in self.d_finished:
            self.dw.ttfts.add(r.first_token_s, r.first_token_s - self.entered[r.id])
            self.ttft_all.add(r.first_token_s, r.ttft_s)
            if r.output_tokens > 1:
                self.dw.tpots.add(r.finish_s, r.tpot_s)
                self.tpot_all.add(r.finish_s, r.tpot_s)
        self.done += len(self.d_finished)
        self.d_finished.clear()
        self.done += self._account_lost()

    def arrive(self, now_s: float) -> None:
        """The source's next request (arriving at `now_s`) reaches the prefill pool."""
        r = self.source.pop()
        request = SimRequest(len(self.requests), r.arrival_s, r.input_tokens, r.output_tokens)
        self.requests.append(request)
        self.transfers.append(math.nan)
        self.prefill_done.append(math.nan)
        proxy = SimRequest(request.id, r.arrival_s, r.input_tokens, 1)
        self.proxies[proxy.id] = request
        self.arrived += 1
        self.input_total += r.input_tokens
        self.output_total += r.output_tokens
        self.pw.arrive(now_s, proxy, 1)
        self.prefill.route(proxy, now_s)

    def view(self, now_s: float) -> PoolsView:
        ps, ds = self.setup.prefill, self.setup.decode
        return PoolsView(
            now_s,
            self.pw.observe(self.prefill, now_s, ps),
            self.dw.observe(self.decode, now_s, ds),
            self.arrived,
            self.input_total,
            self.output_total,
        )

    def decided(self, now_s: float, want_p: Decision, want_d: Decision) -> None:
        """A tick's wants, kept where they change a pool."""
        for role, want, fleet in (("prefill", want_p, self.prefill), ("decode", want_d, self.decode)):
            if want.replicas != fleet.desired_size():
                self.decisions.append((now_s, want.replicas, f"{role}: {want.reason}"))

    def held(self) -> dict[str, int]:
        """GPUs per type both pools hold now (starting, serving and draining replicas)."""
        held: dict[str, int] = {}
        for fleet, pool in ((self.prefill, self.setup.prefill), (self.decode, self.setup.decode)):
            held[pool.cfg.gpu.name] = held.get(pool.cfg.gpu.name, 0) + fleet.held() * pool.cfg.gpus
        return held

    def record(self, now_s: float, view: PoolsView) -> None:
        """The tick's point, after the pools were scaled."""
        ps = self.setup.prefill
        prefill, decode = self.prefill, self.decode
        p_ready, d_ready = len(prefill.serving(now_s)), len(decode.serving(now_s))
        self.pool_timeline.append(
            PoolPoint(now_s, prefill.desired_size(), decode.desired_size(), p_ready, d_ready, self.held())
        )
        self.timeline.append(
            TimelinePoint(
                now_s,
                view.prefill.arrival_rate_per_s or 0.0,
                prefill.desired_size() + decode.desired_size(),
                p_ready + d_ready,
                _percentile(self.ttft_all.values(now_s), ps.slo.percentile),
                _percentile(self.tpot_all.values(now_s), ps.slo.percentile),
            )
        )

    def last_finish_s(self) -> float:
        return max([r.finish_s for r in self.requests if r.done] + [0.0])

    def cut(self, end_s: float) -> None:
        """The run's end under a bound (kvscale.sim.budget_run): what a replica holds is cut,
        what waits at either pool's gateway rejected, and a request still in transfer cut."""
        self.advance(end_s)
        self.prefill.end(end_s)
        self.decode.end(end_s)
        while self.in_transfer:
            _, _, original = heapq.heappop(self.in_transfer)
            original.lost = "cut"
            self.done += 1
        self.done += self._account_lost()

    def result(self, policy: str, end_s: float) -> DisaggregatedResult:
        setup, prefill, decode = self.setup, self.prefill, self.decode
        prefill.stop_all(end_s)
        decode.stop_all(end_s)
        pools = {
            "prefill": _stats("prefill", prefill, setup.prefill, self.pool_timeline),
            "decode": _stats("decode", decode, setup.decode, self.pool_timeline),
        }
        spans = [
            (r.started_s, r.stopped_s if r.stopped_s is not None else end_s)
            for f in (prefill, decode)
            for r in f.replicas
        ]
        return DisaggregatedResult(
            policy=policy,
            requests=self.requests,
            gpu_hours=sum(p.gpu_hours for p in pools.values()),
            cost_usd=sum(p.cost_usd for p in pools.values()),
            scale_events=prefill.scale_events + decode.scale_events,
            preemptions=sum(p.preemptions for p in pools.values()),
            duration_s=end_s,
            timeline=self.timeline,
            decisions=self.decisions,
            routing="gateway",
            token_gaps=sum((r.token_gaps for r in decode.replicas), Counter()),
            replica_spans=spans,
            pools=pools,
            pool_timeline=self.pool_timeline,
            transfer_s=self.transfers,
            prefill_done_s=self.prefill_done,
        )


def simulate_disaggregated(
    setup: DisaggregatedSetup,
    source: Source,
    policy: PoolsPolicy,
    progress: Callable[[float], None] | None = None,
) -> DisaggregatedResult:
    """Replays an open-loop source through both pools under `policy` (ticks every
    setup.prefill.tick_s). Each tick both pools are scaled (at least one replica each);
    with gpu_limits a scale-up starts only the replicas whose GPUs are free."""
    run = PoolsStepper(setup, source)
    run.start(setup.prefill.initial_replicas, setup.decode.initial_replicas)
    next_tick = setup.prefill.tick_s
    while True:
        arrival_at = run.next_arrival()
        if math.isinf(arrival_at) and run.outstanding() == 0:
            break
        now = min(arrival_at, next_tick)
        run.advance(now)
        if now == arrival_at:
            run.arrive(now)
            continue
        view = run.view(now)
        want_p, want_d = policy.decide(view)
        run.decided(now, want_p, want_d)
        _scale(setup, run.prefill, run.decode, max(want_p.replicas, 1), max(want_d.replicas, 1), now)  # never to zero
        run.record(now, view)
        next_tick += setup.prefill.tick_s
        if progress is not None:
            progress(now)
    return run.result(policy.name, run.last_finish_s())


def _scale(setup: DisaggregatedSetup, prefill: PoolFleet, decode: PoolFleet, p: int, d: int, now_s: float) -> None:
    """Scale-downs first, then scale-ups into the GPUs the limits leave free (a draining
    replica holds its GPUs until it stops)."""
    pools = ((prefill, setup.prefill, p), (decode, setup.decode, d))
    for fleet, _, want in pools:
        if want < fleet.desired_size():
            fleet.scale_to(want, now_s)
    for fleet, pool_setup, want in pools:
        more = want - fleet.desired_size()
        if more <= 0:
            continue
        if setup.gpu_limits is not None:
            gpu = pool_setup.cfg.gpu.name
            held = sum(f.held() * s.cfg.gpus for f, s, _ in pools if s.cfg.gpu.name == gpu)
            free = setup.gpu_limits.get(gpu, 0) - held
            more = min(more, max(0, free // pool_setup.cfg.gpus))
        if more > 0:
            fleet.scale_to(fleet.desired_size() + more, now_s)


def _stats(role: str, fleet: PoolFleet, setup: SimSetup, timeline: list[PoolPoint]) -> PoolStats:
    hours = fleet.gpu_hours()
    desired = [t.prefill_desired if role == "prefill" else t.decode_desired for t in timeline]
    return PoolStats(
        role=role,
        gpu=setup.cfg.gpu.name,
        tensor_parallel=setup.cfg.tensor_parallel,
        gpus_per_replica=setup.cfg.gpus,
        gpu_hours=hours,
        cost_usd=hours * setup.cfg.gpu.price_usd_per_gpu_hour,
        replicas_max=max([setup.initial_replicas, *desired]),
        replicas_start=setup.initial_replicas,
        preemptions=sum(r.preemptions for r in fleet.replicas),
    )
