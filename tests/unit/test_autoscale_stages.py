"""The one tick (kvscale.autoscaling.tick: policy, idle, budget, move on plain values) and the
operator's adapter to it (kvscale.control.autoscale): the decision and the service's new
memory returned; the memory and the policy state handed in are never changed."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, replace

from kvscale.api.intent import parse_intent
from kvscale.autoscaling.budget import Budget
from kvscale.autoscaling.observation import Observation
from kvscale.autoscaling.policy import PolicyConfig, PolicyState
from kvscale.autoscaling.tick import Idle, Pooled, Seat, SeatOption, TickInput, Wake, tick, tick_all
from kvscale.autoscaling.tuning import policy_config
from kvscale.control.autoscale import Governor, Readings, autoscale
from kvscale.control.budget import BudgetBook
from kvscale.control.memory import ServiceMemory
from kvscale.control.reconcile import DeploymentView
from kvscale.control.scaling import Fleet, fleet
from tests.unit.test_reconcile import CAT, NOW, RES, SETTINGS, deployed
from tests.unit.test_scale_zero import POOLED


def _idle(current: int) -> tuple[Fleet, Readings]:
    first = deployed(POOLED)
    assert first.status.plan is not None
    start = fleet(parse_intent(POOLED), first.status, DeploymentView(current, current, first.status.plan.gpu_type))
    assert isinstance(start, Fleet)
    obs = Observation(
        time_s=NOW.timestamp(),
        ready_replicas=current,
        starting_replicas=0,
        arrival_rate_per_s=0.0,
        running=0.0,
        waiting=0.0,
    )
    return start, Readings(obs, None, 0.0, (), ())


def test_the_idle_clock_lives_in_the_returned_memory_and_releases_the_last_replica() -> None:
    intent, status = parse_intent(POOLED), deployed(POOLED).status
    start, read = _idle(1)
    governor = Governor(BudgetBook(), {}, 45.0)
    empty = ServiceMemory()
    first = autoscale(intent, RES, status, start, read, empty, governor, CAT, SETTINGS, NOW)
    assert empty == ServiceMemory()  # the memory handed in is a value: unchanged
    assert first.memory.last_active_s == NOW.timestamp()  # a replica ran: the idle clock starts now
    assert first.memory.scaler.capacity is not None and first.move is None
    later = NOW + dt.timedelta(minutes=3)  # past the 2m idle window, no request since
    read = Readings(
        Observation(time_s=later.timestamp(), ready_replicas=1, starting_replicas=0, arrival_rate_per_s=0.0),
        None,
        0.0,
        (),
        (),
    )
    again = autoscale(intent, RES, status, start, read, first.memory, governor, CAT, SETTINGS, later)
    assert again.memory.last_active_s == NOW.timestamp()
    assert again.tick.result.scale_to == 0 and again.tick.decision.replicas == 0


# -- the one tick (kvscale.autoscaling.tick): plain values in, a decision out ---------------


@dataclass
class _PerReplica:
    """A capacity model of a fixed rate per replica."""

    rate: float
    max_batch: int = 64

    def rate_per_replica(
        self, input_tokens: float, output_tokens: float, fleet_rate_per_s: float | None = None
    ) -> float:
        return self.rate

    def predicted_tpot_s(
        self, rate_per_replica: float, input_tokens: float, output_tokens: float, fleet_rate_per_s: float | None = None
    ) -> float:
        return 0.02


def _config(min_replicas: int = 0) -> PolicyConfig:
    return policy_config(
        ttft_target_s=1.0,
        tpot_target_s=0.05,
        input_tokens=400,
        output_tokens=60,
        min_replicas=min_replicas,
        max_replicas=20,
        cold_start_s=60.0,
        interval_s=15.0,
        window_s=60.0,
        least_loaded_routing=False,
    )


def _obs(rate: float, ready: int, t: float = 600.0) -> Observation:
    return Observation(
        time_s=t,
        ready_replicas=ready,
        starting_replicas=0,
        arrival_rate_per_s=rate,
        running=0.0,
        waiting=0.0,
        ttft_p_s=None,
        tpot_p_s=None,
    )


def test_the_tick_applies_the_idle_rule_to_the_policys_decision() -> None:
    quiet = TickInput(_obs(0.0, 1), _PerReplica(2.0), _config(), PolicyState())
    alone = tick(quiet)
    assert alone.policy == alone.decision and alone.budget is None and alone.replicas == alone.policy.replicas
    # Within the idle window one replica stays whatever the policy says; past it, none.
    kept = tick(replace(quiet, idle=Idle(100.0, 300.0, 0.0)))
    assert kept.replicas == max(alone.policy.replicas, 1)
    gone = tick(replace(quiet, idle=Idle(400.0, 300.0, 0.0)))
    assert gone.replicas == 0 and gone.want.idle_reason is not None and "idle window" in gone.want.idle_reason
    # Requests waiting at the gateway with none running wake a fleet sized by the queue.
    woken = tick(
        TickInput(
            _obs(0.0, 0),
            _PerReplica(2.0),
            _config(),
            PolicyState(),
            Idle(0.0, 300.0, 600.0, 0, Wake(None, 2.0, 1.0, 20, 29.0)),
        )
    )
    # The queue drains within the cold start (the policy's, else the fallback) plus the TTFT target.
    drain_s = (woken.policy.cold_start_s or 29.0) + 1.0
    assert woken.wake == math.ceil(600.0 / drain_s / 2.0) > 1
    assert woken.replicas == max(woken.policy.replicas, woken.wake)
    # Refused (no queue signal): one replica whatever the policy says.
    refused = tick(replace(quiet, idle=Idle(None, 300.0, None, refused="no queue")))
    assert refused.replicas >= 1


def test_the_tick_state_is_a_value_handed_back() -> None:
    state = PolicyState()
    first = tick(TickInput(_obs(8.0, 2), _PerReplica(2.0), _config(1), state))
    assert state == PolicyState() and first.state != state  # the state handed in is unchanged
    again = tick(TickInput(_obs(8.0, 2, 615.0), _PerReplica(2.0), _config(1), first.state))
    assert again.state.rates[: len(first.state.rates)] == first.state.rates


def _seat(name: str, priority: int, active: int = 0) -> Seat:
    options = (SeatOption("L4", 1, 2.0), SeatOption("L40S", 1, 4.0))
    return Seat(name, options, active, priority, 1, 20, options[active].gpu_type)


def test_a_pooled_budget_answers_every_service_of_the_tick_together() -> None:
    busy = [
        TickInput(_obs(8.0, 2), _PerReplica(2.0), _config(1), PolicyState(), seat=_seat("high", 10)),
        TickInput(_obs(8.0, 2), _PerReplica(2.0), _config(1), PolicyState(), seat=_seat("low", 0)),
    ]
    alone = [tick(replace(b, seat=None)) for b in busy]
    want = alone[0].replicas
    assert want >= 4  # 8 req/s over 2 per replica, before headroom
    pooled = Pooled(Budget("b", {"L4": want + 1, "L40S": 0}), {})  # the low one's floor, then the high one's want
    high, low = tick_all(busy, pooled)
    assert pooled.allocation is not None and {g.name for g in pooled.allocation.grants} == {"high", "low"}
    assert (high.policy, low.policy) == (alone[0].policy, alone[1].policy)  # the budget does not change the policy
    assert high.replicas == want and high.move is None
    assert low.budget is not None and low.budget.grant is not None and low.budget.grant.held
    assert low.replicas < low.decision.replicas
    # Room on the other GPU type only: the lower priority is moved there, at its capacity.
    pooled = Pooled(Budget("b", {"L4": want + 1, "L40S": 100}), {})
    _, low = tick_all(busy, pooled)
    assert low.move is not None and low.move.gpu_type == "L40S"
    assert low.replicas == math.ceil(low.decision.replicas * 2.0 / 4.0 - 1e-9)
