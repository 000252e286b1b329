"""Runs the operator (`kvscale operator`)."""

from __future__ import annotations

import asyncio

import kopf


def run_operator(namespaces: tuple[str, ...], liveness: str | None = None) -> None:
    from kvscale.operator import handlers

    watched = list(namespaces or handlers.SETTINGS.namespaces)
    asyncio.run(
        kopf.operator(
            clusterwide=not watched,
            namespaces=watched,
            standalone=True,
            liveness_endpoint=liveness,
        )
    )
