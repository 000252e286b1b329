"""Runs the operator (`kvscale operator`): settings, catalog, clients and handlers are made
here, at startup, and nowhere at import."""

from __future__ import annotations

import asyncio
import logging

import kopf

from kvscale.operator.handlers import KUBE_WORKERS, Runtime, register
from kvscale.operator.informers import INFORMERS, inventory
from kvscale.operator.k8s import Kube, new_api_client
from kvscale.operator.settings import Settings
from kvscale.sizing.catalog import load_catalog


def runtime(settings: Settings) -> Runtime:
    catalog = load_catalog(*settings.catalog_overlays)
    return Runtime(
        settings=settings,
        catalog=catalog,
        kube=Kube(new_api_client(KUBE_WORKERS), settings.retry_backoff_s),
        # Its own connections: each informer holds one for its watch.
        inventory=inventory(new_api_client(len(INFORMERS)), catalog),
    )


def run_operator(namespaces: tuple[str, ...], liveness: str | None = None) -> None:
    settings = Settings.from_env()
    registry = kopf.OperatorRegistry()
    register(registry, runtime(settings))
    # kopf's own log format, to stderr; per-object lines (a failing handler) start with [namespace/name].
    kopf.configure(verbose=False, log_prefix=True)
    logging.getLogger().setLevel(settings.log_level.upper())
    # Per-object INFO lines ("Timer 'refresh' succeeded" every interval) drown real news.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Prometheus query otherwise
    watched = list(namespaces or settings.namespaces)
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=not watched,
            namespaces=watched,
            standalone=True,
            liveness_endpoint=liveness,
        )
    )
