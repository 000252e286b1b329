"""The work that arrives, read from the engines' token counters and length histograms: names
checked against the engines' source, PromQL, the prefix-cache discount, length quantiles,
the hour and day peaks, and the stand-in serving these series with a length mix that changes."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvscale.autoscaling.observation import LengthHistogram
from kvscale.metrics.client import AsyncPrometheusClient, Missing, MissingKind, Sample
from kvscale.metrics.engines import ENGINES
from kvscale.metrics.observe import assemble_workload, observe_async, observe_workload_async, prefill_tokens_per_s
from kvscale.metrics.promql import queries, workload_queries
from kvscale.sim.engine import StepTimes
from kvscale.sim.fleet import FleetSpec
from kvscale.sim.load_profile import ProfileError, parse_profile
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.standin.exposition import EngineCollector
from kvscale.standin.fleet import PodFleet


def test_work_counters_are_the_engines_own() -> None:
    vllm, sglang, tgi = ENGINES["vllm"], ENGINES["sglang"], ENGINES["tgi"]
    # vllm/v1/metrics/loggers.py (0.11.0): Counter(name="vllm:prompt_tokens"), "vllm:generation_tokens",
    # "vllm:prefix_cache_queries", "vllm:prefix_cache_hits" (prometheus_client adds _total);
    # vllm:gpu_prefix_cache_* only with --show-hidden-metrics-for-version=0.10.
    assert vllm.prompt_tokens_counter == ("vllm:prompt_tokens_total",)
    assert vllm.generation_tokens_counter == ("vllm:generation_tokens_total",)
    assert vllm.prefix_cache_queries_counter[0] == "vllm:prefix_cache_queries_total"
    assert vllm.prefix_cache_hits_counter[0] == "vllm:prefix_cache_hits_total"
    assert vllm.prompt_tokens_histogram == ("vllm:request_prompt_tokens",)
    # sglang/srt/observability/metrics_collector.py (0.5.23): observe_one_finished_request.
    assert sglang.prompt_tokens_counter == ("sglang:prompt_tokens_total",)
    assert sglang.prefix_cache_hits_counter == ("sglang:cached_tokens_total",)
    assert sglang.prefix_cache_queries_counter == ()  # every prompt token is looked up
    assert tgi.prompt_tokens_counter == () and tgi.prefix_cache_hits_counter == ()


def test_work_queries() -> None:
    vllm = queries(ENGINES["vllm"], "ns", "svc", 0.95, "1m")
    assert vllm["prompt_tokens_rate"].startswith('sum(rate({__name__="vllm:prompt_tokens_total",namespace="ns"')
    hits = vllm["prefix_cache_hit_ratio"]
    assert hits.index("vllm:prefix_cache_hits_total") < hits.index(") / (") < hits.index("prefix_cache_queries_total")
    assert "gpu_prefix_cache_hits_total" in hits  # the pre-0.9.2 name as the fallback
    assert vllm["waiting_max"].startswith('max({__name__="vllm:num_requests_waiting"')
    sglang = queries(ENGINES["sglang"], "ns", "svc", 0.95, "1m")
    assert "sglang:cached_tokens_total" in sglang["prefix_cache_hit_ratio"]
    assert "sglang:prompt_tokens_total" in sglang["prefix_cache_hit_ratio"].split(" / ")[1]
    tgi = queries(ENGINES["tgi"], "ns", "svc", 0.95, "1m")
    assert "prefix_cache_hit_ratio" not in tgi
    assert (
        'rate({__name__="tgi_request_input_length_sum"' in tgi["prompt_tokens_rate"]
    )  # no counter: the histogram's sum
    slow = workload_queries(ENGINES["vllm"], "ns", "svc", "10m", "1m")
    assert slow["prompt_lengths"].startswith('sum by (le) (rate({__name__="vllm:request_prompt_tokens_bucket"')
    assert slow["peak_requests_1h"].startswith("max_over_time((sum(rate(") and slow["peak_requests_1h"].endswith(
        "[1m])))[1h:30s])"
    )
    assert "[1d:" in slow["peak_prompt_tokens_1d"] and "vllm:prompt_tokens_total" in slow["peak_prompt_tokens_1d"]


def test_prefix_cache_hits_discount_prefill_only_when_known() -> None:
    assert prefill_tokens_per_s(1000.0, 0.25) == 750.0
    assert prefill_tokens_per_s(1000.0, None) == 1000.0  # unknown: no discount, never less work
    assert prefill_tokens_per_s(1000.0, 1.5) == 0.0  # a ratio past 1 (counters out of step) is capped
    assert prefill_tokens_per_s(None, 0.5) is None


def _prometheus_quantile(q: float, cumulative: list[tuple[float, float]]) -> float:
    """promql/quantile.go bucketQuantile, for these cases: linear within the bucket."""
    total = cumulative[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for le, count in cumulative:
        if count >= rank:
            return lower if math.isinf(le) else lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


@pytest.mark.parametrize("q", [0.0, 0.1, 0.5, 0.9, 0.95, 0.99, 1.0])
def test_length_quantiles_are_prometheus_quantiles(q: float) -> None:
    cumulative = [(100.0, 2.0), (200.0, 2.0), (500.0, 10.0), (1000.0, 19.0), (2000.0, 20.0), (math.inf, 20.0)]
    hist = LengthHistogram.from_cumulative(list(reversed(cumulative)))  # any order
    assert hist is not None and hist.total == 20.0 and hist.counts[1] == 0.0
    assert math.isclose(hist.quantile(q), _prometheus_quantile(q, cumulative), abs_tol=1e-9)


def test_length_histogram_edges() -> None:
    assert LengthHistogram.from_cumulative([]) is None
    assert LengthHistogram.from_cumulative([(10.0, 0.0), (math.inf, 0.0)]) is None  # no requests in the window
    assert LengthHistogram.from_cumulative([(10.0, math.nan)]) is None
    open_top = LengthHistogram.from_cumulative([(10.0, 1.0), (math.inf, 3.0)])
    assert open_top is not None and open_top.quantile(0.9) == 10.0  # the open bucket: its lower bound
    with pytest.raises(ValueError, match="bucket bounds"):
        LengthHistogram((2.0, 1.0), (1.0, 1.0))


def _vector(value: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metric": labels or {}, "value": [1.7e9, value]}


def _answer(result: list[dict[str, Any]]) -> httpx.Response:
    return httpx.Response(
        200, content=json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    )


def _client(answer: Any) -> AsyncPrometheusClient:
    return AsyncPrometheusClient("http://prometheus.test", retries=0, transport=httpx.MockTransport(answer))


def test_the_tick_observes_work_units() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        q = request.url.params["query"]
        if q.startswith("time()"):
            return _answer([_vector("2")])
        if "prefix_cache_hits" in q:
            return _answer([_vector("0.4")])
        if "prompt_tokens_total" in q:
            return _answer([_vector("3000")])
        if "generation_tokens_total" in q:
            return _answer([_vector("500")])
        if q.startswith("max("):
            return _answer([_vector("7")])
        return _answer([_vector("1")])

    async def go() -> Any:
        client = _client(answer)
        try:
            return await observe_async(client, "vllm", "ns", "svc", 95, 2, 0, time.time())
        finally:
            await client.aclose()

    obs, why = asyncio.run(go())
    assert why is None and obs.complete
    assert obs.prompt_tokens_per_s == 3000 and obs.decode_tokens_per_s == 500
    assert obs.prefix_cache_hit_ratio == 0.4 and math.isclose(obs.prefill_tokens_per_s or 0, 1800)
    assert obs.waiting_max == 7


def _workload_answers(fail: str | None = None) -> Any:
    def answer(request: httpx.Request) -> httpx.Response:
        q = request.url.params["query"]
        if fail is not None and fail in q:
            return httpx.Response(400, content=b'{"status": "error", "errorType": "bad_data", "error": "nope"}')
        if q.startswith("sum by (le)"):
            buckets = [("100", "1"), ("1000", "3"), ("+Inf", "4")] if "prompt" in q else [("10", "2"), ("+Inf", "4")]
            return _answer([_vector(v, {"le": le}) for le, v in buckets])
        if q.startswith("max_over_time"):
            return _answer([_vector("9" if "success" in q else "9000")])
        if "prefix_cache_hits" in q:
            return _answer([_vector("0.5")])
        if " / " in q:  # the mean lengths
            return _answer([_vector("600")])
        return _answer([_vector("4")])

    return answer


def _observe_workload(answer: Any) -> Any:
    async def go() -> Any:
        client = _client(answer)
        try:
            return await observe_workload_async(client, "vllm", "ns", "svc", 100.0, "10m", "1m")
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_the_observed_workload() -> None:
    workload, why = _observe_workload(_workload_answers())
    assert why is None and workload is not None
    assert workload.window_s == 600 and workload.peak_window_s == 60 and workload.requests_per_s == 4
    assert workload.input_tokens_mean == 600 and workload.prefix_cache_hit_ratio == 0.5
    assert workload.prompt_lengths is not None and workload.prompt_lengths.counts == (1.0, 2.0, 1.0)
    assert workload.prompt_lengths.quantile(0.5) == 550.0  # rank 2 of 4: halfway through (100, 1000]
    assert workload.peak_requests_per_s_1h == 9 and workload.peak_requests_per_s_1d == 9
    assert workload.peak_prefill_tokens_per_s_1d == 4500  # the peak's prompt tokens less the cache hits
    assert workload.prefill_tokens_per_s == 2.0


def test_a_failed_query_leaves_the_workload_unread() -> None:
    workload, why = _observe_workload(_workload_answers(fail="max_over_time"))
    assert workload is None and why is not None and "bad_data" in why


def test_an_idle_service_has_a_workload_without_lengths() -> None:
    values: dict[str, float | Missing] = {"rate": 0.0, "input_tokens": Missing(MissingKind.NOT_FINITE, "NaN")}
    empty: dict[str, list[Sample] | Missing] = {"prompt_lengths": Missing(MissingKind.EMPTY, "none")}
    workload, why = assemble_workload(values, empty, 5.0, "5m", "30s")
    assert workload is not None and workload.prompt_lengths is None and workload.input_tokens_mean is None
    assert why == "no data for input_tokens, output_tokens"


def test_load_profile_changes_the_length_mix() -> None:
    arrivals = parse_profile("constant:50;lengths:2048/64@10,4096/16@20", 512, 128, seed=1)
    by_time = arrivals.until(30.0)
    assert {(r.input_tokens, r.output_tokens) for r in by_time if r.arrival_s < 10} == {(512, 128)}
    assert {(r.input_tokens, r.output_tokens) for r in by_time if 10 <= r.arrival_s < 20} == {(2048, 64)}
    assert {(r.input_tokens, r.output_tokens) for r in by_time if r.arrival_s >= 20} == {(4096, 16)}
    for bad in ("constant:1;lengths:", "constant:1;lengths:0/5@0", "constant:1;mix:1/1@0", "constant:1;lengths:a@b"):
        with pytest.raises(ProfileError, match="lengths"):
            parse_profile(bad, 1, 1)


def test_standin_serves_the_work_counters_the_queries_read() -> None:
    cat = default_catalog()
    cfg = ServingConfig.build(cat, cat.model("llama-3.1-8b"), cat.gpu("L4"))
    clock = {"t": 0.0}
    fleet = PodFleet(
        FleetSpec(32, cfg.memory.kv_capacity_tokens, 2048, cfg.gpus, 0.0),
        StepTimes(cfg),
        parse_profile("constant:4;lengths:1000/20@0", 256, 64, seed=1),
        clock=lambda: clock["t"],
    )
    fleet.sync_pods(["chat-5d9c-x1"])
    for step in range(1, 301):
        clock["t"] = step * 0.1
        fleet.tick()
    registry = CollectorRegistry()
    registry.register(EngineCollector(fleet, "ns", "llama"))
    text = generate_latest(registry).decode()
    vllm = ENGINES["vllm"]
    done = fleet.pods["chat-5d9c-x1"].success
    assert done > 50
    for name in (
        vllm.prompt_tokens_counter[0],
        vllm.generation_tokens_counter[0],
        vllm.prefix_cache_queries_counter[0],
        vllm.prefix_cache_hits_counter[0],
    ):
        line = next(line for line in text.splitlines() if line.startswith(name + "{"))
        assert any(name in q for q in queries(vllm, "ns", "chat", 0.95, "1m").values()), name
        value = float(line.rsplit(" ", 1)[1])
        if name == vllm.generation_tokens_counter[0]:
            # counted per engine step, as vLLM does: the in-flight requests' tokens too
            in_flight = len(fleet.pods["chat-5d9c-x1"].replica.running)
            assert 20 * done <= value <= 20 * (done + in_flight), (name, value)
            continue
        expected = {"vllm:prefix_cache_hits_total": 0.0}
        assert value == expected.get(name, 1000 * done), (name, value)
