"""At startup, the kinds kopf is about to watch, waited for while the API server says their
storage is still initializing.

Right after a CRD is established (a fresh install: `kubectl apply -f crds/`, or the chart,
then the operator) the API server answers a list of the new kind with 429 "storage is
(re)initializing" until its watch cache is filled, a second or so. kopf retries that request,
but logs each attempt at ERROR ("Request attempt #1 failed; will retry",
kopf/_cogs/clients/api.py `request`), so a healthy start printed an [ERROR] line. The startup
handler lists each kind once (limit 1) until it answers, and only then do kopf's watches start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.api.budget import BUDGET_PLURAL
from kvscale.operator.k8s import raw_get

log = logging.getLogger("kvscale.operator")
STORAGE_WAIT_S = 30.0  # the longest a start waits for a kind whose storage is initializing
POLL_S = 0.5
LIST_TIMEOUT_S = 10.0
INITIALIZING = 429  # the API server's answer while a resource's storage (watch cache) initializes


def watched_paths(namespaces: tuple[str, ...]) -> tuple[str, ...]:
    """The list paths of kopf's watches: GPUBudgets (cluster-scoped) and InferenceServices,
    cluster-wide or in each watched namespace."""
    base = f"/apis/{GROUP}/{VERSION}"
    services = tuple(f"{base}/namespaces/{ns}/{PLURAL}" for ns in namespaces) or (f"{base}/{PLURAL}",)
    return (f"{base}/{BUDGET_PLURAL}", *services)


def until_served(
    list_once: Callable[[str], object],
    paths: Iterable[str],
    wait_s: float = STORAGE_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[str, ...]:
    """Lists each path (`list_once`) until none answers 429, for at most `wait_s`; the paths
    still initializing then. Any other answer ends the wait for its path: a refusal (403) is
    the access check's to report, a 404 a CRD not installed, an unreachable server kopf's to
    retry."""
    pending = tuple(paths)
    deadline = clock() + wait_s
    said = False
    while True:
        still = []
        for path in pending:
            try:
                list_once(path)
            except ApiException as exc:
                if exc.status == INITIALIZING:
                    still.append(path)
            except (HTTPError, OSError):
                pass
        if not still or clock() >= deadline:
            return tuple(still)
        if not said:
            log.info(
                "The API server initializes the storage of %s (HTTP 429): watching once it answers", ", ".join(still)
            )
            said = True
        pending = tuple(still)
        sleep(POLL_S)


def wait_until_served(api: client.ApiClient, namespaces: tuple[str, ...], wait_s: float = STORAGE_WAIT_S) -> None:
    """`until_served` on the watched kinds through `api`; one warning if any is still initializing."""

    def list_once(path: str) -> object:
        return raw_get(api, path, [("limit", 1)], LIST_TIMEOUT_S).data

    pending = until_served(list_once, watched_paths(namespaces), wait_s)
    if pending:
        log.warning(
            "The API server still initializes the storage of %s after %.0fs (HTTP 429); watching anyway, "
            "kopf retries those requests",
            ", ".join(pending),
            wait_s,
        )
