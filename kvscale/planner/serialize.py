"""Plans and predictions as plain values: `figures`, a feasible candidate's numbers in SI
units rounded once, which both the CLI's JSON (here) and the operator's status
(kvscale.control.status) carry; and the CLI's dicts.

Times leave the JSON in milliseconds with `_ms` in the key (status: seconds, and the readable
text beside them); everything else keeps its SI unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvscale.planner.search import Candidate, Feasible, Plan, Rejected, SimulatedSizing
from kvscale.sizing.batching import BatchPrediction
from kvscale.sizing.units import GIB


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


@dataclass(frozen=True)
class Figures:
    """A feasible candidate's figures, SI units, rounded once for every serialized form."""

    replicas: int
    gpus_per_replica: int
    # The confirmed rate when a simulated check sized the plan and met the SLO (the check's
    # rate over the replicas it confirmed: what one replica carried within the SLO on the
    # traffic itself); the analytic model's otherwise, which `analytic_rate_per_replica_per_s`
    # always is.
    rate_per_replica_per_s: float
    cost_usd_per_hour: float
    throughput_tokens_per_s: float
    mbu: float
    mfu: float
    ttft_s: float | None  # microseconds kept; None where the prediction is unbounded (JSON has no infinity)
    tpot_s: float | None
    analytic_rate_per_replica_per_s: float = 0.0


def _s(seconds: float) -> float | None:
    return round(seconds, 6) if math.isfinite(seconds) else None


def confirmed_rate_per_replica_per_s(c: Feasible) -> float | None:
    """Requests/s one replica carried within the SLO in the simulated check that sized the
    plan (the replayed rate over the fleet it confirmed); None without a check that met."""
    check = c.check
    if check is None or not check.met or check.replicas < 1 or not check.rate_per_s > 0.0:
        return None
    return check.rate_per_s / check.replicas


def figures(c: Feasible) -> Figures:
    p = c.prediction
    confirmed = confirmed_rate_per_replica_per_s(c)
    return Figures(
        replicas=p.replicas,
        gpus_per_replica=c.tensor_parallel * c.pipeline_parallel * c.data_parallel,
        rate_per_replica_per_s=round(confirmed if confirmed is not None else p.rate_per_replica_max, 4),
        analytic_rate_per_replica_per_s=round(p.rate_per_replica_max, 4),
        cost_usd_per_hour=round(p.cost_usd_per_hour, 4),
        throughput_tokens_per_s=round(p.throughput_tokens_per_s, 1),
        mbu=round(p.mbu, 4),
        mfu=round(p.mfu, 4),
        ttft_s=_s(p.ttft_p_s),
        tpot_s=_s(p.tpot_p_s),
    )


def candidate_to_dict(c: Candidate) -> dict[str, Any]:
    out: dict[str, Any] = {
        "gpu": c.gpu,
        "tensor_parallel": c.tensor_parallel,
        "pipeline_parallel": c.pipeline_parallel,
        "nodes": c.nodes,
        "expert_parallel": c.expert_parallel,
        "data_parallel": c.data_parallel,
        "precision": c.precision,
        "kv_cache_precision": c.kv_cache_precision,
        "verdict": c.verdict,
        "reason": c.reason,
    }
    if isinstance(c, Feasible):
        p, f = c.prediction, figures(c)
        out.update(
            replicas=f.replicas,
            gpus_total=c.total_gpus,
            max_batch=p.max_batch,
            rate_per_replica_max=f.rate_per_replica_per_s,
            # the model's figure beside it (equal unless a simulated check sized the plan)
            analytic_rate_per_replica_max=f.analytic_rate_per_replica_per_s,
            ttft_ms=_ms(p.ttft_p_s),
            tpot_ms=_ms(p.tpot_p_s),
            # Per token gap, not per request: the stalls a chunk step puts in a stream (the
            # p99 at the requested load, and the longest step a running request can meet).
            itl_p99_ms=_ms(p.itl_p99_s),
            itl_max_ms=_ms(p.itl_max_s),
            throughput_tokens_per_s=f.throughput_tokens_per_s,
            limited_by=p.limited_by,
            limited_why=p.limited_why,
            mbu=f.mbu,
            mfu=f.mfu,
            kv_cache_tokens=p.kv_cache_tokens,
            weights_gib_per_gpu=round(p.weights_bytes_per_gpu / GIB, 2),
            cost_usd_per_hour=f.cost_usd_per_hour,
            max_num_batched_tokens=c.max_num_batched_tokens,
            # The model's count beside `replicas` (the simulator's, when a check sized the plan).
            analytic_replicas=c.analytic_replicas,
        )
        if c.check is not None:
            out["check"] = check_to_dict(c.check)
    elif isinstance(c, Rejected):
        if c.best_ttft_s is not None:
            out["best_ttft_ms"] = _ms(c.best_ttft_s)
        if c.best_tpot_s is not None:
            out["best_tpot_ms"] = _ms(c.best_tpot_s)
        if c.best_itl_s is not None:
            out["best_itl_ms"] = _ms(c.best_itl_s)
    return out


def check_to_dict(check: SimulatedSizing) -> dict[str, Any]:
    """The simulated check that sized a plan (`plan --json`'s `check`)."""
    analytic = None if check.analytic_attainment is None else round(check.analytic_attainment, 5)
    return {
        "requests": check.requests,
        "rate_per_s": round(check.rate_per_s, 4),
        "routing": check.routing,
        "target": check.target,
        "analytic_replicas": check.analytic_replicas,
        "analytic_attainment": analytic,  # null: not replayed (the search started below it)
        # the analytic count under its older names, kept for scripts that read them
        "planned_replicas": check.analytic_replicas,
        "planned_attainment": analytic,
        "replicas": check.replicas,
        "attainment": round(check.attainment, 5),
        "met": check.met,
        "tried": [{"replicas": n, "attainment": round(a, 5)} for n, a in check.tried],
        "why": check.why,
    }


def plan_to_dict(plan: Plan, engine_args: list[str] | None = None) -> dict[str, Any]:
    r = plan.request
    chosen = candidate_to_dict(plan.chosen) if plan.chosen else None
    if chosen is not None and engine_args is not None:
        chosen["engine_args"] = engine_args
    return {
        "feasible": plan.feasible,
        "model": r.model.name,
        "objective": r.objective,
        "routing": "gateway" if r.least_loaded else "service",
        "workload": {
            "input_tokens": r.workload.input_tokens,
            "output_tokens": r.workload.output_tokens,
            "requests_per_s": r.workload.requests_per_s,
            "max_context_tokens": r.workload.engine_max_context_tokens,
        },
        "slo": {
            "ttft_ms": _ms(r.slo.ttft_s),
            "tpot_ms": _ms(r.slo.tpot_s),
            "percentile": r.slo.percentile,
            "itl_ms": _ms(r.max_itl_s),  # the inter-token latency bound (--itl); null: none
        },
        "headroom": r.headroom,
        "chosen": chosen,
        "alternatives": [candidate_to_dict(c) for c in plan.alternatives],
        "outranked": [candidate_to_dict(c) for c in plan.outranked],
        "rejected": [candidate_to_dict(c) for c in plan.rejected],
        "suggestions": list(plan.suggestions),
    }


def prediction_to_dict(
    p: BatchPrediction, weights_bytes_per_gpu: float, max_num_batched_tokens: int | None = None
) -> dict[str, Any]:
    # The phase that takes most of the batch's time: one long prompt's prefill can run the
    # GPU near its peak FLOPs while a few decode steps read the weights at batch one.
    phase = None
    if p.prefill is not None and p.decode is not None:
        phase = "prefill" if p.prefill.seconds >= p.output_tokens * p.decode.seconds else "decode"
    binding = p.prefill if phase == "prefill" else p.decode
    out = {
        "fits": p.fits,
        "batch": p.batch,
        "input_tokens": p.input_tokens,
        "output_tokens": p.output_tokens,
        "ttft_ms": _ms(p.ttft_s),
        "tpot_ms": _ms(p.tpot_s),
        "latency_ms": _ms(p.latency_s),
        "throughput_tokens_per_s": None if p.throughput_tokens_per_s is None else round(p.throughput_tokens_per_s, 2),
        "requests_per_s": None if p.requests_per_s is None else round(p.requests_per_s, 4),
        "kv_cache_tokens": p.kv_cache_tokens,
        "max_batch": p.max_batch,
        "limited_by": p.limited_by,
        # mbu/mfu: the binding phase's (utilization_phase); each phase's beside them
        "mbu": None if binding is None else round(binding.mbu, 4),
        "mfu": None if binding is None else round(binding.mfu, 4),
        "utilization_phase": phase,
        "prefill_mbu": None if p.prefill is None else round(p.prefill.mbu, 4),
        "prefill_mfu": None if p.prefill is None else round(p.prefill.mfu, 4),
        "decode_mbu": None if p.decode is None else round(p.decode.mbu, 4),
        "decode_mfu": None if p.decode is None else round(p.decode.mfu, 4),
        "weights_gib_per_gpu": round(weights_bytes_per_gpu / GIB, 3),
    }
    if max_num_batched_tokens is not None:
        out["max_num_batched_tokens"] = max_num_batched_tokens  # the prefill chunk size assumed
    return out
