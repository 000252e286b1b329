"""Runs the operator (`kvscale operator`)."""

from __future__ import annotations

import asyncio
import logging

import kopf


def run_operator(namespaces: tuple[str, ...], liveness: str | None = None) -> None:
    from kvscale.operator import handlers

    kopf.configure(verbose=False)  # kopf's own log format, to stderr
    logging.getLogger().setLevel(handlers.SETTINGS.log_level.upper())
    # Per-object INFO lines ("Timer 'refresh' succeeded" every interval) drown real news.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Prometheus query otherwise
    watched = list(namespaces or handlers.SETTINGS.namespaces)
    asyncio.run(
        kopf.operator(
            clusterwide=not watched,
            namespaces=watched,
            standalone=True,
            liveness_endpoint=liveness,
        )
    )
