"""The operator with a plan across nodes: a LeaderWorkerSet in place of the Deployment, a Service
of leaders, readiness and scaling in groups, whole free nodes in the inventory. The plan is
hand-made (the chosen single-node plan with a second pipeline stage), so these tests do not
depend on what the planner picks."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvscale.api import labels
from kvscale.api.intent import parse_intent
from kvscale.api.models import InferenceServiceStatus
from kvscale.autoscaling.observation import Observation
from kvscale.control import leader_worker_set as lws
from kvscale.control import planning
from kvscale.control import reconcile as reconcile_module
from kvscale.control.children import ChildView
from kvscale.control.inventory import gpu_inventory
from kvscale.control.planning import Planned
from kvscale.control.reconcile import DeploymentView, Observed, Resource, Result, reconcile, refresh
from kvscale.control.scaling import Fleet, ScalerMemory, fleet, tick
from kvscale.control.settings import Settings
from kvscale.control.status import get_condition
from kvscale.sizing.catalog import default_catalog
from tests.cluster.harness import node_objects

CAT = default_catalog()
NODES = list(node_objects(Path(__file__).resolve().parents[1] / "cluster" / "nodepool.yaml"))
POOLS = gpu_inventory(CAT, NODES, [])
SETTINGS = Settings()
NOW = dt.datetime(2026, 11, 25, 2, 0, tzinfo=dt.UTC)
RES = Resource("ns", "big", "uid-9", 1)
SPEC: dict[str, Any] = {
    "model": {"name": "llama-3.1-70b"},
    "workload": {"inputTokens": 1024, "outputTokens": 256, "requestsPerSecond": 1},
    "slo": {"timeToFirstToken": "2s", "timePerOutputToken": "100ms"},
    "hardware": {"gpuTypes": ["H100-SXM"], "maxTensorParallel": 8},
}


@pytest.fixture
def two_nodes(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """The planner's choice, made to span two nodes: TP 8 x PP 2 on H100 (8 GPUs a node)."""
    real = planning.plan_service

    def planned(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        if not isinstance(out, Planned):
            return out
        cfg = replace(out.config, tensor_parallel=8, pipeline_parallel=2)
        return replace(out, chosen=replace(out.chosen, config=cfg))

    monkeypatch.setattr(reconcile_module, "plan_service", planned)
    return planned


def deployed(body: dict[str, Any] | None = None, observed: Observed | None = None, res: Resource = RES) -> Result:
    return reconcile(body or SPEC, res, InferenceServiceStatus(), observed or Observed(POOLS), CAT, SETTINGS, now=NOW)


def condition_of(status: InferenceServiceStatus, kind: str) -> tuple[str, str, str]:
    c = get_condition(status, kind)
    assert c is not None, f"no {kind} condition"
    return c.status, c.reason, c.message


@pytest.mark.usefixtures("two_nodes")
def test_a_plan_across_nodes_deploys_a_leader_worker_set_behind_a_service_of_leaders() -> None:
    result = deployed()
    assert [c["kind"] for c in result.apply] == ["Service", "PodDisruptionBudget", "LeaderWorkerSet"]
    svc, _, group = result.apply
    assert svc["metadata"]["name"] == "big" and svc["spec"]["selector"] == lws.leader_labels("big")
    assert group["metadata"]["name"] == "big-lws" and group["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert result.applied_deployment is group and result.delete == ()
    plan = result.status.plan
    assert plan is not None and (plan.nodes, plan.pipeline_parallel, plan.tensor_parallel) == (2, 2, 8)
    assert group["spec"]["replicas"] == result.status.replicas == plan.replicas  # groups
    [event] = result.events
    assert "group(s) of 2 nodes x 8 H100-SXM (TP8 x PP2" in event.message


@pytest.mark.usefixtures("two_nodes")
def test_moving_between_kinds_deletes_the_old_workload() -> None:
    single = DeploymentView(2, 2, "H100-SXM")
    result = deployed(observed=Observed(POOLS, deployment=single))
    assert result.delete == ("Deployment",)


def test_back_to_one_node_deletes_the_leader_worker_set() -> None:
    group = DeploymentView(1, 1, "H100-SXM", kind=lws.KIND)
    result = deployed(observed=Observed(POOLS, leader_worker_set=group))
    assert [c["kind"] for c in result.apply][-1] == "Deployment" and result.delete == (lws.KIND,)
    assert result.apply[0]["spec"]["selector"] == labels("big")  # every pod serves on one node
    recommend = copy.deepcopy(SPEC) | {"scaling": {"mode": "recommend"}}
    # Recommend mode deletes the children this resource owns (the watches see them), never
    # another object of their names (issue 21).
    mine = (
        ChildView(lws.KIND, "ns", lws.set_name("big"), (RES.uid,)),
        ChildView("Deployment", "ns", "big", (RES.uid,)),
    )
    gone = deployed(recommend, observed=Observed(POOLS, leader_worker_set=group, children=mine))
    assert lws.KIND in gone.delete and "Deployment" in gone.delete


@pytest.mark.usefixtures("two_nodes")
def test_readiness_counts_groups_and_drift_is_reverted_in_the_leader_template() -> None:
    first = deployed()
    group = first.applied_deployment
    assert group is not None
    seen = DeploymentView.of(group)
    assert (
        seen.kind == lws.KIND
        and seen.gpu_type == "H100-SXM"
        and seen.args == tuple(group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"])
    )
    half = replace(seen, replicas=2, ready_replicas=1)
    # The Deployment informer's view of another kind is not this plan's workload.
    stray = DeploymentView(7, 7, "H100-SXM")
    pending = refresh(
        SPEC,
        RES,
        first.status,
        Observed(POOLS, deployment=stray, leader_worker_set=half, applied=group),
        CAT,
        SETTINGS,
        NOW,
    )
    assert pending is not None
    assert condition_of(pending.status, "Ready")[2] == "1/2 groups of 2 nodes ready"
    [drifted] = [e for e in pending.events if e.reason == "DriftReverted"]
    assert f"replicas 2 -> {group['spec']['replicas']}" in drifted.message and pending.apply == (group,)
    ready = replace(seen, ready_replicas=seen.replicas)
    done = refresh(SPEC, RES, first.status, Observed(POOLS, leader_worker_set=ready, applied=group), CAT, SETTINGS, NOW)
    assert done is not None and done.status.phase == "Ready" and done.apply == ()


@pytest.mark.usefixtures("two_nodes")
def test_the_autoscaler_scales_whole_groups_through_the_sets_scale_subresource() -> None:
    first = deployed()
    intent = parse_intent(SPEC)
    replicas = first.status.replicas or 1
    group = DeploymentView(replicas, replicas, "H100-SXM", kind=lws.KIND)
    start = fleet(intent, first.status, Observed(POOLS, leader_worker_set=group).workload(True))
    assert isinstance(start, Fleet) and start.current == replicas
    obs = Observation(
        time_s=1000.0,
        ready_replicas=replicas,
        starting_replicas=0,
        arrival_rate_per_s=200.0,
        ttft_p_s=0.2,
        tpot_p_s=0.03,
        running=float(replicas),
        waiting=0.0,
    )
    done = tick(intent, RES, first.status, start, obs, None, ScalerMemory(), CAT, SETTINGS, NOW)
    assert done.result.scale_to is not None and done.result.scale_to > replicas
    assert done.result.scale_kind == lws.KIND
    # The capacity model is the two-stage replica's, not a single node's.
    assert done.memory.capacity is not None and done.memory.capacity.cfg.pipeline_parallel == 2


@pytest.mark.usefixtures("two_nodes")
def test_engines_and_names_that_cannot_span_nodes_fail_naming_the_field() -> None:
    tgi = deployed(copy.deepcopy(SPEC) | {"engine": {"type": "tgi"}})
    assert tgi.retry is not None and tgi.retry.delay_s is None
    assert condition_of(tgi.status, "Planned")[1] == "EngineUnsupported"
    assert "spec.engine.type: tgi" in condition_of(tgi.status, "Planned")[2]
    long = deployed(res=Resource("ns", "a" * 50, "uid-9", 1))
    assert condition_of(long.status, "Planned")[1] == "InvalidName"
    assert "metadata.name" in condition_of(long.status, "Planned")[2]


def test_inventory_counts_whole_free_nodes() -> None:
    def pod(node: str, gpus: int) -> dict[str, Any]:
        limits = {"nvidia.com/gpu": str(gpus)}
        return {
            "metadata": {"labels": {}},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": limits}}]},
        }

    h100 = gpu_inventory(CAT, NODES, [pod("h100-0", 4)])["H100-SXM"]
    assert h100.allocatable == 16 and h100.free == 12
    assert h100.free_by_node == (8, 4)
    assert h100.pods_fitting(8) == 1  # 12 GPUs free, one whole node
    assert h100.pods_fitting(4) == 3


def test_manifests_render_the_leader_worker_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_nodes: Callable[..., Any]
) -> None:
    from typer.testing import CliRunner

    from kvscale.cli import app

    monkeypatch.setattr(planning, "plan_service", two_nodes)
    body = {"apiVersion": "kvscale.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "big"}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({**body, "spec": SPEC}))
    result = CliRunner().invoke(app, ["manifests", "-f", str(path), "--gpus", "H100-SXM=32"])
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [d["kind"] for d in docs] == ["LeaderWorkerSet", "Service", "PodDisruptionBudget"]
    assert "group(s) of 2 nodes x 8 H100-SXM (TP8 x PP2" in result.output.splitlines()[0]
    group, svc, _ = docs
    assert group["spec"]["leaderWorkerTemplate"]["size"] == 2 and svc["spec"]["selector"] == lws.leader_labels("big")
    # The operator's own reconcile builds the same set.
    same = deployed()
    assert same.applied_deployment is not None
    assert (
        group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
        == (same.applied_deployment["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"])
    )
