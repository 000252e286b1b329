"""Status writes from the scaling tick (issue 21, items 5 and 8): a tick that changes only a
condition's message, or observed values by less than MEANINGFUL, writes nothing; observed
latencies do not outlive the metrics they came from."""

from __future__ import annotations

import dataclasses

from kvscale.api.models import InferenceServiceStatus, ObservedStatus, status_patch
from kvscale.autoscaling.observation import Observation
from kvscale.control.scaling import ScalerMemory, tick
from tests.unit.test_reconcile import CAT, NOW, RES, SETTINGS, SPEC, _obs, _planned


def test_a_timeout_message_naming_another_query_is_not_written_again() -> None:
    intent, status, start = _planned(SPEC)
    stale = Observation(time_s=1000.0, ready_replicas=start.ready, starting_replicas=0, stale=True)
    first = tick(
        intent, RES, status, start, stale, "ttft: did not answer within 2s", ScalerMemory(), CAT, SETTINGS, NOW
    )
    memory = first.memory
    second = tick(
        intent, RES, first.result.status, start, stale, "rate: did not answer within 2s", memory, CAT, SETTINGS, NOW
    )
    assert status_patch(first.result.status, second.result.status) == {}


def test_observed_values_are_written_only_when_they_move_meaningfully() -> None:
    intent, status, start = _planned(SPEC)
    first = tick(intent, RES, status, start, _obs(5.0, start.ready), None, ScalerMemory(), CAT, SETTINGS, NOW)
    for _ in range(30):  # calibration settles (it is smoothed): then it moves only in far decimals
        first = tick(
            intent, RES, first.result.status, start, _obs(5.0, start.ready), None, first.memory, CAT, SETTINGS, NOW
        )
    nudged = _obs(5.01, start.ready, ttft=0.2004)
    second = tick(intent, RES, first.result.status, start, nudged, None, first.memory, CAT, SETTINGS, NOW)
    assert "observed" not in status_patch(first.result.status, second.result.status)
    moved = _obs(5.0, start.ready, ttft=0.3)
    third = tick(intent, RES, first.result.status, start, moved, None, first.memory, CAT, SETTINGS, NOW)
    assert status_patch(first.result.status, third.result.status)["observed"]["ttft"] == "300ms"


def test_observed_latencies_are_cleared_when_metrics_go_missing() -> None:
    intent, status, start = _planned(SPEC)
    first = tick(intent, RES, status, start, _obs(5.0, start.ready), None, ScalerMemory(), CAT, SETTINGS, NOW)
    assert first.result.status.observed is not None and first.result.status.observed.ttft is not None
    gone = dataclasses.replace(_obs(None, start.ready, ttft=None, tpot=None), stale=True)
    second = tick(intent, RES, first.result.status, start, gone, "no engine samples", first.memory, CAT, SETTINGS, NOW)
    patch = status_patch(first.result.status, second.result.status)
    assert patch["observed"]["ttft"] is None and patch["observed"]["tpot"] is None


def test_a_merge_patch_nulls_nested_fields_that_went() -> None:
    before = InferenceServiceStatus(observed=ObservedStatus(ttft="200ms", queue=1.0))
    after = InferenceServiceStatus(observed=ObservedStatus(queue=1.0))
    assert status_patch(before, after) == {"observed": {"ttft": None}}
