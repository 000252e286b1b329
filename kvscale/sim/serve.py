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

from kvscale.sim.engine import Replica, SimRequest, StepTimes
from kvscale.sim.load_profile import Arrivals

TTFT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)


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
    e2e: _Histogram = field(default_factory=lambda: _Histogram(TTFT_BUCKETS))
    prompt: _Histogram = field(default_factory=lambda: _Histogram(TOKEN_BUCKETS))
    generation: _Histogram = field(default_factory=lambda: _Histogram(TOKEN_BUCKETS))
    success: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0

    def record(self, r: SimRequest) -> None:
        self.ttft.observe(r.ttft_s)
        if r.output_tokens > 1:
            self.itl.observe(r.tpot_s, r.output_tokens - 1)
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
        labels = ["model_name", "pod", "namespace"]
        now = self.now()
        with self.lock:
            serving = self._serving(now)
            families: dict[str, Any] = {
                "running": GaugeMetricFamily(
                    "vllm:num_requests_running", "Requests running on the engine", labels=labels
                ),
                "waiting": GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting", labels=labels),
                "kv": GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage, 0..1", labels=labels),
                "success": CounterMetricFamily("vllm:request_success", "Finished requests", labels=labels),
                "prompt_total": CounterMetricFamily("vllm:prompt_tokens", "Prefill tokens processed", labels=labels),
                "generation_total": CounterMetricFamily("vllm:generation_tokens", "Generated tokens", labels=labels),
                "preemptions": CounterMetricFamily("vllm:num_preemptions", "Preemptions", labels=labels),
                "ttft": HistogramMetricFamily("vllm:time_to_first_token_seconds", "TTFT", labels=labels),
                "itl": HistogramMetricFamily("vllm:inter_token_latency_seconds", "Inter-token latency", labels=labels),
                "e2e": HistogramMetricFamily("vllm:e2e_request_latency_seconds", "End-to-end latency", labels=labels),
                "prompt": HistogramMetricFamily(
                    "vllm:request_prompt_tokens", "Prompt tokens per request", labels=labels
                ),
                "generation": HistogramMetricFamily(
                    "vllm:request_generation_tokens", "Generated tokens per request", labels=labels
                ),
            }
            for e in serving:
                values = [self.model_name, e.pod, self.namespace]
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
                    ("e2e", e.e2e),
                    ("prompt", e.prompt),
                    ("generation", e.generation),
                ):
                    families[key].add_metric(values, hist.buckets(), hist.total)
        yield from families.values()
