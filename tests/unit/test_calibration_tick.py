"""The operator's calibration tick (kvscale.control.calibration, kvscale.operator.calibration):
what is written, what status says, and when the plan is made again on the calibrated profile."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import httpx
import kopf
import pytest

from kvscale.api.intent import Intent, read_spec
from kvscale.api.models import InferenceServiceStatus
from kvscale.calibration.fit import config_key, with_fields
from kvscale.calibration.profile import PINNED_ANNOTATION, profile_name, read_profile, replan_message
from kvscale.control.calibration import calibrated, calibrated_catalog, serving_config, step
from kvscale.control.reconcile import Observed, Result
from kvscale.control.settings import Settings
from kvscale.metrics.calibration import read_windows_async
from kvscale.metrics.client import AsyncPrometheusClient, PrometheusError
from kvscale.metrics.engines import ENGINES
from kvscale.operator.calibration import profile_namespace, unavailable
from kvscale.sizing.config import ServingConfig
from tests.unit.test_calibration_fit import _configs, _measured
from tests.unit.test_reconcile import CAT, NOW, POOLS, RES, SETTINGS, SPEC, deployed

FIELDS = ("matmul_efficiency_factor", "sequence_overhead_s", "step_overhead_s")
BATCHES = (4.0, 16.0, 64.0)


def _intent(spec: dict[str, Any]) -> Intent:
    intent = read_spec(spec)
    assert isinstance(intent, Intent)
    return intent


def _service(rps: float) -> tuple[dict[str, Any], Result, ServingConfig, ServingConfig]:
    """A deployed service at `rps`, its planned configuration, and the same on slower.yaml's
    engine profile (what the engines are made to measure)."""
    spec = copy.deepcopy(SPEC)
    spec["workload"]["requestsPerSecond"] = rps
    first = deployed(spec)
    assert first.status.plan is not None
    cfg = serving_config(_intent(spec), first.status.plan, CAT)
    assert cfg is not None
    _, slow = _configs(first.status.plan.gpu_type)
    return spec, first, cfg, with_fields(cfg, {k: getattr(slow.engine, k) for k in FIELDS})


def test_too_little_data_writes_nothing_and_status_says_why() -> None:
    spec, first, cfg, slow = _service(20)
    done = step(cfg, _measured(slow, (16.0,))[:2], None, "kvscale-system", NOW)
    assert done.write is None and done.updates is None
    assert done.status.reason == "NotEnoughData" and "window" in done.status.message
    result = calibrated(done, cfg, _intent(spec), RES, first.status, lambda: Observed(POOLS), CAT, SETTINGS, NOW)
    assert result.apply == () and result.events == () and result.retry is None  # not an error
    assert result.status.calibration == done.status and result.status.plan == first.status.plan


def test_a_first_fit_writes_the_profile_configmap_and_predicted_against_observed() -> None:
    _, _, cfg, slow = _service(20)
    done = step(cfg, _measured(slow, BATCHES), None, "kvscale-system", NOW)
    assert done.write is not None and done.status.reason == "Fitted"
    assert done.write["metadata"] == done.write["metadata"] | {
        "name": profile_name(config_key(cfg)),
        "namespace": "kvscale-system",
    }
    stored = read_profile(done.write, config_key(cfg))
    assert stored is not None and not stored.pinned
    for name in ("matmul_efficiency_factor", "sequence_overhead_s"):
        assert stored.updates[name] == pytest.approx(getattr(slow.engine, name), rel=0.1)
    s = done.status
    assert s.profile == profile_name(config_key(cfg))
    assert s.predicted_gap_seconds is not None and s.observed_gap_seconds is not None
    assert s.predicted_prefill_seconds is not None and s.observed_prefill_seconds is not None
    # The calibrated profile predicts what was measured (2% noise); the catalog's did not.
    assert s.predicted_gap_seconds == pytest.approx(s.observed_gap_seconds, rel=0.05)
    assert s.predicted_prefill_seconds == pytest.approx(s.observed_prefill_seconds, rel=0.05)


def test_a_pinned_profile_is_never_rewritten_and_is_what_status_compares() -> None:
    _, _, cfg, slow = _service(20)
    fitted = step(cfg, _measured(slow, BATCHES), None, "ns", NOW).write
    assert fitted is not None
    pinned = copy.deepcopy(fitted)
    pinned["metadata"]["annotations"][PINNED_ANNOTATION] = "true"
    done = step(cfg, _measured(cfg, BATCHES), pinned, "ns", NOW)  # engines now run as the catalog says
    assert done.write is None and done.moved == () and done.status.reason == "Pinned"
    # Predicted with the pinned (slower) profile: well above what the engines now measure.
    assert done.status.predicted_gap_seconds is not None and done.status.observed_gap_seconds is not None
    assert done.status.predicted_gap_seconds > 1.2 * done.status.observed_gap_seconds


def test_a_fit_within_the_stored_profiles_error_rewrites_nothing() -> None:
    _, _, cfg, slow = _service(20)
    stored = step(cfg, _measured(slow, BATCHES, seed=1), None, "ns", NOW).write
    again = step(cfg, _measured(slow, BATCHES, seed=2), stored, "ns", NOW)
    assert again.write is None and again.moved == () and again.status.reason == "Unchanged"


def test_a_moved_profile_that_changes_the_plan_replans_with_one_event() -> None:
    spec, first, cfg, slow = _service(20)
    assert first.status.plan is not None
    done = step(cfg, _measured(slow, BATCHES), None, "ns", NOW)
    result = calibrated(done, cfg, _intent(spec), RES, first.status, lambda: Observed(POOLS), CAT, SETTINGS, NOW)
    after = result.status.plan
    assert after is not None and result.retry is None
    # Half the GEMM share and three times the per-sequence cost: a replica sustains less.
    assert after.replicas > first.status.plan.replicas
    assert [e.reason for e in result.events].count("ProfileCalibrated") == 1
    assert result.events[0].message == replan_message(
        config_key(cfg), list(done.moved), first.status.plan.replicas, after.replicas
    )
    assert "Planned" not in [e.reason for e in result.events]
    assert result.apply  # the children re-built on the new plan
    assert result.status.calibration == done.status


def test_a_moved_profile_that_leaves_the_plan_as_it_is_replans_nothing() -> None:
    # 12 req/s: one H100 with room to spare (at 20 req/s, since the load model charges the
    # per-request intake, the plan is 2 replicas and a 10% faster GEMM makes it 1: a real move)
    spec, first, cfg, _ = _service(12)
    # 10% more GEMM share: beyond the hysteresis; the batch limit moves by a few sequences, but
    # one replica on the same GPU type still serves: the engines are not restarted for it.
    close = with_fields(cfg, {"matmul_efficiency_factor": cfg.engine.matmul_efficiency_factor * 1.1})
    done = step(cfg, _measured(close, BATCHES, noise=0.002), None, "ns", NOW)
    assert [m.name for m in done.moved] == ["matmul_efficiency_factor"] and done.write is not None
    result = calibrated(done, cfg, _intent(spec), RES, first.status, lambda: Observed(POOLS), CAT, SETTINGS, NOW)
    assert result.apply == () and result.events == ()
    assert result.status.plan == first.status.plan and result.status.calibration == done.status


def test_the_calibrated_catalog_changes_only_the_engine_the_service_runs() -> None:
    before = CAT.engine("vllm")
    cat = calibrated_catalog(CAT, "vllm", {"matmul_efficiency_factor": 0.3})
    assert cat.engine("vllm").matmul_efficiency_factor == 0.3
    assert cat.engine("vllm").model_copy(update={"matmul_efficiency_factor": 0.3}) == cat.engine("vllm")
    assert CAT.engine("vllm") is before and before.matmul_efficiency_factor != 0.3  # the operator's own untouched
    assert cat.engine("sglang") == CAT.engine("sglang")


def test_calibration_interval_setting() -> None:
    assert Settings().calibration_interval_s == 60.0
    assert Settings.from_env({"KVSCALE_CALIBRATION_INTERVAL": "off"}).calibration_interval_s == 0.0
    assert Settings.from_env({"KVSCALE_CALIBRATION_WINDOW": "2m"}).calibration_window_s == 120.0


def test_profiles_live_in_the_operators_namespace(tmp_path: Any) -> None:
    account = tmp_path / "namespace"
    assert profile_namespace("", account) == "default"  # hand-run, no pod
    account.write_text("kvscale-system\n")
    assert profile_namespace("", account) == "kvscale-system"
    assert profile_namespace("ops", account) == "ops"


def _answer(request: httpx.Request) -> httpx.Response:
    """Prometheus's range answers for one engine pod: 100 gaps of 20 ms and 5 prefills of 200 ms
    per window (the shape of /api/v1/query_range's matrix)."""
    query = request.url.params["query"]
    if request.url.path.endswith("/query"):
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})
    value = 1.0
    if "inter_token_latency_seconds_sum" in query:
        value = 2.0
    elif "inter_token_latency_seconds_count" in query:
        value = 100.0
    elif "prefill_time_seconds_sum" in query:
        value = 1.0
    elif "count" in query:
        value = 5.0
    metric = {"namespace": "ns", "pod": "chat-0", "instance": "10.0.0.1:8000"}
    points = [[1000.0 + 60 * i, str(value)] for i in range(3)]
    data = {"resultType": "matrix", "result": [{"metric": metric, "values": points}]}
    return httpx.Response(200, json={"status": "success", "data": data})


def test_windows_are_read_through_the_async_client() -> None:
    async def read() -> list[Any]:
        client = AsyncPrometheusClient("http://prom", timeout_s=5, transport=httpx.MockTransport(_answer))
        try:
            reading = await read_windows_async(client, ENGINES["vllm"], 'namespace="ns"', 940.0, 1120.0, 60.0)
        finally:
            await client.aclose()
        return reading.windows(1000.0)

    windows = asyncio.run(read())
    assert len(windows) == 3
    assert windows[0].gaps == 100.0 and windows[0].gap_s == pytest.approx(0.02)
    assert windows[0].prefills == 5.0 and windows[0].prefill_s == pytest.approx(0.2)


def test_a_refused_range_query_is_a_prometheus_error_and_status_says_unavailable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, content=json.dumps({"status": "error", "error": "bad_data"}).encode())

    async def read() -> None:
        client = AsyncPrometheusClient("http://prom", timeout_s=5, transport=httpx.MockTransport(refuse))
        try:
            await read_windows_async(client, ENGINES["vllm"], "", 0.0, 600.0, 60.0)
        finally:
            await client.aclose()

    with pytest.raises(PrometheusError, match="bad_data"):
        asyncio.run(read())
    status = unavailable(InferenceServiceStatus(), "Prometheus at http://prom refused")
    assert status.calibration is not None and status.calibration.reason == "Unavailable"


def _timers(environ: dict[str, str]) -> dict[str, float | None]:
    from kvscale.operator.handlers import Runtime, register

    registry = kopf.OperatorRegistry()
    kube: Any = None  # registering touches no API
    register(registry, Runtime(Settings.from_env(environ), CAT, kube))
    return {str(h.id): getattr(h, "interval", None) for h in registry._spawning.get_all_handlers()}


def test_the_calibration_timer_runs_at_its_interval_and_off_turns_it_off() -> None:
    assert _timers({})["calibration"] == 60.0
    assert _timers({"KVSCALE_CALIBRATION_INTERVAL": "5m"})["calibration"] == 300.0
    assert "calibration" not in _timers({"KVSCALE_CALIBRATION_INTERVAL": "off"})
