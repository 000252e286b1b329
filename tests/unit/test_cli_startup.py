"""`kvscale CMD` imports only CMD's module: the map from command to module is complete and
true, and a plan does not load what only other commands use."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer

import kvscale.cli
from kvscale.cli import COMMAND_MODULES, COMMANDS, app
from tests.unit.test_plan_trace import write_trace


def _module_of(info: typer.models.CommandInfo) -> str:
    assert info.callback is not None
    return info.callback.__module__.removeprefix("kvscale.cli.")


def test_every_command_is_mapped_to_the_module_that_registers_it() -> None:
    registered: dict[str, set[str]] = {}
    for info in app.registered_commands:
        assert info.callback is not None
        name = info.name or info.callback.__name__.lower().replace("_", "-")  # typer's own naming
        registered.setdefault(name, set()).add(_module_of(info))
    for group in app.registered_groups:
        assert group.name is not None and group.typer_instance is not None
        registered[group.name] = {_module_of(info) for info in group.typer_instance.registered_commands}
    assert registered == {name: {module} for name, module in COMMANDS.items()}
    assert set(COMMANDS.values()) == set(COMMAND_MODULES)


def test_app_is_the_typer_application_not_its_module() -> None:
    assert isinstance(kvscale.cli.app, typer.Typer) and kvscale.cli.app is app


# What `kvscale plan` must not import: the operator's API models, the cluster client, the other
# commands, the autoscaling policy (the check replays a static fleet), the --engine-command and
# config.json readers, the pictures (matplotlib) and the calibration's scipy.
NOT_FOR_PLAN = (
    "kvscale.api",
    "kvscale.autoscaling.policy",
    "kvscale.engines.command",
    "kvscale.sizing.hf_config",
    "kvscale.cli.manifests",
    "kvscale.cli.simulate",
    "kvscale.cli.status",
    "kvscale.cli.live",
    "kvscale.operator",
    "matplotlib",
    "numpy",
    "scipy",
    "kubernetes",
    "kopf",
    "httpx",
)

PROBE = """
import json, sys
sys.argv = ["kvscale", *sys.argv[1:]]
from kvscale.cli import main
try:
    main()
finally:
    print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


@pytest.mark.parametrize("workload", ["mean-value", "trace"])
def test_a_plan_loads_only_what_planning_needs(workload: str, tmp_path: Path) -> None:
    args = ["plan", "--model", "llama-3.1-8b", "--gpu", "L4", "--ttft", "2s", "--tpot", "80ms"]
    if workload == "trace":  # fitted, planned and replayed through the simulator
        args += ["--trace", str(write_trace(tmp_path / "t.jsonl", 2.0, 120.0))]
    else:
        args += ["--rps", "1", "--input", "100", "--output", "10"]
    done = subprocess.run([sys.executable, "-c", PROBE, *args, "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["feasible"] is True and ("check" in out) == (workload == "trace")
    loaded = json.loads(done.stderr.strip().splitlines()[-1])
    unwanted = [m for m in loaded if any(m == name or m.startswith(name + ".") for name in NOT_FOR_PLAN)]
    assert not unwanted, f"`kvscale plan` imported {unwanted}"
    assert "kvscale.cli.planning" in loaded and "kvscale.cli.catalog" not in loaded
