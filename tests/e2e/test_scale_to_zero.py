"""Scale to zero and back on the test cluster: the stand-in serves the engines' metrics behind
kwok pods, a second stand-in serves the gateway's queue gauge (the endpoint picker's
inference_extension_flow_control_queue_size behind spec.routing.inferencePool, or the KEDA
HTTP add-on interceptor's interceptor_pending_request_count behind spec.routing.kedaHttp), a
real Prometheus scrapes both, and the operator releases the last replica after the idle
window and brings replicas back, as many as the gateway's queue needs, when requests wait there."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from kvscale.control.scale_zero import KEDA_PENDING_METRIC, QUEUE_METRIC
from tests.cluster.harness import Cluster, free_port, wait_until
from tests.cluster.processes import Operator, standin
from tests.cluster.prometheus import Prometheus
from tests.cluster.test_operator import SAMPLES, condition, create, get

ROOT = Path(__file__).resolve().parents[2]
NAME = "sleepy"
LOAD = "steps:1@0,0@10"  # one request a second for ten seconds, then none


def replicas(api: client.ApiClient, namespace: str) -> int:
    return int(client.AppsV1Api(api).read_namespaced_deployment(NAME, namespace).spec.replicas or 0)


@pytest.fixture(params=["inferencePool", "kedaHttp"])
def zero(
    request: pytest.FixtureRequest, cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/inferenceservices.kvscale.io", "--timeout=60s")
    registry = CollectorRegistry()
    routing = str(request.param)
    if routing == "inferencePool":
        labels: tuple[str, ...] = ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name")
        queue = Gauge(QUEUE_METRIC, "The endpoint picker's flow-control queue (stand-in).", labels, registry=registry)
        series = queue.labels("default", "0", NAME, "m", "m")
    else:
        # The interceptor's OpenTelemetry exporter: attribute host = the HTTPScaledObject's
        # namespace/name, plus the scope labels (go.opentelemetry.io/otel/exporters/prometheus).
        labels = ("host", "otel_scope_name", "otel_scope_version")
        # The sample HTTPScaledObject is valid against the add-on's own CRD (v0.8.0).
        cluster.kubectl("apply", "-f", str(Path(__file__).parent / "data" / "http.keda.sh_httpscaledobjects.yaml"))
        cluster.kubectl("wait", "--for=condition=Established", "crd/httpscaledobjects.http.keda.sh", "--timeout=60s")
        # (kubectl's discovery may not know the new kind for a moment after Established.)
        sample_args = ("apply", "-n", namespace, "-f", str(ROOT / "deploy" / "keda" / "httpscaledobject.yaml"))
        try:
            wait_until(functools.partial(cluster.kubectl_ok, *sample_args), 30, "the sample HTTPScaledObject applied")
        except TimeoutError:
            cluster.kubectl(*sample_args)  # raises with kubectl's own reason (a schema error, say)
            raise
        sample = json.loads(cluster.kubectl("get", "httpscaledobject", NAME, "-n", namespace, "-o", "json"))
        assert sample["spec"]["scaleTargetRef"]["service"] == NAME
        assert sample["metadata"]["annotations"]["httpscaledobject.keda.sh/skip-scaledobject-creation"] == "true"
        help_ = "a count of requests pending forwarding by the interceptor proxy (stand-in)"
        queue = Gauge(KEDA_PENDING_METRIC, help_, labels, registry=registry)
        series = queue.labels(f"{namespace}/{NAME}", "keda-interceptor-proxy", "")
    series.set(0)
    queue_port = free_port()
    server, thread = start_http_server(queue_port, addr="127.0.0.1", registry=registry)
    metrics_port = free_port()
    op = Operator(cluster, tmp_path)
    # The gateway is scraped as Kubernetes service discovery would label it: the picker pod runs
    # in its pool's namespace (the service's), the KEDA interceptor in KEDA's own.
    scraped_in = namespace if routing == "inferencePool" else "keda"
    gateway = {
        "job_name": "gateway",
        "static_configs": [{"targets": [f"127.0.0.1:{queue_port}"], "labels": {"namespace": scraped_in}}],
    }
    prom = Prometheus(tmp_path / "prom", targets=[f"127.0.0.1:{metrics_port}"], jobs=[gateway]).start()
    op.env.update(
        {
            "KVSCALE_PROMETHEUS_URL": prom.url,
            "KVSCALE_SCALE_INTERVAL": "2s",
            "KVSCALE_METRICS_WINDOW": "10s",
            "KVSCALE_METRICS_STALE_AFTER": "10s",
        }
    )
    op.start()
    body = copy.deepcopy(SAMPLES["custom-architecture"])
    body["metadata"]["name"] = NAME
    body["spec"]["scaling"] = {"minReplicas": 0, "maxReplicas": 2, "idleWindow": "10s", "scaleDownStabilization": "5s"}
    body["spec"]["routing"] = {routing: {}}
    create(api, namespace, body)
    wait_until(lambda: get(api, namespace, NAME).get("status", {}).get("phase") == "Ready", 60, "Ready")
    serving = standin(cluster, NAME, namespace, metrics_port, LOAD, "3s", tmp_path / "standin.log")
    try:
        yield {"queue": series, "operator": op, "namespace": namespace}
    finally:
        serving.stop()
        op.stop()
        prom.stop()
        server.shutdown()
        thread.join(5)


def test_idle_window_releases_the_last_replica_and_the_gateway_queue_brings_one_back(
    zero: dict[str, Any], api: client.ApiClient
) -> None:
    ns, op = zero["namespace"], zero["operator"]
    try:
        wait_until(lambda: replicas(api, ns) == 0, 120, "scaled to zero after the idle window")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {get(api, ns, NAME).get('status')}\n{op.tail()}") from exc
    c = condition(get(api, ns, NAME), "ScaleToZero")
    assert c["status"] == "True" and "after 10s without requests" in c["message"]
    assert "waits at the gateway about" in c["message"]
    # Nothing waits: it stays at zero.
    wait_until(lambda: "at zero" in condition(get(api, ns, NAME), "ScaleToZero").get("message", ""), 30, "at zero")
    assert replicas(api, ns) == 0
    # Requests held at the gateway (the picker or the interceptor): far more than one replica
    # drains within its cold start and TTFT target, so the wake starts maxReplicas (2) at once,
    # not one (issue 29: 50 waiting woke one replica, which stayed alone for 40 s).
    zero["queue"].set(5000)
    woke: list[int] = []

    def back() -> bool:
        n = replicas(api, ns)
        if n > 0 and not woke:
            woke.append(n)
        return n >= 1

    try:
        wait_until(back, 60, "scaled back from zero")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {get(api, ns, NAME).get('status')}\n{op.tail()}") from exc
    assert woke == [2], f"the wake started {woke} replicas for 5000 requests waiting (maxReplicas 2)"
    # The Deployment is scaled before the tick's status patch lands: wait for the reason too.

    def reason() -> str:
        return str(get(api, ns, NAME)["status"].get("lastScaleReason", ""))

    try:
        wait_until(lambda: "requests wait for a replica: scaling back from zero to 2" in reason(), 20, "the reason")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {reason()!r}\n{op.tail()}") from exc
