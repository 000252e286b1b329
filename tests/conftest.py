"""Session fixtures: the real test cluster (or an existing one), with logs on failure."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster, ClusterError, find_bins

EXISTING = "KVSCALE_TEST_KUBECONFIG"
_cluster: Cluster | None = None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running cluster with the GPU node pool. Never skips: if it cannot be had, the test fails."""
    global _cluster
    workdir = tmp_path_factory.mktemp("cluster")
    existing = os.environ.get(EXISTING)
    try:
        _cluster = Cluster.attach(Path(existing), workdir) if existing else Cluster(workdir, find_bins()).start()
    except (ClusterError, TimeoutError, OSError) as exc:
        pytest.fail(f"the test cluster could not be had (set {EXISTING} to use an existing one): {exc}", pytrace=False)
    yield _cluster
    _cluster.stop()
    _cluster = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and _cluster is not None and "cluster" in getattr(item, "fixturenames", ()):
        report.sections.append(("cluster component logs", _cluster.logs_report()))
