"""Phase Ready follows the engine Deployment, not the next status tick (issue 20): with a status
interval far longer than the test waits, a new service still turns Ready once its pods are."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kvscale.api import GROUP, PLURAL
from tests.cluster.harness import Cluster
from tests.cluster.processes import Operator
from tests.cluster.test_operator import SAMPLES, condition, create, wait_phase

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def slow_ticking(
    cluster: Cluster, api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
    op = Operator(cluster, tmp_path_factory.mktemp("operator"), {"KVSCALE_STATUS_INTERVAL": "600s"})
    op.start()
    yield op
    op.stop()


def test_ready_without_waiting_for_the_status_tick(
    slow_ticking: Operator, api: client.ApiClient, namespace: str
) -> None:
    body = SAMPLES["llama-3.1-8b-chat"]
    name = body["metadata"]["name"]
    create(api, namespace, body)
    # The first status tick is 600 s away: only the deploying timer can make it Ready in time.
    obj = wait_phase(api, namespace, name, "Ready", slow_ticking, timeout=60)
    assert condition(obj, "Ready")["status"] == "True"
    dep = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    assert obj["status"]["readyReplicas"] == dep.status.ready_replicas >= 1
