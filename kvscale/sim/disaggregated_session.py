"""`kvscale simulate` on a disaggregated plan: both pools from the plan, every pools policy
(kvscale, static, ratematch) on the same arrivals, one row each with each pool's figures."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kvscale.planner.disaggregated import DisaggregatedPlan
from kvscale.sim.disaggregated_fleet import (
    DisaggregatedResult,
    DisaggregatedSetup,
    PoolsPolicy,
    StaticPools,
    setup_from_disaggregated,
    simulate_disaggregated,
)
from kvscale.sim.engine import StepTimes
from kvscale.sim.pool_policies import RateMatchPolicy, kvscale_pools
from kvscale.sim.report import summary
from kvscale.sim.run import Source
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.workload import Workload

POOLS_POLICY_NAMES = ("kvscale", "static", "ratematch")


def pools_policies(
    names: tuple[str, ...],
    setup: DisaggregatedSetup,
    plan: DisaggregatedPlan,
    shape: Workload | None,
    headroom: float,
    max_replicas: int,
) -> list[PoolsPolicy]:
    unknown = [n for n in names if n not in POOLS_POLICY_NAMES]
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)}: not run on prefill and decode pools; choose from {', '.join(POOLS_POLICY_NAMES)}"
        )
    ps, ds = setup.prefill, setup.decode
    limit = sum(setup.gpu_limits.values()) if setup.gpu_limits is not None else None
    built: dict[str, Callable[[], PoolsPolicy]] = {
        "kvscale": lambda: kvscale_pools(setup, shape, max_replicas, headroom, plan.request.step_target_s),
        "static": lambda: StaticPools(ps.initial_replicas, ds.initial_replicas),
        "ratematch": lambda: RateMatchPolicy(
            StepTimes(ps.cfg),
            StepTimes(ds.cfg),
            ttft_target_s=ps.slo.ttft_s,
            itl_target_s=plan.request.step_target_s,
            decode_batch_cap=ds.max_batch,
            prefill_workers=ps.initial_replicas,
            decode_workers=ds.initial_replicas,
            max_gpus=limit,
            max_replicas=max_replicas,
        ),
    }
    return [built[n]() for n in names]


def pools_row(result: DisaggregatedResult, setup: DisaggregatedSetup) -> dict[str, Any]:
    """summary()'s row (totals over both pools) with each pool's GPU-hours, replicas and
    shape, and the mean KV transfer."""
    row = summary(result, setup.prefill.slo)
    row["mode"] = "disaggregated"
    row["replicas_max"] = max((p.prefill_desired + p.decode_desired for p in result.pool_timeline), default=None)
    for role, stats in result.pools.items():
        row[role] = {
            "gpu": stats.gpu,
            "tensor_parallel": stats.tensor_parallel,
            "gpus_per_replica": stats.gpus_per_replica,
            "replicas_start": stats.replicas_start,
            "replicas_max": stats.replicas_max,
            "gpu_hours": round(stats.gpu_hours, 4),
            "cost_usd": round(stats.cost_usd, 4),
            "preemptions": stats.preemptions,
        }
    moved = [t for t in result.transfer_s if not math.isnan(t)]
    row["kv_transfer_mean_ms"] = round(sum(moved) / len(moved) * 1e3, 3) if moved else None
    return row


def run_pools_policies(
    plan: DisaggregatedPlan,
    trace: list[TraceRequest],
    names: tuple[str, ...],
    headroom: float,
    max_replicas: int,
    cold_start_s: float | None = None,
    seed: int = 0,
    shape: Workload | None = None,
    progress: Callable[[str, float], None] | None = None,
    gpu_limits: dict[str, int] | None = None,
) -> tuple[DisaggregatedSetup, list[DisaggregatedResult], list[dict[str, Any]]]:
    """Every named pools policy on the trace, from the plan's pools."""
    setup = setup_from_disaggregated(plan, cold_start_s, seed, gpu_limits)
    results = []
    for policy in pools_policies(names, setup, plan, shape, headroom, max_replicas):
        tick = (lambda t, name=policy.name: progress(name, t)) if progress else None
        results.append(simulate_disaggregated(setup, Source(trace), policy, tick))
    return setup, results, [pools_row(r, setup) for r in results]
