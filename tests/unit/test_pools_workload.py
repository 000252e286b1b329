"""A disaggregated service's observed workload is its decode pool's (every request ends there with
its prompt and whole output; behind a P/D router the prefill pool counts each request too, with
one output token), and a drift re-plans the pools for it as an aggregated service is re-planned."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from kvscale.api.models import InferenceServiceStatus
from kvscale.autoscaling.observation import ObservedWorkload
from kvscale.control.reconcile import Observed, Result
from kvscale.control.settings import Settings
from kvscale.operator import handlers
from tests.unit.test_parse_once import POOLS, _runtime
from tests.unit.test_parse_once import _call as call_of

SPEC: dict[str, Any] = {  # docs/disaggregation.md's steady case, deployed as pools
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 4000, "outputTokens": 300, "requestsPerSecond": 8},
    "slo": {"timeToFirstToken": "1500ms", "timePerOutputToken": "12ms"},
    "hardware": {"gpuTypes": ["H100-SXM"]},
    "serving": {"disaggregation": "on"},
}


def _call(rt: handlers.Runtime, status: InferenceServiceStatus, memo: dict[str, Any]) -> handlers.Call:
    return call_of(rt, status, memo, spec=SPEC)


def test_the_decode_pools_workload_is_read_and_a_drift_replans_the_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[Result] = []

    def apply(self: handlers.Call, rt: Any, result: Result) -> None:
        handlers.remember(self.memo, result)
        applied.append(result)

    monkeypatch.setattr(handlers.Call, "apply", apply)
    monkeypatch.setattr(handlers, "observed", lambda *_, **__: Observed(POOLS))
    rt = _runtime(Settings(replan_drift=1.5, replan_after_s=600.0))
    memo: dict[str, Any] = {}
    handlers.spec_changed(rt, _call(rt, InferenceServiceStatus(), memo))
    planned = applied[-1].status
    assert planned.plan is not None and planned.plan.mode == "disaggregated"
    ready = planned.model_copy(update={"phase": "Ready"})

    asked: list[str] = []
    longer = ObservedWorkload(  # prompts 3x the planned ones, at the planned rate
        time_s=dt.datetime.now(dt.UTC).timestamp(),
        window_s=600.0,
        requests_per_s=8.0,
        input_tokens_mean=12000.0,
        output_tokens_mean=300.0,
    )

    async def read(reader: Any, engine: str, namespace: str, name: str, *_: Any, **__: Any) -> tuple[Any, None]:
        asked.append(name)
        return longer, None

    monkeypatch.setattr(handlers, "observe_workload_batched", read)
    rt.workload_reader = object()  # type: ignore[assignment]
    asyncio.run(handlers.observe_workload(rt, _call(rt, ready, memo)))
    assert asked == ["chat-decode"]  # the pool every request ends in, not the service's own name
    seen = applied[-1].status.observed_workload
    assert seen is not None and seen.drifting_since is not None and seen.input_tokens is not None
    assert seen.input_tokens.mean == 12000.0

    hour_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    held = applied[-1].status.model_copy(
        update={"observed_workload": seen.model_copy(update={"drifting_since": hour_ago})}
    )
    asyncio.run(handlers.observe_workload(rt, _call(rt, held, memo)))
    assert [e.reason for e in applied[-1].events][:1] == ["Replanned"]
    plan = applied[-1].status.plan
    assert plan is not None and plan.mode == "disaggregated" and plan.prefill is not None
    assert plan.workload is not None and plan.workload.source == "observed"
    assert plan.workload.input_tokens > 1.5 * 4000
    before = planned.plan.prefill
    assert before is not None and plan.prefill.replicas > before.replicas  # 3x the prompt tokens to prefill
    names = {c["metadata"]["name"] for c in applied[-1].apply if c["kind"] == "Deployment"}
    assert names == {"chat-prefill", "chat-decode"}
