"""The typer application every command module registers on."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="kvscale: size and autoscale LLM serving from first principles.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

sim_app = typer.Typer(help="Simulator tools.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")
