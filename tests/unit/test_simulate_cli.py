"""`kvscale simulate` with generated loads and a routing mode."""

import json

from typer.testing import CliRunner

from kvscale.cli import app

runner = CliRunner()
BASE = ["simulate", "--model", "llama-3.1-8b", "--ttft", "1s", "--tpot", "60ms", "--gpu", "L4"]
LOAD = "step:before=0.5,after=2,at=2m,input=400,output=60,duration=4m"


def test_generated_load_and_routing_are_reported() -> None:
    rows = {}
    for routing in ("service", "gateway"):
        result = runner.invoke(
            app, [*BASE, "--load", LOAD, "--routing", routing, "--policy", "kvscale,static", "--seed", "3", "--json"]
        )
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert [r["policy"] for r in data] == ["kvscale", "static"]
        assert {r["routing"] for r in data} == {routing}
        rows[routing] = data
    assert rows["service"][0]["requests"] == rows["gateway"][0]["requests"] > 100  # same seeded arrivals


def test_bad_load_and_routing_exit_2_with_the_fix() -> None:
    result = runner.invoke(app, [*BASE, "--load", "bursty:peak=lots"])
    assert result.exit_code == 2 and "peak='lots' is not a number" in result.stderr
    result = runner.invoke(app, [*BASE, "--load", LOAD, "--routing", "anycast"])
    assert result.exit_code == 2 and "service, round-robin, gateway" in result.stderr
    result = runner.invoke(app, [*BASE, "--load", LOAD, "--trace", "x.csv"])
    assert result.exit_code == 2 and "give one of --trace" in " ".join(result.stderr.split())
