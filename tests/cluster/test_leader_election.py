"""Two operators against one cluster (issue 21, item 3): one holds the Lease and acts, the
other stands by; it takes over when the leader shuts down (the Lease released) or dies (the
Lease expires), and no Event is posted twice."""

from __future__ import annotations

import copy
import os
import signal
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import GROUP, PLURAL
from tests.cluster.harness import Cluster, holds_for, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_operator import ROOT, SAMPLES, create, events, wait_phase

LEASE_NAMESPACE = "default"


def holder(api: client.ApiClient, name: str) -> str | None:
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(name, LEASE_NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return str(lease.spec.holder_identity) if lease.spec and lease.spec.holder_identity else None


def pid(op: Operator) -> int:
    assert op.process is not None
    return op.process.pid


def holds(api: client.ApiClient, lease: str, op: Operator) -> bool:
    return f"-{pid(op)}-" in (holder(api, lease) or "")


def named(name: str) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(SAMPLES["custom-architecture"])
    body["metadata"]["name"] = name
    return body


def pair(cluster: Cluster, tmp_path: Path) -> tuple[str, Operator, Operator]:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
    lease = f"kvscale-pair-{uuid.uuid4().hex[:6]}"
    env = {"KVSCALE_LEASE_NAME": lease, "KVSCALE_LEASE_NAMESPACE": LEASE_NAMESPACE, "KVSCALE_LEASE_DURATION": "6s"}
    ops = []
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        ops.append(Operator(cluster, tmp_path / label, env))
    return lease, ops[0], ops[1]


def planned_events(api: client.ApiClient, namespace: str, name: str) -> int:
    return sum(1 for reason, _ in events(api, namespace, name) if reason == "Planned")


def test_two_operators_elect_one_and_hand_over_at_shutdown(
    cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    lease, a, b = pair(cluster, tmp_path)
    a.start()
    try:
        wait_until(lambda: holds(api, lease, a), 60, "the first operator to take the Lease")
        b.start()
        wait_until(lambda: "Standing by" in b.tail(), 60, "the second operator to stand by")
        create(api, namespace, named("one"))
        wait_phase(api, namespace, "one", "Ready", a)
        holds_for(lambda: planned_events(api, namespace, "one") == 1 and holds(api, lease, a), 5, "one leader")
        a.stop()  # graceful: the Lease is released, the standby takes it at its next try
        wait_until(lambda: holds(api, lease, b), 15, "the standby to take the Lease")
        create(api, namespace, named("two"))
        wait_phase(api, namespace, "two", "Ready", b)
        assert planned_events(api, namespace, "one") == 1
    finally:
        a.stop()
        b.stop()


def test_a_dead_leaders_lease_expires_and_the_standby_takes_over(
    cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    lease, a, b = pair(cluster, tmp_path)
    a.start()
    try:
        wait_until(lambda: holds(api, lease, a), 60, "the first operator to take the Lease")
        b.start()
        wait_until(lambda: "Standing by" in b.tail(), 60, "the second operator to stand by")
        os.killpg(pid(a), signal.SIGKILL)  # no release: the Lease must expire (6 s)
        wait_until(lambda: holds(api, lease, b), 30, "the standby to take the expired Lease")
        create(api, namespace, named("after"))
        wait_phase(api, namespace, "after", "Ready", b)
    finally:
        a.stop()
        b.stop()
