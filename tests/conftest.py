"""Session fixtures: the real test cluster (or an existing one), with logs on failure."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

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


# -- a line per cluster file as it finishes ----------------------------------------------
# `make test` runs the cluster files for minutes each, in parallel (pytest-xdist); pytest's
# progress dots say nothing of which file is running or done. Each file under tests/cluster
# and tests/e2e gets "<file>: N passed, M failed in T s" once its last test has torn down
# (counted on the xdist controller, or in the one process without xdist).
_LONG_DIRS = ("tests/cluster/", "tests/e2e/")
_config: pytest.Config | None = None
_expected: dict[str, int] = {}
_seen: dict[str, dict[str, Any]] = {}


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


def _count(nodeids: Iterable[str]) -> None:
    if _expected:
        return  # every xdist worker collects the same tests: the first answer is enough
    for nodeid in nodeids:
        path = nodeid.split("::", 1)[0]
        if path.startswith(_LONG_DIRS):
            _expected[path] = _expected.get(path, 0) + 1


def pytest_collection_finish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # an xdist worker's count goes to the controller
        _count(item.nodeid for item in session.items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: Sequence[str]) -> None:
    _count(ids)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    if path not in _expected:
        return
    file = _seen.setdefault(path, {"tests": set(), "failed": set(), "skipped": set(), "seconds": 0.0})
    file["seconds"] += report.duration
    if report.failed:
        file["failed"].add(report.nodeid)
    elif report.skipped and report.when != "teardown":
        file["skipped"].add(report.nodeid)
    if report.when == "teardown":
        file["tests"].add(report.nodeid)
        if len(file["tests"]) == _expected[path]:
            failed, skipped = len(file["failed"]), len(file["skipped"] - file["failed"])
            passed = len(file["tests"]) - failed - skipped
            line = f"{path}: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")
            reporter = _config.pluginmanager.get_plugin("terminalreporter") if _config else None
            if reporter is not None:
                reporter.ensure_newline()
                reporter.write_line(f"{line} in {file['seconds']:.0f} s")
