"""One plan serializer (issue 30): the CLI's --json and the operator's status carry a plan's
figures from one function (kvscale.planner.serialize.figures), in one unit convention (SI;
the JSON's times in milliseconds at its edge, status's in seconds beside its readable text)."""

from __future__ import annotations

import pytest

from kvscale.api.intent import parse_intent
from kvscale.control.planning import Planned, plan_service
from kvscale.control.status import candidate_status, plan_status
from kvscale.planner.serialize import candidate_to_dict, figures
from tests.unit.test_reconcile import CAT, POOLS, SPEC


def test_the_json_and_the_status_carry_the_same_figures() -> None:
    planned = plan_service(parse_intent(SPEC), CAT, POOLS)
    assert isinstance(planned, Planned)
    f = figures(planned.chosen)
    as_json = candidate_to_dict(planned.chosen)
    status = plan_status(planned, 4096, ())
    listed = candidate_status(planned.chosen)
    assert f.rate_per_replica_per_s == as_json["rate_per_replica_max"] == status.rate_per_replica
    assert f.rate_per_replica_per_s == listed.rate_per_replica
    assert f.cost_usd_per_hour == as_json["cost_usd_per_hour"] == status.cost_per_hour == listed.cost_per_hour
    assert f.throughput_tokens_per_s == as_json["throughput_tokens_per_s"] == status.throughput_tokens_per_second
    assert (f.mbu, f.mfu) == (as_json["mbu"], as_json["mfu"]) == (status.mbu, status.mfu)
    assert f.replicas == as_json["replicas"] == status.replicas == listed.replicas
    assert f.gpus_per_replica == listed.gpus_per_replica == as_json["gpus_total"] // f.replicas
    assert f.ttft_s is not None and f.tpot_s is not None
    assert (status.predicted_ttft_seconds, status.predicted_tpot_seconds) == (f.ttft_s, f.tpot_s)
    assert as_json["ttft_ms"] == pytest.approx(f.ttft_s * 1e3, abs=1e-9)
    assert as_json["tpot_ms"] == pytest.approx(f.tpot_s * 1e3, abs=1e-9)


def test_the_status_carries_both_counts_of_a_simulated_check() -> None:
    """A plan the simulator checked carries the simulator's count (replicas) and the analytic
    model's (analyticReplicas); a plan never simulated leaves analyticReplicas unset."""
    from dataclasses import replace

    from kvscale.planner.search import SimulatedSizing, with_check

    planned = plan_service(parse_intent(SPEC), CAT, POOLS)
    assert isinstance(planned, Planned)
    assert plan_status(planned, 4096, ()).analytic_replicas is None
    analytic = planned.chosen.prediction.replicas
    simulated = analytic + 2  # the replayed sample needed two more than the model said
    check = SimulatedSizing(
        analytic_replicas=analytic,
        analytic_attainment=0.95,
        replicas=simulated,
        attainment=0.995,
        target=0.99,
        met=True,
        requests=2000,
        span_s=600.0,
    )
    checked = with_check(planned.plan, check)  # what kvscale.sim.check.check_and_size returns
    assert checked.chosen is not None
    chosen = checked.chosen
    status = plan_status(replace(planned, plan=checked, chosen=chosen), 4096, ())
    assert (status.replicas, status.analytic_replicas) == (simulated, analytic)
    assert status.model_dump(by_alias=True)["analyticReplicas"] == analytic
