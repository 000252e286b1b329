"""Issue 31, LOW: `simulate --replicas` said its default was "peak provisioning", while the `peak`
policy is another number (the cheapest fixed fleet the simulator confirms). The static
policy's default fleet is the busiest minute over one replica's modelled capacity: the help
and the code say so, and the JSON shows each policy's fleet."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.cli import app
from kvscale.planner.search import PlanRequest, plan
from kvscale.sim.compare import busiest_minute_replicas
from kvscale.sim.fit import fit_trace
from kvscale.sim.load_profile import load_requests
from kvscale.sim.trace import duration_s
from kvscale.sizing.workload import Slo
from tests.unit.profiles import VLLM_0_2_AS_VLLM, catalog_2023

runner = CliRunner()
BASE = ["simulate", "--model", "llama-3.1-8b", "--ttft", "1s", "--tpot", "60ms", "--gpu", "L4"]
BURSTY = "bursty:base=0.5,peak=20,on=20s,off=100s,input=400,output=60,duration=6m"


def test_replicas_help_says_what_the_default_is() -> None:
    result = runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "400"})
    # the words of the help, whatever width the panel wrapped them at (its borders left out)
    text = " ".join(result.stdout.replace("│", " ").split())
    assert result.exit_code == 0
    assert "peak provisioning" not in text
    assert "busiest minute's rate, plus --headroom, over one replica's modelled capacity" in text
    assert "not the `peak` yardstick" in text


def test_static_runs_the_busiest_minute_fleet_which_is_not_peaks() -> None:
    # The bursts are sized on the vLLM profile without the burst fit (tests/unit/profiles.py).
    overlay = ["--catalog", str(VLLM_0_2_AS_VLLM)]
    result = runner.invoke(app, [*BASE, *overlay, "--load", BURSTY, "--policy", "static,peak", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["policy"]: r for r in json.loads(result.stdout)}
    # The same number, computed the way the static policy's default is documented.
    cat = catalog_2023()
    trace = load_requests(BURSTY, 512, 256, 0, 1800.0)
    workload = fit_trace(trace).workload.at_rate(len(trace) / max(duration_s(trace), 1.0))
    chosen = plan(cat, PlanRequest(cat.model("llama-3.1-8b"), workload, Slo(1.0, 0.06), gpus=("L4",))).chosen
    assert chosen is not None
    capacity = SizingCapacity(chosen.config, Slo(1.0, 0.06), chosen.prediction.max_batch, workload)
    assert rows["static"]["replicas_max"] == busiest_minute_replicas(trace, capacity, 0.1)
    # On these bursts the simulated cheapest fixed fleet is smaller: two different definitions.
    assert rows["peak"]["replicas_max"] < rows["static"]["replicas_max"]
    assert rows["peak"]["gpu_hours"] < rows["static"]["gpu_hours"]


def test_replicas_sets_the_static_fleet() -> None:
    result = runner.invoke(app, [*BASE, "--load", BURSTY, "--policy", "static", "--replicas", "3", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["replicas_max"] == 3
