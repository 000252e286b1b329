"""The calibration timer's I/O shell: read the service's engine windows through the async
Prometheus client (kvscale.metrics.calibration's queries), fit and decide in the workers
(kvscale.control.calibration, CPU-bound), write the profile ConfigMap in the operator's
namespace, and apply the status or the re-plan the core returned."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvscale.api.models import CalibrationStatus, InferenceServiceStatus
from kvscale.calibration.fit import Window
from kvscale.calibration.profile import CONFIG_ANNOTATION, profile_name, read_profile
from kvscale.control.calibration import (
    Step,
    calibrated,
    carried,
    planning_catalog,
    profile_key,
    serving_config,
    step,
    stored_profile,
)
from kvscale.control.reconcile import Result
from kvscale.control.scaling import planned
from kvscale.control.status import mark_synced
from kvscale.metrics.calibration import read_windows_async
from kvscale.metrics.client import PrometheusError
from kvscale.metrics.engines import ENGINES
from kvscale.metrics.promql import pod_selector
from kvscale.operator import effects
from kvscale.operator.k8s import Kube, Refused
from kvscale.operator.leader import SERVICE_ACCOUNT_NAMESPACE

if TYPE_CHECKING:
    from kvscale.operator.handlers import Call, Runtime
    from kvscale.sizing.catalog import Catalog
    from kvscale.sizing.config import ServingConfig

log = logging.getLogger("kvscale.operator")
HAND_RUN_NAMESPACE = "default"  # an operator run outside a pod (tests, a laptop) keeps its profiles here


def profile_namespace(configured: str, service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The operator's namespace, where its Lease is: KVSCALE_LEASE_NAMESPACE, else the pod's own
    (its service account says), else HAND_RUN_NAMESPACE. RBAC grants the ConfigMap verbs there only."""
    if configured:
        return configured
    try:
        return service_account_file.read_text().strip() or HAND_RUN_NAMESPACE
    except OSError:
        return HAND_RUN_NAMESPACE


class ProfileCache:
    """The profile ConfigMaps as last read or written, by name (None: there is none), so that
    every reconcile can plan with its service's profile without a GET each time. The
    calibration tick reads its profiles afresh each interval and stores them here (a pin or a
    delete by hand is seen within one interval); a name not seen yet is read once, in the
    workers. Shared by the loop and the workers: locked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: dict[str, dict[str, Any] | None] = {}

    def put(self, name: str, body: dict[str, Any] | None) -> None:
        with self._lock:
            self._bodies[name] = body

    def peek(self, name: str) -> dict[str, Any] | None:
        """As kept, without a request (None where not read yet): for the loop."""
        with self._lock:
            return self._bodies.get(name)

    def get(self, kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            if name in self._bodies:
                return self._bodies[name]
        body = kube.read_configmap(namespace, name)
        self.put(name, body)
        return body


PROFILES = ProfileCache()  # one operator process, one cache


class FitClock:
    """When each profile was last fitted (monotonic seconds), so a configuration is fitted at
    most once per `min_fit_interval_s`: the fit is the CPU-bound part of the tick (about 90 ms
    for 2 pods x 30 one-minute windows from the catalog's values, 40 ms from the stored
    profile, on one core of the test machine), and every interval a fit of 30 minutes of data
    sees one new minute. In between, the stored profile is only compared with the windows
    (about 3 ms). Empty after a restart: each configuration is fitted once, then at the pace."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}

    def due(self, key: str, now_s: float, interval_s: float) -> bool:
        with self._lock:
            last = self._last.get(key)
        return last is None or now_s - last >= interval_s

    def mark(self, key: str, now_s: float) -> None:
        with self._lock:
            self._last[key] = now_s


FITS = FitClock()


def min_fit_interval_s(calibration_interval_s: float, since_s: float) -> float:
    """A configuration's fits at most this often: a sixth of the span read (5 minutes of the
    default 30), never more often than the tick."""
    return max(calibration_interval_s, since_s / 6.0)


def planning_catalog_of(rt: Runtime, call: Call, cached: bool = False) -> Catalog:
    """The catalog `call`'s service plans with (kvscale.control.calibration.planning_catalog):
    its stored or pinned profile over the catalog's. In the workers (it may read a ConfigMap);
    `cached`: only what is kept (the autoscale tick, in the loop: its capacity per replica is
    the calibrated plan's once the reconcile or the calibration tick has read the profile)."""
    if not rt.settings.calibration_interval_s:
        return rt.catalog  # calibration off: no profile is kept up to date, none is planned with
    namespace = profile_namespace(rt.settings.lease_namespace)

    def read(name: str) -> dict[str, Any] | None:
        return PROFILES.peek(name) if cached else PROFILES.get(rt.kube, namespace, name)

    try:  # a transient API error propagates: the handler retries, and plans with the profile then
        return planning_catalog(rt.catalog, call.intent, call.before, call.res.namespace, read)
    except Refused as exc:  # no RBAC on ConfigMaps there (an older chart): plan, on the catalog's profile
        log.warning(
            "calibrated profile of %s/%s not read (%s): planned on the catalog's",
            call.res.namespace,
            call.res.name,
            exc,
        )
        return rt.catalog


def _fit_and_write(rt: Runtime, call: Call, cfg: ServingConfig, windows: list[Window], namespace: str) -> Result:
    """In the workers: the stored profile read (afresh), the fit, the ConfigMap written, the re-plan."""
    intent = call.valid()

    def read(name: str) -> dict[str, Any] | None:
        body = rt.kube.read_configmap(namespace, name)
        PROFILES.put(name, body)
        return body

    own = profile_key(cfg, call.res.namespace)
    _, _, stored = stored_profile(cfg, call.res.namespace, read)
    now, clock = dt.datetime.now(dt.UTC), time.monotonic()
    s = rt.settings
    due = FITS.due(own, clock, min_fit_interval_s(s.calibration_interval_s, s.calibration_since_s))
    done: Step = step(cfg, windows, stored, namespace, now, own, fit_due=due)
    if done.fitted:
        FITS.mark(own, clock)
    if done.write is not None:  # never over a pinned one: `stored` is then the namespace's own, as read
        rt.kube.write_configmap(done.write, exists=stored is not None)
        PROFILES.put(profile_name(own), done.write)
    result = calibrated(done, cfg, intent, call.res, call.before, lambda: call.observed(rt), rt.catalog, s, now)
    extra = carried(done, intent, result.status.plan, rt.catalog, call.res.namespace, now)
    if extra is not None:
        name = extra["metadata"]["name"]
        there = read(name)
        key = extra["metadata"]["annotations"][CONFIG_ANNOTATION]
        kept = None if there is None else read_profile(there, key)
        if kept is None or not kept.pinned:  # a pin is the administrator's: never overwritten
            rt.kube.write_configmap(extra, exists=there is not None)
            PROFILES.put(name, extra)
    return result


async def calibrate_tick(rt: Runtime, call: Call) -> None:
    """One service's calibration: nothing for a service not running (recommend mode, not
    planned), an engine without vLLM's histograms, or no Prometheus."""
    plan = call.before.plan
    if plan is None or not planned(call.before) or call.before.phase == "Recommended" or rt.prometheus is None:
        return
    if plan.mode == "disaggregated":
        return  # the engines' metrics mix both pools' steps: one configuration's profile is not fitted from them
    try:
        intent = call.valid()
        names = ENGINES.get(intent.engine)
        if names is None or not names.prefill_time_histogram:
            return  # calibration reads vLLM's metrics (kvscale calibrate says the same)
        cfg = serving_config(intent, plan, rt.catalog)
        if cfg is None:
            return  # a custom architecture: no catalog profile to fit
        window_s, since_s = rt.settings.calibration_window_s, rt.settings.calibration_since_s
        end_s = time.time()
        where = pod_selector(call.res.namespace, call.res.name)
        try:
            reading = await read_windows_async(rt.prometheus, names, where, end_s - since_s, end_s, window_s)
        except PrometheusError as exc:  # not the service's fault: said in status, read again next tick
            await call.apply_async(rt, Result(status=unavailable(call.before, str(exc))))
            return
        windows = reading.windows(float(cfg.memory.kv_capacity_tokens))
        result = await rt.io(_fit_and_write, rt, call, cfg, windows, profile_namespace(rt.settings.lease_namespace))
    except Exception as exc:  # counted and shown in status; the timer runs again
        if not rt.stopping:
            effects.timer_failed("calibration", call.body, call.patch, call.before, call.res, exc)
        return
    await call.apply_async(rt, replace(result, status=mark_synced("calibration", result.status, call.res.generation)))


def unavailable(before: InferenceServiceStatus, why: str) -> InferenceServiceStatus:
    """Prometheus could not answer: reason Unavailable, the profile named before kept."""
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    profile = before.calibration.profile if before.calibration is not None else None
    gone = CalibrationStatus(profile=profile, reason="Unavailable", message=why[:500], last_time=when)
    return before.model_copy(update={"calibration": gone})
