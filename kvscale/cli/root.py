"""The typer application every command module registers on (kvscale.cli says which module
registers which command)."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    help="kvscale: size and autoscale LLM serving from first principles.",
    no_args_is_help=True,
    # --install-completion / --show-completion for bash, zsh, fish and PowerShell (typer's).
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import PackageNotFoundError, version  # ~25 ms: only for --version

        try:
            typer.echo(f"kvscale {version('kvscale')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("kvscale (not installed: no version)")
        raise typer.Exit()


@app.callback()
def main(
    show_version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """kvscale: size and autoscale LLM serving from first principles."""


sim_app = typer.Typer(help="Simulator tools.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")
