"""`kvscale crd` and `kvscale operator`: what runs against a cluster."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvscale.cli.common import fail
from kvscale.cli.root import app


@app.command()
def crd(
    kind: Annotated[
        str, typer.Option(help="Which CRD: inferenceservice (the default) or gpubudget.")
    ] = "inferenceservice",
) -> None:
    """A CustomResourceDefinition generated from kvscale/api: InferenceService, or GPUBudget."""
    from kvscale.api.budget_crd import budget_crd_yaml
    from kvscale.api.crd import crd_yaml

    known = {"inferenceservice": crd_yaml, "gpubudget": budget_crd_yaml}
    if kind.lower() not in known:
        fail(f"--kind {kind!r}: choose inferenceservice or gpubudget")
    sys.stdout.write(known[kind.lower()]())


@app.command()
def operator(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Watch only these namespaces (repeatable); default all."),
    ] = None,
    liveness: Annotated[
        str | None,
        typer.Option(help="Serve kopf's liveness probe here, e.g. http://127.0.0.1:8080/healthz (none unless given)."),
    ] = None,
) -> None:
    """Run the operator against the cluster of the current kubeconfig (or in-cluster config)."""
    from kvscale.control.settings import SettingsError

    try:
        from kvscale.operator.run import run_operator

        run_operator(tuple(namespace or ()), liveness)
    except SettingsError as exc:
        fail(str(exc))
