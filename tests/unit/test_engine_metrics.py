"""One table of engine metrics for the reader (PromQL) and the stand-in (producer): vLLM's real
names, labels and bucket boundaries; per-request TPOT; SGLang and TGI adapters."""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvscale.api.models import ObservedStatus
from kvscale.autoscaling.observation import Decision, Observation
from kvscale.control.status import observed_status
from kvscale.engines.buckets import vllm_token_buckets
from kvscale.metrics.client import AsyncPrometheusClient
from kvscale.metrics.engines import (
    ENGINES,
    VLLM_REQUEST_LATENCY_BUCKETS_S,
    VLLM_TPOT_BUCKETS_S,
    VLLM_TTFT_BUCKETS_S,
)
from kvscale.metrics.observe import observe_async
from kvscale.metrics.promql import queries
from kvscale.sim.engine import StepTimes
from kvscale.sim.fleet import FleetSpec
from kvscale.sim.load_profile import parse_profile
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.standin.exposition import EngineCollector
from kvscale.standin.fleet import PodFleet


def test_vllm_buckets_are_vllms() -> None:
    # vllm/v1/metrics/loggers.py (0.11.0), vllm/v1/metrics/buckets.py (0.33.0): TTFT jumps
    # 0.1 -> 0.25 -> 0.5 s, TPOT 10 -> 25 -> 50 ms.
    assert VLLM_TTFT_BUCKETS_S[VLLM_TTFT_BUCKETS_S.index(0.1) :][:3] == (0.1, 0.25, 0.5)
    assert VLLM_TPOT_BUCKETS_S[:4] == (0.01, 0.025, 0.05, 0.075) and VLLM_TPOT_BUCKETS_S[-1] == 80.0
    assert len(VLLM_TTFT_BUCKETS_S) == 22 and VLLM_TTFT_BUCKETS_S[-1] == 2560.0
    assert VLLM_REQUEST_LATENCY_BUCKETS_S[0] == 0.3 and VLLM_REQUEST_LATENCY_BUCKETS_S[-1] == 7680.0
    assert vllm_token_buckets(100) == (1, 2, 5, 10, 20, 50, 100)  # loggers.py build_1_2_5_buckets docstring


def test_tpot_reads_the_per_request_histogram_first() -> None:
    vllm = queries(ENGINES["vllm"], "ns", "svc", 0.95, "1m")
    per_request = vllm["tpot"].index("vllm:request_time_per_output_token_seconds_bucket")
    assert per_request < vllm["tpot"].index("vllm:inter_token_latency_seconds_bucket")
    assert "request_time_per_output_token_seconds_count" in vllm["tpot_per_request"]
    assert ENGINES["vllm"].tpot_source(True) == "per-request TPOT"
    assert "inter-token latency" in ENGINES["vllm"].tpot_source(False)


def test_sglang_and_tgi_adapters() -> None:
    sglang = queries(ENGINES["sglang"], "n", "s", 0.9, "30s")
    assert "sglang:prompt_tokens_histogram_sum" in sglang["input_tokens"]
    assert "sglang:generation_tokens_histogram_count" in sglang["output_tokens"]
    assert sglang["tpot"].startswith('histogram_quantile(0.9, sum by (le) (rate({__name__="sglang:request_time')
    tgi = queries(ENGINES["tgi"], "n", "s", 0.9, "30s")
    assert "ttft" not in tgi and "tpot_per_request" not in tgi  # no TTFT histogram: unavailable, not queue time
    assert "queue" in (ENGINES["tgi"].ttft_unavailable_reason or "")
    assert "tgi_request_mean_time_per_token_duration_bucket" in tgi["tpot"]


def _scrape(standin: EngineCollector) -> dict[str, Any]:
    registry = CollectorRegistry()
    registry.register(standin)
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def _quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over cumulative (le, count) pairs (promql/quantile.go)."""
    total = buckets[-1][1]
    rank = q * total
    counts = [c for _, c in buckets]
    i = bisect.bisect_left(counts, rank)
    upper, count = buckets[i]
    lower, below = (0.0, 0.0) if i == 0 else buckets[i - 1]
    if upper == float("inf"):
        return lower
    return lower + (upper - lower) * (rank - below) / (count - below)


def test_standin_exports_vllm_names_labels_and_buckets() -> None:
    cat = default_catalog()
    cfg = ServingConfig.build(cat, cat.model("llama-3.1-8b"), cat.gpu("L4"))
    clock = {"t": 0.0}
    fleet = PodFleet(
        FleetSpec(32, cfg.memory.kv_capacity_tokens, 2048, cfg.gpus, 0.0),
        StepTimes(cfg),
        parse_profile("constant:4", 256, 64, seed=1),
        clock=lambda: clock["t"],
    )
    fleet.sync_pods(["svc-abc-1"])
    for step in range(1, 601):
        clock["t"] = step * 0.1
        fleet.tick()
    families = _scrape(EngineCollector(fleet, "ns", "llama"))
    tpot = families["vllm:request_time_per_output_token_seconds"]
    buckets = [s for s in tpot.samples if s.name.endswith("_bucket")]
    assert [float(s.labels["le"]) for s in buckets] == [*VLLM_TPOT_BUCKETS_S, float("inf")]
    assert {k: buckets[0].labels[k] for k in ("model_name", "engine", "pod", "namespace")} == {
        "model_name": "llama",
        "engine": "0",
        "pod": "svc-abc-1",
        "namespace": "ns",
    }
    ttft = families["vllm:time_to_first_token_seconds"]
    assert [float(s.labels["le"]) for s in ttft.samples if s.name.endswith("_bucket")][:-1] == list(VLLM_TTFT_BUCKETS_S)
    # One observation per finished request for TPOT, one per token gap for ITL, observed at the
    # step that ends the gap as vLLM does (so the in-flight requests' gaps are counted too).
    count = {
        f: next(s.value for s in families[f].samples if s.name.endswith("_count"))
        for f in families
        if families[f].type == "histogram"
    }
    done = count["vllm:request_time_per_output_token_seconds"]
    in_flight = len(fleet.pods["svc-abc-1"].replica.running)
    assert done > 100 and done * 63 <= count["vllm:inter_token_latency_seconds"] <= (done + in_flight) * 63
    # A quantile read from these buckets lands inside one of vLLM's (coarse) buckets, above the mean.
    cumulative = [(float(s.labels["le"]), s.value) for s in buckets]
    p95 = _quantile(0.95, cumulative)
    mean = next(s.value for s in tpot.samples if s.name.endswith("_sum")) / done
    top = next(le for le, c in cumulative if c >= done)
    assert mean <= p95 <= top


def _prometheus(per_request_series: bool) -> AsyncPrometheusClient:
    """Answers every query with 0.2 (age 3 s); the per-request TPOT count is empty when the
    engine exports no per-request histogram, as an older vLLM would."""

    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        result: list[dict[str, Any]] = [{"metric": {}, "value": [1.7e9, "3" if query.startswith("time()") else "0.2"]}]
        if query.startswith("count(") and not per_request_series:
            result = []
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        return httpx.Response(200, content=json.dumps(body).encode())

    return AsyncPrometheusClient("http://prometheus.test", retries=0, transport=httpx.MockTransport(handler))


def observe(client: AsyncPrometheusClient, *args: Any) -> tuple[Observation, str | None]:
    async def go() -> tuple[Observation, str | None]:
        try:
            return await observe_async(client, *args)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_observation_says_what_tpot_and_ttft_were_read_from() -> None:
    obs, why = observe(_prometheus(True), "vllm", "ns", "svc", 95, 1, 0, time.time())
    assert why is None and obs.tpot_source == "per-request TPOT" and obs.ttft_source is None
    fallback, _ = observe(_prometheus(False), "vllm", "ns", "svc", 95, 1, 0, time.time())
    assert fallback.tpot_p_s == 0.2 and "inter-token latency" in (fallback.tpot_source or "")
    tgi, _ = observe(_prometheus(True), "tgi", "ns", "svc", 95, 1, 0, time.time())
    assert tgi.ttft_p_s is None and "no TTFT histogram" in (tgi.ttft_source or "")
    assert tgi.tpot_source == "per-request TPOT"
    status = observed_status(fallback, Decision(1, "hold"))
    assert status.tpot_source == fallback.tpot_source
    assert ObservedStatus.model_validate(status.model_dump(by_alias=True)) == status  # the wire form round-trips
