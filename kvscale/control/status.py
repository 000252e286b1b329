"""Status values (pure): conditions and the plan, as the typed models of kvscale.api."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Literal

from kvscale.api.models import (
    BurstinessStatus,
    CandidateStatus,
    Condition,
    InferenceServiceStatus,
    LengthsStatus,
    ObservedStatus,
    PlannedWorkloadStatus,
    PlanStatus,
)
from kvscale.autoscaling.observation import Decision, Observation
from kvscale.control.planning import Planned
from kvscale.planner.search import Candidate, Feasible, Rejected
from kvscale.planner.serialize import figures
from kvscale.sizing.units import format_duration, parse_duration_s
from kvscale.sizing.workload import Burstiness, LengthDistribution, Slo, Workload

TOP_ALTERNATIVES = 5
MAX_REJECTED = 5  # the closest few in status (kubectl describe stays readable); `kvscale plan` lists all
MAX_MESSAGE = 1000
TICK_CONDITIONS = ("MetricsAvailable", "SLOMet")  # rewritten by every scaling tick
MEANINGFUL = 0.05  # a relative change in status.observed worth a status write


def now_rfc3339(now: dt.datetime | None = None) -> str:
    return (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    status: InferenceServiceStatus,
    type_: str,
    ok: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    now: dt.datetime | None = None,
) -> Condition:
    """A condition; its transition time moves only when its status does."""
    value: Literal["True", "False", "Unknown"] = "Unknown" if ok is None else ("True" if ok else "False")
    before = next((c for c in status.conditions if c.type == type_), None)
    changed = before is None or before.status != value
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message[:MAX_MESSAGE],
        last_transition_time=now_rfc3339(now) if changed or before is None else before.last_transition_time,
        observed_generation=generation,
    )


def with_conditions(status: InferenceServiceStatus, *updates: Condition, **fields: Any) -> InferenceServiceStatus:
    """The status with `updates` replacing conditions of their type (sorted by type) and `fields` set."""
    by_type = {c.type: c for c in status.conditions}
    by_type.update({c.type: c for c in updates})
    return status.model_copy(update={"conditions": [by_type[k] for k in sorted(by_type)], **fields})


def without_condition(status: InferenceServiceStatus, type_: str) -> InferenceServiceStatus:
    return status.model_copy(update={"conditions": [c for c in status.conditions if c.type != type_]})


def get_condition(status: InferenceServiceStatus, type_: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def candidate_status(c: Candidate) -> CandidateStatus:
    """A candidate as status lists it; its figures as the CLI's JSON has them (kvscale.planner.serialize.figures)."""
    p = figures(c) if isinstance(c, Feasible) else None
    return CandidateStatus(
        gpu_type=c.gpu,
        tensor_parallel=c.tensor_parallel,
        expert_parallel=c.expert_parallel,
        data_parallel=c.data_parallel,
        precision=c.precision,
        reason=c.reason[:300],
        replicas=p.replicas if p is not None else None,
        cost_per_hour=p.cost_usd_per_hour if p is not None else None,
        rate_per_replica=p.rate_per_replica_per_s if p is not None else None,
        gpus_per_replica=p.gpus_per_replica if p is not None else None,
    )


def _lengths(dist: LengthDistribution | None) -> LengthsStatus | None:
    if dist is None or dist.is_constant:
        return None
    spans = dist.spans
    return LengthsStatus(
        tokens=list(dist.tokens),
        shares=[round(w, 5) for w in dist.weights],
        shortest=[lo for lo, _ in spans] if spans is not None else None,
        longest=[hi for _, hi in spans] if spans is not None else None,
    )


def planned_workload_status(workload: Workload, source: Literal["spec", "observed"]) -> PlannedWorkloadStatus:
    """The workload a plan was made for, as status records it."""
    return PlannedWorkloadStatus(
        source=source,
        input_tokens=workload.input_tokens,
        output_tokens=workload.output_tokens,
        requests_per_second=round(workload.requests_per_s, 4),
        prefix_cache_hit_ratio=round(workload.prefix_cache_hit_share, 4) if workload.prefix_cache_hit_share else None,
        input_lengths=_lengths(workload.input_lengths),
        output_lengths=_lengths(workload.output_lengths),
        burstiness=burstiness_status(workload.burstiness),
    )


def burstiness_status(burstiness: Burstiness | None) -> BurstinessStatus | None:
    if burstiness is None:
        return None
    share = None if burstiness.burst_share >= 1.0 else float(f"{burstiness.burst_share:.3g}")
    return BurstinessStatus(
        index_of_dispersion=float(f"{burstiness.index_of_dispersion:.3g}"),
        window_seconds=burstiness.window_s,
        burst_share=share,
        burst_requests=float(f"{burstiness.burst_requests:.3g}") if burstiness.burst_requests > 0 else None,
    )


def _burstiness(recorded: BurstinessStatus | None) -> Burstiness | None:
    if recorded is None:
        return None
    try:
        return Burstiness(
            recorded.index_of_dispersion,
            recorded.window_seconds,
            recorded.burst_share or 1.0,
            recorded.burst_requests or 0.0,
        )
    except ValueError:
        return None


def _distribution(lengths: LengthsStatus | None) -> LengthDistribution | None:
    if lengths is None or not lengths.tokens:
        return None
    try:
        shortest, longest = lengths.shortest, lengths.longest
        spans = tuple(zip(shortest, longest, strict=True)) if shortest is not None and longest is not None else None
        return LengthDistribution(tuple(lengths.tokens), tuple(lengths.shares), spans)
    except ValueError:
        return None


def planned_workload(recorded: PlannedWorkloadStatus, max_context_tokens: int | None) -> Workload | None:
    """The workload status says a plan was made for; None when it cannot be read back."""
    inputs, outputs = _distribution(recorded.input_lengths), _distribution(recorded.output_lengths)
    hits = min(0.99, max(0.0, recorded.prefix_cache_hit_ratio or 0.0))
    burst = _burstiness(recorded.burstiness)
    try:
        if inputs is None and outputs is None:
            return Workload(
                recorded.input_tokens,
                recorded.output_tokens,
                recorded.requests_per_second,
                max_context_tokens,
                burstiness=burst,
                prefix_cache_hit_share=hits,
            )
        return Workload.of(
            inputs or LengthDistribution.constant(recorded.input_tokens),
            outputs or LengthDistribution.constant(recorded.output_tokens),
            recorded.requests_per_second,
            max_context_tokens,
            burstiness=burst,
            prefix_cache_hit_share=hits,
        )
    except ValueError:
        return None


def predicted_ttft_s(plan: PlanStatus) -> float:
    """The plan's predicted TTFT as written in seconds; a status written before the number was
    recorded gives its rounded text (the next plan writes the number)."""
    if plan.predicted_ttft_seconds is not None:
        return plan.predicted_ttft_seconds
    return parse_duration_s(plan.predicted_ttft)


def predicted_tpot_s(plan: PlanStatus) -> float:
    if plan.predicted_tpot_seconds is not None:
        return plan.predicted_tpot_seconds
    return parse_duration_s(plan.predicted_tpot)


def plan_status(
    planned: Planned, max_context: int, excluded: tuple[str, ...], workload: PlannedWorkloadStatus | None = None
) -> PlanStatus:
    chosen, p, plan = planned.chosen, planned.prediction, planned.plan
    f = figures(chosen)
    return PlanStatus(
        gpu_type=chosen.gpu,
        gpu_product=planned.pool.product_label,
        tensor_parallel=chosen.tensor_parallel,
        pipeline_parallel=chosen.pipeline_parallel,
        nodes=chosen.nodes,
        expert_parallel=chosen.expert_parallel,
        data_parallel=chosen.data_parallel,
        precision=chosen.precision,
        max_batch=p.max_batch,
        max_context_tokens=max_context,
        max_num_batched_tokens=chosen.max_num_batched_tokens,
        replicas=f.replicas,
        # The simulated check's two counts side by side: `replicas` is the simulator's, this the model's
        analytic_replicas=chosen.check.analytic_replicas if chosen.check is not None else None,
        predicted_ttft=format_duration(p.ttft_p_s),
        predicted_tpot=format_duration(p.tpot_p_s),
        predicted_ttft_seconds=f.ttft_s,
        predicted_tpot_seconds=f.tpot_s,
        predicted_itl_p99=format_duration(p.itl_p99_s),
        throughput_tokens_per_second=f.throughput_tokens_per_s,
        rate_per_replica=f.rate_per_replica_per_s,
        limited_by=p.limited_by,
        mbu=f.mbu,
        mfu=f.mfu,
        cost_per_hour=f.cost_usd_per_hour,
        reason=chosen.reason[:500],
        excluded_gpu_types=list(excluded),
        workload=workload,
        alternatives=[candidate_status(c) for c in plan.alternatives[:TOP_ALTERNATIVES]],
        rejected=[candidate_status(c) for c in closest_rejected(plan.rejected, plan.request.slo)[:MAX_REJECTED]],
    )


def closest_rejected(rejected: Sequence[Rejected], slo: Slo) -> list[Rejected]:
    """Rejected candidates, the most useful first: those a limit held back (they meet the SLO),
    then SLO misses by how far they miss, then the rest (memory, GPU support) in plan order."""

    def key(c: Rejected) -> tuple[int, float]:
        if c.replicas_needed is not None:
            return (0, float(c.replicas_needed))
        if c.best_ttft_s is not None and c.best_tpot_s is not None:
            return (1, max(c.best_ttft_s / slo.ttft_s, c.best_tpot_s / slo.tpot_s))
        return (2, 0.0)

    return sorted(rejected, key=key)


def observed_status(obs: Observation, decision: Decision) -> ObservedStatus:
    def dur(value: float | None) -> str | None:
        return None if value is None else format_duration(value)

    return ObservedStatus(
        ttft=dur(obs.ttft_p_s),
        tpot=dur(obs.tpot_p_s),
        requests_per_second=None if obs.arrival_rate_per_s is None else round(obs.arrival_rate_per_s, 4),
        queue=obs.waiting,
        kv_cache_usage=None if obs.kv_usage is None else round(obs.kv_usage, 4),
        calibration=round(decision.calibration, 4),
        tpot_source=obs.tpot_source,
        ttft_source=obs.ttft_source,
    )


def mark_synced(stage: str, status: InferenceServiceStatus, generation: int | None) -> InferenceServiceStatus:
    """After a timer run succeeds: Synced back to True if that timer had failed before."""
    synced = get_condition(status, "Synced")
    if synced is None or synced.status != "False" or synced.reason != f"{stage.capitalize()}Failed":
        return status
    return with_conditions(status, condition(status, "Synced", True, "Synced", f"{stage} succeeded", generation))


def _number(value: str | float | None) -> float | None:
    if isinstance(value, str):
        try:
            return parse_duration_s(value)
        except ValueError:
            return None
    return value


def _moved(before: ObservedStatus, after: ObservedStatus) -> bool:
    """Whether any observed value appeared, went, or changed by MEANINGFUL or more."""
    for name in type(after).model_fields:
        old, new = getattr(before, name), getattr(after, name)
        if (old is None) != (new is None):
            return True
        a, b = _number(old), _number(new)
        if a is None or b is None:
            if old != new:
                return True
        elif abs(b - a) > MEANINGFUL * max(abs(a), abs(b)):
            return True
    return False


def steady(before: InferenceServiceStatus, after: InferenceServiceStatus) -> InferenceServiceStatus:
    """`after` without the churn of a tick: a tick condition whose status and reason held keeps
    its message (a timeout message naming another query each tick is not news), and
    status.observed keeps its values unless one moved meaningfully, appeared or went."""
    kept = []
    for c in after.conditions:
        old = get_condition(before, c.type)
        same = old is not None and c.type in TICK_CONDITIONS and (old.status, old.reason) == (c.status, c.reason)
        kept.append(old if same and old is not None else c)
    observed = after.observed
    if before.observed is not None and observed is not None and not _moved(before.observed, observed):
        observed = before.observed
    return after.model_copy(update={"conditions": kept, "observed": observed})
