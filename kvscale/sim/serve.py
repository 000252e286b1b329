"""`kvscale sim serve`: plays the engine for every Running pod of an InferenceService.

kwok pods run no containers, so this one process simulates each pod's engine with the
simulator's replica model, in real time, and exposes vLLM-named metrics per pod (with
`pod` and `namespace` labels) for a real Prometheus to scrape. New pods serve only after a
cold start. The load comes from a profile (constant, ramp, steps, trace).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from kvscale.metrics.engines import ENGINES, vllm_token_buckets
from kvscale.sim.engine import Replica, SimRequest, StepTimes
from kvscale.sim.load_profile import Arrivals

# vLLM's own names, labels and bucket boundaries (one table with the PromQL reader): quantiles
# read here are as coarse as on a real cluster.
VLLM = ENGINES["vllm"]
E2E_NAME = "vllm:e2e_request_latency_seconds"
TTFT_BUCKETS = VLLM.buckets_s[VLLM.ttft_histogram[0]]
TPOT_BUCKETS = VLLM.buckets_s[VLLM.tpot_histogram[0]]
ITL_BUCKETS = VLLM.buckets_s[VLLM.itl_histogram[0]]
E2E_BUCKETS = VLLM.buckets_s[E2E_NAME]
TOKEN_BUCKETS = vllm_token_buckets(131072)
ENGINE_INDEX = "0"  # vLLM's `engine` label: the engine core's index within the server


@dataclass
class _Histogram:
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
class PodEngine:
    pod: str
    replica: Replica
    ttft: _Histogram = field(default_factory=lambda: _Histogram(TTFT_BUCKETS))
    itl: _Histogram = field(default_factory=lambda: _Histogram(ITL_BUCKETS))
    tpot: _Histogram = field(default_factory=lambda: _Histogram(TPOT_BUCKETS))
    e2e: _Histogram = field(default_factory=lambda: _Histogram(E2E_BUCKETS))
    prompt: _Histogram = field(default_factory=lambda: _Histogram(TOKEN_BUCKETS))
    generation: _Histogram = field(default_factory=lambda: _Histogram(TOKEN_BUCKETS))
    success: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0

    def record(self, r: SimRequest) -> None:
        self.ttft.observe(r.ttft_s)
        if r.output_tokens > 1:
            # Per token gap (the simulator knows each request's mean gap) and once per request,
            # as vLLM's output processor does (vllm/v1/metrics/loggers.py).
            self.itl.observe(r.tpot_s, r.output_tokens - 1)
            self.tpot.observe(r.tpot_s)
        self.e2e.observe(r.finish_s - r.arrival_s)
        self.prompt.observe(r.input_tokens)
        self.generation.observe(r.output_tokens)
        self.success += 1
        self.prompt_tokens += r.input_tokens
        self.generation_tokens += r.output_tokens


class StandIn(Collector):
    """The fleet of simulated engines; `sync_pods` and `tick` are called by the serve loop."""

    def __init__(
        self,
        namespace: str,
        model_name: str,
        steps: StepTimes,
        max_batch: int,
        kv_capacity_tokens: int,
        token_budget: int,
        cold_start_s: float,
        arrivals: Arrivals,
        clock: Any = time.monotonic,
    ) -> None:
        self.namespace = namespace
        self.model_name = model_name
        self.steps = steps
        self.max_batch = max_batch
        self.kv_capacity = kv_capacity_tokens
        self.token_budget = token_budget
        self.cold_start_s = cold_start_s
        self.arrivals = arrivals
        self.clock = clock
        self.start = clock()
        self.engines: dict[str, PodEngine] = {}
        self.gateway: list[SimRequest] = []  # arrived while no engine was serving
        self.lock = threading.Lock()
        self._ids = 0

    def now(self) -> float:
        return float(self.clock() - self.start)

    def sync_pods(self, running_pods: list[str]) -> None:
        """Running pods get an engine (serving after the cold start); gone pods lose theirs."""
        now = self.now()
        with self.lock:
            for pod in running_pods:
                if pod not in self.engines:
                    replica = Replica(
                        len(self.engines),
                        self.steps,
                        self.max_batch,
                        self.kv_capacity,
                        self.token_budget,
                        started_s=now,
                        ready_s=now + self.cold_start_s,
                    )
                    self.engines[pod] = PodEngine(pod, replica)
            for pod in [p for p in self.engines if p not in running_pods]:
                del self.engines[pod]  # its in-flight requests are lost, as when a pod dies

    def _serving(self, now: float) -> list[PodEngine]:
        return [e for e in self.engines.values() if e.replica.ready_s <= now]

    def tick(self) -> None:
        now = self.now()
        with self.lock:
            for arrival in self.arrivals.until(now):
                self._ids += 1
                self.gateway.append(
                    SimRequest(self._ids, arrival.arrival_s, arrival.input_tokens, arrival.output_tokens)
                )
            serving = self._serving(now)
            for engine in serving:
                finished: list[SimRequest] = []
                engine.replica.advance_to(now, finished)
                for r in finished:
                    engine.record(r)
            if serving:
                for request in self.gateway:
                    min(serving, key=lambda e: (e.replica.load, e.pod)).replica.enqueue(request)
                self.gateway = []

    def collect(self) -> Iterator[Any]:
        labels = [*VLLM.labels, "pod", "namespace"]
        now = self.now()
        with self.lock:
            serving = self._serving(now)
            # Names from the table the PromQL reader uses (the newest name of each), vLLM's help text.
            families: dict[str, Any] = {
                "running": GaugeMetricFamily(
                    VLLM.running_gauge[0], "Number of requests in model execution batches.", labels=labels
                ),
                "waiting": GaugeMetricFamily(
                    VLLM.waiting_gauge[0], "Number of requests waiting to be processed.", labels=labels
                ),
                "kv": GaugeMetricFamily(
                    VLLM.kv_usage_gauge[0], "KV-cache usage. 1 means 100 percent usage.", labels=labels
                ),
                "success": CounterMetricFamily(
                    VLLM.success_counter[0].removesuffix("_total"),
                    "Count of successfully processed requests.",
                    labels=labels,
                ),
                "prompt_total": CounterMetricFamily(
                    "vllm:prompt_tokens", "Number of prefill tokens processed.", labels=labels
                ),
                "generation_total": CounterMetricFamily(
                    "vllm:generation_tokens", "Number of generation tokens processed.", labels=labels
                ),
                "preemptions": CounterMetricFamily(
                    "vllm:num_preemptions", "Cumulative number of preemption.", labels=labels
                ),
                "ttft": HistogramMetricFamily(
                    VLLM.ttft_histogram[0], "Histogram of time to first token in seconds.", labels=labels
                ),
                "itl": HistogramMetricFamily(
                    VLLM.itl_histogram[0], "Histogram of inter-token latency in seconds.", labels=labels
                ),
                "tpot": HistogramMetricFamily(
                    VLLM.tpot_histogram[0], "Histogram of time_per_output_token_seconds per request.", labels=labels
                ),
                "e2e": HistogramMetricFamily(E2E_NAME, "Histogram of e2e request latency in seconds.", labels=labels),
                "prompt": HistogramMetricFamily(
                    VLLM.prompt_tokens_histogram[0], "Number of prefill tokens processed.", labels=labels
                ),
                "generation": HistogramMetricFamily(
                    VLLM.generation_tokens_histogram[0], "Number of generation tokens processed.", labels=labels
                ),
            }
            for e in serving:
                values = [self.model_name, ENGINE_INDEX, e.pod, self.namespace]
                r = e.replica
                families["running"].add_metric(values, len(r.running))
                families["waiting"].add_metric(values, len(r.waiting))
                families["kv"].add_metric(values, r.kv_usage)
                families["success"].add_metric(values, e.success)
                families["prompt_total"].add_metric(values, e.prompt_tokens)
                families["generation_total"].add_metric(values, e.generation_tokens)
                families["preemptions"].add_metric(values, r.preemptions)
                for key, hist in (
                    ("ttft", e.ttft),
                    ("itl", e.itl),
                    ("tpot", e.tpot),
                    ("e2e", e.e2e),
                    ("prompt", e.prompt),
                    ("generation", e.generation),
                ):
                    families[key].add_metric(values, hist.buckets(), hist.total)
        yield from families.values()
