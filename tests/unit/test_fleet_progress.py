"""`simulate --fleet` (20-45 s on deploy/budget/fleet.yaml) says how far it is on stderr, as
`simulate` does (issue 39): plain lines when stderr is not a terminal, a bar when it is; stdout
stays one JSON document."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import kvscale.cli.progress as progress
from kvscale.cli import app

FLEET = """
budget: {L40S: 3}
services:
  - name: chat
    model: llama-3.1-8b
    priority: 10
    slo: {ttft: 1s, tpot: 60ms}
    load: poisson:rate=4,duration=2m,input=400,output=60
  - name: batch
    model: llama-3.1-8b
    slo: {ttft: 1s, tpot: 60ms}
    load: poisson:rate=4,duration=2m,input=400,output=60
"""


def run(tmp_path: Path) -> tuple[str, str]:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    result = CliRunner().invoke(app, ["simulate", "--fleet", str(fleet), "--json"])
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


def test_fleet_progress_lines_on_stderr_with_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    stdout, stderr = run(tmp_path)
    assert [s["name"] for s in json.loads(stdout)["services"]] == ["chat", "batch"]
    lines = stderr.splitlines()
    assert any(line.startswith("simulating 2 services under the budget: ") for line in lines)
    assert any(line.startswith("simulating chat alone: ") for line in lines)
    assert any(line.startswith("simulating batch alone: ") for line in lines)
    assert all(" h simulated after " in line for line in lines if line.startswith("simulating"))


def test_fleet_progress_lines_are_spaced(tmp_path: Path) -> None:
    _, stderr = run(tmp_path)  # a few seconds' run: no line before EVERY_S (10 s)
    assert "simulating" not in stderr


def test_fleet_progress_is_a_bar_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(progress, "err", Console(file=screen, force_terminal=True, width=100))
    stdout, stderr = run(tmp_path)
    assert json.loads(stdout)["services"] and "simulating" not in stderr
    assert "simulating chat alone" in screen.getvalue()
