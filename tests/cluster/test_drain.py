"""Drain-aware scale-down on the real control plane (issues 27 and 29): the operator reads each
engine pod's requests in flight from a real Prometheus, writes the pod-deletion-costs, and scales
the Deployment down; the real ReplicaSet controller then deletes the least-loaded pod, and the
real EndpointSlice controller takes it out of the Service's endpoints while the pod still exists
(a finalizer holds it here, as the preStop does on a node), before it is gone. A GPUBudget's
preemption shortens a terminating pod's grace period to the budget's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kvscale.api.models import InferenceServiceStatus
from kvscale.autoscaling.drain import DELETION_COST_ANNOTATION
from kvscale.control.inventory import EnginePod
from kvscale.control.reconcile import Resource, Result
from kvscale.control.resources import TERMINATION_GRACE_PERIOD_S
from kvscale.metrics.client import AsyncPrometheusClient
from kvscale.operator.drain import mark_scale_down
from kvscale.operator.k8s import Kube
from kvscale.standin.exposition import serve_metrics
from tests.cluster.harness import free_port, wait_until
from tests.cluster.prometheus import Prometheus

NAME = "chat"
HOLD = "kvscale.io/test-hold"  # keeps a deleted pod visible, as a preStop keeps it serving
TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"},
]


class InFlight(Collector):
    """vLLM's running and waiting gauges for the pods named in `loads` (running, waiting)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.loads: dict[str, tuple[float, float]] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for metric, index in (("vllm:num_requests_running", 0), ("vllm:num_requests_waiting", 1)):
            family = GaugeMetricFamily(metric, "requests", labels=["namespace", "pod", "model_name"])
            for pod, load in self.loads.items():
                family.add_metric([self.namespace, pod, "llama"], load[index])
            yield family


def deployment(replicas: int) -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": NAME}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "finalizers": [HOLD]},
                "spec": {
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_PERIOD_S,
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                    "tolerations": TOLERATIONS,
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME},
        "spec": {"selector": {"app.kubernetes.io/instance": NAME}, "ports": [{"port": 8000, "targetPort": "http"}]},
    }


def pods(core: client.CoreV1Api, namespace: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/instance={NAME}").items)


def endpoints(discovery: client.DiscoveryV1Api, namespace: str) -> dict[str, tuple[bool, bool]]:
    """Each pod behind the Service: (ready, terminating), from its EndpointSlices."""
    found: dict[str, tuple[bool, bool]] = {}
    for eps in discovery.list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={NAME}"
    ).items:
        for e in eps.endpoints or []:
            if e.target_ref is not None:
                found[e.target_ref.name] = (bool(e.conditions.ready), bool(e.conditions.terminating))
    return found


def release(core: client.CoreV1Api, namespace: str) -> None:
    for pod in pods(core, namespace):
        if HOLD in (pod.metadata.finalizers or []):
            core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"finalizers": None}})


async def _mark(kube: Kube, url: str, namespace: str, current: int, names: list[str], scale_to: int) -> int:
    async def io(fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    prometheus = AsyncPrometheusClient(url, timeout_s=5.0, retries=1)
    try:
        engine_pods = [EnginePod(n, "A100-80GB", None, "Running", None, False) for n in names]
        result = Result(InferenceServiceStatus(), scale_to=scale_to)
        res = Resource(namespace, NAME, "uid", 1)
        return await mark_scale_down(kube, prometheus, io, res, "vllm", current, engine_pods, result)
    finally:
        await prometheus.aclose()


def test_a_scale_down_takes_the_least_loaded_pod_out_of_routing_before_deleting_it(
    api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    core, apps, discovery = client.CoreV1Api(api), client.AppsV1Api(api), client.DiscoveryV1Api(api)
    apps.create_namespaced_deployment(namespace, deployment(3))
    core.create_namespaced_service(namespace, service())
    collector = InFlight(namespace)
    registry = CollectorRegistry()
    registry.register(collector)
    server = serve_metrics(registry, free_port())
    try:

        def serving() -> bool:
            ready = endpoints(discovery, namespace)
            return len(ready) == 3 and all(r and not t for r, t in ready.values())

        try:
            wait_until(serving, 90, "3 pods ready behind the Service")
        except TimeoutError as exc:
            seen = [(p.metadata.name, p.status.phase, p.status.pod_ip, p.spec.node_name) for p in pods(core, namespace)]
            slices = discovery.list_namespaced_endpoint_slice(namespace).items
            raise AssertionError(f"{exc}: pods {seen}; slices {[s.endpoints for s in slices]}") from exc
        names = sorted(p.metadata.name for p in pods(core, namespace))
        # The middle pod by name is idle, so neither name order nor age picks it by chance.
        collector.loads = {names[0]: (6, 2), names[1]: (0, 0), names[2]: (3, 0)}
        idle = names[1]
        port = server.server_address[1]
        with Prometheus(tmp_path / "prom", targets=[f"127.0.0.1:{port}"]) as prom:
            prom.wait_for_series(f'vllm:num_requests_waiting{{pod="{names[2]}"}}')
            kube = Kube(api, backoff_s=1.0)
            written = asyncio.run(_mark(kube, prom.url, namespace, 3, names, 2))
        assert written == 3
        costs = {
            p.metadata.name: (p.metadata.annotations or {}).get(DELETION_COST_ANNOTATION) for p in pods(core, namespace)
        }
        assert costs == {names[0]: "8", idle: "0", names[2]: "3"}
        kube.scale(namespace, NAME, 2)

        def idle_deleted() -> bool:
            deleting = [p.metadata.name for p in pods(core, namespace) if p.metadata.deletion_timestamp]
            return deleting == [idle]

        wait_until(idle_deleted, 60, f"the idle pod {idle} being deleted")
        # Out of routing while it still exists: not ready, terminating; the others still serve.
        wait_until(
            lambda: endpoints(discovery, namespace).get(idle, (True, False)) == (False, True),
            60,
            f"{idle} out of the Service's ready endpoints",
        )
        assert idle in {p.metadata.name for p in pods(core, namespace)}
        others = {n: endpoints(discovery, namespace)[n] for n in (names[0], names[2])}
        assert others == {names[0]: (True, False), names[2]: (True, False)}
        release(core, namespace)
        wait_until(lambda: sorted(p.metadata.name for p in pods(core, namespace)) == [names[0], names[2]], 60, "2 left")
    finally:
        server.shutdown()
        release(core, namespace)


def test_a_preempted_pod_drains_within_the_budgets_shorter_grace(api: client.ApiClient, namespace: str) -> None:
    """On a node that no kubelet (and no kwok) runs, a deleted pod stays terminating through its
    grace period, as the API server set it (kwok deletes its own pods at once)."""
    core = client.CoreV1Api(api)
    node = f"drain-{namespace}"
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "engine"},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": TERMINATION_GRACE_PERIOD_S,
                "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}],
            },
        }
        core.create_namespaced_pod(namespace, pod)
        core.delete_namespaced_pod("engine", namespace)  # the ReplicaSet's delete: the pod's own grace

        def grace() -> int:
            return int(core.read_namespaced_pod("engine", namespace).metadata.deletion_grace_period_seconds)

        assert grace() == TERMINATION_GRACE_PERIOD_S
        kube = Kube(api, backoff_s=1.0)
        assert kube.shorten_grace(namespace, ["engine", "gone"], 5) == 1  # a pod gone meanwhile is skipped
        assert grace() == 5
        kube.shorten_grace(namespace, ["engine"], 20)  # a longer one does not lengthen it
        assert grace() == 5
    finally:
        core.delete_namespaced_pod("engine", namespace, grace_period_seconds=0)
        core.delete_node(node)
