"""`kvscale plan --disaggregation auto|on|off`: the layout beside the aggregated plan, as JSON
(DESIGN.md "Disaggregated plans") and as lines under the plan's table. Helpers of `planning`,
no command of their own.

With `--trace` both layouts are checked on the trace's busiest stretch: the aggregated plan by
kvscale.sim.check, the pools by kvscale.sim.check_pools (both pools replayed at fixed workers,
grown where they miss); `auto` chooses the cheaper layout the replay confirms."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvscale.engines.args import requested_source
from kvscale.planner.disaggregated import (
    KV_CONNECTOR,
    DisaggregatedPlan,
    Disaggregation,
    Layout,
    LayoutPlan,
    Pool,
    _aggregated_wins,
    _better,
    _dis_summary,
    _disaggregated_wins,
    plan_layouts,
    pool_engine_args,
    pool_launch,
)
from kvscale.planner.search import Plan
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.checkpoints import CheckpointError
from kvscale.sizing.context_limit import ContextLimitError
from kvscale.sizing.units import format_duration

if TYPE_CHECKING:  # the simulator is imported when a replay runs
    from kvscale.sim.check_pools import PoolsCheck
    from kvscale.sim.trace import TraceRequest

DISAGGREGATION_HELP = (
    "Prefill/decode disaggregation: auto (the cheaper layout; aggregated on a tie), on (only prefill and "
    "decode pools with vLLM's KV connector) or off (only aggregated replicas). With --trace both layouts are "
    "replayed on the trace and auto chooses the cheaper one the replay confirms."
)
CHECKED_NOTE = (
    "the aggregated plan was sized by the simulated check, which does not replay two pools without the trace's "
    "sample (plan --trace replays them, as kvscale simulate --disaggregation on does): "
    "kept aggregated (--disaggregation on plans the pools by the analytic model)"
)


@dataclass(frozen=True)
class CheckedLayout(LayoutPlan):
    """The layouts with the disaggregated plan's simulated check (`plan --trace`):
    `disaggregated` at the workers the check settled on, `analytic` as the model sized it."""

    check: PoolsCheck | None = None
    analytic: DisaggregatedPlan | None = None


def layouts(
    cat: Catalog,
    result: Plan,
    disaggregation: str,
    checked: bool = False,
    replay: list[TraceRequest] | None = None,
    routing: str = "service",
) -> LayoutPlan:
    """Both layouts for the plan's request, the aggregated one being `result` as planned (and
    checked). With `replay` (the trace's sample the aggregated plan was checked on) the pools
    are checked on it too, behind `routing` (checked_layouts). A plan sized by a simulated
    check without the sample keeps its layout under `auto`: an unchecked layout does not
    replace a checked one."""
    mode: Disaggregation = "on" if disaggregation == "on" else "off" if disaggregation == "off" else "auto"
    found = plan_layouts(cat, result.request, mode, aggregated=None if mode == "on" else result)
    if replay and found.disaggregated is not None:
        return checked_layouts(found, result, replay, routing)
    if checked and mode == "auto" and found.mode == "disaggregated":
        return replace(found, mode="aggregated", reason=f"aggregated: {CHECKED_NOTE}")
    return found


def checked_layouts(found: LayoutPlan, result: Plan, replay: list[TraceRequest], routing: str) -> CheckedLayout:
    """`found` with its pools replayed on `replay` (kvscale.sim.check_pools) and the layout
    chosen anew: under `auto` the cheaper (by the objective) of the layouts the replay
    confirms, aggregated on a tie or when neither is confirmed; under `on` the pools, checked
    (their check missing the SLO makes the plan infeasible, as the aggregated check does)."""
    from kvscale.sim.check_pools import check_pools

    analytic = found.disaggregated
    assert analytic is not None
    check = check_pools(analytic, replay, "gateway" if routing == "gateway" else "service")
    sized = replace(
        analytic,
        prefill=replace(analytic.prefill, workers=check.prefill),
        decode=replace(analytic.decode, workers=check.decode),
    )
    a = result.chosen if result.chosen is not None and result.feasible else None
    mode: Layout | None
    if found.disaggregation == "on":
        mode, reason = "disaggregated", "disaggregated only (--disaggregation on)"
        if not check.met:
            reason += f"; the pools miss the SLO in the simulated check: {check.why}"
    elif check.met and a is None:
        mode = "disaggregated"
        reason = f"disaggregated: no aggregated replica meets the SLO in the simulated check; the pools do: {check.why}"
    elif check.met and a is not None and _better(sized, a):
        mode = "disaggregated"
        reason = f"{_disaggregated_wins(sized, a)}; both layouts checked in the simulator, the pools: {check.why}"
    elif check.met and a is not None:
        mode = "aggregated"
        reason = f"{_aggregated_wins(a, sized)}; both layouts checked in the simulator, the pools: {check.why}"
    elif a is not None:
        mode = "aggregated"
        reason = (
            f"aggregated: the disaggregated pools miss the SLO in the simulated check ({_dis_summary(sized)}): "
            f"{check.why}"
        )
    elif result.chosen is not None:
        mode = "aggregated"
        reason = f"aggregated: neither layout meets the SLO in the simulated check; the pools: {check.why}"
    else:  # no aggregated candidate at all: the closest pools, infeasible
        mode = "disaggregated"
        reason = (
            f"disaggregated: no aggregated replica meets the SLO; the pools miss it in the simulated check: {check.why}"
        )
    sized = replace(sized, reason=reason if mode == "disaggregated" else "")
    return CheckedLayout(
        request=found.request,
        disaggregation=found.disaggregation,
        mode=mode,
        aggregated=found.aggregated,
        disaggregated=sized,
        disaggregated_why_none=found.disaggregated_why_none,
        reason=reason,
        check=check,
        analytic=analytic,
    )


def _pools_check(found: LayoutPlan) -> PoolsCheck | None:
    return found.check if isinstance(found, CheckedLayout) else None


def _pool_dict(
    pool: Pool, plan: DisaggregatedPlan, served: str | None, source: str | None, analytic_workers: int | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "gpu": pool.cfg.gpu.name,
        "tensor_parallel": pool.cfg.tensor_parallel,
        "precision": pool.cfg.precision.name,
        "workers": pool.workers,
        "gpus": pool.gpus,
        "rate_per_worker_max": round(pool.rate_per_worker_max, 4),
        "cost_usd_per_hour": round(pool.cost_usd_per_hour, 4),
    }
    if analytic_workers is not None:  # checked: `workers` is the simulator's count, the model's beside it
        out["analytic_workers"] = analytic_workers
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


def disaggregated_dict(
    plan: DisaggregatedPlan, served: str | None, source: str | None, check: PoolsCheck | None = None
) -> dict[str, Any]:
    """A disaggregated plan with the keys DESIGN.md names; checked (`plan --trace`), the pools'
    workers are the check's and `check` its figures (`ttft_ms` and `tpot_ms` stay the model's
    prediction at the analytic workers)."""
    p_workers = check.analytic_prefill if check is not None else None
    d_workers = check.analytic_decode if check is not None else None
    out = {
        "mode": "disaggregated",
        "prefill": _pool_dict(plan.prefill, plan, served, source, p_workers),
        "decode": _pool_dict(plan.decode, plan, served, source, d_workers),
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
    if check is not None:
        from kvscale.sim.check_pools import check_pools_to_dict

        out["check"] = check_pools_to_dict(check)
    return out


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
    check = _pools_check(found)
    dis = disaggregated_dict(found.disaggregated, served, source, check) if found.disaggregated is not None else None
    if found.mode == "disaggregated" or found.disaggregation == "on":
        out["chosen"] = dis if found.mode == "disaggregated" else None
        out["feasible"] = found.mode == "disaggregated" and (check is None or check.met)
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
    """No layout meets the SLO: `plan` exits 1 (the pools' simulated check counts, as the
    aggregated one does)."""
    check = _pools_check(found)
    missed = found.mode == "disaggregated" and check is not None and not check.met
    return found.mode is None or (found.mode == "aggregated" and not aggregated_met) or missed


def layout_lines(found: LayoutPlan) -> list[str]:
    """The lines beside the plan's table: the layout and why, and the pools when disaggregated
    (printed above the table then, the aggregated plan below them for comparison), with the
    pools' simulated check when they were replayed. None under `auto` when no disaggregated
    plan exists: the aggregated plan's output as it was (the JSON's `disaggregated_beside`
    says why)."""
    if found.disaggregation == "auto" and found.disaggregated is None:
        return []
    lines = [f"Layout: {found.mode or 'none'} ({found.disaggregation}): {found.reason}"]
    d = found.disaggregated
    check = _pools_check(found)
    if d is not None and found.mode == "disaggregated":
        lines += [
            f"  prefill: {d.prefill.shape}, --max-num-batched-tokens {d.prefill.max_num_batched_tokens}, "
            f"{d.prefill.rate_per_worker_max:.2f} req/s each",
            f"  decode:  {d.decode.shape}, batch limit {d.decode.max_batch}, {d.decode.rate_per_worker_max:.2f} req/s each",
            f"  KV transfer {format_duration(d.kv_transfer_s)} per request over {d.path.name} ({KV_CONNECTOR}); "
            f"TTFT {format_duration(d.ttft_p_s)}, TPOT {format_duration(d.tpot_p_s)} (the model's, at the planned "
            f"workers); {d.gpus_total} GPUs, ${d.cost_usd_per_hour:.2f}/h, {d.tokens_per_s_per_gpu:.0f} output "
            "tokens/s per GPU",
        ]
        if check is None:
            lines.append(
                "  (analytic: plan --trace replays the pools on the trace, as kvscale simulate --disaggregation on "
                "does; --disaggregation off plans aggregated replicas alone)"
            )
    if check is not None:
        lines += check_lines(check, found.request.slo.percentile)
    if d is not None and found.mode == "disaggregated":
        lines += [
            "  deploy: the prefill pool serves only behind a P/D-aware router (llm-d's endpoint picker with its P/D "
            "profile, spec.routing.inferencePool); behind a plain Service the decode pods answer alone, so the "
            "operator's spec.serving.disaggregation auto keeps aggregated replicas there",
            "The aggregated plan beside it:",
        ]
    return lines


def check_lines(check: PoolsCheck, percentile: float) -> list[str]:
    """The pools' simulated check in the plan's words: what was replayed, the figures, and why."""
    c = check.checked
    ttft = format_duration(c.ttft_p_s) if c.ttft_p_s == c.ttft_p_s else "none finished"
    tpot = format_duration(c.tpot_p_s) if c.tpot_p_s == c.tpot_p_s else "none"
    return [
        f"  pools' simulated check: {check.requests} requests ({check.span_s / 60:.1f} min at "
        f"{check.rate_per_s:.2f} req/s, the trace's busiest stretch scaled to the planned rate, behind a "
        f"{check.routing}): {c.prefill} prefill + {c.decode} decode workers {c.attainment:.2%} meet "
        f"p{percentile:g} TTFT/TPOT (target {check.target:.0%}; {'met' if check.met else 'not met'}); TTFT "
        f"p{percentile:g} {ttft}, TPOT p{percentile:g} {tpot}, {c.gpu_hours:.2f} GPU-hours",
        f"  {check.why}",
    ]
