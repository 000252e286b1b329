"""Issue 21, item 9: a service partly placed (some pods serve, some wait for GPUs that vanished)
does not re-plan; past the unschedulable timeout Scheduled says why it waits, with one Event."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from kvscale.control.inventory import EnginePod
from kvscale.control.reconcile import refresh
from tests.unit.test_children import running
from tests.unit.test_reconcile import CAT, NOW, RES, SETTINGS, SHORT, SPEC, condition_of


def test_partly_placed_past_the_timeout_says_why_and_posts_one_event() -> None:
    first, seen = running()
    gpu = first.status.plan.gpu_type if first.status.plan else None
    since = NOW - dt.timedelta(seconds=SETTINGS.unschedulable_timeout_s + 60)
    pods = (
        EnginePod("chat-a-1", gpu, "node-1", "Running", None, False),
        EnginePod("chat-a-2", gpu, None, "Pending", since, False, unschedulable_message=SHORT),
    )
    seen = replace(seen, pods=pods)
    result = refresh(SPEC, RES, first.status, seen, CAT, SETTINGS, NOW)
    assert result is not None and result.apply == ()  # no re-plan
    state, reason, message = condition_of(result.status, "Scheduled")
    assert (state, reason) == ("False", "PartiallyPlaced") and "does not re-plan" in message
    assert [e.reason for e in result.events] == ["PartiallyPlaced"]
    again = refresh(SPEC, RES, result.status, seen, CAT, SETTINGS, NOW)
    assert again is not None and "PartiallyPlaced" not in [e.reason for e in again.events]
    early = replace(seen, pods=(pods[0], replace(pods[1], unschedulable_since=NOW)))
    waiting = refresh(SPEC, RES, first.status, early, CAT, SETTINGS, NOW)
    assert waiting is not None and condition_of(waiting.status, "Scheduled")[1] == "WaitingForGPUs"
