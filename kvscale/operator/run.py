"""Runs the operator (`kvscale operator`): settings, catalog, clients and handlers are made
here, at startup, and nowhere at import. With leader election (the default) the process first
takes the Lease (kvscale.operator.leader), standing by until then, and stops when it loses it."""

from __future__ import annotations

import asyncio
import errno
import logging
import sys
import time
from urllib.parse import urlsplit

import kopf
from aiohttp import web

from kvscale.control.settings import Settings, SettingsError
from kvscale.operator import access, leader, telemetry
from kvscale.operator.handlers import KUBE_WORKERS, RESUME_WORKERS, Runtime, register
from kvscale.operator.informers import INFORMERS, inventory
from kvscale.operator.k8s import Kube, new_api_client
from kvscale.sizing.catalog import load_catalog

log = logging.getLogger("kvscale.operator")
LOST_LEASE_EXIT = 3  # the exit status after losing the Lease: the pod restarts and stands by
METRICS_PORT_WAIT_S = 10.0  # how long a start waits for its metrics port to be let go (serve_metrics)


def runtime(settings: Settings, namespaces: tuple[str, ...] = ()) -> Runtime:
    catalog = load_catalog(*settings.catalog_overlays)
    return Runtime(
        settings=settings,
        catalog=catalog,
        kube=Kube(new_api_client(KUBE_WORKERS + RESUME_WORKERS), settings.retry_backoff_s),
        # Its own connections: each informer holds one for its watch.
        inventory=inventory(new_api_client(len(INFORMERS) * max(1, len(namespaces))), catalog, namespaces),
        namespaces=namespaces,
    )


def run_operator(namespaces: tuple[str, ...], liveness: str | None = None) -> None:
    settings = Settings.from_env()
    serve_metrics(settings.metrics_port, settings.metrics_address)
    watched = list(namespaces or settings.namespaces)
    registry = kopf.OperatorRegistry()
    rt = runtime(settings, tuple(watched))
    register(registry, rt)
    # kopf's own log format, to stderr; per-object lines (a failing handler) start with [namespace/name].
    kopf.configure(verbose=False, log_prefix=True)
    logging.getLogger().setLevel(settings.log_level.upper())
    # Per-object INFO lines ("Timer 'refresh' succeeded" every interval) drown real news.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Prometheus query otherwise
    try:
        lost = asyncio.run(_serve(settings, registry, watched, liveness, rt.access))
    except leader.LeaseUnusable as exc:  # configuration, said once: not a traceback, not a retry loop
        raise SettingsError(str(exc)) from exc
    if lost:
        sys.exit(LOST_LEASE_EXIT)


def serve_metrics(port: int, address: str = "127.0.0.1", wait_s: float = METRICS_PORT_WAIT_S) -> None:
    """The operator's /metrics, first of all: a port in use stops the start, naming it (inside
    kopf's startup it failed and was retried every minute while nothing was handled). In use, it
    is tried again for `wait_s` first: a restarted operator's previous process holds it until it
    has stopped (kopf ends its handlers, the Lease is released), and the restart collided with it
    for those seconds. SO_REUSEADDR is no help: http.server.HTTPServer, which prometheus_client's
    server extends, sets it already (TIME_WAIT is not the cause), and it never lets a second
    process listen on a port that one still listens on."""
    if not port:
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            telemetry.serve(port, address)
            return
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and time.monotonic() < deadline:
                time.sleep(0.25)  # startup, before any handler: poll until the holder lets go
                continue
            raise SettingsError(
                f"KVSCALE_METRICS_PORT: port {port} cannot be served on {address} ({exc.strerror or exc}): free "
                "it, choose another port or KVSCALE_METRICS_ADDRESS, or set the port to 0 to serve no metrics"
            ) from exc


async def _serve(
    settings: Settings,
    registry: kopf.OperatorRegistry,
    watched: list[str],
    liveness: str | None,
    refused: access.Access | None = None,
) -> bool:
    """kopf's operator, behind the Lease when leader election is on; True when the Lease was lost.
    While leading, what its watches are refused is checked (kvscale.operator.access) into `refused`."""
    stop = asyncio.Event()
    elector = None
    if settings.leader_election:
        namespace = leader.lease_namespace(settings.lease_namespace)
        elector = leader.Elector(
            new_api_client(1),
            namespace,
            settings.lease_name,
            settings.lease_duration_s,
            leader.identity(),
            leader.fallback_namespace(settings.lease_namespace),
        )
        probe = await _standby_probe(liveness) if liveness else None
        try:
            await leader.acquire(elector)
        finally:
            if probe is not None:
                await probe.cleanup()
    lost = asyncio.Event()

    def on_lost() -> None:
        lost.set()
        stop.set()

    renewing = asyncio.create_task(leader.keep(elector, on_lost)) if elector is not None else None
    checking = None
    if refused is not None:
        review = access.reviewer(new_api_client(1))
        checking = asyncio.create_task(access.watch(refused, review, access.needs(tuple(watched))))
    try:
        await kopf.operator(
            registry=registry,
            clusterwide=not watched,
            namespaces=watched,
            standalone=True,
            liveness_endpoint=liveness,
            stop_flag=stop,
        )
    finally:
        for task in (renewing, checking):
            if task is not None:
                task.cancel()
        if elector is not None and not lost.is_set():
            await asyncio.to_thread(elector.release)
    return lost.is_set()


async def _standby_probe(liveness: str) -> web.AppRunner:
    """While standing by, the liveness endpoint answers (kopf serves it once leading)."""
    url = urlsplit(liveness)

    async def alive(_: web.Request) -> web.Response:
        return web.json_response({"standby": True})

    app = web.Application()
    app.router.add_get(url.path or "/", alive)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, url.hostname, url.port).start()
    return runner
