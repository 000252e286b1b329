"""Pods the real scheduler cannot place (issue 31, defect 2): an untolerated taint is no reason to
move to another GPU type (the condition quotes the scheduler and names the taint); GPUs that are
all taken are, for KVSCALE_GPU_EXCLUSION_TTL, and then the service goes back to the cheaper plan."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from typer.testing import CliRunner

from kvscale.api import GROUP, PLURAL
from kvscale.cli import app
from tests.cluster.harness import Cluster, holds_for, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_operator import ROOT, SAMPLES, condition, create, engine_pods, events, get, wait_phase

TTL_S = 30
L4_NODES = [f"l4-{i}" for i in range(4)]  # tests/cluster/nodepool.yaml: 4 nodes of 1 L4 each
L4_PRODUCT = "NVIDIA-L4"


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    # Polled: right after the apply, `kubectl wait` can fail on a CRD with no conditions yet.
    wait_until(
        lambda: cluster.kubectl_ok("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=10s"),
        60,
        "the CRD established",
    )
    op = Operator(cluster, tmp_path_factory.mktemp("operator"), {"KVSCALE_GPU_EXCLUSION_TTL": f"{TTL_S}s"})
    op.start()
    yield op
    op.stop()


def service(name: str) -> dict[str, Any]:
    """The small custom model on L4 (cheapest) or A10G: 1 replica of 1 GPU."""
    body: dict[str, Any] = copy.deepcopy(SAMPLES["custom-architecture"])
    body["metadata"]["name"] = name
    body["spec"]["hardware"]["gpuTypes"] = ["L4", "A10G"]
    body["spec"]["scaling"] = {"minReplicas": 1, "maxReplicas": 1}
    return body


def plan(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(get(api, namespace, name).get("status", {}).get("plan") or {})


def blocker(name: str) -> dict[str, Any]:
    """Another team's pod holding one L4 GPU, placed by the scheduler."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": L4_PRODUCT},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


def l4_free(api: client.ApiClient) -> bool:
    """No pod holds an L4 node's GPU (pods of an earlier test's namespace go while it terminates:
    until then the planner rightly counts their GPUs as taken)."""
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded").items
    return not [p for p in pods if p.spec.node_name in L4_NODES and p.status.phase != "Failed"]


def test_an_untolerated_taint_is_quoted_and_never_replans(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    wait_until(lambda: l4_free(api), 120, "the L4 nodes free of earlier tests' pods", interval_s=1.0)
    for node in L4_NODES:
        cluster.kubectl("taint", "nodes", node, "maintenance=true:NoSchedule", "--overwrite")
    try:
        create(api, namespace, service("tainted"))
        try:
            wait_until(
                lambda: condition(get(api, namespace, "tainted"), "Scheduled").get("reason") == "UntoleratedTaint",
                60,
                "Scheduled UntoleratedTaint",
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{get(api, namespace, 'tainted').get('status')}\n{operator.tail()}") from exc
        message = condition(get(api, namespace, "tainted"), "Scheduled")["message"]
        [pod] = engine_pods(api, namespace, "tainted")
        scheduled = next(c for c in pod.status.conditions if c.type == "PodScheduled")
        assert scheduled.reason == "Unschedulable" and scheduled.message in message, (scheduled.message, message)
        assert "untolerated taint" in scheduled.message  # the scheduler's words, quoted whole
        assert "maintenance=true:NoSchedule" in message and "KVSCALE_EXTRA_TOLERATIONS" in message
        assert "does not re-plan" in message
        wait_until(lambda: any(r == "UntoleratedTaint" for r, _ in events(api, namespace, "tainted")), 30, "the Event")
        # Well past KVSCALE_UNSCHEDULABLE_TIMEOUT (4 s) and several status ticks (1 s): still L4, nothing left out.
        holds_for(
            lambda: (
                plan(api, namespace, "tainted").get("gpuType") == "L4"
                and not plan(api, namespace, "tainted").get("excludedGpuTypes")
            ),
            12.0,
            "the L4 plan",
        )
        assert not any(r == "GPUTypeUnschedulable" for r, _ in events(api, namespace, "tainted"))
    finally:
        for node in L4_NODES:
            cluster.kubectl("taint", "nodes", node, "maintenance=true:NoSchedule-")
    obj = wait_phase(api, namespace, "tainted", "Ready", operator)  # the taint gone, it serves where planned
    assert obj["status"]["plan"]["gpuType"] == "L4"


def test_gpus_all_taken_replan_until_the_exclusion_expires(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    create(api, namespace, service("crowded"))
    wait_phase(api, namespace, "crowded", "Ready", operator)
    [pod] = engine_pods(api, namespace, "crowded")
    assert plan(api, namespace, "crowded")["gpuType"] == "L4"
    others = [f"other-{uuid.uuid4().hex[:6]}" for _ in range(len(L4_NODES) - 1)]
    for name in others:  # the other three L4 GPUs go to another team
        core.create_namespaced_pod(namespace, blocker(name))
    wait_until(
        lambda: all(core.read_namespaced_pod(n, namespace).spec.node_name for n in others), 60, "the blockers placed"
    )
    cluster.kubectl("cordon", pod.spec.node_name)  # the engine's node goes for maintenance
    try:
        core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        wait_until(lambda: "L4" in plan(api, namespace, "crowded").get("excludedGpuTypes", []), 60, "L4 left out")
        obj = wait_phase(api, namespace, "crowded", "Ready", operator)
        assert obj["status"]["plan"]["gpuType"] == "A10G"
        [message] = [m for r, m in events(api, namespace, "crowded") if r == "GPUTypeUnschedulable"]
        assert "Insufficient nvidia.com/gpu" in message and "every L4 node (3) lacks free nvidia.com/gpu" in message
        excluded = condition(obj, "GPUTypesExcluded")
        assert excluded["status"] == "True" and "L4 left out of planning until " in excluded["message"]
        out = CliRunner().invoke(app, ["status", "crowded", "--kubeconfig", str(cluster.kubeconfig), "-n", namespace])
        assert out.exit_code == 0, out.output
        assert any(line.startswith("Excluded: L4 until ") for line in out.stdout.splitlines()), out.stdout
    finally:
        cluster.kubectl("uncordon", pod.spec.node_name)
        for name in others:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    # The GPUs are back; once the exclusion's time is up the cheaper plan returns.
    try:
        wait_until(lambda: plan(api, namespace, "crowded").get("gpuType") == "L4", TTL_S + 60, "back on L4")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{get(api, namespace, 'crowded').get('status')}\n{operator.tail()}") from exc
    obj = wait_phase(api, namespace, "crowded", "Ready", operator)
    assert not obj["status"]["plan"].get("excludedGpuTypes") and not condition(obj, "GPUTypesExcluded")
    assert any(r == "GPUTypesReturned" for r, _ in events(api, namespace, "crowded"))
