"""Leader election on a coordination.k8s.io Lease: one operator acts at a time.

Two operators against one cluster (a `kvscale operator` beside the chart's, two replicas, a pod
on a partitioned node) would both scale, patch status and post Events. Each takes the Lease
before it starts handling anything; the others stand by (answering their liveness probe) and
take over when the holder releases the Lease at shutdown or stops renewing it. The rules are
client-go's (k8s.io/client-go/tools/leaderelection): a Lease counts as held while its record
(holder, renew time) changed less than leaseDurationSeconds ago by this process's own clock (no
clock comparison between machines); writes carry the resourceVersion read, so two candidates
cannot both win; a leader that could not renew for two thirds of the duration stops acting
before any other may take the Lease.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

log = logging.getLogger("kvscale.operator")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Outside a pod: the namespace of the README's `helm install kvscale ... -n kvscale-system`, whose
# Lease (named by the chart after the release's full name, "kvscale", the default KVSCALE_LEASE_NAME)
# a hand-run operator then shares instead of leading beside the chart's. Where that namespace does
# not exist (no chart installed: a test cluster, kind) it falls back to FALLBACK_NAMESPACE.
HAND_RUN_NAMESPACE = "kvscale-system"
FALLBACK_NAMESPACE = "default"


def fallback_namespace(configured: str, service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """Where a hand-run operator's Lease goes when HAND_RUN_NAMESPACE does not exist; None when
    the namespace was configured or is the pod's own (then a missing one is an error)."""
    if configured:
        return None
    try:
        in_pod = bool(service_account_file.read_text().strip())
    except OSError:
        in_pod = False
    return None if in_pod else FALLBACK_NAMESPACE


class LeaseUnusable(RuntimeError):
    """The Lease cannot be used as configured; the operator stops with the message."""


class LeaseForbidden(LeaseUnusable):
    """The operator may not read or write its Lease: RBAC must grant it (the chart does)."""


def lease_namespace(configured: str, service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The namespace configured, else the pod's own (in a cluster), else HAND_RUN_NAMESPACE."""
    if configured:
        return configured
    try:
        return service_account_file.read_text().strip() or HAND_RUN_NAMESPACE
    except OSError:
        return HAND_RUN_NAMESPACE


def identity() -> str:
    """Unique per process: the host (the pod's name in a cluster), the pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Record:
    """What decides who may hold the Lease: its holder and last renewal as written."""

    holder: str | None
    renewed: str | None
    duration_s: float


def held_by_other(record: Record, me: str, unchanged_since_s: float) -> bool:
    """Whether someone else holds the Lease: a holder other than `me`, whose record changed
    less than its duration ago (measured on this process's monotonic clock)."""
    return bool(record.holder) and record.holder != me and unchanged_since_s < record.duration_s


class Elector:
    """Takes, renews and releases one Lease. Synchronous (the Kubernetes client); the async
    loops below run it in a thread."""

    def __init__(
        self, api: client.ApiClient, namespace: str, name: str, duration_s: float, me: str, fallback: str | None = None
    ) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace, self.name, self.duration_s, self.me = namespace, name, duration_s, me
        self.fallback = fallback  # the namespace to use when `namespace` does not exist (a hand-run default)
        self._record: Record | None = None
        self._changed_at = 0.0  # monotonic time the record was last seen to change
        self.holder: str | None = None  # as last read, for the standby's log line

    @property
    def retry_s(self) -> float:
        return max(0.2, self.duration_s / 6)

    @property
    def renew_deadline_s(self) -> float:
        return self.duration_s * 2 / 3

    def _lease_body(self, now: dt.datetime, transitions: int) -> client.V1LeaseSpec:
        return client.V1LeaseSpec(
            holder_identity=self.me,
            lease_duration_seconds=max(1, round(self.duration_s)),
            acquire_time=now,
            renew_time=now,
            lease_transitions=transitions,
        )

    def try_hold(self) -> bool:
        """One attempt to take or renew the Lease; True when this process holds it now."""
        now = dt.datetime.now(dt.UTC)
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 403:
                raise LeaseForbidden(self._forbidden(exc)) from exc
            if exc.status != 404:
                raise
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name), spec=self._lease_body(now, 0))
            return self._write(lambda: self.coordination.create_namespaced_lease(self.namespace, body), creating=True)
        spec = lease.spec or client.V1LeaseSpec()
        renewed = spec.renew_time.isoformat() if spec.renew_time else None
        record = Record(spec.holder_identity, renewed, float(spec.lease_duration_seconds or self.duration_s))
        if record != self._record:
            self._record, self._changed_at = record, time.monotonic()
        self.holder = record.holder
        if held_by_other(record, self.me, time.monotonic() - self._changed_at):
            return False
        if spec.holder_identity == self.me:
            spec.renew_time = now
            spec.lease_duration_seconds = max(1, round(self.duration_s))
        else:
            spec = self._lease_body(now, (spec.lease_transitions or 0) + 1)
        lease.spec = spec  # metadata keeps the resourceVersion read: a concurrent writer gets 409
        return self._write(lambda: self.coordination.replace_namespaced_lease(self.name, self.namespace, lease))

    def _write(self, call: Callable[[], Any], creating: bool = False) -> bool:
        try:
            call()
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote first
                return False
            if exc.status == 403:
                raise LeaseForbidden(self._forbidden(exc)) from exc
            if exc.status == 404 and creating and self.fallback:  # a create in a namespace that does not exist
                log.warning(
                    "Lease namespace %s does not exist: using %s/%s (a chart installed in %s later leads beside "
                    "this operator; set KVSCALE_LEASE_NAMESPACE and KVSCALE_LEASE_NAME to its Lease to stand by)",
                    self.namespace,
                    self.fallback,
                    self.name,
                    self.namespace,
                )
                self.namespace, self.fallback = self.fallback, None
                return False  # the next attempt takes it there
            if exc.status == 404 and creating:
                raise LeaseUnusable(
                    f"the Lease's namespace {self.namespace} does not exist: create it (the chart's release "
                    "namespace), or set KVSCALE_LEASE_NAMESPACE (and KVSCALE_LEASE_NAME) to the Lease of the "
                    "operator this one should stand by for"
                ) from exc
            raise
        self.holder = self.me
        return True

    def _forbidden(self, exc: ApiException) -> str:
        return (
            f"the operator may not read or write its Lease {self.namespace}/{self.name} "
            f"(coordination.k8s.io leases: get, create, update; HTTP {exc.status}): grant them in that namespace "
            "(the chart's Role does), set KVSCALE_LEASE_NAMESPACE, or run one replica with KVSCALE_LEADER_ELECTION=false"
        )

    def release(self) -> None:
        """At shutdown: the holder clears the Lease so a standby takes over at once."""
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.me:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            self.coordination.replace_namespaced_lease(self.name, self.namespace, lease)
        except (ApiException, HTTPError, OSError) as exc:  # it expires by itself
            log.warning("Could not release the Lease %s/%s: %s", self.namespace, self.name, exc)


async def _attempt(elector: Elector) -> bool:
    try:
        return await asyncio.to_thread(elector.try_hold)
    except LeaseUnusable:
        raise
    except (ApiException, HTTPError, OSError) as exc:
        log.warning("Lease %s/%s: %s; retrying", elector.namespace, elector.name, exc)
        return False


async def acquire(elector: Elector) -> None:
    """Returns once this process holds the Lease (standing by until then)."""
    said: str | None = None
    while not await _attempt(elector):
        if elector.holder != said:
            said = elector.holder
            log.info("Standing by: Lease %s/%s is held by %s", elector.namespace, elector.name, said)
        await asyncio.sleep(elector.retry_s)
    log.info("Leading: took Lease %s/%s as %s", elector.namespace, elector.name, elector.me)


async def keep(elector: Elector, lost: Callable[[], Awaitable[None] | None]) -> None:
    """Renews the Lease every retry period; calls `lost` (and returns) when a renewal has not
    succeeded within the renew deadline, before another candidate may take it."""
    last = time.monotonic()
    while True:
        await asyncio.sleep(elector.retry_s)
        if await _attempt(elector):
            last = time.monotonic()
        elif elector.holder not in (None, elector.me) or time.monotonic() - last > elector.renew_deadline_s:
            log.error("Lost Lease %s/%s (held by %s): stopping", elector.namespace, elector.name, elector.holder)
            outcome = lost()
            if outcome is not None:
                await outcome
            return
