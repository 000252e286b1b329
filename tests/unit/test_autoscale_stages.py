"""The scale tick as one pure function (kvscale.control.autoscale): named stages, the decision
and the service's new memory returned; the memory handed in is never changed."""

from __future__ import annotations

import datetime as dt

from kvscale.api.intent import parse_intent
from kvscale.autoscaling.observation import Observation
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
