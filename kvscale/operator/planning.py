"""From an InferenceService spec and the cluster's GPUs to a plan, or to a precise reason
why not (pure: no Kubernetes calls)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvscale.api.models import InferenceServiceSpec
from kvscale.operator.inventory import GpuPool
from kvscale.sizing.catalog import Catalog, CatalogError, ModelArch
from kvscale.sizing.checkpoints import CheckpointError, resolve_checkpoint
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.context_limit import ContextLimitError, check_requested_context
from kvscale.sizing.engine_args import requested_source, unsupported_by_engine
from kvscale.sizing.planner import TENSOR_PARALLEL_DEGREES, Feasible, Plan, PlanRequest, plan
from kvscale.sizing.units import parse_duration_s
from kvscale.sizing.workload import Slo, Workload

Outcome = Literal["planned", "unusable", "no-capacity"]


@dataclass(frozen=True)
class PlanningResult:
    outcome: Outcome
    reason: str  # CamelCase, for the condition
    message: str  # names the field and the fix
    plan: Plan | None = None
    model: ModelArch | None = None

    @property
    def chosen(self) -> Feasible | None:
        return self.plan.chosen if self.plan else None


def resolve_model(spec: InferenceServiceSpec, catalog: Catalog) -> ModelArch:
    m = spec.model
    if m.architecture is not None:
        a = m.architecture
        fields = {
            "layers": a.layers,
            "hidden_size": a.hidden_size,
            "heads": a.heads,
            "kv_heads": a.kv_heads,
            "head_dim": a.head_dim,
            "intermediate_size": a.intermediate_size,
            "vocab_size": a.vocab_size,
            "params": a.params,
            "experts": a.experts or 1,
            "active_experts": a.active_experts or 1,
        }
        return ModelArch.from_architecture(m.name or "custom", **fields)
    assert m.name is not None
    return catalog.model(m.name)


def serving_config_from_plan(spec: InferenceServiceSpec, plan: Mapping[str, Any], catalog: Catalog) -> ServingConfig:
    """The configuration a plan in status describes (gpuType, tensorParallel, precision)."""
    model = resolve_model(spec, catalog)
    return ServingConfig.build(
        catalog,
        model,
        catalog.gpu(plan["gpuType"]),
        plan["precision"],
        plan["tensorParallel"],
        spec.model.kv_cache_precision,
        spec.engine.type,
    )


def deployability(spec: InferenceServiceSpec, catalog: Catalog, model: ModelArch) -> PlanningResult | None:
    """Candidate-independent refusals: a context above the model's limit, a precision without a
    matching checkpoint, an engine that cannot run the KV-cache precision."""
    w, m = spec.workload, spec.model
    try:
        check_requested_context(
            model,
            w.max_context_tokens,
            "spec.workload.maxContextTokens",
            w.input_tokens + w.output_tokens,
            "spec.workload.inputTokens + outputTokens",
        )
    except ContextLimitError as exc:
        return PlanningResult("unusable", "ContextTooLong", str(exc), model=model)
    try:
        resolve_checkpoint(model, catalog.precision(m.precision), requested_source(m.name, m.source, m.precision))
    except CheckpointError as exc:
        return PlanningResult("unusable", "NoMatchingCheckpoint", str(exc), model=model)
    unsupported = unsupported_by_engine(spec.engine.type, m.kv_cache_precision)
    if unsupported is not None:
        return PlanningResult("unusable", "EngineUnsupported", f"spec.engine.type: {unsupported}", model=model)
    return None


def _with_engine_images(spec: InferenceServiceSpec, catalog: Catalog, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """Leave out AMD GPUs when the engine has no ROCm image (none in the catalog or the spec)."""
    if spec.engine.rocm_image or catalog.engine(spec.engine.type).rocm_image:
        return allowed
    if allowed and all(catalog.gpu(g).vendor == "amd" for g in allowed):
        return ()
    return tuple(g for g in allowed or tuple(catalog.gpus) if catalog.gpu(g).vendor != "amd")


def _as_sized_in_cluster(catalog: Catalog, pools: Mapping[str, GpuPool]) -> Catalog:
    """The catalog with each present GPU's node size taken from the cluster's largest node."""
    gpus = dict(catalog.gpus)
    for name, pool in pools.items():
        if pool.max_per_node > 0:
            gpus[name] = gpus[name].model_copy(update={"gpus_per_node": (pool.max_per_node,)})
    return catalog.model_copy(update={"gpus": gpus})


def plan_service(
    spec: InferenceServiceSpec,
    catalog: Catalog,
    pools: Mapping[str, GpuPool],
    excluded: tuple[str, ...] = (),
) -> PlanningResult:
    try:
        model = resolve_model(spec, catalog)
    except CatalogError as exc:
        return PlanningResult(
            "unusable", "UnknownModel", f"spec.model.name: {exc}; or describe it with spec.model.architecture"
        )
    except ValueError as exc:
        return PlanningResult("unusable", "InvalidArchitecture", f"spec.model.architecture: {exc}")
    try:
        allowed = tuple(catalog.gpu(g).name for g in spec.hardware.gpu_types)
    except CatalogError as exc:
        return PlanningResult("unusable", "UnknownGPUType", f"spec.hardware.gpuTypes: {exc}")
    refused = deployability(spec, catalog, model)
    if refused is not None:
        return refused
    allowed = _with_engine_images(spec, catalog, allowed)
    if spec.hardware.gpu_types and not allowed:
        return PlanningResult(
            "unusable",
            "NoEngineImage",
            f"spec.engine.rocmImage: engine {spec.engine.type} has no ROCm image in kvscale's catalog and "
            "spec.hardware.gpuTypes allows only AMD GPUs: set spec.engine.rocmImage or allow NVIDIA GPUs",
            model=model,
        )
    w, s = spec.workload, spec.slo
    workload = Workload(w.input_tokens, w.output_tokens, w.requests_per_second, w.max_context_tokens)
    slo = Slo(parse_duration_s(s.time_to_first_token), parse_duration_s(s.time_per_output_token), s.percentile)
    tps = tuple(tp for tp in TENSOR_PARALLEL_DEGREES if tp <= spec.hardware.max_tensor_parallel)
    precisions = (spec.model.precision,)

    def request(gpus: tuple[str, ...], limits: Mapping[str, int] | None) -> PlanRequest:
        return PlanRequest(
            model=model,
            workload=workload,
            slo=slo,
            gpus=gpus,
            tensor_parallel=tps,
            precisions=precisions,
            kv_cache_precision=spec.model.kv_cache_precision,
            objective=spec.hardware.objective,
            max_replicas=spec.scaling.max_replicas,
            gpu_limits=limits,
            engine=spec.engine.type,
        )

    # Anywhere at all? If not, the spec itself is unusable: say what would help.
    everywhere = plan(catalog, request(allowed, None))
    if not everywhere.feasible:
        hint = "; ".join(everywhere.suggestions)
        return PlanningResult(
            "unusable",
            "SLOInfeasible",
            f"no GPU type meets spec.slo for this model and workload: {hint}",
            everywhere,
            model,
        )
    present = tuple(name for name in pools if name not in excluded and (not allowed or name in allowed))
    limits = {name: pools[name].free for name in present}
    in_cluster = plan(_as_sized_in_cluster(catalog, pools), request(present, limits)) if present else None
    if in_cluster is not None and in_cluster.chosen is not None:
        return PlanningResult("planned", "Planned", in_cluster.chosen.reason, in_cluster, model)
    best = everywhere.chosen
    assert best is not None
    need = best.prediction.replicas * best.tensor_parallel
    have = ", ".join(f"{p.free} free {n}" for n, p in sorted(pools.items()) if n not in excluded) or "no GPU nodes"
    gone = f" ({', '.join(excluded)} left out: pods stayed unschedulable)" if excluded else ""
    return PlanningResult(
        "no-capacity",
        "InsufficientGPUs",
        f"no plan fits the cluster's free GPUs ({have}){gone}; it would fit on {need} x {best.gpu} "
        f"({best.prediction.replicas} replica(s) x TP{best.tensor_parallel}): add such nodes or widen spec.hardware.gpuTypes",
        everywhere,
        model,
    )
