"""reconcile, refresh and the scaling tick as pure functions: no cluster, no kopf."""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvscale.api.intent import parse_intent
from kvscale.api.models import InferenceServiceStatus, status_dict, status_patch
from kvscale.autoscaling.observation import Observation
from kvscale.control.children import ChildView
from kvscale.control.inventory import EnginePod, gpu_inventory
from kvscale.control.reconcile import CHILD_KINDS, DeploymentView, Observed, Resource, Result, reconcile, refresh
from kvscale.control.scaling import Fleet, ScalerMemory, fleet, tick
from kvscale.control.settings import Settings
from kvscale.control.status import get_condition
from kvscale.sizing.catalog import default_catalog
from tests.cluster.harness import node_objects

CAT = default_catalog()
NODES = list(node_objects(Path(__file__).resolve().parents[1] / "cluster" / "nodepool.yaml"))
POOLS = gpu_inventory(CAT, NODES, [])
SETTINGS = Settings()
NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
RES = Resource("ns", "chat", "uid-1", 1)
# The scheduler's message for a pod of the A100-80GB plan whose 4 nodes have no GPU free (kube-scheduler
# v1.34.4 FitError.Error, as tests/cluster/test_unschedulable.py sees it): the one cause that re-plans.
SHORT = (
    "0/12 nodes are available: 4 Insufficient nvidia.com/gpu, 8 node(s) didn't match Pod's node affinity/selector. "
    "no new claims to deallocate, preemption: 0/12 nodes are available: 4 No preemption victims found for incoming "
    "pod, 8 Preemption is not helpful for scheduling."
)
SPEC: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": 4},
    "slo": {"timeToFirstToken": "500ms", "timePerOutputToken": "50ms"},
    "hardware": {"gpuTypes": ["L4", "A10G", "A100-80GB", "H100-SXM"]},
}


def spec(**patch: Any) -> dict[str, Any]:
    out = copy.deepcopy(SPEC)
    for key, value in patch.items():
        out[key] = {**out.get(key, {}), **value}
    return out


def deployed(body: dict[str, Any] | None = None, res: Resource = RES) -> Result:
    return reconcile(body or SPEC, res, InferenceServiceStatus(), Observed(POOLS), CAT, SETTINGS, now=NOW)


def condition_of(status: InferenceServiceStatus, kind: str) -> tuple[str, str, str]:
    c = get_condition(status, kind)
    assert c is not None, f"no {kind} condition"
    return c.status, c.reason, c.message


def test_reconcile_builds_the_children_service_first() -> None:
    result = deployed()
    assert [c["kind"] for c in result.apply] == ["Service", "PodDisruptionBudget", "Deployment"]
    assert result.retry is None and result.delete == ()
    st = result.status
    assert st.phase == "Deploying" and st.plan is not None and st.observed_generation == 1
    assert condition_of(st, "Planned")[0] == "True"
    assert st.replicas == st.desired_replicas == result.apply[-1]["spec"]["replicas"]
    assert result.applied_deployment == result.apply[-1]
    [event] = result.events
    assert event.reason == "Planned" and event.message.startswith(f"Deployed {st.replicas} x ")


def test_reconcile_twice_writes_nothing_the_second_time() -> None:
    first = deployed()
    seen = DeploymentView(first.status.replicas or 0, 0, first.status.plan.gpu_type if first.status.plan else None)
    again = reconcile(SPEC, RES, first.status, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    assert status_patch(first.status, again.status) == {}
    assert again.apply == first.apply


def test_recommend_mode_deletes_its_own_children_and_deploys_nothing() -> None:
    mine = tuple(ChildView(kind, "ns", "chat", (RES.uid,)) for kind in CHILD_KINDS)
    seen = Observed(POOLS, children=mine)
    result = reconcile(spec(scaling={"mode": "recommend"}), RES, InferenceServiceStatus(), seen, CAT, SETTINGS, now=NOW)
    assert result.apply == () and result.delete == CHILD_KINDS
    assert result.status.phase == "Recommended"
    assert condition_of(result.status, "Ready")[1] == "RecommendOnly"
    assert result.events[0].reason == "Recommended"


def test_unusable_specs_fail_permanently_with_the_field_named() -> None:
    cases = {
        "UnknownModel": (spec(model={"name": "gpt-17"}), "spec.model.name"),
        "SLOInfeasible": (spec(slo={"timeToFirstToken": "1ms", "timePerOutputToken": "1ms"}), "spec.slo"),
        "UnknownGPUType": (spec(hardware={"gpuTypes": ["V100"]}), "spec.hardware.gpuTypes"),
        "InvalidSpec": (spec(slo={"timeToFirstToken": "0ms"}), "spec.slo.timeToFirstToken"),
    }
    for reason, (body, field) in cases.items():
        result = deployed(body)
        assert result.retry is not None and result.retry.delay_s is None, reason
        assert result.apply == () and result.status.phase == "Failed"
        status, got, message = condition_of(result.status, "Planned")
        assert (status, got) == ("False", reason) and field in message, message
        assert result.events[0].type == "Warning" and result.events[0].reason == reason


def test_names_the_children_cannot_take_fail_before_anything_is_created() -> None:
    for res, body, field in (
        (Resource("ns", "dot.name", "u", 1), SPEC, "metadata.name"),
        (Resource("ns", "x" * 64, "u", 1), SPEC, "metadata.name"),
        (RES, spec(engine={"env": [{"name": "1BAD", "value": "x"}]}), "spec.engine.env[0].name"),
        (RES, spec(model={"name": "llama-3.1-8b", "credentialsSecret": "Not_A_Secret"}), "credentialsSecret"),
    ):
        result = deployed(body, res)
        assert result.apply == () and result.retry is not None and result.retry.delay_s is None
        assert condition_of(result.status, "Planned")[1] == "InvalidName" and field in result.retry.message


def test_no_capacity_retries_after_the_backoff() -> None:
    result = deployed(spec(hardware={"gpuTypes": ["B200"]}))
    assert result.retry is not None and result.retry.delay_s == SETTINGS.retry_backoff_s
    assert result.status.phase == "Pending" and condition_of(result.status, "Planned")[1] == "InsufficientGPUs"


def test_a_plan_needing_more_replicas_grows_the_deployment_and_says_so() -> None:
    first = deployed(spec(hardware={"gpuTypes": ["A100-80GB"]}))
    plan = first.status.plan
    assert plan is not None
    seen = DeploymentView(plan.replicas, plan.replicas, plan.gpu_type)
    busier = spec(workload={"requestsPerSecond": 80}, hardware={"gpuTypes": ["A100-80GB"]})
    result = reconcile(busier, Resource("ns", "chat", "uid-1", 2), first.status, Observed(POOLS, seen), CAT, SETTINGS)
    new_plan = result.status.plan
    assert new_plan is not None and new_plan.replicas > plan.replicas
    assert result.apply[-1]["spec"]["replicas"] == new_plan.replicas == result.status.replicas
    assert result.events[0].message.startswith(f"Deployed {new_plan.replicas} x ")


def test_an_autoscaled_size_is_kept_on_resume() -> None:
    first = deployed()
    plan = first.status.plan
    assert plan is not None
    scaled = first.status.model_copy(update={"desired_replicas": plan.replicas + 2})
    seen = DeploymentView(plan.replicas + 2, plan.replicas + 2, plan.gpu_type)
    result = reconcile(SPEC, RES, scaled, Observed(POOLS, seen), CAT, SETTINGS, now=NOW)
    assert result.apply[-1]["spec"]["replicas"] == plan.replicas + 2
    assert "(the plan needs" in result.events[0].message


def test_refresh_reports_readiness_once() -> None:
    first = deployed()
    assert first.applied_deployment is not None
    seen = DeploymentView.of(first.applied_deployment)
    ready = Observed(POOLS, replace(seen, ready_replicas=seen.replicas), applied=first.applied_deployment)
    result = refresh(SPEC, RES, first.status, ready, CAT, SETTINGS, NOW)
    assert result is not None and result.status.phase == "Ready" and result.apply == ()
    assert [e.reason for e in result.events] == ["Ready"]
    again = refresh(SPEC, RES, result.status, ready, CAT, SETTINGS, NOW)
    assert again is not None and again.events == () and status_patch(result.status, again.status) == {}


def test_refresh_reverts_drift_in_replicas_and_args() -> None:
    first = deployed()
    applied = first.applied_deployment
    assert applied is not None
    container = applied["spec"]["template"]["spec"]["containers"][0]
    gpu = first.status.plan.gpu_type if first.status.plan else None
    edited = DeploymentView(5, 5, gpu, container["image"], (*container["args"], "--enforce-eager"))
    result = refresh(SPEC, RES, first.status, Observed(POOLS, edited, applied=applied), CAT, SETTINGS, NOW)
    assert result is not None and result.apply == (applied,)
    [event] = [e for e in result.events if e.reason == "DriftReverted"]
    assert "replicas 5 -> " in event.message and "engine args" in event.message


def test_refresh_replans_without_a_gpu_type_that_stays_unschedulable() -> None:
    first = deployed()
    gpu = first.status.plan.gpu_type if first.status.plan else ""
    stuck = EnginePod(
        "chat-1", gpu, None, "Pending", NOW - dt.timedelta(seconds=600), False, unschedulable_message=SHORT
    )
    seen = Observed(POOLS, DeploymentView(1, 0, gpu), (stuck,))
    result = refresh(SPEC, RES, first.status, seen, CAT, SETTINGS, NOW)
    assert result is not None and result.status.plan is not None
    assert result.status.plan.excluded_gpu_types == [gpu] and result.status.plan.gpu_type != gpu
    assert result.events[0].reason == "GPUTypeUnschedulable"
    assert condition_of(result.status, "Scheduled")[1] == "GPUTypeUnschedulable"


def test_refresh_ignores_what_is_not_deployed() -> None:
    failed = deployed(spec(model={"name": "gpt-17"}))
    assert refresh(SPEC, RES, failed.status, Observed(POOLS), CAT, SETTINGS, NOW) is None


def _obs(rate: float | None, ready: int, ttft: float | None = 0.2, tpot: float | None = 0.03) -> Observation:
    return Observation(
        time_s=1000.0,
        ready_replicas=ready,
        starting_replicas=0,
        arrival_rate_per_s=rate,
        ttft_p_s=ttft,
        tpot_p_s=tpot,
        running=float(ready) if rate is not None else None,
        waiting=0.0 if rate is not None else None,
    )


def _planned(body: dict[str, Any]) -> tuple[Any, InferenceServiceStatus, Fleet]:
    first = deployed(body)
    intent = parse_intent(body)
    replicas = first.status.replicas or 1
    gpu = first.status.plan.gpu_type if first.status.plan else None
    start = fleet(intent, first.status, DeploymentView(replicas, replicas, gpu))
    assert isinstance(start, Fleet)
    return intent, first.status, start


def test_tick_scales_up_under_load_and_says_why() -> None:
    intent, status, start = _planned(SPEC)
    done = tick(intent, RES, status, start, _obs(200.0, start.ready), None, ScalerMemory(), CAT, SETTINGS, NOW)
    assert done.result.scale_to is not None and done.result.scale_to > start.current
    assert done.result.status.replicas == done.result.scale_to == done.result.status.desired_replicas
    assert done.result.events[0].reason == "Scaled" and done.gauges.decision_kind in (
        "forecast",
        "bounds",
    )  # the policy's kind
    assert done.gauges.current == start.current and done.gauges.cost_usd_per_hour is not None
    assert condition_of(done.result.status, "MetricsAvailable")[0] == "True"
    assert condition_of(done.result.status, "SLOMet")[1] == "WithinTarget"
    assert done.memory.capacity is not None and done.memory.state.rates


def test_tick_holds_without_metrics() -> None:
    intent, status, start = _planned(SPEC)
    obs = Observation(time_s=1000.0, ready_replicas=start.ready, starting_replicas=0, stale=True)
    done = tick(intent, RES, status, start, obs, "no engine samples", ScalerMemory(), CAT, SETTINGS, NOW)
    assert done.result.scale_to is None and done.result.events == ()
    assert condition_of(done.result.status, "MetricsAvailable")[:2] == ("False", "MetricsMissing")
    assert condition_of(done.result.status, "SLOMet")[0] == "Unknown"
    assert not done.gauges.metrics_available


def test_tick_in_recommend_mode_only_recommends_and_exports_no_running_cost() -> None:
    body = spec(scaling={"mode": "recommend"})
    first = deployed(body)
    intent = parse_intent(body)
    start = fleet(intent, first.status, None)
    assert isinstance(start, Fleet)
    done = tick(intent, RES, first.status, start, _obs(200.0, 0), None, ScalerMemory(), CAT, SETTINGS, NOW)
    assert done.result.scale_to is None and done.result.events[0].reason == "Recommendation"
    assert done.gauges.current is None and done.gauges.ready is None and done.gauges.cost_usd_per_hour is None


def test_pinned_replicas_bypass_the_policy() -> None:
    body = spec(scaling={"replicas": 3, "maxReplicas": 5})
    first = deployed(body)
    assert first.apply[-1]["spec"]["replicas"] == 3
    pinned = fleet(parse_intent(body), first.status, DeploymentView(3, 3, None))
    assert isinstance(pinned, Result) and pinned.status.desired_replicas == 3 and pinned.scale_to is None
    metrics = next(c for c in pinned.status.conditions if c.type == "MetricsAvailable")
    assert (metrics.status, metrics.reason) == ("Unknown", "Pinned") and "pins 3 replicas" in metrics.message


def test_status_round_trips_through_the_wire_form() -> None:
    status = deployed().status
    assert InferenceServiceStatus.model_validate(status_dict(status)) == status


@pytest.mark.parametrize(
    ("env", "reason", "says"),
    [
        ([{"name": "HF_HOME", "value": "/x"}], "InvalidEnv", "spec.engine.env: HF_HOME is set by kvscale"),
        ([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}], "InvalidName", "spec.engine.env[1].name"),
    ],
)
def test_an_env_the_deployment_cannot_carry_fails_once_with_the_field(
    env: list[dict[str, str]], reason: str, says: str
) -> None:
    result = reconcile(spec(engine={"env": env}), RES, InferenceServiceStatus(), Observed(POOLS), CAT, SETTINGS)
    assert result.apply == () and result.retry is not None and result.retry.delay_s is None
    status, why, message = condition_of(result.status, "Planned")
    assert (status, why) == ("False", reason) and says in message
    assert [e.reason for e in result.events] == [reason]
