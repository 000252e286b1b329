"""The observed burstiness against a real Prometheus: an exporter serves three services' vLLM
request counters and queue gauges, fed Poisson arrivals, batches, and batches over a base
load, all at the same mean rate, each request held in flight for a few seconds (so
completions alone would smooth the batches out); the operator's queries read the index of
dispersion of the arrivals from the samples at scrape resolution (about 1 for Poisson, about
the batch size for batches), the share of requests that came in bursts and their size."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app

from kvscale.autoscaling.observation import ObservedWorkload
from kvscale.metrics.client import AsyncPrometheusClient
from kvscale.metrics.observe import observe_workload_async
from tests.cluster.harness import free_port, wait_until
from tests.cluster.prometheus import Prometheus

RATE = 4.0  # requests/s, both services
BATCH = 10  # requests per batch of the bursty service
WINDOW, BURST = "60s", "2s"  # 30 burst windows: the estimate's standard error is about 0.32x


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class _Service:
    """One pod's arrivals: batches of `batch` at `batched` requests/s on average, and single
    requests at `single` requests/s, each running for an exponential time of mean 3 s, then
    counted as a success."""

    pod: str
    batch: int
    batched: float
    single: float
    rng: random.Random
    finishes: list[float] = field(default_factory=list)
    next_batch_s: float = math.inf
    next_single_s: float = math.inf

    def __post_init__(self) -> None:
        self.next_batch_s = self._gap(self.batched / self.batch)
        self.next_single_s = self._gap(self.single)

    def _gap(self, rate: float) -> float:
        return self.rng.expovariate(rate) if rate > 0 else math.inf

    def advance(self, now_s: float) -> int:
        """Completions up to `now_s`."""
        while self.next_batch_s <= now_s:
            self.finishes += [self.next_batch_s + self.rng.expovariate(1 / 3.0) for _ in range(self.batch)]
            self.next_batch_s += self._gap(self.batched / self.batch)
        while self.next_single_s <= now_s:
            self.finishes.append(self.next_single_s + self.rng.expovariate(1 / 3.0))
            self.next_single_s += self._gap(self.single)
        done = [f for f in self.finishes if f <= now_s]
        self.finishes = [f for f in self.finishes if f > now_s]
        return len(done)


def _serve(registry: CollectorRegistry, stop: threading.Event) -> int:
    labels = ["namespace", "pod", "model_name"]
    success = Counter("vllm:request_success", "done", [*labels, "finished_reason"], registry=registry)
    running = Gauge("vllm:num_requests_running", "running", labels, registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=registry)
    start = time.monotonic()
    services = [
        _Service("calm-5d8f9-abcde", 1, 0.0, RATE, random.Random(1)),
        _Service("bursty-5d8f9-abcde", BATCH, RATE, 0.0, random.Random(2)),
        # Batch submissions over a base load: half the requests come in batches of 16.
        _Service("mixed-5d8f9-abcde", 16, 0.5 * RATE, 0.5 * RATE, random.Random(3)),
    ]

    def run() -> None:
        while not stop.wait(0.05):
            now = time.monotonic() - start
            for s in services:
                done = s.advance(now)
                success.labels("ns", s.pod, "m", "stop").inc(done)
                running.labels("ns", s.pod, "m").set(len(s.finishes))
                waiting.labels("ns", s.pod, "m").set(0)

    threading.Thread(target=run, daemon=True).start()
    port = free_port()
    server = make_server("127.0.0.1", port, make_wsgi_app(registry), handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def shut() -> None:
        stop.wait()
        server.shutdown()

    threading.Thread(target=shut, daemon=True).start()
    return port


def test_the_burstiness_of_batches_reads_about_the_batch_size(tmp_path: Path) -> None:
    stop = threading.Event()
    port = _serve(CollectorRegistry(), stop)
    try:
        with Prometheus(tmp_path / "prom", targets=[f"127.0.0.1:{port}"]) as prom:
            prom.wait_for_series('{__name__="vllm:request_success_total",pod=~"bursty-.*"}')

            def history_s() -> float:
                """How far back Prometheus holds the bursty pods' series (the oldest sample's age)."""
                oldest = prom.query(
                    'time() - min(min_over_time(timestamp(vllm:request_success_total{pod=~"bursty-.*"})[3m:1s]))'
                )
                return float(oldest[0]["value"][1]) if oldest else 0.0

            # A window of 60 s, and the offsets before it, scraped.
            wait_until(lambda: history_s() >= 65.0, 150, "65 s of the bursty series in Prometheus", interval_s=1.0)

            async def read(name: str) -> tuple[ObservedWorkload | None, str | None]:
                client = AsyncPrometheusClient(prom.url, timeout_s=10.0, retries=0)
                try:
                    now = time.time()
                    return await observe_workload_async(client, "vllm", "ns", name, now, WINDOW, "5s", None, BURST)
                finally:
                    await client.aclose()

            calm, _ = asyncio.run(read("calm"))
            bursty, _ = asyncio.run(read("bursty"))
            mixed, _ = asyncio.run(read("mixed"))
    finally:
        stop.set()
    assert calm is not None and bursty is not None and mixed is not None
    assert calm.burst_window_s == 2.0 and calm.burst_windows == 30.0
    calm_d, bursty_d, mixed_d = calm.burstiness, bursty.burstiness, mixed.burstiness
    assert calm_d is not None and bursty_d is not None and mixed_d is not None, (calm, bursty, mixed)
    # Poisson reads 1 (its 99th percentile over 30 windows is about 1.9); batches of 10, about 10.
    assert 0.2 < calm_d.index_of_dispersion < 2.5 and calm_d.burst_share == 1.0, calm_d
    assert 4.0 < bursty_d.index_of_dispersion < 25.0, bursty_d
    assert bursty_d.window_s == 2.0
    # Half the requests in batches of 16 over a base load: about 8.5, and about half in bursts
    # of about 16 (the windows holding a batch stand far above the mean of the two minutes before them).
    assert 3.0 < mixed_d.index_of_dispersion < 25.0, mixed_d
    assert 0.15 < mixed_d.burst_share < 0.9 and 8 <= mixed_d.burst_requests <= 40, mixed_d
