"""Status and conditions as plain dicts (pure), in the CRD's camelCase."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kvscale.operator.inventory import GpuPool
from kvscale.sizing.planner import Candidate, Feasible, Plan
from kvscale.sizing.units import format_duration

TOP_ALTERNATIVES = 5
MAX_REJECTED = 20


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    type_: str,
    ok: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    previous: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    status = "Unknown" if ok is None else ("True" if ok else "False")
    before = next((c for c in previous or [] if c.get("type") == type_), None)
    changed = before is None or before.get("status") != status
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": now_rfc3339() if changed or not before else before.get("lastTransitionTime"),
        "observedGeneration": generation,
    }


def merge_conditions(previous: list[dict[str, Any]] | None, *updates: dict[str, Any]) -> list[dict[str, Any]]:
    by_type = {c["type"]: c for c in previous or [] if "type" in c}
    for u in updates:
        by_type[u["type"]] = u
    return [by_type[k] for k in sorted(by_type)]


def _candidate(c: Candidate) -> dict[str, Any]:
    out: dict[str, Any] = {
        "gpuType": c.gpu,
        "tensorParallel": c.tensor_parallel,
        "precision": c.precision,
        "reason": c.reason[:300],
    }
    if isinstance(c, Feasible):
        out["replicas"] = c.prediction.replicas
        out["costPerHour"] = round(c.prediction.cost_usd_per_hour, 4)
    return out


def plan_status(plan: Plan, pool: GpuPool, max_context: int, excluded: tuple[str, ...]) -> dict[str, Any]:
    chosen = plan.chosen
    assert chosen is not None
    p = chosen.prediction
    return {
        "gpuType": chosen.gpu,
        "gpuProduct": pool.product_label,
        "tensorParallel": chosen.tensor_parallel,
        "precision": chosen.precision,
        "maxBatch": p.max_batch,
        "maxContextTokens": max_context,
        "replicas": p.replicas,
        "predictedTtft": format_duration(p.ttft_p_s),
        "predictedTpot": format_duration(p.tpot_p_s),
        "throughputTokensPerSecond": round(p.throughput_tokens_per_s, 1),
        "ratePerReplica": round(p.rate_per_replica_max, 4),
        "limitedBy": p.limited_by,
        "mbu": round(p.mbu, 4),
        "mfu": round(p.mfu, 4),
        "costPerHour": round(p.cost_usd_per_hour, 4),
        "reason": chosen.reason[:500],
        "excludedGpuTypes": list(excluded),
        "alternatives": [_candidate(c) for c in plan.alternatives[:TOP_ALTERNATIVES]],
        "rejected": [_candidate(c) for c in plan.rejected[:MAX_REJECTED]],
    }
