"""A drift re-plan whose write is refused (a 409 on the Deployment, kopf's retry) is made again
on the next workload tick. The tick marked its re-plan in memory before writing it, so after
the conflict every later tick took the status for older than a re-plan it never got, and
waited (tests/e2e/test_workload_replan.py under the parallel suite: no Replanned event in 90 s,
the observed workload frozen)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import kopf
import pytest

from kvscale.api.models import InferenceServiceStatus
from kvscale.control.reconcile import DeploymentView, Result
from kvscale.control.settings import Settings
from kvscale.operator import handlers
from tests.unit.test_parse_once import _call, _drifted_reads, _runtime, _seen


def test_a_refused_replan_is_made_again_on_the_next_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[Result] = []
    refuse = [False]

    def apply(self: handlers.Call, rt: Any, result: Result) -> None:
        if refuse[0] and any(e.reason == "Replanned" for e in result.events):
            raise kopf.TemporaryError("Deployment ns/chat: conflict, retrying", delay=1.0)
        handlers.remember(self.memo, result)
        applied.append(result)

    monkeypatch.setattr(handlers.Call, "apply", apply)
    rt = _runtime(Settings(replan_drift=1.5, replan_after_s=600.0))
    memo: dict[str, Any] = {}
    _seen(monkeypatch, None)
    handlers.spec_changed(rt, _call(rt, InferenceServiceStatus(), memo))
    planned = applied[-1].status
    assert planned.plan is not None
    replicas = planned.replicas or 1
    _seen(monkeypatch, DeploymentView(replicas, replicas, planned.plan.gpu_type))
    asyncio.run(handlers.status_tick(rt, _call(rt, planned, memo)))
    ready = applied[-1].status
    _drifted_reads(monkeypatch, rt)
    asyncio.run(handlers.observe_workload(rt, _call(rt, ready, memo)))  # the drift starts
    seen = applied[-1].status.observed_workload
    assert seen is not None and seen.drifting_since is not None
    hour_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    held = applied[-1].status.model_copy(
        update={"observed_workload": seen.model_copy(update={"drifting_since": hour_ago})}
    )
    refuse[0] = True  # the re-plan's write conflicts: kopf retries the timer
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(handlers.observe_workload(rt, _call(rt, held, memo)))
    refuse[0] = False
    writes = len(applied)
    asyncio.run(handlers.observe_workload(rt, _call(rt, held, memo)))  # the retry, on the same status
    assert len(applied) == writes + 1, "the tick after a refused re-plan wrote nothing"
    assert any(e.reason == "Replanned" for e in applied[-1].events)
