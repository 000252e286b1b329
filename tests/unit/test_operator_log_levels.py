"""What the operator logs at ERROR: neither a user's spec that cannot be met nor a healthy start
(issue 39: `[ERROR]` lines for an infeasible SLO and right after a fresh install)."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import pytest
from kubernetes.client.rest import ApiException

from kvscale.api.models import InferenceServiceStatus
from kvscale.control.reconcile import Resource, _failed
from kvscale.operator import effects
from kvscale.operator.served import until_served, watched_paths

RES = Resource("team", "chat", "uid-1", 2)
INFEASIBLE = "no GPU type meets spec.slo for this model and workload: lower the rate"


class _Kube:
    """No writes expected: the result applies no child."""


def _apply(result: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[kopf.Patch, list[tuple[str, str]]]:
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda body, type, reason, message: posted.append((type, reason)))
    patch = kopf.Patch()
    body = {
        "apiVersion": "kvscale.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "team", "uid": "uid-1"},
    }
    effects.apply(_Kube(), body, patch, InferenceServiceStatus(), result, RES)  # type: ignore[arg-type]
    return patch, posted


def test_a_spec_that_cannot_be_met_is_a_warning_not_a_handler_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    result = _failed(InferenceServiceStatus(), RES, "SLOInfeasible", INFEASIBLE)
    patch, posted = _apply(result, monkeypatch)  # kopf.PermanentError before: kopf logged it at ERROR
    assert patch.status["phase"] == "Failed" and posted == [("Warning", "SLOInfeasible")]
    (record,) = [r for r in caplog.records if r.name == "kvscale.operator"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == f"[team/chat] Not planned (SLOInfeasible): {INFEASIBLE}"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_cluster_that_may_change_is_still_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _failed(InferenceServiceStatus(), RES, "NoCapacity", "no free GPUs", retry_s=30.0)
    with pytest.raises(kopf.TemporaryError):
        _apply(result, monkeypatch)


def test_startup_waits_while_a_kind_s_storage_initializes() -> None:
    # Right after `kubectl apply -f crds/` the API server answers 429 "storage is (re)initializing"
    # to a list of the new kind; kopf's watch logged each retry at ERROR on a healthy start.
    answers = {"/budgets": [429, 429, 200], "/services": [200], "/gone": [404]}
    asked: list[str] = []
    slept: list[float] = []

    def list_once(path: str) -> None:
        asked.append(path)
        status = answers[path].pop(0) if len(answers[path]) > 1 else answers[path][0]
        if status != 200:
            raise ApiException(status=status, reason="storage is (re)initializing")

    assert until_served(list_once, ["/budgets", "/services", "/gone"], sleep=slept.append) == ()
    assert asked == ["/budgets", "/services", "/gone", "/budgets", "/budgets"] and len(slept) == 2
    clock = iter(range(100))
    answers["/budgets"] = [429]
    pending = until_served(list_once, ["/budgets"], 5.0, sleep=lambda s: None, clock=lambda: float(next(clock)))
    assert pending == ("/budgets",)  # bounded: the start goes on, and says so once


def test_the_paths_waited_for_are_the_watches() -> None:
    assert watched_paths(()) == ("/apis/kvscale.io/v1alpha1/gpubudgets", "/apis/kvscale.io/v1alpha1/inferenceservices")
    assert watched_paths(("a",))[1] == "/apis/kvscale.io/v1alpha1/namespaces/a/inferenceservices"
