"""The capacity timer's I/O shell (status.capacity, kvscale.control.capacity): read the
service's observed workload from the batched workload reader (the workload timer's reads,
shared), run the simulated search in the search worker, keep the confirmed capacity in the
service's memory (the scale tick acts on it) and apply status.capacity.

The search is CPU-bound: it runs in one thread of its own (`SEARCH`), so however many services
search, they take at most one core between them, one at a time; each service's timer starts at
its own phase of the interval (handlers.spread), so the searches are spread over it. One search
replays at most kvscale.sim.online.MAX_REPLAY_REQUESTS requests (its CPU time is exported as
kvscale_capacity_search_cpu_seconds). With KVSCALE_HOLDING=tuned the holding tuner runs after
it in the same worker (kvscale.operator.holding: status.holding)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import kopf

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.control.capacity import Measured, measure, with_capacity
from kvscale.control.holding import TUNED, with_holding
from kvscale.control.reconcile import Result
from kvscale.control.scaling import planned
from kvscale.control.status import mark_synced
from kvscale.metrics.arrivals import arrival_counts
from kvscale.metrics.engines import ENGINES
from kvscale.operator import effects, telemetry
from kvscale.operator.calibration import planning_catalog_of
from kvscale.operator.holding import holding_tick

if TYPE_CHECKING:
    from kvscale.operator.handlers import Call, Runtime

SEARCH = ThreadPoolExecutor(1, thread_name_prefix="capacity-search")  # one core at most, for every service


def _cpu_timed(search: Callable[[], Measured]) -> tuple[Measured, float]:
    """In the search thread: the search, and the CPU seconds it took (this thread's)."""
    started = time.thread_time()
    return search(), time.thread_time() - started


async def capacity_tick(rt: Runtime, call: Call) -> None:
    """One service's capacity search: nothing for a service not running (recommend mode, not
    planned) or without Prometheus."""
    from kvscale.operator.handlers import memory, read_workload, update  # the handlers import this module

    plan = call.before.plan
    if plan is None or not planned(call.before) or call.before.phase == "Recommended" or rt.workload_reader is None:
        return
    if plan.mode == "disaggregated":
        return  # a replica's capacity is an aggregated one's; each pool's is the model's (pool_capacity)
    try:
        intent = call.valid()
        s = rt.settings
        workload, missing = await read_workload(rt, call, intent.engine)
        counts = None
        if rt.workload_prometheus is not None and workload is not None and workload.requests_per_s:
            counts = await arrival_counts(
                rt.workload_prometheus,
                ENGINES[intent.engine],
                call.res.namespace,
                call.res.name,
                time.time(),
                s.workload_window_s,
                s.burst_window_s,
            )
        catalog = planning_catalog_of(rt, call, cached=True)  # the calibrated profile, as the tick's capacity
        previous = memory(call.memo).capacity
        now = dt.datetime.now(dt.UTC)
        search = partial(
            measure,
            intent,
            plan,
            workload,
            missing,
            previous,
            catalog,
            s.capacity_min_requests,
            now,
            counts=counts,
            counts_step_s=s.burst_window_s,
        )
        measured, cpu_s = await rt.io(_cpu_timed, search, pool=SEARCH)
        if measured.search is not None and measured.search.requests:
            telemetry.CAPACITY_SEARCH_CPU_SECONDS.observe(cpu_s)
        update(call.memo, lambda m: replace(m, capacity=measured.confirmed))
        status = mark_synced("capacity", with_capacity(call.before, measured.status), call.res.generation)
        tuned = await holding_tick(rt, call, intent, plan, workload, catalog, measured.confirmed)
    except Exception as exc:  # counted and shown in status; the timer runs again
        if not rt.stopping:
            effects.timer_failed("capacity", call.body, call.patch, call.before, call.res, exc)
        return
    if tuned is None:  # status.holding as it was (none with KVSCALE_HOLDING=configured)
        status = status if rt.settings.holding == TUNED else with_holding(status, None)
        await call.apply_async(rt, Result(status=status))
        return
    events = (tuned.event,) if tuned.event is not None else ()
    await call.apply_async(rt, Result(status=with_holding(status, tuned.status), events=events))


def capacity_handlers(registry: kopf.OperatorRegistry, rt: Runtime, spread: Callable[[float], Any]) -> None:
    """The capacity timer, every KVSCALE_CAPACITY_INTERVAL per service at its own phase
    (`spread`); none with the setting off (the policy acts on the model's figure)."""
    interval_s = rt.settings.capacity_interval_s
    if interval_s <= 0:
        return

    @kopf.timer(
        GROUP, VERSION, PLURAL, id="capacity", interval=interval_s, initial_delay=spread(interval_s), registry=registry
    )
    async def capacity_timer(**kwargs: Any) -> None:
        from kvscale.operator.handlers import Call

        await capacity_tick(rt, Call.of(rt, kwargs))
