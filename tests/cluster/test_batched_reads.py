"""Batched Prometheus reads (issue 21, item 5) against a real Prometheus: one query per key
answers every service, and each service's share equals what its own queries answer. Three
stand-in services with different loads, two of them in one namespace with names where one
is a prefix of the other (`svc`, `svc-v2`), one in another namespace."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from kvscale.autoscaling.observation import Observation, ObservedWorkload
from kvscale.metrics.batch import FleetReader
from kvscale.metrics.client import AsyncPrometheusClient
from kvscale.metrics.engines import ENGINES
from kvscale.metrics.observe import (
    observe_async,
    observe_batched,
    observe_workload_async,
    observe_workload_batched,
    tick_queries,
    workload_reads,
)
from kvscale.metrics.promql import queries, workload_queries
from kvscale.sim.engine import StepTimes
from kvscale.sim.fleet import FleetSpec
from kvscale.sim.load_profile import parse_profile
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.standin.exposition import EngineCollector, serve_metrics
from kvscale.standin.fleet import PodFleet
from tests.cluster.harness import free_port, wait_until
from tests.cluster.prometheus import Prometheus

SERVICES = {("ns", "svc"): "constant:8", ("ns", "svc-v2"): "constant:2", ("ns2", "svc"): "constant:4"}
WINDOW = "30s"
# Compared once the window is full of samples: a rate over a half-filled window moves with each
# 1 s scrape, and the batch and the single reads are a few hundred ms apart.
SETTLE_S = 40.0


@contextlib.contextmanager
def serving(tmp_path: Path) -> Iterator[tuple[Prometheus, threading.Event]]:
    """The three stand-ins with traffic (simulated time 4x the wall clock, as in
    test_standin_quantiles), scraped every second by a real Prometheus; clearing the event
    freezes them (gauges hold, rates move only as the window slides)."""
    cat = default_catalog()
    cfg = ServingConfig.build(cat, cat.model("llama-3.1-8b"), cat.gpu("A100-80GB"))
    clock = {"t": 0.0}
    fleets, servers, targets = [], [], []
    for i, ((namespace, name), load) in enumerate(SERVICES.items()):
        fleet = PodFleet(
            FleetSpec(48, cfg.memory.kv_capacity_tokens, 2048, cfg.gpus, 0.0),
            StepTimes(cfg),
            parse_profile(load, 512, 128, seed=i),
            clock=lambda: clock["t"],
        )
        fleet.sync_pods([f"{name}-abc12-x1y2z"])
        registry = CollectorRegistry()
        registry.register(EngineCollector(fleet, namespace, "llama"))
        port = free_port()
        servers.append(serve_metrics(registry, port))
        fleets.append(fleet)
        targets.append(f"127.0.0.1:{port}")
    running = threading.Event()
    running.set()

    def advance() -> None:
        start = time.monotonic()
        while running.is_set():
            clock["t"] = 4 * (time.monotonic() - start)
            for fleet in fleets:
                fleet.tick()
            time.sleep(0.02)  # the stand-in's own pacing

    threading.Thread(target=advance, daemon=True).start()
    try:
        with Prometheus(tmp_path / "prom", targets=targets) as prom:
            prom.wait_for_series('vllm:request_time_per_output_token_seconds_count{namespace="ns2"}')
            yield prom, running
    finally:
        running.clear()
        for server in servers:
            server.shutdown()


def test_a_batch_answers_each_service_as_its_own_queries_do(tmp_path: Path) -> None:
    started = time.monotonic()
    with serving(tmp_path) as (prom, running):
        got: dict[str, object] = {}

        def complete() -> bool:
            got.update(asyncio.run(_both(prom.url)))
            if time.monotonic() - started < SETTLE_S:
                return False
            answers = [got["alone"], got["batched"]]
            assert all(isinstance(a, dict) for a in answers)
            return all(
                o.tpot_p_s is not None and o.arrival_rate_per_s and why is None
                for a in answers
                for o, why in a.values()  # type: ignore[attr-defined]
            )

        wait_until(complete, 60 + SETTLE_S, "every service observed with traffic", interval_s=1.0)
        running.clear()  # frozen: gauges hold and rates move only as the window slides
        frozen_at = time.time()

        def scraped_twice() -> bool:
            """Every target scraped at least twice (1 s apart) since the freeze."""
            latest = prom.query("min(timestamp(up))")
            return bool(latest) and float(latest[0]["value"][1]) >= frozen_at + 2.0

        wait_until(scraped_twice, 30, "two scrapes of the frozen values", interval_s=0.2)
        got.update(asyncio.run(_both(prom.url)))
    alone, batched, sent = got["alone"], got["batched"], got["sent"]
    assert isinstance(alone, dict) and isinstance(batched, dict)
    assert sent == len(queries(ENGINES["vllm"], "ns", "svc", 0.95, WINDOW))  # one query per key, 3 services
    for service in SERVICES:
        (one, why_one), (many, why_many) = alone[service], batched[service]
        assert why_one == why_many, service
        for f in fields(Observation):
            a, b = getattr(one, f.name), getattr(many, f.name)
            if f.name == "time_s":
                continue
            assert (a is None) == (b is None), (service, f.name, a, b)
            if isinstance(a, float) and isinstance(b, float):
                # Evaluated a few ms apart on 1 s scrapes: the same up to a scrape's move.
                assert b == pytest.approx(a, rel=0.2, abs=1e-6), (service, f.name)
            else:
                assert a == b, (service, f.name)
    rates = {s: batched[s][0].arrival_rate_per_s for s in SERVICES}
    assert rates[("ns", "svc")] > 2 * rates[("ns", "svc-v2")]  # each service got its own series


async def _both(url: str) -> dict[str, object]:
    client = AsyncPrometheusClient(url, timeout_s=5, retries=1, backoff_s=0.05)
    reader = FleetReader(client, tick_queries(WINDOW), max_age_s=60)
    try:
        now = time.time()
        for namespace, name in SERVICES:  # the reader learns the namespaces (a read per new one)
            await observe_batched(reader, "vllm", namespace, name, 95, 1, 0, now, 120, 5)
        reader.max_age_s, sent = 0.0, reader.queries_sent
        batched = {("ns2", "svc"): await observe_batched(reader, "vllm", "ns2", "svc", 95, 1, 0, now, 120, 5)}
        reader.max_age_s = 60.0  # one read for both namespaces, then every service from it
        for namespace, name in SERVICES:
            batched[namespace, name] = await observe_batched(reader, "vllm", namespace, name, 95, 1, 0, now, 120, 5)
        alone = {}
        for namespace, name in SERVICES:
            alone[namespace, name] = await observe_async(
                client, "vllm", namespace, name, 95, 1, 0, now, window=WINDOW, deadline_s=5
            )
        return {"alone": alone, "batched": batched, "sent": reader.queries_sent - sent}
    finally:
        await client.aclose()


# The workload's windows, short enough for a test: 16 burst windows of 2 s (1 s scrapes).
WORK_WINDOW, PEAK_WINDOW, BURST_WINDOW = "32s", "5s", "2s"


def test_a_workload_batch_answers_each_service_as_its_own_queries_do(tmp_path: Path) -> None:
    """The workload's reads (lengths, token rates, peaks, burstiness), batched: every key once
    for the three services, each service's ObservedWorkload the one its own queries give.
    Both are evaluated at one instant (Prometheus's `time` parameter), so they read the same
    samples and must agree to rounding."""
    with serving(tmp_path) as (prom, _running):

        def history_s() -> float:
            """How far back Prometheus holds the stand-ins' series (the oldest sample's age)."""
            oldest = prom.query("time() - min(min_over_time(timestamp(vllm:request_success_total)[2m:1s]))")
            return float(oldest[0]["value"][1]) if oldest else 0.0

        # The workload window (WORK_WINDOW, 32 s) full of samples, with the scrape after it.
        wait_until(lambda: history_s() >= 34.0, 60 + SETTLE_S, "the workload window full of samples", interval_s=1.0)
        alone, batched, sent = asyncio.run(_workloads(prom.url, time.time() - 2))
    built = workload_queries(ENGINES["vllm"], "ns", "svc", WORK_WINDOW, PEAK_WINDOW, BURST_WINDOW)
    assert sent == len(built)  # one query per key for the three services
    assert any(k.startswith("arrival") for k in built) and any(k.startswith("peak_") for k in built)
    for service in SERVICES:
        (one, why_one), (many, why_many) = alone[service], batched[service]
        assert why_one == why_many, service
        assert one is not None and many is not None, (service, why_one)
        assert one.requests_per_s and one.prompt_lengths is not None and one.arrival_dispersion is not None
        for f in fields(ObservedWorkload):
            a, b = getattr(one, f.name), getattr(many, f.name)
            if f.name == "time_s":
                continue
            assert (a is None) == (b is None), (service, f.name, a, b)
            if isinstance(a, float) and isinstance(b, float):
                assert b == pytest.approx(a, rel=1e-6), (service, f.name)
            else:
                assert a == b, (service, f.name)
    rates = {s: (batched[s][0] or ObservedWorkload(0, 1)).requests_per_s or 0.0 for s in SERVICES}
    assert rates[("ns", "svc")] > 2 * rates[("ns", "svc-v2")]  # each service got its own series


Workloads = dict[tuple[str, str], tuple[ObservedWorkload | None, str | None]]


async def batched_read(
    reader: FleetReader, namespace: str, name: str, at_s: float
) -> tuple[ObservedWorkload | None, str | None]:
    return await observe_workload_batched(
        reader, "vllm", namespace, name, at_s, WORK_WINDOW, PEAK_WINDOW, 10.0, BURST_WINDOW
    )


async def _workloads(url: str, at_s: float) -> tuple[Workloads, Workloads, int]:
    client = AsyncPrometheusClient(url, timeout_s=10, retries=1, backoff_s=0.05)
    # Every query evaluated at `at_s` (httpx merges the client's params into each request's).
    client._http.params = httpx.QueryParams({"time": f"{at_s:.3f}"})
    reader = FleetReader(client, workload_reads(WORK_WINDOW, PEAK_WINDOW, BURST_WINDOW), max_age_s=60)
    try:
        for namespace, name in SERVICES:  # the reader learns the namespaces (a read per new one)
            await batched_read(reader, namespace, name, at_s)
        reader.max_age_s, sent = 0.0, reader.queries_sent
        await batched_read(reader, "ns2", "svc", at_s)  # one read for both namespaces
        reader.max_age_s = 60.0
        batched = {(ns, name): await batched_read(reader, ns, name, at_s) for ns, name in SERVICES}
        alone = {
            (ns, name): await observe_workload_async(
                client, "vllm", ns, name, at_s, WORK_WINDOW, PEAK_WINDOW, 10.0, BURST_WINDOW
            )
            for ns, name in SERVICES
        }
        return alone, batched, reader.queries_sent - sent
    finally:
        await client.aclose()
