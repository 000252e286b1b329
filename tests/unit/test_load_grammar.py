"""One --load grammar for `kvscale simulate` and `kvscale sim serve` (issue 20): each command
takes the other's forms, and one text means the same arrivals in both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscale.cli import app
from kvscale.sim.generators import LoadError
from kvscale.sim.load_profile import load_arrivals, load_requests

runner = CliRunner()
SIM = ["simulate", "-m", "llama-3.1-8b", "--ttft", "1s", "--tpot", "60ms", "--gpu", "L4", "--policy", "static"]


@pytest.mark.parametrize(
    "text",
    ["poisson:rate=3,duration=2m", "bursty:base=0.5,peak=6,on=20s,off=40s,duration=2m", "constant:3", "ramp:1:5:60"],
)
def test_one_text_same_arrivals_in_both_commands(text: str) -> None:
    simulated = load_requests(text, 300, 40, 7, 120.0)
    served = load_arrivals(text, 300, 40, 7, 120.0)
    replayed = served.until(120.0)
    assert simulated == replayed and len(simulated) > 100


def test_sim_serve_takes_a_generated_load_with_the_services_lengths() -> None:
    arrivals = load_arrivals("poisson:rate=4,duration=5m,lengths=fixed", 300, 40, seed=1)
    requests = arrivals.until(1e9)
    assert {(r.input_tokens, r.output_tokens) for r in requests} == {(300, 40)}
    assert requests[-1].arrival_s < 300 and arrivals.until(1e12) == []  # played until its duration ends


def test_sim_serve_cli_accepts_a_generated_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No cluster here: the --load is read and accepted first, then the kubeconfig is missing.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = runner.invoke(app, ["sim", "serve", "--name", "x", "--load", "bursty:base=1,peak=10,duration=10m"])
    assert result.exit_code == 2 and "--load" not in result.output and "no cluster" in result.output, result.output
    bad = runner.invoke(app, ["sim", "serve", "--name", "x", "--load", "bursty:peak=x"])
    assert bad.exit_code == 2 and "peak='x' is not a number" in bad.output


def test_simulate_takes_the_stand_ins_profiles() -> None:
    args = [*SIM, "--load", "constant:2;lengths:1000/20@60", "--duration", "2m", "--input", "200", "--output", "30"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert 180 <= row["requests"] <= 300  # 2 req/s for 120 s
    requests = load_requests("constant:2;lengths:1000/20@60", 200, 30, 0, 120.0)
    assert {(r.input_tokens, r.output_tokens) for r in requests if r.arrival_s < 60} == {(200, 30)}
    assert {(r.input_tokens, r.output_tokens) for r in requests if r.arrival_s >= 60} == {(1000, 20)}


def test_simulate_profile_lasts_30_minutes_by_default_and_is_bounded() -> None:
    requests = load_requests("constant:1", 512, 256, 0, 1800.0)
    assert 1600 < len(requests) < 2000 and requests[-1].arrival_s <= 1800
    with pytest.raises(LoadError, match="more than 2,000,000"):
        load_requests("constant:5000", 512, 256, 0, 30 * 86400.0)
    bad = runner.invoke(app, [*SIM, "--load", "nonsense:1"])
    assert bad.exit_code == 2 and "constant:R" in bad.output and "poisson" in bad.output
    traced = runner.invoke(app, [*SIM, "--trace", "x.csv", "--duration", "1m"])
    assert traced.exit_code == 2 and "give one of" in traced.output
