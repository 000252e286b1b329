"""The `kvscale` command line, a module per command group:

- `catalog`: `gpus`, `models`
- `planning`: `plan`, `predict`, `roofline` (its picture in `roofline_plot`)
- `bench`: `bench` (open-loop load on a live endpoint against the plan)
- `simulate`: `simulate` (its picture in `simulate_plot`)
- `sim_serve`: `sim serve`, `sim serve-openai`
- `calibrate`: `calibrate` (engine profile fitted to the engines' metrics in a Prometheus)
- `cluster`: `crd`, `operator`
- `manifests`: `manifests` (the operator's objects for a spec, as YAML; `--diff` against the live ones)
- `status`: `status NAME` (plan, observed, decision, conditions and Events of a live InferenceService)
- `live`: the cluster client `status` and `manifests --diff` share

`common` holds the input checks: bad input exits 2 with a message naming the option and
the fix, never a traceback. Importing a command module registers its commands on the typer
application in `root`. `kvscale CMD ...` imports only CMD's module (a plan does not load the
API models, the simulator's commands or the cluster client: a tenth of its start-up);
`kvscale.cli.app` (`from kvscale.cli import app`) is the application with every command.
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

# Registration order is the order of `kvscale --help`.
COMMAND_MODULES = (
    "catalog",
    "planning",
    "bench",
    "simulate",
    "sim_serve",
    "calibrate",
    "cluster",
    "manifests",
    "status",
)
# The module that registers each command (tests/unit/test_cli_startup.py checks this against
# the commands the modules register).
COMMANDS = {
    "gpus": "catalog",
    "models": "catalog",
    "plan": "planning",
    "predict": "planning",
    "roofline": "planning",
    "bench": "bench",
    "simulate": "simulate",
    "sim": "sim_serve",
    "calibrate": "calibrate",
    "crd": "cluster",
    "operator": "cluster",
    "manifests": "manifests",
    "status": "status",
}

__all__ = ["COMMANDS", "COMMAND_MODULES", "app", "load_commands", "main"]


def load_commands(modules: tuple[str, ...] = COMMAND_MODULES) -> typer.Typer:
    """The application with the commands of `modules` registered (all by default)."""
    for name in modules:
        import_module(f"kvscale.cli.{name}")
    from kvscale.cli.root import app

    return app


def __getattr__(name: str) -> typer.Typer:
    if name == "app":
        return load_commands()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """The console script: the command's own module when the first argument names one, else
    every command (`kvscale`, `kvscale --help`, a mistyped command: help and suggestions)."""
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    load_commands((COMMANDS[first],) if first in COMMANDS else COMMAND_MODULES)()
