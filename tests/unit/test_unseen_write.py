"""The status tick waits for its own last status write to show in the body kopf hands it.
kopf gives a timer the body its watch last delivered; on a loaded API server that can predate
the previous tick's patch, and a tick on it repeats that tick's transition (a fresh-clone CI run
posted GPUTypeUnschedulable twice for one move: the second tick re-planned away from the GPU type
the first had already left)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kvscale.api.models import InferenceServiceStatus, status_patch
from kvscale.control.reconcile import DeploymentView, Result
from kvscale.control.settings import Settings
from kvscale.operator import handlers
from tests.unit.test_parse_once import _call as call_of
from tests.unit.test_parse_once import _runtime, _seen


def _call(rt: handlers.Runtime, status: InferenceServiceStatus, memo: dict[str, Any], version: str) -> handlers.Call:
    return call_of(rt, status, memo, version=version)


def test_a_tick_on_a_body_older_than_its_last_write_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[Result] = []

    def apply(self: handlers.Call, rt: Any, result: Result) -> None:
        handlers.remember(self.memo, result)
        if status_patch(self.before, result.status) or result.events:  # what kopf would write or post
            applied.append(result)

    monkeypatch.setattr(handlers.Call, "apply", apply)
    rt = _runtime(Settings())
    memo: dict[str, Any] = {}
    _seen(monkeypatch, None)
    handlers.spec_changed(rt, _call(rt, InferenceServiceStatus(), memo, "10"))
    planned = applied[-1].status
    assert planned.plan is not None and planned.phase == "Deploying"
    replicas = planned.replicas or 1
    _seen(monkeypatch, DeploymentView(replicas, replicas, planned.plan.gpu_type))

    asyncio.run(handlers.status_tick(rt, _call(rt, planned, memo, "11")))
    assert len(applied) == 2 and applied[-1].status.phase == "Ready"  # the tick's transition, written
    # The watch has not delivered that write: the same version, the status before it.
    asyncio.run(handlers.status_tick(rt, _call(rt, planned, memo, "11")))
    assert len(applied) == 2
    # The body moved on (kopf's patch arrived, or anything else changed it): ticks act again.
    ready = applied[-1].status
    asyncio.run(handlers.status_tick(rt, _call(rt, ready, memo, "12")))
    assert len(applied) == 2  # nothing to change: nothing written
    asyncio.run(handlers.status_tick(rt, _call(rt, planned, memo, "13")))
    assert len(applied) == 3 and applied[-1].status.phase == "Ready"


def test_a_write_that_never_shows_is_not_waited_for_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """A status patch kopf failed to apply leaves the body at the version the tick read: the next
    ticks act again after UNSEEN_WRITE_S, not never."""
    rt = _runtime(Settings())
    memo: dict[str, Any] = {}
    call = _call(rt, InferenceServiceStatus(), memo, "7")
    assert not handlers.unseen_write(call, 100.0)  # nothing written yet
    handlers.update(memo, lambda m: m.__class__(**{**m.__dict__, "status_written": ("7", 100.0)}))
    assert handlers.unseen_write(call, 100.0 + handlers.UNSEEN_WRITE_S - 1)
    assert not handlers.unseen_write(call, 100.0 + handlers.UNSEEN_WRITE_S + 1)
    assert not handlers.unseen_write(_call(rt, InferenceServiceStatus(), memo, "8"), 101.0)
