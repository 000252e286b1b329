"""The stand-in's fleet: one simulated replica per Running pod (the simulator's Fleet and its
least-loaded routing), and per-pod counters and histograms of what the replicas finished."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvscale.engines.buckets import vllm_token_buckets
from kvscale.metrics.engines import ENGINES
from kvscale.sim.engine import Replica, SimRequest, StepTimes
from kvscale.sim.fleet import Fleet, FleetSpec
from kvscale.sim.load_profile import Arrivals

# vLLM's own bucket boundaries (the one engine table): quantiles read here are as coarse as on
# a real cluster.
VLLM = ENGINES["vllm"]
TTFT_BUCKETS = VLLM.buckets_s[VLLM.ttft_histogram[0]]
TPOT_BUCKETS = VLLM.buckets_s[VLLM.tpot_histogram[0]]
ITL_BUCKETS = VLLM.buckets_s[VLLM.itl_histogram[0]]
E2E_BUCKETS = VLLM.buckets_s[VLLM.e2e_histogram[0]]
PHASE_BUCKETS = VLLM.buckets_s[VLLM.prefill_time_histogram[0]]  # prefill and decode time
ITERATION_BUCKETS = VLLM.buckets_s[VLLM.iteration_tokens_histogram[0]]
TOKEN_BUCKETS = vllm_token_buckets(131072)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    total: float = 0.0
    count: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0.0] * len(self.bounds)

    def observe(self, value: float, weight: float = 1.0) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += weight
        self.total += value * weight
        self.count += weight

    def buckets(self) -> list[tuple[str, float]]:
        return [(str(b), c) for b, c in zip(self.bounds, self.counts, strict=True)] + [("+Inf", self.count)]


@dataclass
class PodStats:
    """What one pod's engine has served, as the engine's metrics count it."""

    pod: str
    replica: Replica
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    prefill_time: Histogram = field(default_factory=lambda: Histogram(PHASE_BUCKETS))
    decode_time: Histogram = field(default_factory=lambda: Histogram(PHASE_BUCKETS))
    prompt: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    generation: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    success: float = 0.0
    prompt_tokens: float = 0.0

    def record(self, r: SimRequest) -> None:
        self.ttft.observe(r.ttft_s)
        if r.output_tokens > 1:
            # Once per finished request, as vLLM's output processor does (vllm/v1/metrics/
            # loggers.py); the per-token gaps are counted per step (PodFleet.inter_token_latency).
            self.tpot.observe(r.tpot_s)
        self.e2e.observe(r.finish_s - r.arrival_s)
        # vLLM's request phases (vllm/v1/metrics/stats.py update_from_finished_request).
        self.prefill_time.observe(r.prefill_s)
        self.decode_time.observe(r.finish_s - r.first_token_s)
        self.prompt.observe(r.input_tokens)
        self.generation.observe(r.output_tokens)
        self.success += 1
        self.prompt_tokens += r.input_tokens


class EngineFleet:
    """Pods and their engines as the metrics collector reads them (kvscale.standin.exposition):
    each pod's PodStats, the engines' clock, and the lock `sync_pods` and `tick` hold. PodFleet
    runs one pool of replicas; kvscale.standin.pools.PoolsPodFleet a prefill and a decode pool."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.start = clock()
        self.pods: dict[str, PodStats] = {}
        self.lock = threading.Lock()

    def now(self) -> float:
        return float(self.clock() - self.start)

    def iterations(self, stats: PodStats) -> Histogram:
        """vllm:iteration_tokens_total of the pod's engine: one observation per step of the
        tokens it carried (call under `lock`)."""
        steps = Histogram(ITERATION_BUCKETS)
        for tokens, count in stats.replica.iterations.items():
            steps.observe(tokens, count)
        return steps

    def inter_token_latency(self, stats: PodStats) -> Histogram:
        """vllm:inter_token_latency_seconds of the pod's engine: every gap between two tokens of
        a request, observed at the step that ends it (vLLM's IterationStats, vllm/v1/metrics/
        stats.py), not when the request finishes: a window's gaps are the steps it ran, the
        steps its batch (generated tokens over steps) counts (call under `lock`)."""
        gaps = Histogram(ITL_BUCKETS)
        for gap_s, tokens in stats.replica.token_gaps.items():
            gaps.observe(gap_s, tokens)
        gaps.total = stats.replica.gap_seconds  # the exact sum (the bins are 0.1 ms wide)
        return gaps

    def serving(self) -> list[PodStats]:
        """Pods whose engine answers (past its cold start); call under `lock`."""
        now = self.now()
        return [s for s in self.pods.values() if s.replica.is_ready(now)]


class PodFleet(EngineFleet):
    """The simulator's fleet, driven by the cluster's pods: `sync_pods` and `tick` are called
    by the serve loop, `serving` by the metrics collector (all under one lock)."""

    def __init__(self, spec: FleetSpec, steps: StepTimes, arrivals: Arrivals, clock: Callable[[], float]) -> None:
        self.fleet = Fleet(spec, steps)
        self.arrivals = arrivals
        super().__init__(clock)
        self._ids = 0

    def sync_pods(self, running_pods: Iterable[str]) -> None:
        """Running pods get a replica (serving after the cold start); gone pods lose theirs,
        with their in-flight requests, as when a pod dies."""
        now, running = self.now(), set(running_pods)
        with self.lock:
            for pod in sorted(running - set(self.pods)):
                self.fleet.start(1, now)
                self.pods[pod] = PodStats(pod, self.fleet.replicas[-1])
            for pod in set(self.pods) - running:
                self.pods.pop(pod).replica.stopped_s = now

    def tick(self) -> None:
        """Runs the engines to now. Each request reaches its engine at its own arrival time (the
        engines run up to it first), as a real engine sees it: handed over at the tick, an idle
        engine would start it before it arrived, and a tick's arrivals would share one prefill."""
        now = self.now()
        with self.lock:
            finished: list[SimRequest] = []
            for arrival in self.arrivals.until(now):
                self._ids += 1
                self.fleet.advance_to(arrival.arrival_s, finished)
                self.fleet.route(
                    SimRequest(self._ids, arrival.arrival_s, arrival.input_tokens, arrival.output_tokens),
                    arrival.arrival_s,
                )
            self.fleet.advance_to(now, finished)
            by_replica = {stats.replica.id: stats for stats in self.pods.values()}
            for request in finished:
                stats = by_replica.get(request.replica)
                if stats is not None:
                    stats.record(request)
