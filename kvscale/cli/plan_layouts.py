"""`kvscale plan --disaggregation auto|on|off`: the layout beside the aggregated plan, as JSON
(DESIGN.md "Disaggregated plans") and as lines under the plan's table. Helpers of `planning`,
no command of their own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvscale.engines.args import requested_source
from kvscale.planner.disaggregated import (
    KV_CONNECTOR,
    DisaggregatedPlan,
    Disaggregation,
    LayoutPlan,
    Pool,
    plan_layouts,
    pool_engine_args,
    pool_launch,
)
from kvscale.planner.search import Plan
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.checkpoints import CheckpointError
from kvscale.sizing.context_limit import ContextLimitError
from kvscale.sizing.units import format_duration

DISAGGREGATION_HELP = (
    "Prefill/decode disaggregation: auto (the cheaper layout; aggregated on a tie), on (only prefill and "
    "decode pools with vLLM's KV connector) or off (only aggregated replicas)."
)
CHECKED_NOTE = (
    "the aggregated plan was sized by the simulated check, which does not replay two pools yet (kvscale simulate "
    "--disaggregation on replays them): "
    "kept aggregated (--disaggregation on plans the pools by the analytic model)"
)


def layouts(cat: Catalog, result: Plan, disaggregation: str, checked: bool = False) -> LayoutPlan:
    """Both layouts for the plan's request, the aggregated one being `result` as planned (and
    checked). A plan sized by a simulated check keeps its layout under `auto`, feasible or not:
    the simulator cannot check the pools, so an unchecked layout does not replace a checked one."""
    mode: Disaggregation = "on" if disaggregation == "on" else "off" if disaggregation == "off" else "auto"
    found = plan_layouts(cat, result.request, mode, aggregated=None if mode == "on" else result)
    if checked and mode == "auto" and found.mode == "disaggregated":
        return replace(found, mode="aggregated", reason=f"aggregated: {CHECKED_NOTE}")
    return found


def _pool_dict(pool: Pool, plan: DisaggregatedPlan, served: str | None, source: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "gpu": pool.cfg.gpu.name,
        "tensor_parallel": pool.cfg.tensor_parallel,
        "precision": pool.cfg.precision.name,
        "workers": pool.workers,
        "gpus": pool.gpus,
        "rate_per_worker_max": round(pool.rate_per_worker_max, 4),
        "cost_usd_per_hour": round(pool.cost_usd_per_hour, 4),
    }
    if pool.role == "prefill":
        out["max_num_batched_tokens"] = pool.max_num_batched_tokens
    else:
        out["max_batch"] = pool.max_batch
    w = plan.request.workload
    try:
        launch = pool_launch(
            pool, requested_source(served, source, pool.cfg.precision.name), w.max_context_tokens, w.context_tokens
        )
    except (CheckpointError, ContextLimitError) as exc:
        out.update(engine_args=None, engine_args_missing=str(exc))
    else:
        out["engine_args"] = pool_engine_args(launch, pool.role)
    return out


def disaggregated_dict(plan: DisaggregatedPlan, served: str | None, source: str | None) -> dict[str, Any]:
    """A disaggregated plan with the keys DESIGN.md names."""
    return {
        "mode": "disaggregated",
        "prefill": _pool_dict(plan.prefill, plan, served, source),
        "decode": _pool_dict(plan.decode, plan, served, source),
        "kv_transfer_ms": round(plan.kv_transfer_s * 1e3, 3),
        "kv_transfer_p_ms": round(plan.kv_transfer_p_s * 1e3, 3),
        "kv_transfer_path": plan.path.name,
        "kv_transfer_bytes_per_s": plan.path.bandwidth_bytes_per_s,
        "kv_connector": KV_CONNECTOR,
        "gpus_total": plan.gpus_total,
        "tokens_per_s_per_gpu": round(plan.tokens_per_s_per_gpu, 1),
        "cost_usd_per_hour": round(plan.cost_usd_per_hour, 4),
        "ttft_ms": round(plan.ttft_p_s * 1e3, 3),
        "tpot_ms": round(plan.tpot_p_s * 1e3, 3),
        "reason": plan.reason,
    }


def with_layouts(
    out: dict[str, Any], found: LayoutPlan, served: str | None, source: str | None, aggregated_met: bool = True
) -> dict[str, Any]:
    """`plan --json` with the layout: the aggregated `chosen` gains `mode` and
    `disaggregated_beside`; a disaggregated `chosen` (or none, under `on`) replaces it, the
    aggregated one beside it. `aggregated_met`: the aggregated plan meets the SLO (its check too)."""
    aggregated = out.get("chosen")
    if aggregated is not None:
        aggregated["mode"] = "aggregated"
        w = found.request.workload
        gpus = aggregated.get("gpus_total")
        aggregated.setdefault(
            "tokens_per_s_per_gpu", round(w.requests_per_s * w.outputs.mean / gpus, 1) if gpus else None
        )
    dis = disaggregated_dict(found.disaggregated, served, source) if found.disaggregated is not None else None
    if found.mode == "disaggregated" or found.disaggregation == "on":
        out["chosen"] = dis if found.mode == "disaggregated" else None
        out["feasible"] = found.mode == "disaggregated"
        out["aggregated_beside"] = (
            aggregated if aggregated is not None and aggregated_met else {"why": "no aggregated plan meets the SLO"}
        )
        if found.mode is None:
            out["suggestions"] = [found.reason, *out.get("suggestions", [])]
    elif aggregated is not None:
        if dis is not None:
            dis["reason"] = found.reason
        aggregated["disaggregated_beside"] = (
            dis if dis is not None else {"why": found.disaggregated_why_none or "not searched (--disaggregation off)"}
        )
    out["layout"] = {"disaggregation": found.disaggregation, "mode": found.mode, "reason": found.reason}
    return out


def infeasible(found: LayoutPlan, aggregated_met: bool) -> bool:
    """No layout meets the SLO: `plan` exits 1."""
    return found.mode is None or (found.mode == "aggregated" and not aggregated_met)


def layout_lines(found: LayoutPlan) -> list[str]:
    """The lines beside the plan's table: the layout and why, and the pools when disaggregated
    (printed above the table then, the aggregated plan below them for comparison). None under
    `auto` when no disaggregated plan exists: the aggregated plan's output as it was (the JSON's
    `disaggregated_beside` says why)."""
    if found.disaggregation == "auto" and found.disaggregated is None:
        return []
    lines = [f"Layout: {found.mode or 'none'} ({found.disaggregation}): {found.reason}"]
    d = found.disaggregated
    if d is not None and found.mode == "disaggregated":
        lines += [
            f"  prefill: {d.prefill.shape}, --max-num-batched-tokens {d.prefill.max_num_batched_tokens}, "
            f"{d.prefill.rate_per_worker_max:.2f} req/s each",
            f"  decode:  {d.decode.shape}, batch limit {d.decode.max_batch}, {d.decode.rate_per_worker_max:.2f} req/s each",
            f"  KV transfer {format_duration(d.kv_transfer_s)} per request over {d.path.name} ({KV_CONNECTOR}); "
            f"TTFT {format_duration(d.ttft_p_s)}, TPOT {format_duration(d.tpot_p_s)}; {d.gpus_total} GPUs, "
            f"${d.cost_usd_per_hour:.2f}/h, {d.tokens_per_s_per_gpu:.0f} output tokens/s per GPU",
            "  (analytic: plan --trace does not replay the pools yet, kvscale simulate --disaggregation on does; "
            "the operator deploys aggregated replicas only; --disaggregation off plans those alone)",
            "The aggregated plan beside it:",
        ]
    return lines
