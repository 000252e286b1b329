"""The spec, parsed once: from the wire model to the domain values the planner, the policy and
the builders take (SI units, durations in seconds). Every later step reads these values, never
the strings; every error names the field and the fix."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from kvscale.api.crd import DNS_LABEL_1035, ENV_VAR_NAME, MAX_NAME_LENGTH
from kvscale.api.models import InferenceServiceSpec, PlanStatus, PoolPlanStatus, parse_spec
from kvscale.autoscaling import tuning
from kvscale.autoscaling.policy import PolicyConfig
from kvscale.engines.knobs import RESOURCE_KNOBS
from kvscale.planner.search import TENSOR_PARALLEL_DEGREES, Objective, PlanRequest
from kvscale.sizing.catalog import Catalog, CatalogError, ModelArch
from kvscale.sizing.checkpoints import EngineType, default_precision
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.engine_profiles import profile_on
from kvscale.sizing.hf_config import arch_from_hf_config
from kvscale.sizing.units import UnitError, parse_duration_s
from kvscale.sizing.workload import Slo, Workload

Mode = Literal["auto", "recommend"]


class SpecError(ValueError):
    """The spec cannot be used as written. `reason` is the condition's CamelCase reason; the
    message names the field (spec.x.y) and what to change."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ScalingIntent:
    min_replicas: int
    max_replicas: int
    mode: Mode
    scale_down_stabilization_s: float
    pinned_replicas: int | None  # spec.scaling.replicas (the scale subresource)
    idle_window_s: float = 300.0  # with minReplicas 0: no requests this long releases the last replica
    priority: int = 0  # spec.scaling.priority: who gives GPUs up first under a GPUBudget

    def bounded(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class Routing:
    """How requests reach the engines (spec.routing): through an InferencePool, whose endpoint
    picker routes to the least-loaded pods, and/or the KEDA HTTP add-on's interceptor."""

    inference_pool: bool = False
    pool_name: str | None = None  # as written; None: the service's own name
    keda_http: bool = False
    http_scaled_object: str | None = None  # as written; None: the service's own name

    @property
    def least_loaded(self) -> bool:
        """Behind an InferencePool the endpoint picker sends a request to the least-loaded pod;
        behind a plain Service a backlog stays where it is."""
        return self.inference_pool

    def pool(self, service: str) -> str | None:
        return (self.pool_name or service) if self.inference_pool else None

    def scaled_object(self, service: str) -> str | None:
        return (self.http_scaled_object or service) if self.keda_http else None


@dataclass(frozen=True)
class ModelIntent:
    """spec.model beyond its architecture: what tells replicas of one model apart, where the
    weights come from, and whether a cache keeps them across pods."""

    key: str  # the catalog name, or the architecture as JSON: replicas that start alike share it
    name: str | None
    source: str | None  # spec.model.source as written
    weights_cached: bool  # spec.model.cache is set: a new pod does not download the checkpoint


@dataclass(frozen=True)
class Intent:
    """What an InferenceService asks for, in domain values. The pure core reads these fields;
    `spec`, the validated wire form, only travels to the builders that copy it through into
    the children (image, env, volumes) and to the pre-planning name check."""

    spec: InferenceServiceSpec  # the validated wire form, for what the builders copy through
    workload: Workload
    slo: Slo
    gpu_types: tuple[str, ...]  # as written; empty: any type present
    tensor_parallel: tuple[int, ...]
    precision: str | None  # as written; None: the checkpoint's own (weight_precision)
    kv_cache_precision: str
    objective: Objective
    engine: EngineType
    scaling: ScalingIntent
    max_itl_s: float | None = None  # spec.slo.maxInterTokenLatency: bounds the chunk budget
    routing: Routing = Routing()
    model: ModelIntent = ModelIntent("", None, None, False)
    written: Workload | None = None  # spec.workload as written (`workload` may be a re-plan's observed one)
    env_names: tuple[str, ...] = ()  # spec.engine.env's names, in order
    rocm_image: bool = False  # spec.engine.rocmImage is set
    data_parallel_attention: bool = False  # spec.hardware.dataParallelAttention

    @property
    def as_written(self) -> Workload:
        return self.written or self.workload

    @property
    def max_context_tokens(self) -> int:
        return self.workload.engine_max_context_tokens


def validation_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        where = ".".join(["spec", *(str(p) for p in e["loc"])])
        parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)


def _seconds(text: str, field: str) -> float:
    try:
        return parse_duration_s(text, field=field)
    except UnitError as exc:
        raise SpecError("InvalidSpec", str(exc)) from exc


def parse_intent(raw: Mapping[str, Any] | InferenceServiceSpec) -> Intent:
    """The spec as domain values, or a SpecError naming the field."""
    try:
        spec = raw if isinstance(raw, InferenceServiceSpec) else parse_spec(raw)
    except ValidationError as exc:
        raise SpecError("InvalidSpec", validation_message(exc)) from exc
    w, s, h, sc = spec.workload, spec.slo, spec.hardware, spec.scaling
    ttft_s = _seconds(s.time_to_first_token, "spec.slo.timeToFirstToken")
    tpot_s = _seconds(s.time_per_output_token, "spec.slo.timePerOutputToken")
    stabilization_s = _seconds(sc.scale_down_stabilization, "spec.scaling.scaleDownStabilization")
    try:
        workload = Workload(w.input_tokens, w.output_tokens, w.requests_per_second, w.max_context_tokens)
        slo = Slo(ttft_s, tpot_s, s.percentile)
    except ValueError as exc:
        raise SpecError("InvalidSpec", f"spec.workload/spec.slo: {exc}") from exc
    return Intent(
        spec=spec,
        workload=workload,
        slo=slo,
        gpu_types=tuple(h.gpu_types),
        tensor_parallel=tuple(tp for tp in TENSOR_PARALLEL_DEGREES if tp <= h.max_tensor_parallel),
        precision=spec.model.precision,
        kv_cache_precision=spec.model.kv_cache_precision,
        objective=h.objective,
        engine=spec.engine.type,
        scaling=ScalingIntent(
            sc.min_replicas,
            sc.max_replicas,
            sc.mode,
            stabilization_s,
            sc.replicas,
            _seconds(sc.idle_window, "spec.scaling.idleWindow"),
            sc.priority,
        ),
        max_itl_s=(
            _seconds(s.max_inter_token_latency, "spec.slo.maxInterTokenLatency")
            if s.max_inter_token_latency is not None
            else None
        ),
        routing=_routing(spec),
        model=ModelIntent(
            spec.model.name
            or (spec.model.architecture.model_dump_json() if spec.model.architecture is not None else ""),
            spec.model.name,
            spec.model.source,
            spec.model.cache is not None,
        ),
        written=workload,
        env_names=tuple(e.name for e in spec.engine.env),
        rocm_image=bool(spec.engine.rocm_image),
        data_parallel_attention=spec.hardware.data_parallel_attention,
    )


def read_spec(raw: Mapping[str, Any] | InferenceServiceSpec) -> Intent | SpecError:
    """The one parse of a handler call: the Intent, or the SpecError that says what to fix
    (a value, so the pure core can turn it into a condition instead of catching it)."""
    try:
        return parse_intent(raw)
    except SpecError as exc:
        return exc


def _routing(spec: InferenceServiceSpec) -> Routing:
    r = spec.routing
    pool = r.inference_pool if r is not None else None
    keda = r.keda_http if r is not None else None
    return Routing(
        pool is not None,
        pool.name if pool is not None else None,
        keda is not None,
        keda.http_scaled_object if keda is not None else None,
    )


def resolve_model(intent: Intent, catalog: Catalog) -> ModelArch:
    """The catalog's model, or the spec's own architecture; SpecError when neither is usable."""
    m = intent.spec.model
    if m.architecture is not None:
        a = m.architecture
        if a.hugging_face_config is not None:
            try:
                return arch_from_hf_config(
                    a.hugging_face_config, m.name or "custom", "spec.model.architecture.huggingFaceConfig"
                )
            except ValueError as exc:
                raise SpecError(
                    "InvalidArchitecture", f"spec.model.architecture.huggingFaceConfig: {' '.join(str(exc).split())}"
                ) from exc
        try:
            return ModelArch.from_architecture(
                m.name or "custom",
                layers=a.layers,
                hidden_size=a.hidden_size,
                heads=a.heads,
                kv_heads=a.kv_heads,
                head_dim=a.head_dim,
                intermediate_size=a.intermediate_size,
                vocab_size=a.vocab_size,
                params=a.params,
                experts=a.experts or 1,
                active_experts=a.active_experts or 1,
                max_context_tokens=a.max_context_tokens,
            )
        except ValueError as exc:
            raise SpecError("InvalidArchitecture", f"spec.model.architecture: {exc}") from exc
    try:
        return catalog.model(m.name or "")
    except CatalogError as exc:
        raise SpecError("UnknownModel", f"spec.model.name: {exc}; or describe it with spec.model.architecture") from exc


def weight_precision(intent: Intent, model: ModelArch) -> str:
    """spec.model.precision, else the model's checkpoint precision (fp8 for DeepSeek-V3/R1,
    mxfp4 for gpt-oss), else bf16: what the CLI's --precision defaults to as well."""
    return default_precision(intent.precision, model)


def serving_config(intent: Intent, plan: PlanStatus, catalog: Catalog) -> ServingConfig:
    """The configuration a plan in status describes (gpuType, tensorParallel, pipelineParallel,
    expert parallelism, precision, chunk budget; a status written before the budget was recorded gets the engine's default)."""
    gpu = catalog.gpu(plan.gpu_type)
    return ServingConfig.build(
        catalog,
        resolve_model(intent, catalog),
        gpu,
        plan.precision,
        plan.tensor_parallel,
        intent.kv_cache_precision,
        # The profile of the release the pods run, as the plan was made with (plan_request)
        profile_on(catalog, intent.engine, gpu, intent.spec.engine.image, intent.spec.engine.rocm_image).profile,
        plan.max_num_batched_tokens,
        pipeline_parallel=plan.pipeline_parallel,
        expert_parallel=plan.expert_parallel,
        data_parallel=plan.data_parallel,
    )


def pool_serving_config(intent: Intent, plan: PlanStatus, pool: PoolPlanStatus, catalog: Catalog) -> ServingConfig:
    """The configuration of one pool of a disaggregated plan in status (status.plan.prefill or
    .decode): the service's model, KV precision and engine profile, the pool's GPU type, tensor
    parallelism, precision and chunk budget."""
    as_plan = plan.model_copy(
        update={
            "gpu_type": pool.gpu_type,
            "tensor_parallel": pool.tensor_parallel,
            "pipeline_parallel": 1,
            "data_parallel": 1,
            "precision": pool.precision,
            "max_batch": pool.max_batch,
            "max_num_batched_tokens": pool.max_num_batched_tokens,
        }
    )
    return serving_config(intent, as_plan, catalog)


def allowed_gpus(intent: Intent, catalog: Catalog) -> tuple[str, ...]:
    """spec.hardware.gpuTypes as catalog names (aliases resolved); empty: any."""
    try:
        return tuple(catalog.gpu(g).name for g in intent.gpu_types)
    except CatalogError as exc:
        raise SpecError("UnknownGPUType", f"spec.hardware.gpuTypes: {exc}") from exc


def plan_request(
    intent: Intent, model: ModelArch, gpus: tuple[str, ...], gpu_limits: Mapping[str, int] | None
) -> PlanRequest:
    return PlanRequest(
        model=model,
        workload=intent.workload,
        slo=intent.slo,
        gpus=gpus,
        tensor_parallel=intent.tensor_parallel,
        precisions=(weight_precision(intent, model),),
        kv_cache_precision=intent.kv_cache_precision,
        objective=intent.objective,
        max_replicas=intent.scaling.max_replicas,
        gpu_limits=gpu_limits,
        engine=intent.engine,
        # The engine release sizes the plan: spec.engine.image's tag picks the profile of its
        # step times and CPU costs (vllm/vllm-openai:v0.6.3 plans as vllm-0.2, not as vllm-0.11)
        engine_image=intent.spec.engine.image,
        rocm_engine_image=intent.spec.engine.rocm_image,
        data_parallel_attention=intent.data_parallel_attention,
        # Behind an InferencePool the endpoint picker routes to the least-loaded pods, as the
        # autoscaler's capacity model takes it (kvscale.control.scaling.capacity).
        least_loaded=intent.routing.least_loaded,
        knobs=RESOURCE_KNOBS,  # the operator's conditions name the resource's fields, not the CLI's flags
        max_itl_s=intent.max_itl_s,
    )


def policy_config(intent: Intent, cold_start_s: float, interval_s: float, window_s: float) -> PolicyConfig:
    """The autoscaling policy's configuration for this resource, through the one constructor
    the simulator uses too (kvscale.autoscaling.tuning)."""
    return tuning.policy_config(
        ttft_target_s=intent.slo.ttft_s,
        tpot_target_s=intent.slo.tpot_s,
        input_tokens=intent.workload.input_tokens,
        output_tokens=intent.workload.output_tokens,
        min_replicas=intent.scaling.min_replicas,
        max_replicas=intent.scaling.max_replicas,
        cold_start_s=cold_start_s,
        interval_s=interval_s,
        window_s=window_s,
        # Behind an InferencePool the endpoint picker sends requests to the least-loaded pods,
        # so a backlog reaches new replicas; behind the plain Service it stays where it is.
        least_loaded_routing=intent.routing.least_loaded,
        scale_down_stabilization_s=intent.scaling.scale_down_stabilization_s,
    )


_DNS_LABEL = re.compile(DNS_LABEL_1035)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME = re.compile(ENV_VAR_NAME)


def child_name_problems(name: str, spec: InferenceServiceSpec) -> list[str]:
    """What the API server would refuse in the children this resource makes, said up front
    (the CRD's CEL rules say the same where the API server checks them): the name becomes a
    Service name (a DNS-1035 label) and, with suffixes, the pods' names; env names and the
    credentials Secret must be valid as Kubernetes names."""
    problems = []
    if len(name) > MAX_NAME_LENGTH or not _DNS_LABEL.match(name):
        problems.append(
            f"metadata.name: {name!r} must be at most {MAX_NAME_LENGTH} characters of a-z, 0-9 and '-', "
            "starting with a letter (it names the engine Service); recreate it under such a name"
        )
    for i, env in enumerate(spec.engine.env):
        if not _ENV_NAME.match(env.name):
            problems.append(
                f"spec.engine.env[{i}].name: {env.name!r} is not a valid environment variable name "
                "(letters, digits, '_', '-', '.'; not starting with a digit)"
            )
    seen: set[str] = set()
    for i, env in enumerate(spec.engine.env):
        if env.name in seen:  # server-side apply refuses a list with two entries of one key
            problems.append(f"spec.engine.env[{i}].name: {env.name!r} is set twice; keep one entry")
        seen.add(env.name)
    secret = spec.model.credentials_secret
    if secret is not None and (len(secret) > 253 or not _DNS_SUBDOMAIN.match(secret)):
        problems.append(f"spec.model.credentialsSecret: {secret!r} is not a valid Secret name (lowercase DNS name)")
    return problems
