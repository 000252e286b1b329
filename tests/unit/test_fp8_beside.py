"""`kvscale plan`'s "fp8 beside it" line: the cheapest fp8 plan over every GPU type the plan may
use, not only the chosen type (issue 39: fp8 on L40S was 21% cheaper than the chosen bf16
H100-PCIE, and the line compared fp8 on H100-PCIE only)."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from kvscale.cli import app

runner = CliRunner()
LOAD = ["-m", "llama-3.1-8b", "--ttft", "500ms", "--tpot", "50ms", "--rps", "10", "--input", "512", "--output", "256"]


def plan(*args: str) -> Any:
    result = runner.invoke(app, ["plan", *LOAD, *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_fp8_beside_is_the_cheapest_fp8_plan_over_the_allowed_types() -> None:
    chosen = json.loads(plan("--json"))["chosen"]
    fp8_alone = json.loads(plan("--precision", "fp8", "--json"))["chosen"]
    beside = chosen["fp8_beside"]
    # what --precision fp8 would choose over the same GPU types, whichever type that is
    assert (beside["gpu"], beside["replicas"]) == (fp8_alone["gpu"], fp8_alone["replicas"])
    assert beside["cost_usd_per_hour"] == round(fp8_alone["cost_usd_per_hour"], 4)
    assert beside["gpu"] != chosen["gpu"]  # fp8 on another type is the cheaper one here
    assert beside["saving"] == round(1 - beside["cost_usd_per_hour"] / chosen["cost_usd_per_hour"], 3) > 0


def test_the_line_says_how_much_cheaper_and_against_which_type() -> None:
    chosen = json.loads(plan("--json"))["chosen"]
    beside = chosen["fp8_beside"]
    line = next(line for line in plan().splitlines() if "fp8 beside it" in line)
    assert f"{beside['replicas']} x 1 {beside['gpu']}" in line
    assert f"{beside['saving']:.0%} cheaper than the bf16 plan on {chosen['gpu']}" in line


def test_a_gpu_list_bounds_the_comparison() -> None:
    chosen = json.loads(plan("--gpu", "H100-SXM,A100-80GB", "--json"))["chosen"]
    assert chosen["fp8_beside"]["gpu"] in ("H100-SXM", "A100-80GB")
    # no allowed type with fp8 tensor cores: no line
    assert "fp8_beside" not in json.loads(plan("--gpu", "A100-80GB,A10", "--json"))["chosen"]
