"""What a new user hit in the first hour (issue 20): each defect, as the user met it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from kvscale.cli import app

runner = CliRunner()
SLO = ["--ttft", "500ms", "--tpot", "50ms", "--rps", "10", "--input", "512", "--output", "256"]


def plan_json(*args: str, code: int = 0) -> Any:
    result = runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize(
    "typed",
    ["meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct", "mistralai/Mixtral-8x7B-Instruct-v0.1"],
)
def test_plan_serves_the_id_the_user_typed(typed: str, precision: str) -> None:
    # The operator keeps spec.model.name as the checkpoint; `plan` swapped it for the
    # catalog's default (base) checkpoint, and fp8 switched between base and Instruct.
    chosen = plan_json("-m", typed, *SLO, "--precision", precision, "--gpu", "H100-SXM")["chosen"]
    assert chosen["checkpoint"] == typed
    assert chosen["engine_args"][0] == typed or typed in chosen["engine_args"]
