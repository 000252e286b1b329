"""From an InferenceService's intent and the cluster's GPUs to a plan, or to a precise reason
why not (pure: no Kubernetes calls)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvscale.api.intent import (
    Intent,
    SpecError,
    allowed_gpus,
    child_name_problems,
    plan_request,
    resolve_model,
    weight_precision,
)
from kvscale.control.inventory import GpuPool
from kvscale.engines.args import requested_source, unsupported_by_engine
from kvscale.engines.knobs import RESOURCE_KNOBS
from kvscale.planner.disaggregated import DisaggregatedPlan, LayoutPlan, Role, plan_disaggregated, plan_layouts
from kvscale.planner.routing_advice import GatewayAdvice, gateway_advice
from kvscale.planner.search import Feasible, Plan, Prediction, Rejected, plan
from kvscale.sizing.catalog import Catalog, ModelArch
from kvscale.sizing.checkpoints import CheckpointError, resolve_checkpoint, substitution
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.context_limit import ContextLimitError, check_requested_context
from kvscale.sizing.units import format_duration


@dataclass(frozen=True)
class Planned:
    """A plan that fits the cluster: the chosen candidate (with its configuration and
    prediction), the model, and the GPU pool it goes to."""

    plan: Plan
    chosen: Feasible
    model: ModelArch
    pool: GpuPool
    catalog: Catalog  # the one planned with: node sizes as the cluster's

    def gateway_advice(self) -> GatewayAdvice | None:
        """Behind a plain Service: the same GPU type behind a least-loaded gateway, where
        markedly cheaper (one more candidate's evaluation: asked for only where it is shown)."""
        return gateway_advice(self.catalog, self.plan)

    @property
    def prediction(self) -> Prediction:
        return self.chosen.prediction

    @property
    def config(self) -> ServingConfig:
        return self.chosen.config


@dataclass(frozen=True)
class Unplanned:
    """No plan: `retry` False when the spec must change (it waits for the next edit, logged as a
    warning), True when the cluster may change (no capacity: TemporaryError)."""

    reason: str  # CamelCase, for the condition
    message: str  # names the field and the fix
    retry: bool


def deployability(intent: Intent, catalog: Catalog, model: ModelArch) -> Unplanned | None:
    """Candidate-independent refusals: a context above the model's limit, a precision without a
    matching checkpoint, an engine that cannot run the KV-cache precision."""
    w, m = intent.as_written, intent.model
    try:
        check_requested_context(
            model,
            w.max_context_tokens,
            "spec.workload.maxContextTokens",
            w.input_tokens + w.output_tokens,
            "spec.workload.inputTokens + outputTokens",
        )
    except ContextLimitError as exc:
        return Unplanned("ContextTooLong", str(exc), retry=False)
    try:
        precision = weight_precision(intent, model)
        resolve_checkpoint(model, catalog.precision(precision), requested_source(m.name, m.source, precision))
    except CheckpointError as exc:
        return Unplanned("NoMatchingCheckpoint", str(exc), retry=False)
    unsupported = unsupported_by_engine(intent.engine, intent.kv_cache_precision)
    if unsupported is not None:
        return Unplanned("EngineUnsupported", f"spec.engine.type: {unsupported}", retry=False)
    return None


def _with_engine_images(intent: Intent, catalog: Catalog, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """Leave out AMD GPUs when the engine has no ROCm image (none in the catalog or the spec)."""
    if intent.rocm_image or catalog.engine(intent.engine).rocm_image:
        return allowed
    if allowed and all(catalog.gpu(g).vendor == "amd" for g in allowed):
        return ()
    return tuple(g for g in allowed or tuple(catalog.gpus) if catalog.gpu(g).vendor != "amd")


def _as_sized_in_cluster(catalog: Catalog, pools: Mapping[str, GpuPool]) -> Catalog:
    """The catalog with each present GPU's node size taken from the cluster's largest node."""
    gpus = dict(catalog.gpus)
    for name, pool in pools.items():
        if pool.max_per_node > 0 and name in gpus:
            gpus[name] = gpus[name].model_copy(update={"gpus_per_node": (pool.max_per_node,)})
    return catalog.model_copy(update={"gpus": gpus})


def _no_capacity(best: Plan, pools: Mapping[str, GpuPool], excluded: tuple[str, ...]) -> Unplanned:
    have = ", ".join(f"{p.free} free {n}" for n, p in sorted(pools.items()) if n not in excluded) or "no GPU nodes"
    gone = f" ({', '.join(excluded)} left out: pods stayed unschedulable)" if excluded else ""
    fits = ""
    if best.chosen is not None:
        c = best.chosen
        need = c.prediction.replicas * c.config.gpus
        shape = (
            f"DP{c.data_parallel} attention"
            if c.data_parallel > 1
            else f"TP{c.tensor_parallel}"
            if c.pipeline_parallel == 1
            else f"TP{c.tensor_parallel} x PP{c.pipeline_parallel}"
        )
        nodes = f", {c.nodes} whole nodes each" if c.nodes > 1 else ""
        fits = f"; it would fit on {need} x {c.gpu} ({c.prediction.replicas} replica(s) x {shape}{nodes})"
    return Unplanned(
        "InsufficientGPUs",
        f"no plan fits the cluster's free GPUs ({have}){gone}{fits}: add such nodes or widen spec.hardware.gpuTypes",
        retry=True,
    )


def _usable(intent: Intent, catalog: Catalog) -> tuple[ModelArch, tuple[str, ...]] | Unplanned:
    """The model and the GPU types the spec allows, or why the spec cannot be planned at all."""
    try:
        model = resolve_model(intent, catalog)
        allowed = allowed_gpus(intent, catalog)
    except SpecError as exc:
        return Unplanned(exc.reason, exc.message, retry=False)
    refused = deployability(intent, catalog, model)
    if refused is not None:
        return refused
    with_images = _with_engine_images(intent, catalog, allowed)
    if intent.gpu_types and not with_images:
        return Unplanned(
            "NoEngineImage",
            f"spec.engine.rocmImage: engine {intent.engine} has no ROCm image in kvscale's catalog and "
            "spec.hardware.gpuTypes allows only AMD GPUs: set spec.engine.rocmImage or allow NVIDIA GPUs",
            retry=False,
        )
    return model, with_images


def _misfit(r: Rejected) -> bool:
    """Refused for memory: the weights, or one sequence of the context, do not fit (planner reasons)."""
    return r.reason.startswith(("does not fit", "KV cache holds"))


def fits_nowhere(result: Plan) -> bool:
    """No candidate fits in memory: none reached an SLO check or a replica limit."""
    rejected = result.rejected
    return (
        result.chosen is None
        and any(_misfit(r) for r in rejected)
        and all(r.best_ttft_s is None and r.limit is None for r in rejected)
    )


def _does_not_fit(
    intent: Intent, catalog: Catalog, model: ModelArch, result: Plan, pools: Mapping[str, GpuPool]
) -> str:
    """DoesNotFit's message: the largest candidate's shortfall, then the spec's fields that would
    help, naming only GPU types the cluster has."""
    misfits = [r for r in result.rejected if _misfit(r)]
    largest = max(misfits, key=lambda r: catalog.gpu(r.gpu).memory_bytes * r.tensor_parallel * r.pipeline_parallel)
    precision = largest.precision
    fixes = []
    if precision in ("bf16", "fp16"):
        fixes.append(RESOURCE_KNOBS.to(RESOURCE_KNOBS.precision, RESOURCE_KNOBS.smaller_precision))
    elif precision in ("fp8", "int8"):
        fixes.append(RESOURCE_KNOBS.to(RESOURCE_KNOBS.precision, "int4 (with a checkpoint quantized that way)"))
    tried = {r.gpu for r in result.rejected}
    biggest = max(catalog.gpu(g).memory_bytes for g in tried)
    larger = sorted(n for n in pools if n in catalog.gpus and catalog.gpu(n).memory_bytes > biggest)
    if larger:
        fixes.append(f"add {', '.join(larger)} (in the cluster, larger) to spec.hardware.gpuTypes")
    top = max(intent.tensor_parallel)
    if top < max(catalog.gpu(g).max_gpus_per_node for g in tried):
        fixes.append(f"raise spec.hardware.maxTensorParallel above {top}")
    if largest.reason.startswith("KV cache holds"):
        fixes.append("lower spec.workload.maxContextTokens")
    fix = "; ".join(fixes) or "add nodes with GPUs of more memory"
    return (
        f"{model.name} at {precision} fits in no allowed GPU's memory ({', '.join(sorted(tried))}, up to tensor "
        f"parallel {top}); largest tried, {largest.label}: {largest.reason}. Fix: {fix}"
    )


def _unservable(
    intent: Intent,
    catalog: Catalog,
    model: ModelArch,
    allowed: tuple[str, ...],
    pools: Mapping[str, GpuPool],
    everywhere: Plan,
) -> Unplanned:
    """Why no allowed GPU type serves the spec at all, with fixes that name only GPU types the
    cluster has (its nodes): a suggestion of B200 in a cluster of A100s helps no one."""
    have = tuple(n for n in pools if not allowed or n in allowed)
    local = plan(_as_sized_in_cluster(catalog, pools), plan_request(intent, model, have, None)) if have else everywhere
    if local.feasible:  # a node size the catalog does not know: keep the catalog-wide verdict
        local = everywhere
    if fits_nowhere(local):
        return Unplanned("DoesNotFit", _does_not_fit(intent, catalog, model, local, pools), retry=False)
    hint = "; ".join(local.suggestions)
    return Unplanned("SLOInfeasible", f"no GPU type meets spec.slo for this model and workload: {hint}", retry=False)


def precheck(name: str, intent: Intent, catalog: Catalog) -> SpecError | None:
    """What is refused before planning, by the operator and `kvscale manifests` alike: names
    the API server would refuse in the children (kvscale.api.intent.child_name_problems), and
    the engine's weights-cache variable in spec.engine.env (kvscale sets it, from spec.model.cache;
    the CRD's CEL rule says the same where the API server checks it)."""
    problems = child_name_problems(name, intent.spec)
    if problems:
        return SpecError("InvalidName", "; ".join(problems))
    cache_env = catalog.engine(intent.engine).cache_env
    if cache_env in intent.env_names:
        return SpecError(
            "InvalidEnv",
            f"spec.engine.env: {cache_env} is set by kvscale (where the engine keeps downloaded weights, "
            "mounted from spec.model.cache); remove it from spec.engine.env and set spec.model.cache instead",
        )
    return None


def plan_service(
    intent: Intent,
    catalog: Catalog,
    pools: Mapping[str, GpuPool],
    excluded: tuple[str, ...] = (),
    prefer_gpu: str | None = None,
) -> Planned | Unplanned:
    """The best plan that fits the cluster's free GPUs; with `prefer_gpu` (a GPUBudget's move),
    the best one on that type where one fits, the others kept as alternatives."""
    usable = _usable(intent, catalog)
    if isinstance(usable, Unplanned):
        return usable
    model, allowed = usable
    # Anywhere at all? If not, the spec itself is unusable: say what would help.
    everywhere = plan(catalog, plan_request(intent, model, allowed, None))
    if not everywhere.feasible:
        return _unservable(intent, catalog, model, allowed, pools, everywhere)
    present = tuple(name for name in pools if name not in excluded and (not allowed or name in allowed))
    if not present:
        return _no_capacity(everywhere, pools, excluded)
    limits = {name: pools[name].free for name in present}
    sized = _as_sized_in_cluster(catalog, pools)
    in_cluster = plan(sized, plan_request(intent, model, present, limits))
    # A replica across nodes needs whole nodes of free GPUs, which free GPUs summed over nodes
    # overstate: count the pods that fit node by node, and plan again within them if short.
    for _ in present:
        chosen = in_cluster.chosen
        if chosen is None or chosen.nodes == 1:
            break
        per_node = chosen.config.gpus_per_node
        fitting = pools[chosen.gpu].pods_fitting(per_node)
        if fitting >= chosen.prediction.replicas * chosen.nodes:
            break
        limits[chosen.gpu] = min(limits[chosen.gpu], fitting * per_node)
        in_cluster = plan(sized, plan_request(intent, model, present, limits))
    if in_cluster.chosen is None:
        return _no_capacity(everywhere, pools, excluded)
    chosen = in_cluster.chosen
    moved = next((c for c in in_cluster.alternatives if c.gpu == prefer_gpu), None)
    if prefer_gpu is not None and chosen.gpu != prefer_gpu and moved is not None:
        rest = tuple(c for c in in_cluster.alternatives if c is not moved)
        in_cluster = replace(in_cluster, chosen=moved, alternatives=(chosen, *rest))
        chosen = moved
    note = _substitution(intent, catalog, model, chosen.precision)
    if note is not None:  # status.plan.reason, the Planned condition and its Event say it
        chosen = replace(chosen, reason=f"{note}; {chosen.reason}")
        in_cluster = replace(in_cluster, chosen=chosen)
    return Planned(in_cluster, chosen, model, pools[chosen.gpu], sized)


def _substitution(intent: Intent, catalog: Catalog, model: ModelArch, precision: str) -> str | None:
    """The plan's checkpoint when it is another repository than the one named (a published
    quantization of the same model), said first; deployability() refused the rest already."""
    m = intent.model
    try:
        checkpoint = resolve_checkpoint(
            model, catalog.precision(precision), requested_source(m.name, m.source, precision)
        )
    except CheckpointError:
        return None
    return substitution(checkpoint)


@dataclass(frozen=True)
class PoolsPlanned:
    """A disaggregated plan (a prefill pool and a decode pool) that fits the cluster's free
    GPUs, chosen under spec.serving.disaggregation; `aggregated`: the aggregated plan beside it
    where one fits (auto)."""

    plan: DisaggregatedPlan
    model: ModelArch
    pools: Mapping[Role, GpuPool]  # by role: the GPU pool each pool's pods go to
    catalog: Catalog
    aggregated: Planned | None = None

    @property
    def reason(self) -> str:
        return self.plan.reason


def plan_layout(
    intent: Intent,
    catalog: Catalog,
    pools: Mapping[str, GpuPool],
    excluded: tuple[str, ...],
    aggregated: Planned | Unplanned,
) -> Planned | PoolsPlanned | Unplanned:
    """spec.serving.disaggregation on the cluster's free GPUs: `off` keeps `aggregated` (the
    plan_service outcome) as it is; `auto` the disaggregated pools where the planner finds them
    strictly better by the objective (kvscale.planner.disaggregated.plan_layouts) and a P/D
    router can reach them (spec.routing.inferencePool), else `aggregated`; `on` the pools, or
    why there are none."""
    mode = intent.spec.serving.disaggregation
    if mode == "off":
        return aggregated
    usable = _usable(intent, catalog)
    if isinstance(usable, Unplanned):
        return usable
    model, allowed = usable
    present = tuple(name for name in pools if name not in excluded and (not allowed or name in allowed))
    found: LayoutPlan | None = None
    if present:
        request = plan_request(intent, model, present, {name: pools[name].free for name in present})
        beside = aggregated.plan if isinstance(aggregated, Planned) and mode == "auto" else None
        found = plan_layouts(_as_sized_in_cluster(catalog, pools), request, mode, aggregated=beside)
        if found.mode == "disaggregated" and found.disaggregated is not None:
            d = found.disaggregated
            if mode == "auto" and not intent.routing.inference_pool and isinstance(aggregated, Planned):
                # Behind a plain Service the decode pods answer alone, prefilling locally: the
                # prefill pool serves only behind a P/D-aware router (llm-d's endpoint picker with
                # its P/D profile, through spec.routing.inferencePool), so `auto` does not pick
                # pools that nothing would route to.
                return aggregated
            if mode == "on":
                d = replace(d, reason=f"spec.serving.disaggregation is on: {_pools_said(d)}")
            by_role: dict[Role, GpuPool] = {
                "prefill": pools[d.prefill.cfg.gpu.name],
                "decode": pools[d.decode.cfg.gpu.name],
            }
            kept = aggregated if isinstance(aggregated, Planned) else None
            return PoolsPlanned(d, model, by_role, _as_sized_in_cluster(catalog, pools), kept)
    if mode == "auto":
        return aggregated
    anywhere = plan_disaggregated(catalog, plan_request(intent, model, allowed, None))
    if isinstance(anywhere, str):
        why = found.disaggregated_why_none if found is not None else anywhere
        return Unplanned(
            "DisaggregationInfeasible",
            f"spec.serving.disaggregation is on but no prefill and decode pools serve this spec: {why or anywhere}; "
            "set spec.serving.disaggregation to auto or off for aggregated replicas",
            retry=False,
        )
    have = ", ".join(f"{p.free} free {n}" for n, p in sorted(pools.items()) if n not in excluded) or "no GPU nodes"
    return Unplanned(
        "InsufficientGPUs",
        f"spec.serving.disaggregation is on and no prefill and decode pools fit the cluster's free GPUs ({have}); "
        f"they would fit on {anywhere.prefill.shape} (prefill) + {anywhere.decode.shape} (decode): add such nodes "
        "or widen spec.hardware.gpuTypes",
        retry=True,
    )


def _pools_said(d: DisaggregatedPlan) -> str:
    return (
        f"{d.prefill.shape} prefill + {d.decode.shape} decode ({d.gpus_total} GPUs, ${d.cost_usd_per_hour:.2f}/h), "
        f"TTFT {format_duration(d.ttft_p_s)} and TPOT {format_duration(d.tpot_p_s)} predicted at "
        f"p{d.request.slo.percentile:g}, KV transfer {format_duration(d.kv_transfer_s)} per request over {d.path.name}"
    )
