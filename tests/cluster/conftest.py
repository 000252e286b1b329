"""Fixtures for tests against the cluster: API clients and a namespace per test."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from kvscale.api import GROUP, PLURAL
from tests.cluster.harness import Cluster, wait_until
from tests.cluster.processes import Operator

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def api(cluster: Cluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.fixture
def namespace(api: client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """The CRDs applied and one operator (the test harness's settings) for a module's tests; a
    module that needs other settings defines its own."""
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    # Polled: a CRD just created has no conditions yet, and `kubectl wait` then fails at once.
    established = functools.partial(
        cluster.kubectl_ok, "wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=5s"
    )
    wait_until(established, 60, "the InferenceService CRD established")
    op = Operator(cluster, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()
