"""Capacity the simulator confirms (issue 35, part 1): `plan --json`'s rate per replica is the
simulated check's when a check sized the plan, the model's beside it; offline, `simulate`
gives kvscale's policy the capacity the simulated sizing search confirms on the traffic."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscale.autoscaling.capacity import ConfirmedCapacity, SizingCapacity
from kvscale.cli import app
from kvscale.sim.check import sample, service_attainment
from kvscale.sim.compare import make_policies
from kvscale.sim.engine import StepTimes
from kvscale.sim.fit import fit_trace
from kvscale.sim.generators import generate, parse_load
from kvscale.sim.policies import KvscalePolicy
from kvscale.sim.run import SimSetup
from kvscale.sim.session import confirmed_capacity, policy_capacity
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo, Workload
from tests.unit.test_plan_trace import write_trace

runner = CliRunner()
CAT = default_catalog()
CFG = ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu("H100-SXM"), "bf16", 1).with_chunk_budget(2048)
SLO = Slo(4.0, 0.04, 99.0)


def test_plan_json_carries_the_confirmed_rate_with_the_models_beside_it(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", rate=20.0, span_s=300.0)
    args = ["plan", "-m", "llama-3.1-8b", "--gpu", "L4", "--ttft", "1s", "--tpot", "60ms", "--percentile", "99"]
    result = runner.invoke(app, [*args, "--trace", str(trace), "--disaggregation", "off", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    chosen, check = out["chosen"], out["check"]
    assert check["met"]
    assert chosen["rate_per_replica_max"] == round(check["rate_per_s"] / check["replicas"], 4)
    # The model's own figure beside it: the analytic count is what it sizes
    analytic = chosen["analytic_rate_per_replica_max"]
    assert math.ceil(check["rate_per_s"] * 1.1 / analytic - 1e-3) in range(
        check["analytic_replicas"] - 1, check["analytic_replicas"] + 2
    )
    # Unchecked (no trace): the two figures are one (aggregated replicas: under auto this load
    # plans prefill/decode pools, whose workers carry their own rates)
    load = ["--rps", "20", "--input", "700", "--output", "110", "--disaggregation", "off", "--json"]
    unchecked = json.loads(runner.invoke(app, [*args, *load]).output)["chosen"]
    assert unchecked["rate_per_replica_max"] == unchecked["analytic_rate_per_replica_max"]


Heavy = tuple[list[TraceRequest], Workload, SizingCapacity, SimSetup]


@pytest.fixture(scope="module")
def heavy() -> Heavy:
    # Long heavy-tailed prompts beside short outputs, behind a Service
    trace = generate(parse_load("poisson:rate=6,input=8000,output=20,lengths=heavy,duration=10m"), seed=3)
    shape = fit_trace(trace).workload.at_rate(len(trace) / trace[-1].arrival_s)
    capacity = SizingCapacity(CFG, SLO, 64, shape)
    setup = SimSetup(CFG, SLO, 64, cold_start_s=0.0, initial_replicas=1)
    return trace, shape, capacity, setup


def test_the_confirmed_capacity_is_one_the_simulator_confirms(heavy: Heavy) -> None:
    trace, shape, capacity, setup = heavy
    confirmed = confirmed_capacity(setup, trace, capacity, shape)
    assert confirmed is not None
    replay = sample(trace, shape.requests_per_s)
    rate = len(replay) / (replay[-1].arrival_s - replay[0].arrival_s)
    fleet = round(rate / confirmed.confirmed_rate_per_s)
    assert math.isclose(rate / fleet, confirmed.confirmed_rate_per_s)
    # That fleet meets the SLO on the replay; the model's own count is not what it is
    steps = StepTimes(CFG)
    assert service_attainment(setup, replay, fleet, steps) >= 0.99
    # At the replayed traffic the rate is the confirmed one; elsewhere the model's shape, scaled
    assert math.isclose(
        confirmed.rate_per_replica(shape.input_tokens, shape.output_tokens, fleet_rate_per_s=rate),
        confirmed.confirmed_rate_per_s,
    )
    longer = confirmed.rate_per_replica(2 * shape.input_tokens, shape.output_tokens, fleet_rate_per_s=rate)
    model_longer = capacity.rate_per_replica(2 * shape.input_tokens, shape.output_tokens, fleet_rate_per_s=rate)
    assert math.isclose(longer / model_longer, confirmed.scale or 0.0)
    # The engine-speed yardstick is the model's at the load asked
    assert confirmed.predicted_tpot_s(0.1, shape.input_tokens, shape.output_tokens) == capacity.predicted_tpot_s(
        0.1, shape.input_tokens, shape.output_tokens
    )


def test_simulate_gives_kvscales_policy_the_confirmed_capacity(heavy: Heavy) -> None:
    trace, shape, capacity, setup = heavy
    confirmed = ConfirmedCapacity(capacity, 0.2, shape.input_tokens, shape.output_tokens, shape.requests_per_s)
    policies = make_policies(("kvscale", "hpa"), setup, capacity, trace, 0.1, None, 100, confirmed)
    kvscale = next(p for p in policies if isinstance(p, KvscalePolicy))
    assert kvscale.capacity is confirmed
    plain = make_policies(("kvscale",), setup, capacity, trace, 0.1, None, 100)[0]
    assert isinstance(plain, KvscalePolicy) and plain.capacity is capacity


def test_a_confirmed_rate_must_be_positive(heavy: Heavy) -> None:
    _, shape, capacity, _ = heavy
    with pytest.raises(ValueError, match="positive"):
        ConfirmedCapacity(capacity, 0.0, shape.input_tokens, shape.output_tokens)


def test_the_policy_acts_on_a_confirmed_figure_only_above_the_models(heavy: Heavy) -> None:
    # SLO feedback corrects an optimistic model online (it lowers the capacity on misses);
    # nothing raises a pessimistic one: only a confirmed figure above the model's replaces it
    _, shape, capacity, _ = heavy
    lengths = (shape.input_tokens, shape.output_tokens)
    model = capacity.rate_per_replica(*lengths, shape.requests_per_s)
    above = ConfirmedCapacity(capacity, 1.5 * model, *lengths, shape.requests_per_s)
    below = ConfirmedCapacity(capacity, 0.5 * model, *lengths, shape.requests_per_s)
    assert policy_capacity(above) is above
    assert policy_capacity(below) is None
    assert policy_capacity(None) is None
