"""What a current Prometheus (3.x, built from the Go module proxy) stores for vLLM's
`vllm:`-prefixed names, and that kvscale reads it either way.

vLLM serves /metrics with prometheus_client's content negotiation (the stand-in does the
same): Prometheus 3 asks for `escaping=allow-utf-8` and stores `vllm:num_requests_running`;
a scrape that asks for escaped names (Prometheus 2's OpenMetrics, or Prometheus 3 with
`metric_name_validation_scheme: legacy`) gets prometheus_client's "underscores" escaping and
stores `vllm_num_requests_running`. The metrics client queries both spellings."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from kvscale.autoscaling.observation import Observation
from kvscale.metrics.client import AsyncPrometheusClient
from kvscale.metrics.observe import observe_async
from kvscale.sim.engine import StepTimes
from kvscale.sim.fleet import FleetSpec
from kvscale.sim.load_profile import parse_profile
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.standin.exposition import EngineCollector, serve_metrics
from kvscale.standin.fleet import PodFleet
from tests.cluster.harness import free_port, wait_until
from tests.cluster.prometheus import Prometheus


@pytest.mark.parametrize(
    ("scrape", "stored", "absent"),
    [
        ({}, "vllm:", "vllm_"),
        ({"metric_name_validation_scheme": "legacy"}, "vllm_", "vllm:"),
    ],
    ids=["utf8-names", "legacy-escaped-names"],
)
def test_engine_names_as_prometheus_3_stores_them_are_read(
    tmp_path: Path, scrape: dict[str, Any], stored: str, absent: str
) -> None:
    cat = default_catalog()
    cfg = ServingConfig.build(cat, cat.model("llama-3.1-8b"), cat.gpu("A100-80GB"))
    clock = {"t": 0.0}
    fleet = PodFleet(
        FleetSpec(48, cfg.memory.kv_capacity_tokens, 2048, cfg.gpus, 0.0),
        StepTimes(cfg),
        parse_profile("constant:8", 512, 128, seed=3),
        clock=lambda: clock["t"],
    )
    fleet.sync_pods(["svc-abc12-x1y2z"])
    registry = CollectorRegistry()
    registry.register(EngineCollector(fleet, "ns", "llama"))
    port = free_port()
    server = serve_metrics(registry, port)
    running = threading.Event()
    running.set()

    def advance() -> None:
        start = time.monotonic()
        while running.is_set():
            clock["t"] = 4 * (time.monotonic() - start)
            fleet.tick()
            time.sleep(0.02)

    threading.Thread(target=advance, daemon=True).start()
    try:
        with Prometheus(tmp_path / "prom", targets=[f"127.0.0.1:{port}"], scrape_options=scrape) as prom:
            build = httpx.get(f"{prom.url}/api/v1/status/buildinfo", timeout=5).json()["data"]
            assert build["version"].startswith("3."), build
            prom.wait_for_series(f'{{__name__="{stored}num_requests_running"}}')
            assert prom.query(f'{{__name__="{absent}num_requests_running"}}') == []
            assert prom.query(f'{{__name__="{stored}time_to_first_token_seconds_bucket"}}')
            result: dict[str, Any] = {}

            def observed() -> bool:
                obs, why = asyncio.run(_observe(prom.url))
                result.update(obs=obs, why=why)
                return obs.ttft_p_s is not None and obs.tpot_p_s is not None and obs.running is not None

            wait_until(observed, 60, f"an observation from {stored}* series", interval_s=1.0)
    finally:
        running.clear()
        server.shutdown()
    obs: Observation = result["obs"]
    assert result["why"] is None and not obs.stale
    assert obs.arrival_rate_per_s is not None and obs.arrival_rate_per_s > 0


async def _observe(url: str) -> tuple[Observation, str | None]:
    client = AsyncPrometheusClient(url, timeout_s=2, retries=1, backoff_s=0.05)
    try:
        return await observe_async(client, "vllm", "ns", "svc", 95, 1, 0, time.time(), window="30s")
    finally:
        await client.aclose()
