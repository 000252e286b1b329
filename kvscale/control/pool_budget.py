"""GPU budgets over a disaggregated plan's two pools (kvscale.control.budget for the rest).

Each pool is a want in the budget book of its own (`<namespace>/<name>-prefill`,
`<namespace>/<name>-decode`: the budget's status lists both), with the service's priority and
labels and a floor of one worker (a pool at zero loses every request), so the allocator weighs
the pools against the budget's other services as it weighs any service. What the two pools get
together is then split between them by what the split serves, not in proportion to their wants
(NVIDIA Dynamo's planner scales both pools down proportionally under a GPU budget): a request
needs both pools, so the service carries min(P x prefill rate, D x decode rate) requests/s, and
the split is the one that carries the most within the pools' GPUs, each pool within its want
(kvscale.autoscaling.pool_capacity.split_pools, which the simulator's budget stage runs too).
That re-split applies where both pools are on one GPU type under one budget; pools on two types
keep each type's grant.

Scale-ups go only into GPUs free now (as an aggregated service's), and a reconcile that deploys
new pools starts them within the GPUs free then (`cap_pools`); with no room for one worker of
each, nothing is deployed and the service waits (PoolsUnderBudget, retried).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from kvscale.api.budget import service_key
from kvscale.api.intent import Intent
from kvscale.api.models import InferenceServiceStatus, PoolPlanStatus
from kvscale.autoscaling.budget import Demand, Option
from kvscale.autoscaling.pool_capacity import split_pools
from kvscale.control.budget import CONDITION, WITHIN, BudgetBook, Entry, free_gpus, service_allocation
from kvscale.control.reconcile import DEPLOYMENT, Event, Resource, Result
from kvscale.control.status import condition, with_conditions, without_condition
from kvscale.planner.disaggregated import Role

ROLES: tuple[Role, ...] = ("prefill", "decode")
_N = TypeVar("_N", int, float)


def _pair(by_role: Mapping[Role, _N]) -> tuple[_N, _N]:
    return by_role["prefill"], by_role["decode"]


def pool_key(res: Resource, role: Role) -> str:
    return service_key(res.namespace, f"{res.name}-{role}")


@dataclass(frozen=True)
class PoolsGoverned:
    counts: dict[Role, int]  # what each pool runs after the budget
    status: InferenceServiceStatus  # with HeldByBudget (or without it, no budget governing)
    events: tuple[Event, ...]
    budget: str = ""  # the governing budget ("": none)


def _gpus(pool: PoolPlanStatus) -> int:
    return max(pool.tensor_parallel, 1)


def govern_pools(
    book: BudgetBook,
    res: Resource,
    labels: Mapping[str, str],
    intent: Intent,
    before: InferenceServiceStatus,
    status: InferenceServiceStatus,
    pools: Mapping[Role, PoolPlanStatus],
    current: Mapping[Role, int],
    wants: Mapping[Role, int],
    now: dt.datetime,
    ttl_s: float,
) -> PoolsGoverned:
    """The pools' tick under the budgets that bound their GPU types (unchanged without one):
    both wants recorded, the grants taken and split by what they serve, scale-ups into free
    GPUs only, the HeldByBudget condition and its Event."""
    view = book.view()
    types = {role: pools[role].gpu_type for role in ROLES}
    governed = view.governors(res.namespace, labels, types.values())
    if not governed or intent.scaling.mode != "auto":
        quiet = without_condition(status, CONDITION) if any(c.type == CONDITION for c in status.conditions) else status
        return PoolsGoverned(dict(wants), quiet, ())
    now_s = now.timestamp()
    floor = max(1, intent.scaling.min_replicas)
    entries = {}
    for role in ROLES:
        pool, key = pools[role], pool_key(res, role)
        option = Option(pool.gpu_type, _gpus(pool), max(wants[role], floor), max(pool.rate_per_worker, 0.0))
        demand = Demand(key, (option,), intent.scaling.priority, floor, res.namespace, 0.0, pool.gpu_type, True, True)
        entries[role] = Entry(
            governed.get(pool.gpu_type, min(governed.values())),
            demand,
            res.namespace,
            f"{res.name}-{role}",
            current[role] * _gpus(pool),
            pool.gpu_type,
            now_s,
            (),
            tuple(sorted(labels.items())),
        )
        book.record(entries[role], now_s, ttl_s)
    view = book.view()
    allocation = service_allocation(view, pool_key(res, "prefill"), now_s, ttl_s)
    book.remember(allocation)
    grants = {role: allocation.grant(pool_key(res, role)) for role in ROLES}
    counts: dict[Role, int] = {role: grants[role].replicas for role in ROLES}
    gpus = {role: _gpus(pools[role]) for role in ROLES}
    one_budget = types["prefill"] == types["decode"] and len({governed.get(t) for t in types.values()}) == 1
    split = ""
    if one_budget:
        total = sum(counts[r] * gpus[r] for r in ROLES)
        rates = {role: pools[role].rate_per_worker for role in ROLES}
        p, d = split_pools(
            total, (max(wants["prefill"], floor), max(wants["decode"], floor)), _pair(rates), _pair(gpus)
        )
        counts = {"prefill": p, "decode": d}
        split = (
            f"; the {total} GPUs split to serve the most requests/s (prefill {counts['prefill']} x "
            f"{rates['prefill']:.2f}, decode {counts['decode']} x {rates['decode']:.2f} req/s), not in proportion"
        )
    for role in ROLES:  # scale-ups only into GPUs free now
        if counts[role] > current[role]:
            free = free_gpus(view, pool_key(res, role), res.namespace, labels, types[role]) - current[role] * gpus[role]
            if not math.isinf(free):
                counts[role] = current[role] + max(0, min(counts[role] - current[role], math.floor(free / gpus[role])))
            book.record(replace(entries[role], held_gpus=counts[role] * gpus[role]), now_s, ttl_s)
    budget = governed.get(types["decode"]) or min(governed.values())
    held = any(counts[r] < wants[r] for r in ROLES)
    parts = [f"{r} wanted {wants[r]}, gets {counts[r]} on {types[r]} x{gpus[r]}" for r in ROLES]
    message = f"budget {budget}: {'; '.join(parts)}{split}"
    cond = condition(
        status, CONDITION, held, "BudgetLimit" if held else "WithinBudget", message[:1000], res.generation, now
    )
    events: list[Event] = []
    key = service_key(res.namespace, res.name)
    last = view.posted.get(key)
    previous = next((c for c in before.conditions if c.type == CONDITION), None)
    if held:
        said_before = previous.message if previous is not None and previous.status == "True" else None
        if cond.message != (last if last is not None else said_before):
            events.append(Event("Warning", CONDITION, cond.message))
            book.post(key, cond.message)
    elif (last != WITHIN) if last is not None else (previous is not None and previous.status == "True"):
        events.append(Event("Normal", "WithinBudget", cond.message))
        book.post(key, WITHIN)
    return PoolsGoverned(counts, with_conditions(status, cond), tuple(events), budget)


def cap_pools(
    book: BudgetBook,
    res: Resource,
    labels: Mapping[str, str],
    priority: int,
    pools: Mapping[Role, PoolPlanStatus],
    planned: Mapping[Role, int],
    now: dt.datetime,
) -> dict[Role, int] | None:
    """New pools' starting counts within the GPUs their budget has free now (the plan's counts
    where they fit; the split that serves the most otherwise), recorded in the book at once so
    that services deployed together do not count the same GPUs; None: not one worker of each
    fits (nothing is deployed). Pools on GPU types no budget limits: the plan's counts."""
    view = book.view()
    types = {role: pools[role].gpu_type for role in ROLES}
    governed = view.governors(res.namespace, labels, types.values())
    if not governed:
        return dict(planned)
    gpus = {role: _gpus(pools[role]) for role in ROLES}
    if types["prefill"] == types["decode"]:
        free = free_gpus(view, pool_key(res, "prefill"), res.namespace, labels, types["prefill"])
        # free_gpus leaves out the prefill pool's own want; the decode pool's earlier one is this service's too
        earlier = view.entries.get(pool_key(res, "decode"))
        free += earlier.holds(types["decode"]) if earlier is not None else 0
        if free < gpus["prefill"] + gpus["decode"]:
            return None
        need = sum(planned[r] * gpus[r] for r in ROLES)
        rates = {role: pools[role].rate_per_worker for role in ROLES}
        if need <= free:
            counts = dict(planned)
        else:
            p, d = split_pools(free, _pair(planned), _pair(rates), _pair(gpus))
            counts = {"prefill": p, "decode": d}
    else:
        counts = {}
        for role in ROLES:
            room = free_gpus(view, pool_key(res, role), res.namespace, labels, types[role])
            if room < gpus[role]:
                return None
            counts[role] = planned[role] if math.isinf(room) else min(planned[role], math.floor(room / gpus[role]))
    now_s = now.timestamp()
    for role in ROLES:
        pool = pools[role]
        option = Option(pool.gpu_type, gpus[role], counts[role], max(pool.rate_per_worker, 0.0))
        demand = Demand(pool_key(res, role), (option,), priority, 1, res.namespace, 0.0, pool.gpu_type, True, True)
        budget = governed.get(pool.gpu_type, min(governed.values()))
        book.record(
            Entry(
                budget,
                demand,
                res.namespace,
                f"{res.name}-{role}",
                counts[role] * gpus[role],
                pool.gpu_type,
                now_s,
                (),
                tuple(sorted(labels.items())),
            )
        )
    return counts


def capped_pools(result: Result, name: str, counts: Mapping[Role, int]) -> Result:
    """A reconcile's result with its pool Deployments and status.plan at `counts` (cap_pools)."""
    if all(_planned(result, r) == counts[r] for r in ROLES):
        return result
    names = {f"{name}-{role}": role for role in ROLES}
    bodies = []
    for body in result.apply:
        role = names.get(str((body.get("metadata") or {}).get("name"))) if body.get("kind") == DEPLOYMENT else None
        if role is not None:
            body = {**body, "spec": {**(body.get("spec") or {}), "replicas": counts[role]}}
        bodies.append(body)
    plan = result.status.plan
    assert plan is not None and plan.prefill is not None and plan.decode is not None
    new_plan = plan.model_copy(
        update={
            "prefill": plan.prefill.model_copy(update={"replicas": counts["prefill"]}),
            "decode": plan.decode.model_copy(update={"replicas": counts["decode"]}),
        }
    )
    status = result.status.model_copy(
        update={"plan": new_plan, "replicas": counts["decode"], "desired_replicas": counts["decode"]}
    )
    held = (
        f"the GPUBudget's free GPUs start the pools at prefill {counts['prefill']} and decode {counts['decode']} "
        f"(the plan: {_planned(result, 'prefill')} and {_planned(result, 'decode')})"
    )
    return replace(
        result, apply=tuple(bodies), status=status, events=(*result.events, Event("Normal", CONDITION, held))
    )


def _planned(result: Result, role: Role) -> int:
    plan = result.status.plan
    pool = getattr(plan, role, None) if plan is not None else None
    return int(pool.replicas) if pool is not None else 0
