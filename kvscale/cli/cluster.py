"""`kvscale crd` and `kvscale operator`: what runs against a cluster."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvscale.cli.app import app
from kvscale.cli.common import fail


@app.command()
def crd() -> None:
    """The InferenceService CustomResourceDefinition, generated from kvscale/api."""
    from kvscale.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())


@app.command()
def operator(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Watch only these namespaces (repeatable); default all."),
    ] = None,
    liveness: Annotated[
        str | None, typer.Option(help="Serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz.")
    ] = None,
) -> None:
    """Run the operator against the cluster of the current kubeconfig (or in-cluster config)."""
    from kvscale.operator.settings import SettingsError

    try:
        from kvscale.operator.run import run_operator

        run_operator(tuple(namespace or ()), liveness)
    except SettingsError as exc:
        fail(str(exc))
