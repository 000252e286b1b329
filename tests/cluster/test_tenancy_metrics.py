"""One tenant's metrics cannot steer another's scaling (issue 28, HIGH 1), on a real Prometheus
scraping through the chart's rendered PodMonitor (as the Prometheus Operator configures it).

A pod in another namespace that carries the engine labels (anyone who may set
spec.engine.image gets such a pod) exposes `vllm:num_requests_waiting{namespace="<t2>",
pod="lead-..."} 5000` and the gateway signals of t2/lead; a picker in that other namespace runs
a pool of the same name with requests waiting. The operator's own reads for t2/lead (the
batched tick read the operator uses, the per-service one, the scale-to-zero queue reads) see
only t2's own targets, and the real operator keeps t2/lead's size; t2's own queue moves it.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIServer

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from kvscale.api.intent import parse_intent
from kvscale.control.reconcile import Resource
from kvscale.control.scale_zero import KEDA_PENDING_METRIC, QUEUE_METRIC, gateway_queue, queue_queries
from kvscale.metrics.batch import FleetReader
from kvscale.metrics.client import AsyncPrometheusClient
from kvscale.metrics.observe import observe_async, observe_batched, tick_queries
from tests.cluster.harness import Cluster, free_port, holds_for, wait_until
from tests.cluster.monitors import Discovered, chart_monitors, scrape_config
from tests.cluster.processes import Operator
from tests.cluster.prometheus import Prometheus
from tests.cluster.test_chart import CHART, KUBE_VERSION
from tests.cluster.test_operator import SAMPLES, condition, create, get

NAME = "lead"
LEGIT_POD = "lead-abc12-xyz34"  # as the Deployment names its pods: <name>-<hash>-<suffix>
FORGED = 5000.0
MODEL = ("m", "0")  # vLLM's labels: model_name, engine


@dataclass
class Target:
    registry: CollectorRegistry
    port: int
    server: WSGIServer
    thread: Thread

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(5)


def serving(registry: CollectorRegistry) -> Target:
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return Target(registry, port, server, thread)


@dataclass
class Stand:
    """Every target and the Prometheus that scrapes them."""

    t2: str
    evil: str
    prom: Prometheus
    legit_waiting: Gauge
    targets: list[Target]

    def stop(self) -> None:
        self.prom.stop()
        for t in self.targets:
            t.stop()


def start_stand(cluster: Cluster, t2: str, workdir: Path) -> Stand:
    evil = f"{t2}-evil"
    # t2's engine pod: nothing waits, nothing runs, no requests.
    legit = CollectorRegistry()
    waiting = Gauge("vllm:num_requests_waiting", "Waiting.", ["model_name", "engine"], registry=legit)
    waiting.labels(*MODEL).set(0)
    Gauge("vllm:num_requests_running", "Running.", ["model_name", "engine"], registry=legit).labels(*MODEL).set(0)
    Counter("vllm:request_success", "Done.", ["model_name", "engine"], registry=legit).labels(*MODEL)
    # The pod in the other namespace claims t2/lead's identity and its gateway queues.
    forged = CollectorRegistry()
    claim = ["model_name", "engine", "namespace", "pod"]
    Gauge("vllm:num_requests_waiting", "Waiting.", claim, registry=forged).labels(*MODEL, t2, LEGIT_POD).set(FORGED)
    Gauge("vllm:num_requests_running", "Running.", claim, registry=forged).labels(*MODEL, t2, LEGIT_POD).set(0)
    pool = ["fairness_id", "priority", "inference_pool", "model_name", "target_model_name", "namespace"]
    Gauge(QUEUE_METRIC, "Queue.", pool, registry=forged).labels("d", "0", NAME, "m", "m", t2).set(7)
    Gauge(KEDA_PENDING_METRIC, "Pending.", ["host"], registry=forged).labels(f"{t2}/{NAME}").set(7)
    # Two endpoint pickers, one per namespace, each of a pool named "lead"; and KEDA's interceptor.
    pickers = []
    for queued in (0, 7):
        registry = CollectorRegistry()
        Gauge(QUEUE_METRIC, "Queue.", pool[:-1], registry=registry).labels("d", "0", NAME, "m", "m").set(queued)
        pickers.append(registry)
    interceptor = CollectorRegistry()
    Gauge(KEDA_PENDING_METRIC, "Pending.", ["host"], registry=interceptor).labels(f"{t2}/{NAME}").set(0)
    targets = [serving(r) for r in (legit, forged, *pickers, interceptor)]
    legit_t, forged_t, t2_picker, evil_picker, keda_t = targets

    monitors = chart_monitors(cluster.helm, CHART, "kvscale-system", KUBE_VERSION)
    engines = scrape_config(
        monitors["PodMonitor"],
        Discovered(legit_t.address, t2, LEGIT_POD, "engine", "http"),
        Discovered(forged_t.address, evil, "mallory-abc12-xyz34", "engine", "http"),
    )

    # The pickers and the interceptor as a user's own monitors scrape them: target labels win
    # (honor_labels false, the default), `namespace` the pod's, as Kubernetes discovery gives it.
    def job(name: str, *at: tuple[Target, str]) -> dict[str, Any]:
        static = [{"targets": [t.address], "labels": {"namespace": ns}} for t, ns in at]
        return {"job_name": name, "scrape_interval": "1s", "static_configs": static}

    jobs = [engines, job("pickers", (t2_picker, t2), (evil_picker, evil)), job("keda", (keda_t, "keda"))]
    prom = Prometheus(workdir / "prom", targets=[], jobs=jobs).start()
    stand = Stand(t2, evil, prom, waiting, targets)
    try:
        # Every target scraped five times over (enough samples for the rate windows): asked of
        # `up`, whatever the chart makes of the targets' own series.
        addresses = "|".join(t.address for t in targets)
        scraped = f'count_over_time(up{{instance=~"{addresses}"}}[1m]) >= 5'
        wait_until(lambda: len(prom.query(scraped)) == len(targets), 30, "every target scraped five times")
    except BaseException:
        stand.stop()
        raise
    return stand


@pytest.fixture
def stand(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Stand]:
    s = start_stand(cluster, namespace, tmp_path)
    try:
        yield s
    finally:
        s.stop()


async def operator_reads(url: str, t2: str) -> dict[str, Any]:
    """What the operator reads for t2/lead: the batched tick read (as the operator runs it),
    the per-service read, and each gateway queue of scale to zero."""
    prometheus = AsyncPrometheusClient(url, timeout_s=5)
    try:
        reader = FleetReader(prometheus, tick_queries("15s"), max_age_s=1.0)
        batched, why_batched = await observe_batched(reader, "vllm", t2, NAME, 95, 1, 0, time.time(), 10.0, 5.0)
        alone, why_alone = await observe_async(prometheus, "vllm", t2, NAME, 95, 1, 0, time.time(), "15s", 10.0)
        body = copy.deepcopy(SAMPLES["custom-architecture"])["spec"]
        body["scaling"] = {"minReplicas": 0}
        body["routing"] = {"inferencePool": {}, "kedaHttp": {}}
        gateway = [await prometheus.scalar(q) for q in queue_queries(parse_intent(body), Resource(t2, NAME, "u", 1))]
        return {"batched": (batched, why_batched), "alone": (alone, why_alone), "gateway": gateway}
    finally:
        await prometheus.aclose()


def test_a_forged_series_from_another_namespace_is_not_read(stand: Stand) -> None:
    t2, evil, prom = stand.t2, stand.evil, stand.prom
    reads = asyncio.run(operator_reads(prom.url, t2))
    for how in ("batched", "alone"):
        obs, why = reads[how]
        assert why is None and obs.complete, (how, why)
        assert (obs.waiting, obs.running, obs.waiting_max) == (0.0, 0.0, 0.0), (how, obs)
    # t2's picker holds nothing for its pool; the other namespace's pool of the same name has 7
    # waiting, and the forged interceptor count says 7: none of it wakes t2/lead.
    assert reads["gateway"] == [0.0, 0.0]
    assert gateway_queue(reads["gateway"]) == 0.0
    assert float(prom.query(f'sum({QUEUE_METRIC}{{namespace="{evil}",inference_pool="{NAME}"}})')[0]["value"][1]) == 7
    # The forged series is in Prometheus, but as the other namespace's pod: target labels won,
    # and the series' own identity (exported_namespace, exported_pod) was dropped.
    forged = prom.query(f'vllm:num_requests_waiting{{namespace="{evil}"}}')
    assert [(s["metric"]["pod"], float(s["value"][1])) for s in forged] == [("mallory-abc12-xyz34", FORGED)]
    assert not any(k.startswith("exported_") for k in forged[0]["metric"])
    # An engine pod's gateway signals are dropped: no engine serves them.
    assert not prom.query(f'{QUEUE_METRIC}{{job!="pickers"}}') and not prom.query(
        f'{KEDA_PENDING_METRIC}{{job!="keda"}}'
    )


def test_the_operator_keeps_its_size_against_a_forged_series_and_follows_its_own(
    stand: Stand, cluster: Cluster, api: client.ApiClient, tmp_path: Path
) -> None:
    t2 = stand.t2
    cluster.kubectl("apply", "-f", str(CHART.parents[1] / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/inferenceservices.kvscale.io", "--timeout=60s")
    op = Operator(cluster, tmp_path)
    op.env.update(
        {
            "KVSCALE_PROMETHEUS_URL": stand.prom.url,
            "KVSCALE_SCALE_INTERVAL": "2s",
            "KVSCALE_METRICS_WINDOW": "15s",
            "KVSCALE_METRICS_STALE_AFTER": "10s",
        }
    )
    body = copy.deepcopy(SAMPLES["custom-architecture"])
    body["metadata"]["name"] = NAME
    body["spec"]["scaling"] = {"minReplicas": 1, "maxReplicas": 4}
    op.start()
    try:
        create(api, t2, body)
        wait_until(lambda: get(api, t2, NAME).get("status", {}).get("phase") == "Ready", 60, "Ready")

        def metrics_read() -> bool:
            return bool(condition(get(api, t2, NAME), "MetricsAvailable").get("status") == "True")

        wait_until(metrics_read, 60, "t2's metrics read")

        def size() -> int:
            return int(client.AppsV1Api(api).read_namespaced_deployment(NAME, t2).spec.replicas)

        # 5000 requests "waiting" in the other namespace's series: five ticks, one replica.
        holds_for(lambda: size() == 1, 10.0, "t2/lead's size against the forged queue")
        assert get(api, t2, NAME)["status"]["observed"]["queue"] == 0
        # Its own queue moves it: the reads above were of t2's pod, not blind.
        stand.legit_waiting.labels(*MODEL).set(FORGED)
        wait_until(lambda: size() > 1, 60, "t2/lead scaled up by its own queue")
    except BaseException:
        print(op.tail())
        raise
    finally:
        op.stop()
