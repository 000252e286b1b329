"""The typer application every command module registers on (kvscale.cli says which module
registers which command)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from typer.core import TyperCommand
from typer.models import CommandFunctionType


def reflow(text: str | None) -> str | None:
    """A docstring as help that wraps to the terminal: each paragraph on one line. Typer's rich
    help joins the first paragraph's lines but prints the later ones with the docstring's own
    line breaks (typer.rich_utils._fix_linebreaks), so they broke mid-sentence at the source's
    width. What follows a \\f line (typer's cut) is kept as it is."""
    if not text:
        return text
    shown, cut, rest = text.partition("\f")
    paragraphs = (" ".join(p.split()) for p in shown.strip("\n").split("\n\n"))
    return "\n\n".join(p for p in paragraphs if p) + cut + rest


class ReflowCommand(TyperCommand):
    """Every command's help reflowed (`reflow`), whichever module registers it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = reflow(self.help)


class App(typer.Typer):
    """typer's application whose commands are ReflowCommands unless one asks for another class."""

    def command(
        self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or ReflowCommand, **kwargs)


app = App(
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


sim_app = App(help="Simulator tools.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")
