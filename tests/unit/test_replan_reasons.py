"""One re-plan with one reason type (issue 30): every trigger goes through `replan`, which says
the reason once, in one Event first; `reconcile` itself takes no trigger's arguments."""

from __future__ import annotations

import inspect

import pytest

from kvscale.api.intent import read_spec
from kvscale.autoscaling.budget import Grant
from kvscale.control.reconcile import Observed, reconcile, replan
from kvscale.control.replan import (
    BudgetMove,
    Drifted,
    ProfileCalibrated,
    Replan,
    TypesReturned,
    Unschedulable,
)
from kvscale.sizing.workload import Workload
from tests.unit.test_reconcile import CAT, NOW, POOLS, RES, SETTINGS, SPEC, deployed

GRANT = Grant("chat", 0, "H100-SXM", 1, 2, 2, 1, 0, True, "cheaper types are full")
REASONS: list[tuple[Replan, str, str]] = [
    (Unschedulable("A100-80GB", ("A100-80GB",), "pods waited", 3600.0), "Warning", "GPUTypeUnschedulable"),
    (TypesReturned("L4 left out for 3600s"), "Normal", "GPUTypesReturned"),
    (Drifted(Workload(4096, 128, 4.0), "mean prompt 4096 tokens vs 512 planned (8x)", "600s"), "Normal", "Replanned"),
    (BudgetMove(GRANT, "team"), "Normal", "MovedByBudget"),
    (ProfileCalibrated("llama-3.1-8b on H100-SXM"), "Normal", "ProfileCalibrated"),
]


def test_reconcile_takes_no_triggers_arguments() -> None:
    assert {"excluded", "traffic", "prefer_gpu"}.isdisjoint(inspect.signature(reconcile).parameters)


@pytest.mark.parametrize(("reason", "kind", "said"), REASONS, ids=[r[2] for r in REASONS])
def test_replan_says_its_reason_once_and_first(reason: Replan, kind: str, said: str) -> None:
    first = deployed()
    result = replan(reason, read_spec(SPEC), RES, first.status, Observed(POOLS), CAT, SETTINGS, NOW)
    assert result.retry is None and result.status.plan is not None
    event = result.events[0]
    assert (event.type, event.reason) == (kind, said)
    assert [e.reason for e in result.events].count(said) == 1
    assert event.message == reason.says(first.status.plan, result.status.plan)[:1000]
    # Where the reason's Event says the plan, reconcile's Planned is not posted beside it.
    assert ("Planned" in [e.reason for e in result.events]) == (not reason.quiet_plan)


def test_each_reason_steers_the_planner_its_own_way() -> None:
    first = deployed()
    assert first.status.plan is not None
    gpu = first.status.plan.gpu_type
    left_out = Unschedulable(gpu, (gpu,), "pods waited", 3600.0)
    without = replan(left_out, read_spec(SPEC), RES, first.status, Observed(POOLS), CAT, SETTINGS, NOW)
    assert without.status.plan is not None and without.status.plan.gpu_type != gpu
    assert without.status.plan.excluded_gpu_types == [gpu]
    busier = Drifted(Workload(4096, 128, 4.0), "mean prompt", "600s")
    drifted = replan(busier, read_spec(SPEC), RES, first.status, Observed(POOLS), CAT, SETTINGS, NOW)
    assert drifted.status.plan is not None and drifted.status.plan.workload is not None
    assert drifted.status.plan.workload.source == "observed"
    calibrated = replan(ProfileCalibrated("p"), read_spec(SPEC), RES, first.status, Observed(POOLS), CAT, SETTINGS, NOW)
    assert calibrated.status.plan == first.status.plan  # nothing steered: the plan from the spec
