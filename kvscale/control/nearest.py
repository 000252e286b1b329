"""The nearest thing this cluster can serve when a spec cannot be met (pure).

The planner's own suggestion for a binding replica limit is sized on the catalog ("raise
spec.scaling.maxReplicas to 10" of 8-GPU H100 replicas, on a cluster of 16 H100): true, and of
no use on this cluster. Here the question is put to the cluster's GPUs instead: the highest
request rate the spec's SLO can be met at on the GPUs free to this service, within
spec.scaling.maxReplicas and with every free GPU of one type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from kvscale.api.intent import Intent, SpecError, allowed_gpus, plan_request, resolve_model
from kvscale.control.inventory import GpuPool
from kvscale.control.planning import _as_sized_in_cluster
from kvscale.planner.search import Feasible, plan
from kvscale.sizing.catalog import Catalog, ModelArch

# Bisection on the request rate: each step is one plan (tens of ms); 1/2**12 of the spec's rate
# is finer than any rate a user would write back.
STEPS = 12
REASONS = ("SLOInfeasible", "InsufficientGPUs")  # where a rate this cluster can serve is the nearest thing


def _floor3(x: float) -> float:
    """`x` rounded down to 3 significant digits: a rate quoted as servable must be servable."""
    if x <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    return float(math.floor(x / step) * step)


def _best_at(
    intent: Intent,
    catalog: Catalog,
    model: ModelArch,
    types: tuple[str, ...],
    limits: Mapping[str, int],
    rps: float,
    max_replicas: int | None,
) -> Feasible | None:
    request = plan_request(intent, model, types, limits)
    request = replace(request, workload=replace(intent.workload, requests_per_s=rps), max_replicas=max_replicas)
    result = plan(catalog, request)
    return result.chosen if result.feasible else None


def _most(
    intent: Intent,
    catalog: Catalog,
    model: ModelArch,
    types: tuple[str, ...],
    limits: Mapping[str, int],
    max_replicas: int | None,
) -> tuple[float, Feasible] | None:
    """The highest request rate (below the spec's) that a plan meets within the limits, and that plan."""
    hi = intent.workload.requests_per_s
    lo = hi / 2**STEPS
    best = _best_at(intent, catalog, model, types, limits, lo, max_replicas)
    if best is None:
        return None  # not even a trickle: the SLO itself is out of reach on these GPUs
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        found = _best_at(intent, catalog, model, types, limits, mid, max_replicas)
        if found is None:
            hi = mid
        else:
            lo, best = mid, found
    return lo, best


def _fleet(c: Feasible) -> str:
    return f"{c.prediction.replicas} x {c.label}"


def nearest(
    intent: Intent, catalog: Catalog, pools: Mapping[str, GpuPool], excluded: tuple[str, ...] = ()
) -> str | None:
    """What the cluster's free GPUs (this service's own pods counted as free: `pools` leave
    them out) can serve at spec.slo: the most within spec.scaling.maxReplicas, and with every
    free GPU of one type. None where nothing is servable at the SLO (the planner's latency
    suggestions say more there) or where the spec's own rate is servable (nothing to say)."""
    try:
        model = resolve_model(intent, catalog)
        allowed = allowed_gpus(intent, catalog)
    except SpecError:
        return None
    types = tuple(
        sorted(n for n, p in pools.items() if p.free > 0 and n not in excluded and (not allowed or n in allowed))
    )
    if not types:
        return None
    sized = _as_sized_in_cluster(catalog, pools)
    limits = {n: pools[n].free for n in types}
    have = ", ".join(f"{limits[n]} {n}" for n in types)
    rps = intent.workload.requests_per_s
    cap = intent.scaling.max_replicas
    within = _most(intent, sized, model, types, limits, cap)
    unbounded = _best_at(intent, sized, model, types, limits, rps, None)
    if unbounded is not None:  # only spec.scaling.maxReplicas binds, and this cluster has the GPUs
        n = unbounded.prediction.replicas
        lines = [f"{rps:g} requests/s fit on {_fleet(unbounded)}: raise spec.scaling.maxReplicas to {n}"]
        if within is not None:
            lines.append(f"or lower spec.workload.requestsPerSecond to {_floor3(within[0]):g} ({_fleet(within[1])})")
        return f"on this cluster's free GPUs ({have}): {'; '.join(lines)}"
    everything = _most(intent, sized, model, types, limits, None)
    if within is None and everything is None:
        return None
    lines = []
    if within is not None:
        lines.append(
            f"at most {_floor3(within[0]):g} requests/s within spec.scaling.maxReplicas {cap} ({_fleet(within[1])})"
        )
    if everything is not None and (within is None or everything[0] > within[0] * 1.01):
        n = everything[1].prediction.replicas
        lines.append(
            f"at most {_floor3(everything[0]):g} requests/s with every free GPU of one type ({_fleet(everything[1])}, "
            f"spec.scaling.maxReplicas {n})"
        )
    return (
        f"on this cluster's free GPUs ({have}) spec.slo is met for {'; '.join(lines)}: lower "
        "spec.workload.requestsPerSecond, relax spec.slo, or add GPUs"
    )
