"""LeaderWorkerSets on the real API server with the real LWS CRD (sigs.k8s.io/lws, fetched by
hack/fetch-lws-crd.sh): kvscale's builder output survives the CRD's schema unpruned, the
operator's Kubernetes layer applies, scales (the scale subresource counts groups) and deletes
it, and its informer follows the CRD coming and going.

No LWS controller runs here (it is a Go controller with webhooks; the test cluster runs none),
so no pods appear: these tests check the objects and the scale subresource, not the groups'
pods."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import labels
from kvscale.api.intent import parse_intent
from kvscale.control import leader_worker_set as lws
from kvscale.control.inventory import GpuPool
from kvscale.control.settings import parse_tolerations
from kvscale.engines.args import plan_launch
from kvscale.operator import informers
from kvscale.operator.k8s import Kube
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from tests.cluster.harness import Cluster, find_lws_crd, wait_until

CAT = default_catalog()
CRD_NAME = f"{lws.PLURAL}.{lws.GROUP}"


def served(cluster: Cluster) -> bool:
    return cluster.kubectl_ok("get", "--raw", f"/apis/{lws.GROUP}/{lws.VERSION}")


def install_crd(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(find_lws_crd()))
    # A CRD this large (16,000 lines of schema) has no status for a moment: `kubectl wait` fails
    # then rather than waiting, so it is asked again.
    established = ("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=5s")
    wait_until(lambda: cluster.kubectl_ok(*established), 60, "the LeaderWorkerSet CRD established")
    wait_until(lambda: served(cluster), 30, "the LeaderWorkerSet API in discovery")


def uninstall_crd(cluster: Cluster) -> None:
    cluster.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true", "--timeout=60s")
    wait_until(lambda: not served(cluster), 30, "the LeaderWorkerSet API gone from discovery")


@pytest.fixture
def crd(cluster: Cluster) -> Iterator[None]:
    install_crd(cluster)
    yield
    uninstall_crd(cluster)


def built(name: str, engine: str = "vllm", groups: int = 1) -> dict[str, Any]:
    """A hand-made plan across nodes: Llama 3.1 405B in bf16, TP 8 x PP 2 on two H100 nodes."""
    h100 = CAT.gpu("H100-SXM")
    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-405b"), h100, "bf16", 8, engine=engine, pipeline_parallel=2)
    planned = plan_launch(cfg, "meta-llama/Llama-3.1-405B", 8192, 2304, 64, 100_000, 8000, cached=False)
    spec = parse_intent(
        {
            "model": {"name": "llama-3.1-405b", "credentialsSecret": "hf"},
            "engine": {"type": engine, "args": ["--enable-prefix-caching"], "env": [{"name": "A", "value": "b"}]},
            "workload": {"inputTokens": 2048, "outputTokens": 256, "requestsPerSecond": 1},
            "slo": {"timeToFirstToken": "5s", "timePerOutputToken": "100ms"},
        }
    ).spec
    pool = GpuPool("H100-SXM", h100.node_labels[0], h100.label_key, h100.resource_name, 16, 0, 8, (8, 8))
    pod = {**labels(name), "kvscale.io/owner-uid": "uid-1"}
    tolerations = parse_tolerations("kwok.x-k8s.io/node:NoSchedule")
    return lws.leader_worker_set(name, spec, cfg, planned, pool, groups, 8000, pod, tolerations)


def read(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(
            client.CustomObjectsApi(api).get_namespaced_custom_object(
                lws.GROUP, lws.VERSION, namespace, lws.PLURAL, lws.set_name(name)
            )
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def missing(sent: Any, kept: Any, path: str = "") -> list[str]:
    """Paths of what was sent and is not in what the server kept (a CRD's schema prunes fields
    it does not know: a misspelt one would vanish without an error)."""
    if isinstance(sent, dict):
        if not isinstance(kept, dict):
            return [path or "/"]
        return [p for k, v in sent.items() for p in missing(v, kept.get(k), f"{path}.{k}")]
    if isinstance(sent, list):
        if not isinstance(kept, list) or len(kept) != len(sent):
            return [path]
        return [p for i, (a, b) in enumerate(zip(sent, kept, strict=True)) for p in missing(a, b, f"{path}[{i}]")]
    return [] if sent == kept else [f"{path}: sent {sent!r}, kept {kept!r}"]


@pytest.mark.usefixtures("crd")
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_builders_set_is_accepted_whole_and_scaled_in_groups(
    api: client.ApiClient, namespace: str, engine: str
) -> None:
    kube = Kube(api, backoff_s=1.0)
    obj = built("big", engine, groups=1)
    obj["metadata"]["namespace"] = namespace
    kube.apply(obj)
    kept = read(api, namespace, "big")
    assert kept is not None
    assert missing(obj, kept) == []
    # The CRD's schema defaults fill the rest (the LWS webhook, not running here, adds more).
    assert kept["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"] == 0
    kube.apply(obj)  # idempotent
    # The autoscaler's path: the scale subresource, in whole groups.
    kube.scale(namespace, "big", 3, lws.KIND)
    scale = client.CustomObjectsApi(api).get_namespaced_custom_object_scale(
        lws.GROUP, lws.VERSION, namespace, lws.PLURAL, lws.set_name("big")
    )
    assert scale["spec"]["replicas"] == 3
    kept = read(api, namespace, "big")
    assert kept is not None and kept["spec"]["replicas"] == 3
    assert kept["spec"]["leaderWorkerTemplate"]["size"] == 2  # each group still two nodes
    assert kube.delete_if_present(lws.KIND, namespace, "big") is True
    wait_until(lambda: read(api, namespace, "big") is None, 30, "the LeaderWorkerSet deleted")
    assert kube.delete_if_present(lws.KIND, namespace, "big") is False


def test_the_informer_follows_the_crd(
    cluster: Cluster, api: client.ApiClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informers, "OPTIONAL_RETRY_S", 0.5)
    uninstall_crd(cluster)
    inventory = informers.inventory(api, CAT)
    sets = inventory.leader_worker_sets
    sets.start()
    try:
        # Without the CRD the operator still starts: the informer is synced, empty, not served.
        assert sets.wait_synced(30)
        assert sets.values() == [] and not sets.served
        install_crd(cluster)
        obj = built("watched", groups=2)
        obj["metadata"]["namespace"] = namespace
        Kube(api, backoff_s=1.0).apply(obj)
        wait_until(lambda: bool(sets.get((namespace, "watched"))), 60, "the informer to see the LeaderWorkerSet")
        [view] = sets.get((namespace, "watched"))
        assert (view.kind, view.replicas, view.ready_replicas, view.gpu_type) == (lws.KIND, 2, 0, None)
        assert sets.served
    finally:
        sets.stop()
        uninstall_crd(cluster)
