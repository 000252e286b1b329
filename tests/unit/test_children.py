"""What the operator owns and what it does not (issue 21): a child deleted or edited outside
kvscale is applied again by the status tick, and an object of a child's name that is not
kvscale's is never applied to, deleted, or adopted. Pure: reconcile and refresh on values."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from kvscale.api.models import InferenceServiceStatus
from kvscale.control.children import KINDS, ChildView, check, covers
from kvscale.control.reconcile import CHILD_KINDS, DeploymentView, Observed, Result, reconcile, refresh, settled
from tests.unit.test_reconcile import CAT, NOW, POOLS, RES, SETTINGS, SPEC, condition_of, spec


def mine(body: dict[str, Any]) -> ChildView:
    spec_ = copy.deepcopy(body.get("spec"))
    compared = next(k for k in KINDS if k.kind == body["kind"]).compare_spec
    return ChildView(body["kind"], "ns", body["metadata"]["name"], (RES.uid,), spec_ if compared else None)


def running() -> tuple[Result, Observed]:
    """A deployed service, Ready, as the status tick sees it with every child in place."""
    first = reconcile(SPEC, RES, InferenceServiceStatus(), Observed(POOLS), CAT, SETTINGS, now=NOW)
    dep = first.apply[-1]
    replicas = int(dep["spec"]["replicas"])
    ready = first.status.model_copy(update={"phase": "Ready"})
    seen = Observed(
        POOLS,
        DeploymentView(replicas, replicas, first.status.plan.gpu_type if first.status.plan else None, *_image(dep)),
        applied=dep,
        children=tuple(mine(b) for b in first.apply),
        applied_children=first.apply,
    )
    return replace(first, status=ready), seen


def _image(dep: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    container = dep["spec"]["template"]["spec"]["containers"][0]
    return container["image"], tuple(container["args"])


def test_nothing_missing_changes_nothing() -> None:
    first, seen = running()
    result = refresh(SPEC, RES, first.status, seen, CAT, SETTINGS, NOW)
    assert result is not None and result.apply == () and result.events == ()


def test_a_deleted_service_and_pdb_are_applied_again_and_status_says_so() -> None:
    first, seen = running()
    kept = tuple(v for v in seen.children if v.kind == "Deployment")
    result = refresh(SPEC, RES, first.status, replace(seen, children=kept), CAT, SETTINGS, NOW)
    assert result is not None
    assert [b["kind"] for b in result.apply] == ["Service", "PodDisruptionBudget"]
    state, reason, message = condition_of(result.status, "Children")
    assert (state, reason) == ("True", "Restored")
    assert "Service ns/chat (deleted outside kvscale)" in message and "PodDisruptionBudget ns/chat" in message
    assert [e.reason for e in result.events] == ["ChildrenRestored"]
    assert condition_of(result.status, "Ready")[0] == "True"  # the engines still serve


def test_a_deleted_deployment_is_recreated_with_its_replicas_and_ready_turns_false() -> None:
    first, seen = running()
    applied = copy.deepcopy(seen.applied)
    assert applied is not None
    applied["spec"]["replicas"] = 5  # the autoscaler moved it since
    gone = replace(
        seen,
        deployment=None,
        applied=applied,
        applied_children=(*first.apply[:-1], applied),
        children=tuple(v for v in seen.children if v.kind != "Deployment"),
    )
    result = refresh(SPEC, RES, first.status, gone, CAT, SETTINGS, NOW)
    assert result is not None
    [dep] = result.apply
    assert dep["kind"] == "Deployment" and dep["spec"]["replicas"] == 5
    assert result.status.phase == "Deploying" and result.status.ready_replicas == 0
    assert condition_of(result.status, "Ready")[:2] == ("False", "DeploymentMissing")


def test_an_edited_service_selector_is_reverted() -> None:
    first, seen = running()
    edited = tuple(
        replace(v, spec={**(v.spec or {}), "selector": {"app": "payments"}}) if v.kind == "Service" else v
        for v in seen.children
    )
    result = refresh(SPEC, RES, first.status, replace(seen, children=edited), CAT, SETTINGS, NOW)
    assert result is not None and [b["kind"] for b in result.apply] == ["Service"]
    assert "(edited outside kvscale)" in condition_of(result.status, "Children")[2]


def test_defaults_the_api_server_adds_are_not_edits() -> None:
    applied = {"ports": [{"name": "http", "port": 8000}], "selector": {"a": "b"}}
    live = {"ports": [{"name": "http", "port": 8000, "targetPort": 8000}], "selector": {"a": "b"}, "clusterIP": "x"}
    assert covers(applied, live)
    assert not covers(applied, {**live, "selector": {"a": "c"}})
    assert not covers(applied, {**live, "ports": [{"name": "http", "port": 9000}]})


def test_a_foreign_service_under_the_name_is_left_alone_with_one_event() -> None:
    foreign = ChildView("Service", "ns", "chat", (), {"selector": {"app": "payments"}})
    seen = Observed(POOLS, children=(foreign,))
    result = reconcile(SPEC, RES, InferenceServiceStatus(), seen, CAT, SETTINGS, now=NOW)
    assert result.apply == () and result.delete == ()
    state, _, message = condition_of(result.status, "NameConflict")
    assert state == "True" and "Service ns/chat" in message
    assert condition_of(result.status, "Ready")[:2] == ("False", "NameConflict")
    assert [e.reason for e in result.events] == ["NameConflict"]
    # No kopf retry (it logged an ERROR every backoff while the conflict lasted, issue 28 LOW):
    # the status tick looks again, quietly, and deploys once the name is free.
    assert result.retry is None
    again = refresh(SPEC, RES, result.status, seen, CAT, SETTINGS, NOW)
    assert again is not None and again.events == () and again.apply == () and again.retry is None
    cleared = refresh(SPEC, RES, result.status, Observed(POOLS), CAT, SETTINGS, NOW)
    assert cleared is not None and len(cleared.apply) == 3 and cleared.retry is None
    assert all(c.type != "NameConflict" for c in cleared.status.conditions)


def test_a_deployment_owned_by_another_resource_is_a_conflict() -> None:
    other = ChildView("Deployment", "ns", "chat", ("someone-else",))
    result = reconcile(SPEC, RES, InferenceServiceStatus(), Observed(POOLS, children=(other,)), CAT, SETTINGS, now=NOW)
    assert result.apply == () and "Deployment ns/chat" in condition_of(result.status, "NameConflict")[2]


def test_recommend_mode_never_deletes_a_foreign_object() -> None:
    foreign = ChildView("Service", "ns", "chat", ())
    body = spec(scaling={"mode": "recommend"})
    result = reconcile(body, RES, InferenceServiceStatus(), Observed(POOLS, children=(foreign,)), CAT, SETTINGS)
    assert result.delete == ()


def test_a_foreign_object_in_a_deleted_childs_place_is_named_not_taken() -> None:
    first, seen = running()
    taken = tuple(ChildView("Service", "ns", "chat", ()) if v.kind == "Service" else v for v in seen.children)
    result = refresh(SPEC, RES, first.status, replace(seen, children=taken), CAT, SETTINGS, NOW)
    assert result is not None and result.apply == ()
    assert condition_of(result.status, "NameConflict")[0] == "True"
    # Never NameConflict=True beside Ready=True (issue 28, LOW): the engine runs, a child is not ours.
    assert condition_of(result.status, "Ready")[:2] == ("False", "NameConflict")
    assert check(seen.applied_children, taken, RES.uid).foreign == (taken[0],)


def test_every_child_kind_reconcile_builds_is_watched() -> None:
    assert set(CHILD_KINDS) <= {k.kind for k in KINDS}


def test_a_resume_that_changes_nothing_is_settled() -> None:
    first, seen = running()
    again = reconcile(SPEC, RES, first.status, seen, CAT, SETTINGS, now=NOW)
    assert settled(again, first.status, seen, RES)
    without_pdb = replace(seen, children=tuple(v for v in seen.children if v.kind != "PodDisruptionBudget"))
    assert not settled(
        reconcile(SPEC, RES, first.status, without_pdb, CAT, SETTINGS, now=NOW), first.status, without_pdb, RES
    )
    assert seen.deployment is not None
    scaled = replace(seen, deployment=replace(seen.deployment, image="other:1"))
    assert not settled(reconcile(SPEC, RES, first.status, scaled, CAT, SETTINGS, now=NOW), first.status, scaled, RES)
    edited = reconcile(spec(workload={"requestsPerSecond": 40}), RES, first.status, seen, CAT, SETTINGS, now=NOW)
    assert not settled(edited, first.status, seen, RES)
