"""The Prometheus client and the observation against a real Prometheus: NaN, empty,
multi-series and unreachable answers are each handled explicitly."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app

from kvscale.metrics.client import PrometheusClient, PrometheusError
from kvscale.metrics.observe import observe
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
            client = PrometheusClient(prom.url, timeout_s=2, retries=1, backoff_s=0.05)
            assert client.scalar('kvscale_test_value{pod="a"}') is None  # NaN
            assert client.scalar('kvscale_test_value{pod="b"}') == 2.0
            assert client.scalar('kvscale_test_value{pod="zzz"}') is None  # empty
            with pytest.raises(PrometheusError, match="2 series"):
                client.scalar("kvscale_test_value")
            with pytest.raises(PrometheusError, match="bad_data"):
                client.scalar("sum(")
            assert client.scalar("1 + 1") == 2.0  # a scalar result
            obs, why = observe(client, "vllm", "ns", "svc", 95, 2, 0, time.time())
            assert obs.stale and why == "no engine samples in Prometheus"
            assert not obs.complete
    finally:
        server.shutdown()
    dead = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.5, retries=1, backoff_s=0.01)
    with pytest.raises(PrometheusError, match="unreachable after 2 tries"):
        dead.query("up")
    obs, why = observe(dead, "vllm", "ns", "svc", 95, 2, 1, time.time())
    assert obs.stale and obs.ready_replicas == 2 and obs.starting_replicas == 1 and why and "unreachable" in why
