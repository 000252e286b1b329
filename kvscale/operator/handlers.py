"""kopf handlers, registered at startup by `register` (nothing happens at import). Each one
reads the object and the informers' view of the cluster, calls one pure function (reconcile, refresh, the
scaling tick) and applies the value it returns (effects.apply).

Every handler is a coroutine on kopf's event loop, and none of them waits there on I/O that
another resource needs:
- Prometheus is read with the async client (made at startup inside kopf's loop, closed at
  cleanup): each observation has a deadline shorter than the tick and holds no thread, so a
  slow Prometheus delays only the ticks that wait on it.
- The Kubernetes client is synchronous; its calls (and the planner, CPU-bound, on create or
  spec change) run in `Runtime.workers`, a thread pool of the operator's own sized like the
  client's connection pool. Not kopf's executor: that one is shared by anything kopf runs
  synchronously, and a pool of our own keeps the size tied to the connections it needs.
- Results without writes (most status and scaling ticks) are applied in the loop: kopf
  patches the status itself, no thread needed.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import functools
import logging
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import kopf

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.api.intent import Intent, SpecError, read_spec
from kvscale.api.models import InferenceServiceStatus, PlanStatus, PoolPlanStatus, parse_status, status_patch
from kvscale.autoscaling.budget import Grant
from kvscale.autoscaling.observation import Observation, ObservedWorkload
from kvscale.control import children as owned
from kvscale.control import pool_scaling
from kvscale.control.autoscale import Autoscaled, Governor, Readings, autoscale
from kvscale.control.autoscale import moved as moved_tick
from kvscale.control.budget import BudgetBook, cap_deploy, govern_pin, moved
from kvscale.control.disaggregated import ROLES, SERVING_ROLE, pool_name
from kvscale.control.drain import preemption_grace_s
from kvscale.control.inventory import pools
from kvscale.control.memory import MEMO_KEY, ServiceMemory
from kvscale.control.pool_budget import cap_pools, capped_pools
from kvscale.control.reconcile import (
    DeploymentView,
    Observed,
    PoolView,
    Resource,
    Result,
    conflicted,
    disaggregated,
    multi_node,
    pool_api_missing,
    pools_under_budget,
    reconcile,
    refresh,
    replan,
    replans,
    settled,
)
from kvscale.control.replan import BudgetMove
from kvscale.control.scale_zero import gateway_queue, queue_queries, wants_zero
from kvscale.control.scaling import (
    NO_ENGINE_PODS,
    Fleet,
    cold_start_key,
    fleet,
    planned,
)
from kvscale.control.settings import Settings
from kvscale.control.status import mark_synced
from kvscale.control.workload import predates, workload_tick
from kvscale.metrics.batch import FleetReader
from kvscale.metrics.client import AsyncPrometheusClient
from kvscale.metrics.observe import observe_batched, observe_workload_batched, tick_queries, workload_reads
from kvscale.operator import effects, telemetry
from kvscale.operator.access import Access, RetryForever, budgets_watched
from kvscale.operator.budget_handlers import budget_handlers, budget_ttl_s
from kvscale.operator.calibration import calibrate_tick, planning_catalog_of
from kvscale.operator.capacity import capacity_handlers
from kvscale.operator.diffbase import DigestDiffBaseStorage
from kvscale.operator.drain import mark_scale_down, shorten_preempted
from kvscale.operator.informers import Inventory
from kvscale.operator.k8s import Kube
from kvscale.operator.served import wait_until_served
from kvscale.planner.disaggregated import Role
from kvscale.sizing.catalog import Catalog

INVENTORY_SYNC_S = 300.0
T = TypeVar("T")
KUBE_WORKERS = 8  # threads for Kubernetes calls; the client's connection pool has as many
COLD_START_SAMPLES = 8  # start-to-ready times kept per model and GPU type
BATCHES_PER_INTERVAL = 3  # batched Prometheus reads per scale interval: a tick's data is at most a third of it old
RESUME_WORKERS = 2  # threads for resuming objects at startup: a new or changed one never waits behind them


@dataclass
class Runtime:
    """What the handlers share, built once at startup. The Prometheus client is made in
    kopf's event loop (the `startup` handler), not here."""

    settings: Settings
    catalog: Catalog
    kube: Kube
    workers: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(KUBE_WORKERS, thread_name_prefix="kube")
    )
    resume_workers: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(RESUME_WORKERS, thread_name_prefix="kube-resume")
    )
    inventory: Inventory | None = None  # made with the runtime (run.runtime), started at startup
    namespaces: tuple[str, ...] = ()  # the watched namespaces (none: all)
    prometheus: AsyncPrometheusClient | None = None
    # The workload's queries (a day of rates in a subquery) get a longer deadline of their own.
    workload_prometheus: AsyncPrometheusClient | None = None
    reader: FleetReader | None = None  # the ticks' batched Prometheus reads, made with the client
    workload_reader: FleetReader | None = None  # the workload's, with the workload client
    stopping: bool = False  # set at cleanup: a tick still in flight then writes nothing
    budgets: BudgetBook = field(default_factory=BudgetBook)  # GPUBudgets and their services' wants
    access: Access = field(default_factory=Access)  # watches refused (run.py checks them)
    # Observed start-to-ready seconds by (model, GPU type, TP, precision), newest last: a new
    # service (or a re-plan) starts its policy with the cold starts other replicas showed.
    cold_starts: dict[tuple[str, str, int, str], tuple[float, ...]] = field(default_factory=dict)

    async def io(self, fn: Callable[..., T], *args: Any, pool: ThreadPoolExecutor | None = None) -> T:
        """`fn(*args)` in the Kubernetes workers (or `pool`), with kopf's context (its Events need it)."""
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(pool or self.workers, call)

    def pool(self, resumed: bool) -> ThreadPoolExecutor:
        """At startup every object resumes at once: those queue in their own small pool, so a
        create or an edit meanwhile is handled at once instead of after all of them."""
        return self.resume_workers if resumed else self.workers

    def observation_deadline_s(self) -> float:
        """Each tick's observation ends within this: a third of the tick, at most 2 s."""
        return min(2.0, self.settings.scale_interval_s / 3)

    def workload_deadline_s(self) -> float:
        """Each workload read ends within this: half its interval, at least 2 s, at most 10 s
        (the timer waits for its previous run)."""
        return min(10.0, max(2.0, self.settings.workload_interval_s / 2))


def resource(meta: Mapping[str, Any], namespace: str | None, name: str) -> Resource:
    return Resource(namespace or "", name, str(meta.get("uid", "")), meta.get("generation"))


def observed(res: Resource, memo: Any, inventory: Inventory | None, pool: PoolView | None = None) -> Observed:
    """The cluster from the informers (memory, no API request), and the pool if looked at."""
    mine = memory(memo)
    if inventory is None:
        return Observed(pools={}, applied=mine.applied, pool=pool, applied_children=mine.applied_children())
    key = (res.namespace, res.name)
    deployments = inventory.deployments.get(key)
    sets = inventory.leader_worker_sets.get(key)
    by_role = {role: inventory.deployments.get((res.namespace, pool_name(res.name, role))) for role in ROLES}
    return Observed(
        pools=pools(inventory.nodes.values(), inventory.gpu_pods.values(), exclude_owner_uid=res.uid),
        deployment=deployments[0] if deployments else None,
        pods=tuple(inventory.engine_pods.get(key)),
        applied=mine.applied,
        pool=pool,
        leader_worker_set=sets[0] if sets else None,
        children=tuple(inventory.children_of(*key)),
        applied_children=mine.applied_children(),
        pool_workloads={role: views[0] for role, views in by_role.items() if views},
    )


_MEMORY_LOCK = threading.Lock()  # spec handling runs in the workers, the timers in the loop


def memory(memo: Any) -> ServiceMemory:
    """The service's memory (kvscale.control.memory), one frozen value under one memo key."""
    found = memo.get(MEMO_KEY)
    return found if isinstance(found, ServiceMemory) else ServiceMemory()


def update(memo: Any, change: Callable[[ServiceMemory], ServiceMemory]) -> None:
    """Store `change` of the memory as it is now: each handler changes only the fields it owns,
    and one that awaited meanwhile does not write back what another stored."""
    with _MEMORY_LOCK:
        memo[MEMO_KEY] = change(memory(memo))


def remember(memo: Any, result: Result) -> None:
    """What `result` applied, deleted or pruned."""
    update(memo, lambda m: m.remembered(result))


def confirmed(rt: Runtime, res: Resource, seen: Observed, names: list[tuple[str, str]]) -> Observed:
    """The informers' view with `names` (kind, name) read from the API server: a watch may lag
    behind a child just applied, and does not see objects without kvscale's labels."""
    read = [rt.kube.read(owned.BY_KIND[kind], res.namespace, name) for kind, name in names if kind in owned.BY_KIND]
    kept = [v for v in seen.children if (v.kind, v.name) not in names]
    return replace(seen, children=(*kept, *(v for v in read if v is not None)))


def register(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    """Every handler of the operator, bound to the runtime objects."""
    _lifecycle(registry, rt)
    _timers(registry, rt)
    budget_handlers(registry, rt.budgets, rt.settings.scale_interval_s, rt.catalog.gpus)
    capacity_handlers(registry, rt, spread)


@dataclass(frozen=True)
class Call:
    """One handler call: the object, its spec parsed once (the Intent, or the SpecError that
    says what to fix), kopf's patch and per-object memo, the informers."""

    body: kopf.Body
    intent: Intent | SpecError
    patch: kopf.Patch
    memo: Any
    res: Resource
    before: InferenceServiceStatus
    inventory: Inventory | None

    @classmethod
    def of(cls, rt: Runtime, kw: Mapping[str, Any]) -> Call:
        res = resource(kw["meta"], kw["namespace"], kw["name"])
        intent = read_spec(kw["spec"])
        return cls(kw["body"], intent, kw["patch"], kw["memo"], res, parse_status(kw["status"]), rt.inventory)

    def valid(self) -> Intent:
        """The Intent; a tick with a spec that cannot be read fails (spec handling says why)."""
        if isinstance(self.intent, SpecError):
            raise self.intent
        return self.intent

    def observed(self, rt: Runtime | None = None, base: Observed | None = None) -> Observed:
        """The informers' view (`base`: as read earlier in this call, its GPU pools not built
        again); with `rt`, also the InferencePool the spec asks for and, in mode auto, any
        object holding a child's name that the informers do not show as this resource's (API
        reads: such an object is someone else's, and is left alone)."""
        pool = self._pool(rt) if rt is not None else None
        seen = observed(self.res, self.memo, self.inventory, pool) if base is None else replace(base, pool=pool)
        if rt is None or (isinstance(self.intent, Intent) and self.intent.scaling.mode == "recommend"):
            return seen
        names = [(k.kind, owned.child_name(k.kind, self.res.name)) for k in owned.KINDS if k.named_as_owner]
        unknown = [
            (kind, name)
            for kind, name in names
            if not ((v := owned.find(seen.children, kind, name)) and v.owned_by(self.res.uid))
        ]
        return confirmed(rt, self.res, seen, unknown) if unknown else seen

    def _pool(self, rt: Runtime) -> PoolView | None:
        name = self.intent.routing.pool(self.res.name) if isinstance(self.intent, Intent) else None
        return None if name is None else rt.kube.pool_view(self.res.namespace, name)

    def apply(self, rt: Runtime, result: Result) -> None:
        remember(self.memo, result)
        effects.apply(rt.kube, self.body, self.patch, self.before, result, self.res)

    async def apply_async(self, rt: Runtime, result: Result) -> None:
        """Writes to the API server in the workers; a status-only result in the loop."""
        if effects.writes(result):
            await rt.io(self.apply, rt, result)
        else:
            self.apply(rt, result)


def _lifecycle(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        if rt.settings.prometheus_url:
            prometheus_clients(rt, rt.settings.prometheus_url)
        if rt.inventory is not None:
            unsynced = await asyncio.to_thread(rt.inventory.start, INVENTORY_SYNC_S)
            if unsynced:
                raise kopf.PermanentError(f"watches not synced after {INVENTORY_SYNC_S:.0f}s: {', '.join(unsynced)}")
        # kopf's watches start after this: not while a CRD's storage initializes (kvscale.operator.served)
        await asyncio.to_thread(wait_until_served, rt.kube.api, rt.namespaces)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        rt.stopping = True
        if rt.inventory is not None:
            rt.inventory.stop()
        for prometheus in (rt.prometheus, rt.workload_prometheus):
            if prometheus is not None:
                await prometheus.aclose()
        for pool in (rt.workers, rt.resume_workers):
            pool.shutdown(wait=False, cancel_futures=True)

    @kopf.on.create(GROUP, VERSION, PLURAL, id="on_spec", registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, id="on_spec", field="spec", registry=registry)
    @kopf.on.resume(GROUP, VERSION, PLURAL, id="on_spec", registry=registry)
    async def on_spec(reason: str, **kwargs: Any) -> None:
        resumed = reason == kopf.Reason.RESUME  # on their own pool: see spec_changed
        await rt.io(spec_changed, rt, Call.of(rt, kwargs), resumed, pool=rt.pool(resumed))

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="forget", optional=True, registry=registry)
    async def forget(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
        update(memo, lambda m: replace(m, deleted=True))  # a tick in flight exports nothing after this
        rt.budgets.forget(namespace or "", name)
        forget_series(namespace or "", name)


def forget_series(namespace: str, name: str) -> None:
    """The operator's own series of a deleted service, its disaggregated plan's pools' too."""
    for series in (name, *(pool_name(name, role) for role in ROLES)):
        telemetry.forget(namespace, series)


def prometheus_clients(rt: Runtime, url: str) -> None:
    """The ticks' client with its batched reader, and the workload reads' (a longer deadline),
    one count of errors."""
    rt.prometheus = AsyncPrometheusClient(url, timeout_s=rt.observation_deadline_s(), retries=1)
    telemetry.count_prometheus_errors(rt.prometheus.errors)
    rt.workload_prometheus = AsyncPrometheusClient(url, timeout_s=rt.workload_deadline_s(), retries=1)
    rt.workload_prometheus.errors = rt.prometheus.errors
    batch_age_s = rt.settings.scale_interval_s / BATCHES_PER_INTERVAL
    rt.reader = FleetReader(rt.prometheus, tick_queries(rt.settings.metrics_window), batch_age_s)
    s = rt.settings
    # Each service reads its workload once per interval at its own phase; a batch at most half
    # an interval old serves them all (a 10-minute window moves little in that time).
    reads = workload_reads(s.workload_window, s.metrics_window, s.burst_window)
    rt.workload_reader = FleetReader(rt.workload_prometheus, reads, s.workload_interval_s / 2)


def _timers(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    status_s, scale_s = rt.settings.status_interval_s, rt.settings.scale_interval_s

    @kopf.timer(GROUP, VERSION, PLURAL, id="refresh", interval=status_s, initial_delay=status_s, registry=registry)
    async def refresh_timer(**kwargs: Any) -> None:
        await status_tick(rt, Call.of(rt, kwargs))

    if status_s > DEPLOYING_POLL_S:
        # While Deploying, readiness is looked at every second (the informers' cache, no API reads):
        # phase Ready follows the Deployment within about a second, not at the next status tick.
        @kopf.timer(
            GROUP, VERSION, PLURAL, id="deploying", interval=DEPLOYING_POLL_S, when=deploying, registry=registry
        )
        async def deploying_timer(**kwargs: Any) -> None:
            await status_tick(rt, Call.of(rt, kwargs))

    @kopf.timer(
        GROUP, VERSION, PLURAL, id="autoscale", interval=scale_s, initial_delay=spread(scale_s), registry=registry
    )
    async def autoscale_timer(**kwargs: Any) -> None:
        await scale_tick(rt, Call.of(rt, kwargs))

    work_s = rt.settings.workload_interval_s

    @kopf.timer(GROUP, VERSION, PLURAL, id="workload", interval=work_s, initial_delay=spread(work_s), registry=registry)
    async def workload_timer(**kwargs: Any) -> None:
        await observe_workload(rt, Call.of(rt, kwargs))

    cal_s = rt.settings.calibration_interval_s
    if cal_s > 0:  # KVSCALE_CALIBRATION_INTERVAL=off

        @kopf.timer(
            GROUP, VERSION, PLURAL, id="calibration", interval=cal_s, initial_delay=spread(cal_s), registry=registry
        )
        async def calibration_timer(**kwargs: Any) -> None:
            await calibrate_tick(rt, Call.of(rt, kwargs))


DEPLOYING_POLL_S = 1.0


def deploying(status: Mapping[str, Any] | None, **_: Any) -> bool:
    """The deploying timer's filter: kopf runs it only while this holds."""
    return (status or {}).get("phase") == "Deploying"


def spread(interval_s: float) -> Callable[..., float]:
    """A first delay of one to two intervals, fixed per object (from its uid): the ticks of
    services created together do not stay aligned and ask Prometheus in one burst."""

    def delay(meta: Mapping[str, Any], **_: Any) -> float:
        phase = zlib.crc32(str(meta.get("uid", "")).encode()) % 1000 / 1000
        return interval_s * (1.0 + phase)

    return delay


def spec_changed(rt: Runtime, call: Call, resumed: bool = False) -> None:
    """Create, spec change, resume: plan and build the children. A resume that would change
    nothing (same status, every child in place as built) writes nothing and posts no Event."""
    with telemetry.RECONCILE_SECONDS.time():
        seen = call.observed(rt)
        result = under_budget(
            rt,
            call,
            reconcile(call.intent, call.res, call.before, seen, planning_catalog_of(rt, call), rt.settings),
            seen,
        )
    if result.retry is not None and result.retry.delay_s is None:
        telemetry.ERRORS.labels("reconcile").inc()
    if resumed and settled(result, call.before, seen, call.res):
        remember(call.memo, result)  # what the status tick restores if a child goes
        return
    call.apply(rt, result)


def under_budget(rt: Runtime, call: Call, result: Result, seen: Observed) -> Result:
    """A reconcile's workload within what the governing GPUBudget has free now (kvscale.control.budget)."""
    if disaggregated(result.status):
        return _pools_under_budget(rt, call, result, seen)
    if not result.apply or result.status.plan is None:
        return result
    intent = call.intent
    if isinstance(intent, SpecError):
        return result
    labels = (call.body.get("metadata") or {}).get("labels") or {}
    existing = seen.workload(multi_node(result.status))
    return cap_deploy(rt.budgets, call.res, labels, intent, result, existing, dt.datetime.now(dt.UTC))


def _pools_under_budget(rt: Runtime, call: Call, result: Result, seen: Observed) -> Result:
    """New pools on GPU types a GPUBudget governs start within the GPUs it has free now
    (kvscale.control.pool_budget.cap_pools: the plan's counts where they fit, else the split that
    serves the most); with no room for one worker of each nothing is deployed and the service
    waits (kvscale.control.reconcile.pools_under_budget). Running pools: their tick's budget stage."""
    plan = result.status.plan
    if not result.apply or seen.pool_workloads or plan is None or plan.prefill is None or plan.decode is None:
        return result
    labels = (call.body.get("metadata") or {}).get("labels") or {}
    pools: dict[Role, PoolPlanStatus] = {"prefill": plan.prefill, "decode": plan.decode}
    planned = {role: pool.replicas for role, pool in pools.items()}
    intent = call.intent
    priority = 0 if isinstance(intent, SpecError) else intent.scaling.priority
    counts = cap_pools(rt.budgets, call.res, labels, priority, pools, planned, dt.datetime.now(dt.UTC))
    if counts is None:
        governed = rt.budgets.view().governors(
            call.res.namespace, labels, (plan.prefill.gpu_type, plan.decode.gpu_type)
        )
        return pools_under_budget(call.before, call.res, governed, rt.settings.retry_backoff_s)
    return capped_pools(result, call.res.name, counts)


async def status_tick(rt: Runtime, call: Call) -> None:
    """Readiness, scheduling, drift; a re-plan when the GPU type stays unschedulable. Pure and
    cheap in the loop; a re-plan (planner, API reads) in the workers."""
    if unseen_write(call, time.monotonic()):
        return
    try:
        now = dt.datetime.now(dt.UTC)
        seen = call.observed()
        suspects = owned.check(seen.applied_children, seen.children, call.res.uid)
        if suspects.missing or suspects.foreign:  # the informers may lag, and do not see foreign objects
            names = [owned.key(b) for b in suspects.missing] + [(v.kind, v.name) for v in suspects.foreign]
            seen = await rt.io(confirmed, rt, call.res, seen, names)
        if pool_api_missing(call.before) or replans(call.before, seen, rt.settings, now) or conflicted(call.before):
            seen = await rt.io(call.observed, rt)  # the InferencePool too: a reconcile follows
            catalog = await rt.io(planning_catalog_of, rt, call)  # the calibrated profile, as reconcile plans
            result = await rt.io(refresh, call.intent, call.res, call.before, seen, catalog, rt.settings, now)
        else:
            result = refresh(call.intent, call.res, call.before, seen, rt.catalog, rt.settings, now)
        result = None if result is None else under_budget(rt, call, result, seen)
        result = refusals(rt, call, result, now)
    except Exception as exc:  # counted and shown in status; the timer runs again
        effects.timer_failed("refresh", call.body, call.patch, call.before, call.res, exc)
        return
    if result is not None:
        result = replace(result, status=mark_synced("refresh", result.status, call.res.generation))
        await call.apply_async(rt, result)
        if status_patch(call.before, result.status):
            written = (str(call.body.get("metadata", {}).get("resourceVersion", "")), time.monotonic())
            update(call.memo, lambda m: replace(m, status_written=written))


UNSEEN_WRITE_S = 30.0  # a status patch kopf failed to apply is not waited for longer


def unseen_write(call: Call, now_s: float) -> bool:
    """Whether the status tick's last status write is not in this body yet. kopf hands a timer
    the body its watch last delivered, which on a loaded API server can predate the previous
    tick's patch; a tick on it repeats that tick's transition (a CI run posted
    GPUTypeUnschedulable twice: a second re-plan away from the GPU type just left)."""
    written = memory(call.memo).status_written
    version = str(call.body.get("metadata", {}).get("resourceVersion", ""))
    return written is not None and written[0] == version and now_s - written[1] < UNSEEN_WRITE_S


def refusals(rt: Runtime, call: Call, result: Result | None, now: dt.datetime) -> Result | None:
    """The BudgetsWatched condition and its Event (kvscale.operator.access) on the status tick's result."""
    if not rt.access.checked:  # nothing known yet: a condition a previous run set stays until the check
        return result
    status = call.before if result is None else result.status
    changed = budgets_watched(status, call.res, rt.access.budgets, now)
    if changed is None:
        return result
    new, events = changed
    if result is None:
        return Result(status=new, events=events)
    return replace(result, status=new, events=(*result.events, *events))


def _pin_under_budget(rt: Runtime, call: Call, intent: Intent, pinned: Result, seen: DeploymentView | None) -> Result:
    """A pinned service's tick held to its GPUBudget's grant (kvscale.control.budget.govern_pin)."""
    labels = (call.body.get("metadata") or {}).get("labels") or {}
    return govern_pin(rt.budgets, call.res, labels, intent, pinned, seen, dt.datetime.now(dt.UTC), budget_ttl_s(rt))


async def scale_tick(rt: Runtime, call: Call) -> None:
    """Observe (async, within the deadline), ask the policy, scale (mode auto) or only
    recommend. The tick's wall time is measured (kvscale_tick_duration_seconds)."""
    if not planned(call.before):
        return
    if disaggregated(call.before):
        await _scale_pools(rt, call)
        return
    started = time.monotonic()
    try:
        intent = call.valid()
        seen = call.observed()  # the GPU pools built once for the tick
        workload = seen.workload(multi_node(call.before))
        start = fleet(intent, call.before, workload, call.res.generation)
        if start is not None and not isinstance(start, Fleet):  # a pin counts against a GPUBudget too
            start = _pin_under_budget(rt, call, intent, start, workload)
        if isinstance(start, Fleet):
            scaled = await _autoscale(rt, call, intent, start, seen)
    except Exception as exc:  # counted and shown in status; the timer runs again
        if not rt.stopping:  # at shutdown the closed clients fail a tick in flight: not news
            effects.timer_failed("autoscale", call.body, call.patch, call.before, call.res, exc)
        return
    if not isinstance(start, Fleet):
        if start is not None:  # pinned replicas: recorded, the policy is not asked
            await _drain_and_apply(rt, call, intent, workload, seen.pods, start)
        return
    done = scaled.tick
    update(call.memo, lambda now: now.after_tick(scaled.memory, done.result.scale_to))
    if not memory(call.memo).deleted:
        telemetry.export(call.res.namespace, call.res.name, done.gauges)
        for role in ROLES:  # an earlier disaggregated plan's pools' series
            if telemetry.exported(call.res.namespace, pool_name(call.res.name, role)):
                telemetry.forget(call.res.namespace, pool_name(call.res.name, role))
    synced = replace(done.result, status=mark_synced("autoscale", done.result.status, call.res.generation))
    await _drain_and_apply(rt, call, intent, workload, seen.pods, synced)
    telemetry.TICK_SECONDS.observe(time.monotonic() - started)


async def _scale_pools(rt: Runtime, call: Call) -> None:
    """A disaggregated plan's pools, each on its own metrics (kvscale.control.pool_scaling):
    both Deployments seen, mode auto and no pinned count; otherwise they stay where reconcile
    put them."""
    started = time.monotonic()
    try:
        intent = call.valid()
        if not pool_scaling.autoscaled(intent):
            return
        views, plan = call.observed().pool_workloads, call.before.plan
        if set(views) != set(ROLES) or plan is None:
            return  # a pool's Deployment not seen yet: reconcile and the status tick come first
        readings: dict[str, pool_scaling.PoolReading] = {}
        for role in ROLES:
            view = views[role]
            start = Fleet(view.replicas, view.ready_replicas, plan)
            name = pool_name(call.res.name, role)
            res = replace(call.res, name=name)
            obs, missing = await _observe(rt, res, intent.engine, intent.slo.percentile, start, view.replicas == 0)
            readings[role] = pool_scaling.PoolReading(obs, missing, view)
        catalog = planning_catalog_of(rt, call, cached=True)
        now = dt.datetime.now(dt.UTC)
        labels = (call.body.get("metadata") or {}).get("labels") or {}
        governor = pool_scaling.PoolsGovernor(rt.budgets, labels, budget_ttl_s(rt), call.before)
        done = pool_scaling.tick_pools(
            intent, call.res, call.before, readings, memory(call.memo).pools, catalog, rt.settings, now, governor
        )
    except Exception as exc:  # counted and shown in status; the timer runs again
        if not rt.stopping:
            effects.timer_failed("autoscale", call.body, call.patch, call.before, call.res, exc)
        return
    update(call.memo, lambda now: now.pools_ticked(done.memory, done.scaled))
    if not memory(call.memo).deleted:
        for pool, gauges in done.gauges.items():
            telemetry.export(call.res.namespace, pool, gauges)
        telemetry.forget(call.res.namespace, call.res.name)  # an earlier aggregated plan's series
    synced = replace(done.result, status=mark_synced("autoscale", done.result.status, call.res.generation))
    await call.apply_async(rt, synced)
    telemetry.TICK_SECONDS.observe(time.monotonic() - started)


async def _drain_and_apply(
    rt: Runtime, call: Call, intent: Intent, current: DeploymentView | None, pods: Any, result: Result
) -> None:
    """The tick's result applied; before it, a scale-down marks the least-loaded pods to go first,
    and pods the budget took drain within its grace (kvscale.operator.drain)."""
    replicas = current.replicas if current is not None else None
    await mark_scale_down(rt.kube, rt.prometheus, rt.io, call.res, intent.engine, replicas, pods, result)
    labels = (call.body.get("metadata") or {}).get("labels") or {}
    gpu_type = current.gpu_type if current is not None else None
    grace_s = preemption_grace_s(rt.budgets, call.res.namespace, labels, gpu_type)
    await shorten_preempted(rt.kube, rt.io, call.res, grace_s, result.status, pods)
    await call.apply_async(rt, result)


async def _autoscale(rt: Runtime, call: Call, intent: Intent, start: Fleet, seen: Observed) -> Autoscaled:
    """Read (the engines' metrics, the gateway's queue, the cold starts other replicas showed),
    decide (kvscale.control.autoscale), and make a GPUBudget's move if it grants another type."""
    podless = intent.scaling.mode == "auto" and rt.inventory is not None and not seen.pods
    obs, missing = await _observe(rt, call.res, intent.engine, intent.slo.percentile, start, podless)
    queue = await _gateway_queue(rt, call.res, intent)
    key = cold_start_key(intent, start.plan)
    read = Readings(obs, missing, queue, rt.cold_starts.get(key, ()), seen.pods)
    labels = (call.body.get("metadata") or {}).get("labels") or {}
    governor = Governor(rt.budgets, labels, budget_ttl_s(rt))
    now = dt.datetime.now(dt.UTC)
    scaled = autoscale(
        intent,
        call.res,
        call.before,
        start,
        read,
        memory(call.memo),
        governor,
        planning_catalog_of(rt, call, cached=True),  # capacity per replica as the calibrated plan's
        rt.settings,
        now,
    )
    if scaled.fresh:  # recorded for the others: a new service starts from what these showed
        rt.cold_starts[key] = (*read.learned, *scaled.fresh)[-COLD_START_SAMPLES:]
    if scaled.move is None:
        return scaled
    status = scaled.tick.result.status
    result = await rt.io(_move, rt, call, status, start.plan, scaled.move, scaled.budget, now, seen)
    return moved_tick(scaled, result, start.plan)


async def _gateway_queue(rt: Runtime, res: Resource, intent: Intent) -> float | None:
    """Requests waiting at the gateway, read only where minReplicas is 0 and a gateway holds them."""
    queries = queue_queries(intent, res)
    if not (wants_zero(intent) and queries and rt.prometheus is not None):
        return None
    readings = [await rt.prometheus.scalar(q, timeout_s=rt.observation_deadline_s()) for q in queries]
    return gateway_queue([r if isinstance(r, float) else None for r in readings])


async def read_workload(rt: Runtime, call: Call, engine: str) -> tuple[ObservedWorkload | None, str | None]:
    """The service's observed workload over the operator's workload window (and why not, when
    it could not be read): what the workload timer and the capacity search both start from. A
    disaggregated plan's is its decode pool's: every request ends there, with its prompt and its
    whole output (behind a P/D router the prefill pool counts each request too, with one output
    token; behind a plain Service only the decode pods serve)."""
    reader = rt.workload_reader
    if reader is None:  # the callers return before this without one
        return None, "no Prometheus to read the workload from"
    s = rt.settings
    name = pool_name(call.res.name, SERVING_ROLE) if disaggregated(call.before) else call.res.name
    return await observe_workload_batched(
        reader,
        engine,
        call.res.namespace,
        name,
        time.time(),
        s.workload_window,
        s.metrics_window,
        deadline_s=rt.workload_deadline_s(),
        burst_window=s.burst_window,
    )


async def observe_workload(rt: Runtime, call: Call) -> None:
    """The observed workload into status, and a re-plan when it drifted long enough (the
    planner and the API reads in the workers)."""
    if not planned(call.before) or call.before.phase == "Recommended" or rt.workload_reader is None:
        return  # nothing runs in recommend mode: no engine to read
    if predates(memory(call.memo).replanned, call.before, call.res.generation):
        return  # the status handed in is older than this operator's own re-plan: wait for the watch
    try:
        intent = call.valid()
        s = rt.settings
        workload, missing = await read_workload(rt, call, intent.engine)
        now = dt.datetime.now(dt.UTC)
        catalog = await rt.io(planning_catalog_of, rt, call)
        args = (intent, call.res, call.before, lambda: call.observed(rt), workload, missing, catalog, s, now)
        result = await rt.io(workload_tick, *args)
        result = None if result is None else under_budget(rt, call, result, call.observed())
    except Exception as exc:  # counted and shown in status; the timer runs again
        if not rt.stopping:
            effects.timer_failed("workload", call.body, call.patch, call.before, call.res, exc)
        return
    if result is not None:
        await call.apply_async(rt, replace(result, status=mark_synced("workload", result.status, call.res.generation)))
        # Marked once written: a write refused (a conflict on the Deployment, retried) left the
        # mark on a re-plan the status never got, and every later tick waited for it.
        if any(e.reason == "Replanned" for e in result.events) and result.status.plan is not None:
            replanned = (call.res.generation, result.status.plan.workload)
            update(call.memo, lambda m: replace(m, replanned=replanned))


def _move(
    rt: Runtime,
    call: Call,
    status: InferenceServiceStatus,
    before: PlanStatus,
    grant: Grant,
    budget: str,
    now: dt.datetime,
    base: Observed,
) -> Result | None:
    """A budget's move: the plan re-made on the granted GPU type, at the granted replicas
    within what that type has free now (the tick's view of the cluster, and the API's reads)."""
    seen = call.observed(rt, base)
    catalog = planning_catalog_of(rt, call)
    result = replan(BudgetMove(grant, budget), call.intent, call.res, status, seen, catalog, rt.settings, now)
    out = moved(result, before, grant)
    return None if out is None else under_budget(rt, call, out, seen)


async def _observe(
    rt: Runtime, res: Resource, engine: str, percentile: float, start: Fleet, podless: bool = False
) -> tuple[Observation, str | None]:
    """From the batched reader: one query per metric for every service, not ~13 per service.
    A deployed service without engine pods asks nothing (there is nothing to read)."""
    now = time.time()
    starting = max(0, start.current - start.ready)
    unread = Observation(time_s=now, ready_replicas=start.ready, starting_replicas=starting, stale=True)
    if rt.reader is None:
        return unread, "KVSCALE_PROMETHEUS_URL is not set"
    if podless:
        return unread, NO_ENGINE_PODS
    s = rt.settings
    return await observe_batched(
        rt.reader,
        engine,
        res.namespace,
        res.name,
        percentile,
        start.ready,
        starting,
        now,
        s.metrics_stale_after_s,
        rt.observation_deadline_s(),
    )


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's own settings: progress in annotations under kvscale.io/ (the diff base as a digest of
    the spec, kvscale.operator.diffbase), standalone."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvscale.io")
    settings.persistence.diffbase_storage = DigestDiffBaseStorage(prefix="kvscale.io", key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True
    # kopf keeps a finalizer while the per-object timers run, so it can stop them cleanly.
    settings.persistence.finalizer = "kvscale.io/finalizer"
    # A refused or failing request is retried without end (capped backoff): after kopf's own nine
    # attempts one refused watch (403) ended the whole operator (kvscale.operator.access).
    settings.networking.error_backoffs = RetryForever()
