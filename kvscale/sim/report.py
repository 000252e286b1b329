"""Summaries of simulation results: SLO attainment, latency quantiles, GPU-hours, cost."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

from kvscale.sim.run import SimResult
from kvscale.sizing.workload import Slo


def attainment(result: SimResult, slo: Slo) -> float:
    """Share of requests whose TTFT and TPOT both met the targets (unfinished ones missed)."""
    if not result.requests:
        return 1.0
    met = sum(1 for r in result.requests if r.done and r.ttft_s <= slo.ttft_s and r.tpot_s <= slo.tpot_s)
    return met / len(result.requests)


def attainment_from(result: SimResult, slo: Slo, from_s: float) -> float:
    """Attainment over the requests that arrived at or after `from_s` (after a warm-up)."""
    kept = [r for r in result.requests if r.arrival_s >= from_s]
    if not kept:
        return 1.0
    return sum(1 for r in kept if r.done and r.ttft_s <= slo.ttft_s and r.tpot_s <= slo.tpot_s) / len(kept)


def gpu_hours_from(result: SimResult, gpus_per_replica: int, from_s: float) -> float:
    """GPU-hours spent at or after `from_s`, from the replicas' spans."""
    seconds = sum(max(0.0, stop - max(start, from_s)) for start, stop in result.replica_spans)
    return seconds * gpus_per_replica / 3600.0


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def gap_quantile(gaps: Counter[float], q: float) -> float:
    """Quantile of per-token gaps from their histogram (gap -> tokens)."""
    total = sum(gaps.values())
    if total == 0:
        return math.nan
    rank, seen = math.ceil(q * total), 0
    for gap in sorted(gaps):
        seen += gaps[gap]
        if seen >= rank:
            return gap
    return max(gaps)


def summary(
    result: SimResult,
    slo: Slo,
    oracle_gpu_hours: float | None = None,
    references: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One row per policy; `references` (bound, peak, oracle GPU-hours) add a
    gpu_hours_vs_<name> column each."""
    done = [r for r in result.requests if r.done]
    ttft = [r.ttft_s * 1e3 for r in done]
    tpot = [r.tpot_s * 1e3 for r in done if r.output_tokens > 1]
    generated = sum(r.output_tokens for r in done)
    gaps = result.token_gaps
    row: dict[str, Any] = {
        "policy": result.policy,
        "routing": result.routing,
        "requests": len(result.requests),
        "slo_attainment": round(attainment(result, slo), 5),
        "ttft_mean_ms": round(statistics.fmean(ttft), 2) if ttft else None,
        "ttft_p50_ms": round(_quantile(ttft, 0.50), 2) if ttft else None,
        "ttft_p95_ms": round(_quantile(ttft, 0.95), 2) if ttft else None,
        "tpot_mean_ms": round(statistics.fmean(tpot), 3) if tpot else None,
        "tpot_p50_ms": round(_quantile(tpot, 0.50), 3) if tpot else None,
        "tpot_p95_ms": round(_quantile(tpot, 0.95), 3) if tpot else None,
        "itl_mean_ms": round(sum(g * c for g, c in gaps.items()) / sum(gaps.values()) * 1e3, 3) if gaps else None,
        "itl_p95_ms": round(gap_quantile(gaps, 0.95) * 1e3, 3) if gaps else None,
        # What a plan's itl_p99_ms predicts: the per-token gap a streaming user sees stall.
        "itl_p99_ms": round(gap_quantile(gaps, 0.99) * 1e3, 3) if gaps else None,
        "throughput_tokens_per_s": round(generated / result.duration_s, 2) if result.duration_s > 0 else 0.0,
        "gpu_hours": round(result.gpu_hours, 4),
        "cost_usd": round(result.cost_usd, 4),
        "scale_events": result.scale_events,
        # The largest fleet the policy asked for (the static policy's --replicas, or its default).
        "replicas_max": max((p.desired for p in result.timeline), default=None),
        "preemptions": result.preemptions,
        # Requests a scale-down cut: still in flight on a replica when its drain's bound passed
        # (the engine pod's preStop; kvscale.sim.fleet.DRAIN_BOUND_S); counted as missed.
        "cut_by_scale_down": sum(1 for r in result.requests if r.lost == "cut"),
    }
    if oracle_gpu_hours:
        row["gpu_hours_vs_oracle"] = round(result.gpu_hours / oracle_gpu_hours, 3)
    for name, hours in (references or {}).items():
        if hours > 0:
            row[f"gpu_hours_vs_{name}"] = round(result.gpu_hours / hours, 3)
    return row
