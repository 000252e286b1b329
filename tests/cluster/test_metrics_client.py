"""The Prometheus client and the observation against a real Prometheus: NaN, empty,
multi-series and unreachable answers are each handled explicitly."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app

from kvscale.metrics.client import AsyncPrometheusClient, Missing, MissingKind, PrometheusError
from kvscale.metrics.observe import observe_async
from tests.cluster.harness import free_port
from tests.cluster.prometheus import Prometheus


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_client_handles_nan_empty_multi_and_errors(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("kvscale_test_value", "test", ["pod"], registry=registry)
    gauge.labels(pod="a").set(math.nan)
    gauge.labels(pod="b").set(2.0)
    port = free_port()
    server = make_server("127.0.0.1", port, make_wsgi_app(registry), handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Prometheus(tmp_path / "prom", targets=[f"127.0.0.1:{port}"]) as prom:
            prom.wait_for_series('kvscale_test_value{pod="b"}')
            asyncio.run(_live(prom.url))
    finally:
        server.shutdown()
    asyncio.run(_dead(f"http://127.0.0.1:{free_port()}"))


async def _live(url: str) -> None:
    client = AsyncPrometheusClient(url, timeout_s=2, retries=1, backoff_s=0.05)
    try:
        nan = await client.scalar('kvscale_test_value{pod="a"}')
        assert isinstance(nan, Missing) and nan.kind is MissingKind.NOT_FINITE
        assert await client.scalar('kvscale_test_value{pod="b"}') == 2.0
        empty = await client.scalar('kvscale_test_value{pod="zzz"}')
        assert isinstance(empty, Missing) and empty.kind is MissingKind.EMPTY
        many = await client.scalar("kvscale_test_value")
        assert isinstance(many, Missing) and many.kind is MissingKind.AMBIGUOUS and "2 series" in many.reason
        bad = await client.scalar("sum(")
        assert isinstance(bad, Missing) and bad.kind is MissingKind.REJECTED and "bad_data" in bad.reason
        assert await client.scalar("1 + 1") == 2.0  # a scalar result
        obs, why = await observe_async(client, "vllm", "ns", "svc", 95, 2, 0, time.time())
        assert obs.stale and why == "no engine samples in Prometheus"
        assert not obs.complete
    finally:
        await client.aclose()


async def _dead(url: str) -> None:
    dead = AsyncPrometheusClient(url, timeout_s=0.5, retries=1, backoff_s=0.01)
    try:
        with pytest.raises(PrometheusError, match="unreachable after 2 tries"):
            await dead.query("up")
        obs, why = await observe_async(dead, "vllm", "ns", "svc", 95, 2, 1, time.time())
        assert obs.stale and obs.ready_replicas == 2 and obs.starting_replicas == 1 and why and "unreachable" in why
    finally:
        await dead.aclose()


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi"])
def test_every_engine_query_parses_on_a_real_prometheus(tmp_path: Path, engine: str) -> None:
    """Each query the tick and the workload read send, for every engine, is accepted (a
    refused query would leave the observation stale for good): with no such series, each
    answers empty or NaN, never an error."""
    from kvscale.autoscaling.observation import ObservedWorkload
    from kvscale.metrics.client import Sample
    from kvscale.metrics.engines import ENGINES
    from kvscale.metrics.observe import observe_workload_async
    from kvscale.metrics.promql import queries, workload_queries

    built = {
        **queries(ENGINES[engine], "ns", "svc", 0.95, "1m"),
        **{f"workload {k}": q for k, q in workload_queries(ENGINES[engine], "ns", "svc", "10m", "1m", "30s").items()},
    }
    with Prometheus(tmp_path / "prom", targets=[]) as prom:

        async def ask() -> tuple[dict[str, list[Sample] | Missing], ObservedWorkload | None, str | None]:
            client = AsyncPrometheusClient(prom.url, timeout_s=10.0, retries=0)
            try:
                answers = {key: await client.vector(q) for key, q in built.items()}
                workload, why = await observe_workload_async(client, engine, "ns", "svc", time.time())
                return answers, workload, why
            finally:
                await client.aclose()

        answers, workload, why = asyncio.run(ask())
    refused = {k: v.reason for k, v in answers.items() if isinstance(v, Missing) and v.is_error}
    assert refused == {}
    assert workload is not None and workload.requests_per_s is None
    assert why == "no data for rate, input_tokens, output_tokens"
