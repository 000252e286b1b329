"""Holding tuned on the service's own history in the operator (issue 35, part 2; opt-in,
KVSCALE_HOLDING=tuned): the settings the scale tick runs, the tune on the observed arrivals
(kvscale.control.holding.tune_holding, the simulator's tuner replaying them), what stays on a
missing or too short history, and status.holding on the wire."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from kvscale.api.intent import Intent, parse_intent
from kvscale.api.models import HoldingStatus, InferenceServiceStatus, PlanStatus, parse_status, status_dict
from kvscale.autoscaling.autotune import TRAILING_MARGIN, before_history, candidates
from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.autoscaling.policy import PolicyConfig
from kvscale.control.holding import (
    CONFIGURED,
    RETUNE_S,
    TUNED,
    Held,
    holding_config,
    running,
    tune_holding,
    with_holding,
)
from kvscale.control.memory import ServiceMemory
from kvscale.control.scaling import configuration_key, prepared
from kvscale.control.settings import Settings, SettingsError
from tests.unit.test_online_capacity import window
from tests.unit.test_reconcile import CAT, NOW, SETTINGS, SPEC, deployed

STEP_S = 30.0

Planned = tuple[Intent, PlanStatus, SizingCapacity, PolicyConfig]


@pytest.fixture(scope="module")
def planned() -> Planned:
    intent = parse_intent(SPEC)
    plan = deployed().status.plan
    assert plan is not None
    model, config, _ = prepared(intent, plan, ServiceMemory().scaler, CAT, SETTINGS)
    assert isinstance(model, SizingCapacity)
    return intent, plan, model, config


def batches(mean_per_s: float, steps: int = 60, every: int = 10, factor: float = 8.0) -> list[float]:
    """Arrivals per 30 s step with the same mean: a batch of `factor` x the mean every `every` steps."""
    batch = factor * mean_per_s * STEP_S
    quiet = (mean_per_s * STEP_S * every - batch) / (every - 1)
    return [batch if i % every == every - 1 else quiet for i in range(steps)]


def test_the_switch_is_an_operator_setting_configured_by_default() -> None:
    assert Settings().holding == CONFIGURED and Settings().holding_history_s == 1800.0
    assert Settings.from_env({"KVSCALE_HOLDING": "Tuned"}).holding == TUNED
    with pytest.raises(SettingsError, match="configured or tuned"):
        Settings.from_env({"KVSCALE_HOLDING": "auto"})


def test_the_tick_runs_the_configured_settings_the_trailing_rule_or_the_choice(planned: Planned) -> None:
    intent, plan, _, config = planned
    key = configuration_key(intent, plan)
    lean = candidates(config)[1]
    held = Held(key, lean, HoldingStatus(settings="lean", burst_quantile=0.9, burst_hold_seconds=600,
                                         headroom=0.05, source="tuned"))  # fmt: skip
    # configured (the default): the config as it is, whatever was chosen before
    assert holding_config(config, CONFIGURED, held, intent, plan) is config
    # tuned, before any choice: the causal trailing rule over the configured holding
    before = holding_config(config, TUNED, None, intent, plan)
    assert before == dataclasses.replace(config, trailing_margin=TRAILING_MARGIN)
    # tuned, with a choice for this configuration: it; for another (a re-plan): the trailing rule again
    assert holding_config(config, TUNED, held, intent, plan) == lean.apply(config)
    assert running(config, TUNED, dataclasses.replace(held, key=("old plan",)), key) == before_history(config)


def test_a_missing_or_short_history_runs_the_trailing_rule_and_says_so(planned: Planned) -> None:
    intent, plan, model, config = planned
    args = (intent, plan, CAT, config, model)
    none = tune_holding(*args, window(), None, STEP_S, 2, None, 200, NOW)
    assert none.held is None and none.event is None  # the trailing rule ran before too
    assert none.status.source == "beforeHistory" and none.status.settings == "trailing"
    assert none.status.trailing_margin == TRAILING_MARGIN and not none.status.candidates
    assert "not read" in none.status.message and "the trailing rule runs" in none.status.message
    # ten minutes of traffic (after twenty quiet ones): less than the fifteen a replay needs
    short = tune_holding(*args, window(), [0.0] * 40 + [60.0] * 20, STEP_S, 2, None, 200, NOW)
    assert short.status.source == "beforeHistory" and short.status.replayed_requests == 0
    assert "1200 request(s) over 10 min of history, fewer than the 200 over 15 min" in (short.status.message)
    few = tune_holding(*args, window(), [1.0] * 60, STEP_S, 2, None, 200, NOW)
    assert few.status.source == "beforeHistory" and "60 request(s) over 30 min" in few.status.message


def test_a_choice_made_before_stays_through_a_short_history(planned: Planned) -> None:
    intent, plan, model, config = planned
    chosen_at = "2026-11-23T11:00:00Z"
    lean = candidates(config)[1]
    shown = HoldingStatus(settings="lean", burst_quantile=0.9, burst_hold_seconds=600, headroom=0.05,
                          source="tuned", chosen_at=chosen_at, requests=5000)  # fmt: skip
    held = Held(configuration_key(intent, plan), lean, shown)
    kept = tune_holding(intent, plan, CAT, config, model, None, None, STEP_S, 2, held, 200, NOW)
    assert kept.held == held and kept.event is None
    assert kept.status.source == "kept" and kept.status.settings == "lean" and kept.status.chosen_at == chosen_at
    assert kept.status.replayed_at == "2026-11-23T12:00:00Z" and kept.status.requests == 5000
    assert f"the settings chosen at {chosen_at} stay" in kept.status.message
    # a choice for another configuration does not: the trailing rule, and an Event says so
    moved = tune_holding(
        intent, plan, CAT, config, model, None, None, STEP_S, 2, dataclasses.replace(held, key=("x",)), 200, NOW
    )
    assert moved.held is None and moved.status.source == "beforeHistory"


def test_the_history_is_replayed_with_each_candidate_and_the_choice_runs(planned: Planned) -> None:
    intent, plan, model, config = planned
    counts = batches(1.0)  # 1,800 requests over 30 minutes, a batch of 240 in 30 s every 5 minutes
    previous = Held(configuration_key(intent, plan), candidates(config)[0],
                    HoldingStatus(settings="configured", burst_quantile=0.95, burst_hold_seconds=1200,
                                  headroom=0.1, source="tuned", chosen_at="2026-11-23T11:00:00Z"))  # fmt: skip
    tuned = tune_holding(intent, plan, CAT, config, model, window(), counts, STEP_S, 2, previous, 200, NOW)
    s = tuned.status
    assert s.source == "tuned" and s.requests == 1800
    assert s.replayed_requests == pytest.approx(1800, abs=10)  # not thinned (each step's fraction rounded at random)
    assert s.history_seconds == 1800.0 and s.replayed_at == "2026-11-23T12:00:00Z"
    assert [c.name for c in s.candidates] == ["configured", "lean", "thin", "reserve", "trailing"]
    assert all(0.0 <= c.attainment <= 1.0 and c.gpu_hours > 0 for c in s.candidates)
    # the choice is the tuner's: the cheapest meeting the SLO's percentile (p95 here) + 0.2 pt, else the closest
    met = [c for c in s.candidates if c.attainment >= intent.slo.percentile / 100 + 0.002]
    best = (
        min(met, key=lambda c: (c.gpu_hours, -c.attainment)) if met else max(s.candidates, key=lambda c: c.attainment)
    )
    assert s.settings == best.name and tuned.held is not None and tuned.held.settings.name == best.name
    assert "on the replayed past" in s.message and "replayed the last 30 min (1800 requests" in s.message
    assert tuned.held.replayed_s == NOW.timestamp()
    assert not tuned.held.due(NOW + dt.timedelta(seconds=RETUNE_S / 2), tuned.held.key)
    assert tuned.held.due(NOW + dt.timedelta(seconds=RETUNE_S), tuned.held.key)
    if best.name == "configured":
        assert tuned.event is None and s.chosen_at == "2026-11-23T11:00:00Z"  # the same settings since then
    else:
        assert tuned.event is not None and tuned.event.reason == "HoldingTuned"
        assert tuned.event.message.startswith(f"Holding settings configured -> {best.name}: {best.name} (")
        assert s.chosen_at == "2026-11-23T12:00:00Z"


def test_a_history_thinned_below_a_few_replicas_is_not_tuned_on(planned: Planned) -> None:
    intent, plan, model, config = planned
    steady = [600.0] * 60  # 20 req/s for 30 minutes: 36,000 requests
    tuned = tune_holding(
        intent, plan, CAT, config, model, window(), steady, STEP_S, 4, None, 200, NOW, max_requests=1000
    )
    assert tuned.status.source == "beforeHistory" and "thinned to 1000 to bound the CPU" in tuned.status.message


def test_status_holding_round_trips_in_camel_case(planned: Planned) -> None:
    intent, plan, model, config = planned
    tuned = tune_holding(intent, plan, CAT, config, model, window(), batches(0.5), STEP_S, 1, None, 200, NOW)
    status = with_holding(InferenceServiceStatus(), tuned.status)
    wire = status_dict(status)["holding"]
    assert {"settings", "burstQuantile", "burstHoldSeconds", "headroom", "source", "replayedAt", "requests",
            "replayedRequests", "historySeconds", "message", "candidates"} <= set(wire)  # fmt: skip
    assert set(wire["candidates"][0]) == {"name", "settings", "attainment", "gpuHours"}
    assert parse_status(status_dict(status)) == status
    assert status_dict(with_holding(status, None)).get("holding") is None


def test_the_scale_tick_runs_the_held_settings_with_the_switch_on(planned: Planned) -> None:
    from kvscale.autoscaling.observation import Observation
    from kvscale.control.autoscale import Governor, Readings, autoscale
    from kvscale.control.budget import BudgetBook
    from kvscale.control.reconcile import DeploymentView
    from kvscale.control.scaling import Fleet, fleet
    from tests.unit.test_reconcile import RES

    intent, plan, _, config = planned
    status = deployed().status
    start = fleet(intent, status, DeploymentView(1, 1, plan.gpu_type))
    assert isinstance(start, Fleet)
    obs = Observation(NOW.timestamp(), 1, 0, 30.0, 420.0, 100.0, running=1.0, waiting=0.0)
    read = Readings(obs, None, None, (), ())
    thin, reserve = candidates(config)[2], candidates(config)[3]

    def desired(mode: str, settings: object) -> int:
        shown = HoldingStatus(settings="x", burst_quantile=1, burst_hold_seconds=1, headroom=0, source="tuned")
        held = Held(configuration_key(intent, plan), settings, shown)  # type: ignore[arg-type]
        memory = dataclasses.replace(ServiceMemory(), holding=held)
        done = autoscale(intent, RES, status, start, read, memory, Governor(BudgetBook(), {}, 45.0), CAT,
                         dataclasses.replace(SETTINGS, holding=mode), NOW)  # fmt: skip
        return done.tick.decision.replicas

    # configured: the choice in memory is not run; tuned: it is (25% headroom over none asks for more)
    assert desired(CONFIGURED, thin) == desired(CONFIGURED, reserve)
    assert desired(TUNED, reserve) > desired(TUNED, thin)


def test_kvscale_status_shows_the_holding_settings_when_tuned() -> None:
    from kvscale.cli.status import status_lines

    holding = {"settings": "lean", "burstQuantile": 0.9, "burstHoldSeconds": 600, "headroom": 0.05,
               "source": "tuned", "chosenAt": "2026-11-29T16:31:41Z", "message": "lean (p90 held 600s): the cheapest"}  # fmt: skip
    obj = {"metadata": {"name": "chat", "namespace": "ns"}, "spec": {}, "status": {"holding": holding}}
    (line,) = [line for line in status_lines(obj, []) if line.startswith("Holding:")]
    assert line == "Holding:  lean (tuned, since 2026-11-29T16:31:41Z): lean (p90 held 600s): the cheapest"
    assert not any(line.startswith("Holding:") for line in status_lines({**obj, "status": {}}, []))
