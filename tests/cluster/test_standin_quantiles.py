"""PromQL quantiles from the stand-in's vLLM buckets, through a real Prometheus: the operator's
TPOT reads the per-request histogram, and its p95 is as coarse as vLLM's buckets make it (it
lands in the bucket that holds the exact p95, not on it)."""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from kvscale.autoscaling.observation import Observation
from kvscale.metrics.client import AsyncPrometheusClient
from kvscale.metrics.engines import VLLM_TPOT_BUCKETS_S, VLLM_TTFT_BUCKETS_S
from kvscale.metrics.observe import observe_async
from kvscale.sim.engine import SimRequest, StepTimes
from kvscale.sim.fleet import FleetSpec
from kvscale.sim.load_profile import parse_profile
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.standin.exposition import EngineCollector, serve_metrics
from kvscale.standin.fleet import PodFleet, PodStats
from tests.cluster.harness import free_port, wait_until
from tests.cluster.prometheus import Prometheus

ROOT = Path(__file__).resolve().parents[2]


def _bucket(bounds: tuple[float, ...], value: float) -> int:
    return bisect.bisect_left(bounds, value)


def test_promql_quantiles_from_vllm_buckets(tmp_path: Path) -> None:
    cat = default_catalog()
    cfg = ServingConfig.build(cat, cat.model("llama-3.1-8b"), cat.gpu("A100-80GB"))
    clock = {"t": 0.0}
    standin = PodFleet(
        FleetSpec(48, cfg.memory.kv_capacity_tokens, 2048, cfg.gpus, 0.0),
        StepTimes(cfg),
        parse_profile("constant:8", 512, 128, seed=3),
        clock=lambda: clock["t"],
    )
    standin.sync_pods(["svc-abc12-x1y2z"])
    tpots: list[float] = []
    ttfts: list[float] = []
    original = PodStats.record

    def record(self: PodStats, r: SimRequest) -> None:
        tpots.append(r.tpot_s)
        ttfts.append(r.ttft_s)
        original(self, r)

    PodStats.record = record  # type: ignore[method-assign]
    registry = CollectorRegistry()
    registry.register(EngineCollector(standin, "ns", "llama"))
    port = free_port()
    server = serve_metrics(registry, port)  # as `kvscale sim serve` serves them
    running = threading.Event()
    running.set()

    def advance() -> None:  # simulated time runs 4x faster than the wall clock
        start = time.monotonic()
        while running.is_set():
            clock["t"] = 4 * (time.monotonic() - start)
            standin.tick()
            time.sleep(0.02)  # the stand-in's own pacing

    ticker = threading.Thread(target=advance, daemon=True)
    ticker.start()
    try:
        with Prometheus(tmp_path / "prom", targets=[f"127.0.0.1:{port}"]) as prom:
            prom.wait_for_series('vllm:request_time_per_output_token_seconds_count{engine="0"}')
            result: dict[str, Any] = {}

            def observed() -> bool:
                obs, why = asyncio.run(_observe(prom.url))
                result.update(obs=obs, why=why)
                return obs.tpot_p_s is not None and obs.ttft_p_s is not None and len(tpots) > 300

            wait_until(observed, 60, "TPOT and TTFT quantiles from Prometheus", interval_s=1.0)
            # The dashboard's TPOT panel reads the same per-request histogram.
            dashboard = json.loads((ROOT / "deploy" / "grafana" / "kvscale.json").read_text())
            panel = next(p for p in dashboard["panels"] if p["title"] == "TPOT p95 vs target")
            expr = panel["targets"][0]["expr"].replace("$namespace", "ns").replace("$inferenceservice", "svc")
            assert "request_time_per_output_token" in expr and prom.query(expr)
    finally:
        running.clear()
        server.shutdown()
        PodStats.record = original  # type: ignore[method-assign]
    obs = result["obs"]
    assert result["why"] is None and obs.tpot_source == "per-request TPOT"
    exact_tpot = sorted(tpots)[math.ceil(0.95 * len(tpots)) - 1]
    exact_ttft = sorted(ttfts)[math.ceil(0.95 * len(ttfts)) - 1]
    # The windowed quantile and the whole run's differ a little; both fall in the same or a
    # neighbouring vLLM bucket, and PromQL can say no more than the bucket.
    assert abs(_bucket(VLLM_TPOT_BUCKETS_S, obs.tpot_p_s) - _bucket(VLLM_TPOT_BUCKETS_S, exact_tpot)) <= 1, (
        obs.tpot_p_s,
        exact_tpot,
    )
    assert abs(_bucket(VLLM_TTFT_BUCKETS_S, obs.ttft_p_s) - _bucket(VLLM_TTFT_BUCKETS_S, exact_ttft)) <= 1, (
        obs.ttft_p_s,
        exact_ttft,
    )


async def _observe(url: str) -> tuple[Observation, str | None]:
    client = AsyncPrometheusClient(url, timeout_s=2, retries=1, backoff_s=0.05)
    try:
        return await observe_async(client, "vllm", "ns", "svc", 95, 1, 0, time.time(), window="30s")
    finally:
        await client.aclose()
