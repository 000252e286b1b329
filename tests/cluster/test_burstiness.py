"""The observed burstiness against a real Prometheus: an exporter serves two services' vLLM
request counters and queue gauges, one fed Poisson arrivals and one batches at the same mean
rate, each request held in flight for a few seconds (so completions alone would smooth the
batches out); the operator's query reads the index of dispersion of the arrivals from the
samples at scrape resolution, about 1 for the first and about the batch size for the second."""

from __future__ import annotations

import asyncio
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
from tests.cluster.harness import free_port
from tests.cluster.prometheus import Prometheus

RATE = 4.0  # requests/s, both services
BATCH = 10  # requests per batch of the bursty service
WINDOW, BURST = "40s", "2s"  # 20 burst windows: the estimate's standard error is about 0.4x


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class _Service:
    """One pod's arrivals (a batch of `batch` at a time, at RATE requests/s on average), each
    running for an exponential time of mean 3 s, then counted as a success."""

    pod: str
    batch: int
    rng: random.Random
    finishes: list[float] = field(default_factory=list)
    next_s: float = 0.0

    def advance(self, now_s: float) -> tuple[int, int]:
        """(arrivals, completions) up to `now_s`."""
        arrived = 0
        while self.next_s <= now_s:
            self.finishes += [self.next_s + self.rng.expovariate(1 / 3.0) for _ in range(self.batch)]
            arrived += self.batch
            self.next_s += self.rng.expovariate(RATE / self.batch)
        done = [f for f in self.finishes if f <= now_s]
        self.finishes = [f for f in self.finishes if f > now_s]
        return arrived, len(done)


def _serve(registry: CollectorRegistry, stop: threading.Event) -> int:
    labels = ["namespace", "pod", "model_name"]
    success = Counter("vllm:request_success", "done", [*labels, "finished_reason"], registry=registry)
    running = Gauge("vllm:num_requests_running", "running", labels, registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=registry)
    start = time.monotonic()
    services = [
        _Service("calm-5d8f9-abcde", 1, random.Random(1)),
        _Service("bursty-5d8f9-abcde", BATCH, random.Random(2)),
    ]
    for s in services:
        s.next_s = s.rng.expovariate(RATE / s.batch)

    def run() -> None:
        while not stop.wait(0.05):
            now = time.monotonic() - start
            for s in services:
                _, done = s.advance(now)
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
            time.sleep(45.0)  # a window of 40 s, and the offsets before it

            async def read(name: str) -> tuple[ObservedWorkload | None, str | None]:
                client = AsyncPrometheusClient(prom.url, timeout_s=10.0, retries=0)
                try:
                    now = time.time()
                    return await observe_workload_async(client, "vllm", "ns", name, now, WINDOW, "5s", None, BURST)
                finally:
                    await client.aclose()

            calm, _ = asyncio.run(read("calm"))
            bursty, _ = asyncio.run(read("bursty"))
    finally:
        stop.set()
    assert calm is not None and bursty is not None
    assert calm.burst_window_s == 2.0 and calm.burst_windows == 20.0
    calm_d, bursty_d = calm.burstiness, bursty.burstiness
    assert calm_d is not None and bursty_d is not None, (calm, bursty)
    # Poisson reads 1 (its 99th percentile over 20 windows is about 2.2); batches of 10, about 10.
    assert 0.2 < calm_d.index_of_dispersion < 3.0, calm_d
    assert 4.0 < bursty_d.index_of_dispersion < 30.0, bursty_d
    assert bursty_d.window_s == 2.0
