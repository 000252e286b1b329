"""The observed workload in status and the re-plan on drift, as pure functions: hysteresis,
the Event, the planned-for workload kept across restarts and dropped on a spec change."""

from __future__ import annotations

import datetime as dt
import math

from kvscale.api.models import InferenceServiceStatus
from kvscale.autoscaling.observation import LengthHistogram, ObservedWorkload
from kvscale.control.reconcile import Observed, Resource, Result, reconcile
from kvscale.control.settings import Settings
from kvscale.control.workload import MIN_REQUESTS, as_workload, check_drift, predates, workload_tick
from kvscale.sizing.workload import LengthDistribution, Workload
from tests.unit.test_reconcile import CAT, NOW, POOLS, RES, SPEC, deployed

SETTINGS = Settings(replan_drift=1.5, replan_after_s=600.0)
PLANNED = Workload(512, 128, 4.0)


def observed(prompt: float, output: float = 128.0, rate: float = 4.0, window_s: float = 600.0) -> ObservedWorkload:
    # A spread of prompts around `prompt`: a quarter each at 0.5x, 1x (twice) and 1.5x.
    bounds = (prompt * 0.5, prompt, prompt * 1.5, math.inf)
    return ObservedWorkload(
        time_s=NOW.timestamp(),
        window_s=window_s,
        requests_per_s=rate,
        input_tokens_mean=prompt,
        output_tokens_mean=output,
        prompt_lengths=LengthHistogram(bounds, (rate / 4, rate / 2, rate / 4, 0.0)),
        output_lengths=LengthHistogram((output, math.inf), (rate, 0.0)),
        prompt_tokens_per_s=rate * prompt,
        prefill_tokens_per_s=rate * prompt * 0.8,
        decode_tokens_per_s=rate * output,
        prefix_cache_hit_ratio=0.2,
        peak_window_s=60.0,
        peak_requests_per_s_1h=2 * rate,
        peak_requests_per_s_1d=3 * rate,
        peak_prefill_tokens_per_s_1h=2 * rate * prompt * 0.8,
        peak_prefill_tokens_per_s_1d=3 * rate * prompt * 0.8,
    )


def at(minutes: float) -> dt.datetime:
    return NOW + dt.timedelta(minutes=minutes)


def tick(status: InferenceServiceStatus, w: ObservedWorkload | None, minutes: float, res: Resource = RES) -> Result:
    result = workload_tick(
        SPEC, res, status, lambda: Observed(POOLS), w, None if w else "timed out", CAT, SETTINGS, at(minutes)
    )
    assert result is not None
    return result


def test_drift_starts_at_the_factor_and_ends_within_its_square_root() -> None:
    assert check_drift(PLANNED, observed(700), None, NOW, 1.5, 600).drift is None  # 1.37x: not yet
    started = check_drift(PLANNED, observed(800), None, NOW, 1.5, 600)
    assert started.since == NOW and not started.replan
    assert started.drift == "mean prompt 800 tokens vs 512 planned (1.6x)"
    held = check_drift(PLANNED, observed(700), NOW, at(5), 1.5, 600)  # back to 1.37x: still beyond sqrt(1.5)
    assert held.since == NOW and not held.replan
    assert check_drift(PLANNED, observed(600), NOW, at(6), 1.5, 600).since is None  # 1.17x: settled
    assert check_drift(PLANNED, observed(800), NOW, at(10), 1.5, 600).replan
    shorter = check_drift(PLANNED, observed(512, output=40), None, NOW, 1.5, 600)  # shorter outputs count too
    assert shorter.drift is not None and "mean output 40 tokens vs 128 planned" in shorter.drift


def test_a_thin_window_judges_nothing() -> None:
    thin = observed(4096, rate=(MIN_REQUESTS - 1) / 600)
    assert check_drift(PLANNED, thin, NOW, at(30), 1.5, 600) == check_drift(PLANNED, thin, None, NOW, 1.5, 600)
    assert check_drift(PLANNED, thin, NOW, at(30), 1.5, 600).since is None


def test_the_tail_counts_once_the_plan_has_a_distribution() -> None:
    spread = Workload.of(LengthDistribution((256, 512, 768), (0.25, 0.5, 0.25)), LengthDistribution.constant(128), 4)
    heavy = observed(512)
    tail = LengthHistogram((256.0, 512.0, 768.0, 8192.0, math.inf), (1.0, 1.5, 0.5, 1.0, 0.0))
    heavy = ObservedWorkload(**{**heavy.__dict__, "prompt_lengths": tail})
    check = check_drift(spread, heavy, None, NOW, 1.5, 600)
    assert check.drift is not None and check.drift.startswith("prompt p90")
    assert check_drift(PLANNED, heavy, None, NOW, 1.5, 600).drift is None  # a mean-value plan: means only


def test_the_observed_workload_as_the_planner_takes_it() -> None:
    workload = as_workload(observed(2000), PLANNED)
    assert workload is not None and abs(workload.input_tokens - 2000) <= 20
    assert workload.requests_per_s == 4.0 and workload.prefix_cache_hit_share == 0.2
    assert not workload.inputs.is_constant and workload.inputs.max > workload.input_tokens
    no_means = ObservedWorkload(time_s=0.0, window_s=600.0, requests_per_s=4.0)
    assert as_workload(no_means, PLANNED) is None


def test_status_shows_the_workload_and_a_long_drift_replans_with_an_event() -> None:
    start = deployed().status
    assert start.plan is not None and start.plan.workload is not None
    assert (start.plan.workload.source, start.plan.workload.input_tokens) == ("spec", 512)
    first = tick(start, observed(4096), 0)
    shown = first.status.observed_workload
    assert shown is not None and first.apply == () and first.events == ()
    assert (
        shown.input_tokens is not None and shown.input_tokens.mean == 4096 and shown.input_tokens.p50 == 3072
    )  # linear in (2048, 4096]
    assert shown.window == "10m" and shown.peak_window == "1m" and shown.prefix_cache_hit_ratio == 0.2
    assert shown.peak_requests_per_second_last_day == 12 and shown.decode_tokens_per_second == 512
    assert shown.drifting_since == "2026-11-23T12:00:00Z" and "mean prompt 4096" in (shown.drift or "")
    assert tick(first.status, observed(4096), 9).apply == ()  # within the hold
    replanned = tick(tick(first.status, observed(4096), 9).status, observed(4096), 10)
    [event] = replanned.events
    assert event.reason == "Replanned" and "drifted for 600s: mean prompt 4096 tokens vs 512 planned" in event.message
    assert [c["kind"] for c in replanned.apply][-1] == "Deployment"
    plan = replanned.status.plan
    assert plan is not None and plan.workload is not None and plan.workload.source == "observed"
    assert abs(plan.workload.input_tokens - 4096) <= 41 and plan.workload.input_lengths is not None
    settled = replanned.status.observed_workload
    assert settled is not None and settled.drift is None and settled.drifting_since is None
    calm = tick(replanned.status, observed(4096), 11)
    assert calm.events == () and calm.status.observed_workload and calm.status.observed_workload.drift is None


def test_an_observed_plan_survives_a_resume_but_not_a_spec_change() -> None:
    first = tick(deployed().status, observed(4096), 0)
    replanned = tick(first.status, observed(4096), 10).status
    resumed = reconcile(SPEC, RES, replanned, Observed(POOLS), CAT, SETTINGS, now=at(20))
    assert resumed.status.plan is not None and resumed.status.plan.workload is not None
    assert resumed.status.plan.workload.source == "observed" and resumed.status.plan == replanned.plan
    edited = reconcile(SPEC, Resource("ns", "chat", "uid-1", 2), replanned, Observed(POOLS), CAT, SETTINGS, now=at(20))
    assert edited.status.plan is not None and edited.status.plan.workload is not None
    assert (edited.status.plan.workload.source, edited.status.plan.workload.input_tokens) == ("spec", 512)


def test_no_plan_for_the_observed_workload_keeps_the_current_one() -> None:
    start = deployed().status
    huge = observed(120_000, output=4000, rate=0.5)  # no GPU meets a 500 ms TTFT on 120k-token prompts
    failed = tick(tick(start, huge, 0).status, huge, 10)
    [event] = failed.events
    assert event.type == "Warning" and event.reason == "ReplanFailed" and "spec.slo" in event.message
    assert failed.status.phase == start.phase and failed.status.plan == start.plan and failed.apply == ()
    shown = failed.status.observed_workload
    assert shown is not None and shown.drifting_since == "2026-11-23T12:10:00Z"  # another full hold first


def test_an_unread_workload_keeps_what_was_shown_and_says_why() -> None:
    first = tick(deployed().status, observed(4096), 0)
    unread = tick(first.status, None, 30)
    assert unread.status.observed_workload == first.status.observed_workload.model_copy(  # type: ignore[union-attr]
        update={"message": "timed out"}
    )
    assert unread.apply == () and unread.events == ()


def test_drift_replanning_can_be_turned_off() -> None:
    off = Settings(replan_drift=None)
    start = deployed().status
    for minutes in (0, 30):
        result = workload_tick(SPEC, RES, start, lambda: Observed(POOLS), observed(4096), None, CAT, off, at(minutes))
        assert result is not None and result.apply == () and result.status.observed_workload is not None
        start = result.status
    assert start.observed_workload is not None and start.observed_workload.drift is None


def test_a_status_older_than_the_operators_own_replan_is_recognized() -> None:
    start = deployed().status
    replanned = tick(tick(start, observed(4096), 0).status, observed(4096), 10).status
    assert replanned.plan is not None
    written = (RES.generation, replanned.plan.workload)
    assert predates(written, start, RES.generation)  # the watch has not delivered the re-plan yet
    assert not predates(written, replanned, RES.generation)
    assert not predates(written, start, 2)  # a spec change since: the spec's plan is the news
    assert not predates(None, start, RES.generation)


def test_a_drift_that_ended_is_removed_from_the_server_status() -> None:
    from kvscale.api.models import status_patch

    first = tick(deployed().status, observed(4096), 0)
    replanned = tick(first.status, observed(4096), 10)
    patch = status_patch(first.status, replanned.status)
    # A JSON merge patch merges nested objects: the ended drift is sent as null, not left out.
    assert patch["observedWorkload"]["drift"] is None and patch["observedWorkload"]["driftingSince"] is None
    assert "window" not in patch["observedWorkload"]  # unchanged fields are not sent
