"""The holding tuner's I/O shell (status.holding, kvscale.control.holding; KVSCALE_HOLDING=tuned):
after each capacity search, in the same search worker (kvscale.operator.capacity.SEARCH, one
thread for every service), read the service's arrivals over KVSCALE_HOLDING_HISTORY per
KVSCALE_BURST_WINDOW, replay them with each candidate setting (at most every
kvscale.control.holding.RETUNE_S), and keep the choice in the service's memory (the scale tick
runs it). Its CPU time is exported as
kvscale_holding_tune_cpu_seconds."""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from kvscale.api.intent import Intent
from kvscale.api.models import PlanStatus
from kvscale.autoscaling.observation import ObservedWorkload
from kvscale.control.capacity import Confirmed, acted_on
from kvscale.control.holding import TUNED, Tuned, tune_holding
from kvscale.control.scaling import configuration_key, prepared
from kvscale.metrics.arrivals import arrival_counts
from kvscale.metrics.engines import ENGINES
from kvscale.operator import telemetry
from kvscale.sizing.catalog import Catalog

if TYPE_CHECKING:
    from kvscale.operator.handlers import Call, Runtime

log = logging.getLogger("kvscale.operator")


def _cpu_timed(tuning: partial[Tuned]) -> tuple[Tuned, float]:
    """In the search thread: the tune, and the CPU seconds it took (this thread's)."""
    started = time.thread_time()
    return tuning(), time.thread_time() - started


async def holding_tick(
    rt: Runtime,
    call: Call,
    intent: Intent,
    plan: PlanStatus,
    workload: ObservedWorkload | None,
    catalog: Catalog,
    confirmed: Confirmed | None,
) -> Tuned | None:
    """One service's holding tune, its choice stored in the service's memory for the scale tick;
    None when nothing ran (KVSCALE_HOLDING=configured, the last replay is recent, or the tune
    failed: counted in kvscale_errors{stage="holding"} and logged, status.holding as it was)."""
    from kvscale.operator.capacity import SEARCH  # capacity imports this module
    from kvscale.operator.handlers import memory, update

    s = rt.settings
    mine = memory(call.memo)
    now = dt.datetime.now(dt.UTC)
    if s.holding != TUNED or rt.workload_prometheus is None:
        return None
    if mine.holding is not None and not mine.holding.due(now, configuration_key(intent, plan)):
        return None  # replayed less than RETUNE_S ago: the choice and status.holding stand
    try:
        counts = await arrival_counts(
            rt.workload_prometheus,
            ENGINES[intent.engine],
            call.res.namespace,
            call.res.name,
            time.time(),
            s.holding_history_s,
            s.burst_window_s,
        )
        model, config, _ = prepared(intent, plan, mine.scaler, catalog, s)
        acting = acted_on(model, confirmed, intent, plan)  # the capacity the tick acts on
        replicas = call.before.replicas or plan.replicas
        args = (intent, plan, catalog, config, acting, workload, counts, s.burst_window_s, replicas)
        tuning = partial(tune_holding, *args, mine.holding, s.capacity_min_requests, now, s.holding_history_s)
        tuned, cpu_s = await rt.io(_cpu_timed, tuning, pool=SEARCH)
    except Exception as exc:  # counted and logged; the capacity search's status is written all the same
        telemetry.ERRORS.labels("holding").inc()
        log.warning("Holding tune failed for %s/%s: %s: %s", call.res.namespace, call.res.name, type(exc).__name__, exc)
        return None
    if tuned.status.replayed_requests and tuned.status.source == "tuned":
        telemetry.HOLDING_TUNE_CPU_SECONDS.observe(cpu_s)
    update(call.memo, lambda m: replace(m, holding=tuned.held))
    return tuned
