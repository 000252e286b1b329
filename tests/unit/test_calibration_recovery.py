"""Calibration recovers the profile a stand-in runs (issue 37 item 3): stand-in engines (the
simulator's) on the catalog's vllm-0.11 profile and on profiles 2x faster and slower per
sequence and step and with half its GEMM share, under steady and changing Poisson load, read
as `kvscale calibrate` reads them (benchmarks/calibration_recovery.py: the CLI's own range
queries evaluated on scrapes every second, 10 s windows, 150 simulated seconds). Each fitted
field is within K stated standard errors of the truth, or flagged as left at the prior; on
the catalog's own profile the plan does not change."""

from __future__ import annotations

import pytest

from benchmarks.calibration_recovery import (
    CHANGING,
    STANDINS,
    STEADY,
    K,
    Outcome,
    StandIn,
    base_config,
    describe,
    replicas,
    run_case,
)
from kvscale.calibration.fit import AT_PRIOR, FIELDS, PRIOR_SPREAD, fit
from tests.unit.test_calibration_fit import _configs, _measured

SECONDS, WINDOW = 150.0, 10.0
LOADS = {"steady": STEADY, "changing": CHANGING}
_cases: dict[tuple[str, str], Outcome] = {}


def _outcome(standin: StandIn, load: str) -> Outcome:
    key = (standin.name, load)
    if key not in _cases:
        _cases[key] = run_case(standin, LOADS[load], SECONDS, WINDOW)
    return _cases[key]


@pytest.mark.parametrize("load", sorted(LOADS))
@pytest.mark.parametrize("standin", STANDINS, ids=lambda s: s.name)
def test_each_field_within_its_stated_error_of_the_truth(standin: StandIn, load: str) -> None:
    o = _outcome(standin, load)
    assert o.calibration is not None, o.error
    assert K == 2.0
    for name in FIELDS:
        assert o.within(name), describe(o)
    # The GEMM share the prefills carry is always determined (hundreds of timed prefills).
    gemm = o.calibration.field("matmul_efficiency_factor")
    assert not gemm.at_prior_with and gemm.stderr < 0.05 * gemm.value, describe(o)


@pytest.mark.parametrize("load", sorted(LOADS))
def test_the_catalogs_own_profile_leaves_the_plan_unchanged(load: str) -> None:
    o = _outcome(STANDINS[0], load)
    assert o.calibration is not None, o.error
    base = base_config()
    assert replicas(base, o.calibration) == replicas(base, None)


def test_changing_load_separates_the_per_sequence_and_per_step_costs() -> None:
    """Batches from a few to tens of sequences: both CPU costs fitted, none left at the prior,
    the per-sequence one to within 15 us (steady load's batches of 5-15 leave about 30)."""
    for standin in STANDINS:
        o = _outcome(standin, "changing")
        assert o.calibration is not None and not o.calibration.unidentified, describe(o)
        seq = o.calibration.field("sequence_overhead_s")
        assert seq.stderr < 15e-6, describe(o)


def test_windows_that_cannot_tell_the_costs_apart_leave_them_at_the_prior() -> None:
    """Batches of 4 and 6.5 only: the per-sequence cost and the per-step one lengthen the gap
    alike; the per-sequence cost stays near the catalog's, flagged, naming the per-step cost,
    and its stated error is nearly the prior's."""
    base, _ = _configs()
    c = fit(base, _measured(base, (4.0, 6.5)))
    seq = c.field("sequence_overhead_s")
    assert c.unidentified == ("sequence_overhead_s",) and seq.at_prior_with == "step_overhead_s"
    assert seq.stderr > AT_PRIOR * PRIOR_SPREAD * seq.value
    assert abs(seq.value - seq.prior) < seq.stderr
    assert "not told apart from step_overhead_s" in str(c.overlay())
