"""helm and Prometheus, for real: a chart installs and uninstalls; a scrape answers a query."""

from __future__ import annotations

import subprocess
import threading
from http.server import HTTPServer
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app

from tests.cluster.harness import Cluster, free_port, wait_until
from tests.cluster.prometheus import Prometheus


def helm(cluster: Cluster, *args: str) -> str:
    out = subprocess.run(
        [str(cluster.helm), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_helm_installs_and_uninstalls_a_chart(
    cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    chart = tmp_path / "hello"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: hello\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hi\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-greeting\ndata:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    helm(cluster, "install", "demo", str(chart), "--namespace", namespace, "--set", "greeting=hello", "--wait")
    core = client.CoreV1Api(api)
    assert core.read_namespaced_config_map("demo-greeting", namespace).data == {"greeting": "hello"}
    assert "demo" in helm(cluster, "list", "--namespace", namespace, "--short")
    helm(cluster, "uninstall", "demo", "--namespace", namespace, "--wait")

    def gone() -> bool:
        try:
            core.read_namespaced_config_map("demo-greeting", namespace)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_until(gone, 30, "the chart's ConfigMap to be deleted")


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_prometheus_scrapes_an_exporter(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("kvscale_test_requests_waiting", "A test gauge", ["pod"], registry=registry)
    gauge.labels(pod="engine-0").set(7)
    port = free_port()
    server: HTTPServer = make_server("127.0.0.1", port, make_wsgi_app(registry), handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with Prometheus(tmp_path / "prom", targets=[f"127.0.0.1:{port}"]) as prom:
            series = prom.wait_for_series('kvscale_test_requests_waiting{pod="engine-0"}')
            assert float(series[0]["value"][1]) == 7.0
            gauge.labels(pod="engine-0").set(3)
            wait_until(
                lambda: float(prom.query("kvscale_test_requests_waiting")[0]["value"][1]) == 3.0,
                30,
                "the new value scraped",
            )
            up = prom.query('up{job="test"}')
            assert up and up[0]["value"][1] == "1"
    finally:
        server.shutdown()
