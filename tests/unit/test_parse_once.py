"""Each handler call parses the spec once (issue 30): the Intent (or its SpecError) made in
`Call.of` is the one value every step below reads. Counted on the handlers themselves, with
the informers' view and the writes replaced (no API server here): every `parse_intent` that a
kvscale module holds is wrapped by a counter."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kvscale.api.intent
from kvscale.api.models import InferenceServiceStatus, status_dict
from kvscale.autoscaling.observation import ObservedWorkload
from kvscale.control.inventory import gpu_inventory
from kvscale.control.reconcile import DeploymentView, Observed, Result
from kvscale.control.settings import Settings
from kvscale.operator import handlers
from kvscale.sizing.catalog import default_catalog
from tests.cluster.harness import node_objects

CAT = default_catalog()
POOLS = gpu_inventory(CAT, list(node_objects(Path(__file__).resolve().parents[1] / "cluster" / "nodepool.yaml")), [])
SPEC: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": 4},
    "slo": {"timeToFirstToken": "500ms", "timePerOutputToken": "50ms"},
    "hardware": {"gpuTypes": ["L4", "A10G", "A100-80GB", "H100-SXM"]},
}


class _Kube:
    """No API server: nothing of another owner holds a child's name."""

    def read(self, *_: Any) -> None:
        return None

    def read_configmap(self, *_: Any) -> None:  # no calibrated profile stored
        return None


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The count of parse_intent calls, through any module's reference to it."""
    count = [0]
    real = kvscale.api.intent.parse_intent

    def counted(raw: Any) -> Any:
        count[0] += 1
        return real(raw)

    for name, module in list(sys.modules.items()):
        if name.startswith("kvscale") and getattr(module, "parse_intent", None) is real:
            monkeypatch.setattr(module, "parse_intent", counted)
    yield count


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> list[Result]:
    """What the handlers apply, remembered as Call.apply does; the writes (effects.apply) left out."""
    out: list[Result] = []

    def apply(self: handlers.Call, rt: Any, result: Result) -> None:
        handlers.remember(self.memo, result)
        out.append(result)

    monkeypatch.setattr(handlers.Call, "apply", apply)
    return out


def _runtime(settings: Settings) -> handlers.Runtime:
    return handlers.Runtime(settings, CAT, _Kube())  # type: ignore[arg-type]


def _call(
    rt: handlers.Runtime,
    status: InferenceServiceStatus,
    memo: dict[str, Any],
    spec: dict[str, Any] | None = None,
    version: str | None = None,
) -> handlers.Call:
    """A handler call as kopf makes it for ns/chat (`spec`: SPEC; `version`: the body's
    metadata.resourceVersion, none by default)."""
    spec = SPEC if spec is None else spec
    meta: dict[str, Any] = {"uid": "uid-1", "generation": 1}
    if version is not None:
        meta["resourceVersion"] = version
    body = {"metadata": {"name": "chat", "namespace": "ns", **meta}, "spec": spec}
    kw = {"meta": meta, "namespace": "ns", "name": "chat", "body": body, "spec": spec, "patch": None, "memo": memo}
    return handlers.Call.of(rt, {**kw, "status": status_dict(status)})


def _seen(monkeypatch: pytest.MonkeyPatch, deployment: DeploymentView | None) -> None:
    def view(res: Any, memo: Any, inventory: Any, pool: Any = None) -> Observed:
        return Observed(POOLS, deployment, applied=memo.get("applied"))

    monkeypatch.setattr(handlers, "observed", view)


def _drifted_reads(monkeypatch: pytest.MonkeyPatch, rt: handlers.Runtime) -> None:
    """The workload reader answers a 4,096-token mean prompt, far from the planned one: a drift to re-plan for."""
    drifted = ObservedWorkload(
        time_s=dt.datetime.now(dt.UTC).timestamp(),
        window_s=600.0,
        requests_per_s=4.0,
        input_tokens_mean=4096.0,
        output_tokens_mean=128.0,
    )

    async def read(*_: Any, **__: Any) -> tuple[ObservedWorkload, None]:
        return drifted, None

    monkeypatch.setattr(handlers, "observe_workload_batched", read)
    rt.workload_reader = object()  # type: ignore[assignment]


def _once(parses: list[int], run: Callable[[], Any]) -> None:
    parses[0] = 0
    run()
    assert parses[0] == 1


def test_every_handler_call_parses_the_spec_once(
    monkeypatch: pytest.MonkeyPatch, parses: list[int], applied: list[Result]
) -> None:
    rt = _runtime(Settings(replan_drift=1.5, replan_after_s=600.0))
    memo: dict[str, Any] = {}
    _seen(monkeypatch, None)
    _once(parses, lambda: handlers.spec_changed(rt, _call(rt, InferenceServiceStatus(), memo)))
    planned = applied[-1].status
    assert planned.plan is not None and planned.phase == "Deploying"  # planned, built, under no budget

    gpu, replicas = planned.plan.gpu_type, planned.replicas or 1
    _seen(monkeypatch, DeploymentView(replicas, replicas, gpu))
    _once(parses, lambda: asyncio.run(handlers.status_tick(rt, _call(rt, planned, memo))))
    ready = applied[-1].status
    assert ready.phase == "Ready"
    _once(parses, lambda: asyncio.run(handlers.scale_tick(rt, _call(rt, ready, memo))))
    assert applied[-1].status.desired_replicas is not None  # the policy was asked

    # A drift re-plan: the path that parsed four times (handler, workload_tick, reconcile, budget).
    _drifted_reads(monkeypatch, rt)
    _once(parses, lambda: asyncio.run(handlers.observe_workload(rt, _call(rt, ready, memo))))
    seen = applied[-1].status.observed_workload
    assert seen is not None and seen.drifting_since is not None
    hour_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    held = applied[-1].status.model_copy(
        update={"observed_workload": seen.model_copy(update={"drifting_since": hour_ago})}
    )
    _once(parses, lambda: asyncio.run(handlers.observe_workload(rt, _call(rt, held, memo))))
    assert any(e.reason == "Replanned" for e in applied[-1].events)


def test_the_tick_reads_the_predictions_as_numbers_not_as_the_text_it_wrote() -> None:
    """status.plan carries the predicted TTFT and TPOT in seconds beside the rounded text; the
    scale tick's gauges read the number (a text the tick would parse says 412ms here)."""
    from kvscale.control.scaling import ScalerMemory, tick
    from tests.unit.test_reconcile import NOW, RES, SETTINGS, _obs, _planned

    intent, status, start = _planned(SPEC)
    assert status.plan is not None and status.plan.predicted_ttft_seconds is not None
    written = status.plan.model_copy(
        update={"predicted_ttft": "412ms", "predicted_ttft_seconds": 0.41234, "predicted_tpot_seconds": 0.0217}
    )
    status = status.model_copy(update={"plan": written})
    start = type(start)(start.current, start.ready, written)
    done = tick(intent, RES, status, start, _obs(4.0, start.ready), None, ScalerMemory(), CAT, SETTINGS, NOW)
    assert (done.gauges.ttft_predicted_s, done.gauges.tpot_predicted_s) == (0.41234, 0.0217)


def test_the_memory_is_one_frozen_value_under_one_key_and_a_tick_builds_the_pools_once(
    monkeypatch: pytest.MonkeyPatch, applied: list[Result]
) -> None:
    """Every handler stores one ServiceMemory under MEMO_KEY (no loose memo keys); the scale
    tick reads the informers' view, GPU pools and all, once."""
    rt = _runtime(Settings())
    memo: dict[str, Any] = {}
    _seen(monkeypatch, None)
    handlers.spec_changed(rt, _call(rt, InferenceServiceStatus(), memo))
    planned = applied[-1].status
    assert planned.plan is not None
    replicas = planned.replicas or 1
    _seen(monkeypatch, DeploymentView(replicas, replicas, planned.plan.gpu_type))
    views = [0]
    real = handlers.observed

    def counted(*args: Any, **kw: Any) -> Observed:
        views[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(handlers, "observed", counted)
    asyncio.run(handlers.scale_tick(rt, _call(rt, planned, memo)))
    assert views[0] == 1
    assert len(memo) == 1, sorted(memo)
    from kvscale.control.memory import MEMO_KEY, ServiceMemory

    assert set(memo) == {MEMO_KEY}
    stored = memo[MEMO_KEY]
    assert isinstance(stored, ServiceMemory) and stored.scaler.capacity is not None and stored.applied is not None
    with pytest.raises(AttributeError):
        stored.deleted = True  # type: ignore[misc]
