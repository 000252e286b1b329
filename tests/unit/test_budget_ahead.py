"""Room ahead of need (issue 29): the allocator holds a higher priority the room its forecast
asks for one lead further, before lower priorities' wants; the policy says how much."""

import pytest

from kvscale.autoscaling.budget import Budget, Demand, Option, allocate
from kvscale.autoscaling.observation import Decision, DecisionKind
from kvscale.autoscaling.policy import PolicyConfig, PolicyState, replicas_ahead

H100 = "H100-SXM"


def test_room_ahead_of_the_top_priority_comes_before_a_lower_want() -> None:
    a = allocate(
        Budget("prod", {H100: 8}),
        [
            Demand("chat", (Option(H100, 1, 4, ahead=2),), priority=100, min_replicas=1),
            Demand("batch", (Option(H100, 1, 8),), priority=1, min_replicas=1),
        ],
    )
    chat, batch = a.grant("chat"), a.grant("batch")
    assert (chat.replicas, chat.ahead, chat.held) == (4, 2, False)  # reserved, not granted
    assert (batch.replicas, batch.ahead) == (2, 0)
    assert (a.used, a.reserved) == ({H100: 6}, {H100: 2})
    assert chat.reason == "wanted 4, got 4 on H100-SXM x1; room for 2 more held ahead of its forecast"
    assert batch.reason == (
        "wanted 8, got 2 on H100-SXM x1: budget prod holds the H100-SXM limit of 8 GPUs; in priority order: "
        "chat (priority 100) 4 (+2 ahead)"
    )


def test_lower_floors_come_before_room_ahead() -> None:
    a = allocate(
        Budget("b", {H100: 8}),
        [
            Demand("chat", (Option(H100, 1, 4, ahead=4),), priority=100),
            Demand("batch", (Option(H100, 1, 8),), priority=1, min_replicas=2),
        ],
    )
    assert (a.grant("chat").ahead, a.grant("batch").replicas) == (2, 2)


def test_room_ahead_waits_for_every_want_of_its_priority() -> None:
    a = allocate(
        Budget("b", {H100: 8}),
        [
            Demand("a", (Option(H100, 1, 4, ahead=2),), priority=50),
            Demand("b", (Option(H100, 1, 4),), priority=50),
        ],
    )
    assert (a.grant("a").replicas, a.grant("a").ahead, a.grant("b").replicas) == (4, 0, 4)


def test_a_held_service_gets_no_room_ahead() -> None:
    a = allocate(Budget("b", {H100: 8}), [Demand("chat", (Option(H100, 1, 10, ahead=2),), priority=100)])
    assert (a.grant("chat").replicas, a.grant("chat").ahead, a.reserved) == (8, 0, {})


def test_ahead_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="ahead must be >= 0"):
        Option(H100, 1, 1, ahead=-1)


CONFIG = PolicyConfig(ttft_target_s=1.0, tpot_target_s=0.05, default_input_tokens=800, default_output_tokens=200)


def _rising() -> PolicyState:
    # 10 req/s rising 0.1 req/s per second, sampled each 15 s over the 180 s forecast window.
    return PolicyState(rates=tuple((float(t), 10 + 0.1 * t) for t in range(0, 181, 15)))


def test_replicas_ahead_reads_the_damped_trend_one_lead_further() -> None:
    # The fit: mean 19 req/s at t=90, slope 0.1; read at now + half the 60 s rate window
    # (t=210): 31 req/s; the damped reach over the 105 s horizon (90 s cold start + 15 s
    # tick) is 120 (1 - e^(-105/120)) = 69.97 s, so the policy forecasts 38.0 req/s: 11
    # replicas of 4 req/s with 10% headroom. One lead further (210 s): 120 (1 - e^(-1.75)) =
    # 99.15 s, 40.91 req/s, x 1.1 / 4 = 11.25: 12.
    decision = Decision(11, "forecast", DecisionKind.FORECAST, 4.0, 1.0, 90.0)
    assert replicas_ahead(decision, _rising(), CONFIG, 180.0) == 12
    # A lead of 600 s: reach 120 (1 - e^(-705/120)) = 119.66 s, 42.97 req/s, x 1.1 / 4 = 11.8: 12.
    assert replicas_ahead(decision, _rising(), CONFIG, 180.0, lead_s=600.0) == 12
    # No lead: the decision's own horizon, no more than it asked.
    assert replicas_ahead(decision, _rising(), CONFIG, 180.0, lead_s=0.0) == 11


def test_replicas_ahead_adds_nothing_on_a_flat_rate_or_without_a_capacity() -> None:
    flat = PolicyState(rates=tuple((float(t), 20.0) for t in range(0, 181, 15)))
    decision = Decision(6, "forecast", DecisionKind.FORECAST, 4.0, 1.0, 90.0)
    assert replicas_ahead(decision, flat, CONFIG, 180.0) == 6  # 20 x 1.1 / 4 = 5.5: 6, the decision
    held = Decision(3, "metrics missing", DecisionKind.MISSING_METRICS)
    assert replicas_ahead(held, _rising(), CONFIG, 180.0) == 3


def test_replicas_ahead_stays_within_max_replicas() -> None:
    capped = PolicyConfig(
        ttft_target_s=1.0, tpot_target_s=0.05, default_input_tokens=800, default_output_tokens=200, max_replicas=11
    )
    decision = Decision(11, "forecast", DecisionKind.FORECAST, 4.0, 1.0, 90.0)
    assert replicas_ahead(decision, _rising(), capped, 180.0) == 11
