"""Spec and status of an InferenceService. Strict: unknown fields are rejected, ranges and
enums enforced; camelCase on the wire. The CRD schema is generated from these models."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from kvscale.engines.args import OWNED_FLAGS, owned_flag_problem

DURATION_PATTERN = r"^[0-9]+(\.[0-9]+)?(us|ms|s|m|h)$"
_DURATION = re.compile(DURATION_PATTERN)


def _duration(value: str) -> str:
    if not _DURATION.match(value):
        raise ValueError(f"{value!r} is not a duration; write a number with us, ms, s, m or h, e.g. '500ms'")
    return value


Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, description="A duration such as 500ms, 1.5s or 2m."),
    AfterValidator(_duration),
]
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# An image reference as container runtimes parse it (github.com/distribution/reference, regexp.go):
# [host[:port]/]path[:tag][@digest], the path's components lowercase. A space or a non-ASCII
# character was deployed as given and failed only at the kubelet's pull.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
IMAGE_PATTERN = (
    # A first component is a registry only with a dot, a port or as localhost (splitDockerDomain);
    # otherwise it is a path component, lowercase ("Vllm/vllm-openai" is refused by runtimes).
    rf"^(?:(?:(?:localhost|{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})+)(?::[0-9]+)?|{_DOMAIN_COMPONENT}:[0-9]+)/)?"
    rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_IMAGE = re.compile(IMAGE_PATTERN)


def _image(value: str) -> str:
    if not _IMAGE.match(value):
        raise ValueError(
            f"{value!r} is not an image reference: write [registry[:port]/]path[:tag][@sha256:digest], the path in "
            "lowercase ASCII without spaces, e.g. vllm/vllm-openai:v0.11.0"
        )
    return value


# The pattern is the CRD's (the API server refuses at the edge); the validator says the fix.
ImageReference = Annotated[str, Field(json_schema_extra={"pattern": IMAGE_PATTERN}), AfterValidator(_image)]
# Far above any one service's load (a million requests a second), and finite: 1e308 reached the
# queueing code as infinity and failed every reconcile without a status.
MAX_REQUESTS_PER_SECOND = 1_000_000.0


def _rate(value: float) -> float:
    if not value <= MAX_REQUESTS_PER_SECOND:
        raise ValueError(
            f"{value:g} requests/s is more than kvscale plans for ({MAX_REQUESTS_PER_SECOND:.0f}): write the expected "
            "rate of this one service, e.g. 20"
        )
    return value


Precision = Literal["bf16", "fp16", "fp8", "int8", "int4", "mxfp4", "nvfp4"]

# Bounds on every string and list a user writes. kopf keeps the whole spec in an annotation
# (kvscale.io/last-handled-configuration) and `kubectl apply` another copy; an object's
# annotations may hold 256 KiB in all, and past that the operator can write neither status nor
# its finalizer (a 200,000-character image wedged an object). With these bounds the largest
# spec stays far below that: tests/unit/test_api.py adds the worst case up.
MAX_IMAGE_LENGTH = 512  # an OCI reference: a registry host and path, a tag of 128, a digest of 71
MAX_SOURCE_LENGTH = 1024
MAX_MODEL_NAME_LENGTH = 256
MAX_PATH_LENGTH = 1024
MAX_GPU_TYPES = 32
MAX_GPU_TYPE_LENGTH = 64
MAX_ARGS = 256
MAX_ARG_LENGTH = 4096
MAX_ARGS_TOTAL_LENGTH = 16384  # all of spec.engine.args together
MAX_ENV = 256
MAX_ENV_VALUE_LENGTH = 8192
MAX_ENV_TOTAL_LENGTH = 16384  # every name and value of spec.engine.env together
MAX_CONFIG_KEYS = 512  # top-level keys of a config.json
MAX_CONFIG_BYTES = 32768  # a config.json as JSON (no schema can bound a free-form object's depth: the operator checks)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class _Status(BaseModel):
    """Status is written by the operator and read back by it: unknown keys (an older or newer
    operator's) are ignored rather than refused."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, alias_generator=to_camel, frozen=True)


class ModelArchitecture(_Wire):
    """The shapes of a model that is not in kvscale's catalog: its Hugging Face config.json
    (huggingFaceConfig), or the shape fields below."""

    hugging_face_config: dict[str, Any] | None = Field(
        default=None,
        max_length=MAX_CONFIG_KEYS,
        description="The model's Hugging Face config.json, as is (model_type llama, mistral, qwen2, qwen3, "
        "qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss, gemma3, glm4_moe or mixtral); replaces the shape fields.",
    )
    layers: int | None = Field(default=None, ge=1, description="Transformer layers.")
    hidden_size: int | None = Field(default=None, ge=1, description="Model (residual) width.")
    heads: int | None = Field(default=None, ge=1, description="Attention heads.")
    kv_heads: int | None = Field(default=None, ge=1, description="Key/value heads (GQA/MQA); equal to heads for MHA.")
    head_dim: int | None = Field(default=None, ge=1, description="Dimension of each attention head.")
    intermediate_size: int | None = Field(default=None, ge=1, description="FFN width (per expert for MoE).")
    vocab_size: int | None = Field(default=None, ge=1, description="Vocabulary size.")
    params: float | None = Field(
        default=None, gt=0, description="Total parameters; derived from the shapes when absent."
    )
    experts: int | None = Field(default=None, ge=1, description="MoE experts per layer.")
    active_experts: int | None = Field(default=None, ge=1, description="Experts each token is routed to.")
    max_context_tokens: int | None = Field(
        default=None,
        ge=2,
        description="The model's own context limit (max_position_embeddings in config.json); default 4096.",
    )

    @model_validator(mode="after")
    def _shapes_or_config(self) -> ModelArchitecture:
        if self.hugging_face_config is not None:
            size = len(json.dumps(self.hugging_face_config))
            if size > MAX_CONFIG_BYTES:
                raise ValueError(
                    f"spec.model.architecture.huggingFaceConfig is {size} bytes as JSON, more than {MAX_CONFIG_BYTES}: "
                    "give the model's config.json as published (no tokenizer or weights index in it)"
                )
            return self
        missing = [to_camel(f) for f in SHAPE_FIELDS if getattr(self, f) is None]
        if missing:
            raise ValueError(
                f"spec.model.architecture needs huggingFaceConfig (the model's config.json) or all of "
                f"{', '.join(to_camel(f) for f in SHAPE_FIELDS)}; missing {', '.join(missing)}"
            )
        return self


SHAPE_FIELDS = ("layers", "hidden_size", "heads", "kv_heads", "head_dim", "intermediate_size", "vocab_size")


class ModelCache(_Wire):
    """Where downloaded weights persist across container starts: an existing PersistentVolumeClaim or a node path."""

    persistent_volume_claim: str | None = Field(
        default=None,
        min_length=1,
        description="An existing PersistentVolumeClaim in the service's namespace (ReadWriteMany when replicas share it).",
    )
    host_path: str | None = Field(
        default=None,
        pattern=r"^/",
        max_length=MAX_PATH_LENGTH,
        description="An absolute directory on each node (node-local cache).",
    )
    read_only: bool = Field(
        default=False,
        description=(
            "Mount the cache read-only: weights filled in advance, which the engine only reads (set HF_HUB_OFFLINE=1 "
            "in spec.engine.env so it does not try to download). Default false: the engine downloads into the cache, "
            "so the pods write the claim (see docs/tenancy.md)."
        ),
    )

    @model_validator(mode="after")
    def _one(self) -> ModelCache:
        if (self.persistent_volume_claim is None) == (self.host_path is None):
            raise ValueError("set exactly one of spec.model.cache.persistentVolumeClaim or spec.model.cache.hostPath")
        return self


class ModelSpec(_Wire):
    """Which model to serve: a catalog name (or alias such as a Hugging Face id), or an explicit architecture."""

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MODEL_NAME_LENGTH,
        description="kvscale catalog key or alias, e.g. meta-llama/Llama-3.1-8B-Instruct.",
    )
    architecture: ModelArchitecture | None = Field(default=None, description="Shapes of a model not in the catalog.")
    precision: Precision | None = Field(
        default=None,
        description=(
            "Weight precision: bf16, fp16, fp8, int8, int4, mxfp4 or nvfp4; unset: the checkpoint's own "
            "(fp8 for DeepSeek-V3/R1, mxfp4 for gpt-oss), else bf16."
        ),
    )
    kv_cache_precision: Literal["auto", "fp16", "fp8"] = Field(
        default="auto", description="KV-cache precision; auto keeps the model dtype."
    )
    source: str | None = Field(
        default=None,
        max_length=MAX_SOURCE_LENGTH,
        description=(
            "What the engine loads, e.g. hf://meta-llama/Llama-3.1-8B-Instruct; defaults to the catalog's "
            "Hugging Face id (16-bit), or the catalog's known checkpoint for int4/int8/fp8. int4 and int8 need a "
            "checkpoint quantized that way (AWQ, GPTQ or compressed-tensors)."
        ),
    )
    credentials_secret: str | None = Field(
        default=None, description="Secret whose keys become the engine's environment (e.g. HF_TOKEN)."
    )
    cache: ModelCache | None = Field(
        default=None,
        description="Volume mounted where the engine keeps downloaded weights; without one every container start downloads them.",
    )

    @model_validator(mode="after")
    def _one_of(self) -> ModelSpec:
        if self.name is None and self.architecture is None:
            raise ValueError("set spec.model.name (a catalog model) or spec.model.architecture (custom shapes)")
        return self


class EnvVar(_Wire):
    name: str = Field(min_length=1, description="Variable name.")
    value: str = Field(default="", max_length=MAX_ENV_VALUE_LENGTH, description="Variable value.")


class EngineSpec(_Wire):
    """The serving engine."""

    type: Literal["vllm", "sglang", "tgi"] = Field(default="vllm", description="Serving engine: vllm, sglang or tgi.")
    image: ImageReference | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_IMAGE_LENGTH,
        description="Container image on NVIDIA GPUs; default: the catalog's image for the engine (vllm/vllm-openai:v0.11.0 for vllm).",
    )
    rocm_image: ImageReference | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_IMAGE_LENGTH,
        description="Container image on AMD GPUs (ROCm); default: the catalog's (rocm/vllm for vllm).",
    )
    args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description=f"Extra engine arguments appended after kvscale's (at most {MAX_ARGS_TOTAL_LENGTH} characters in all). "
        "Flags kvscale sets from the plan are refused, with their other spellings: "
        + "; ".join(f"{engine}: {', '.join(sorted(flags))}" for engine, flags in OWNED_FLAGS.items())
        + ".",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description=f"Extra environment variables (names and values at most {MAX_ENV_TOTAL_LENGTH} characters in all).",
    )

    @model_validator(mode="after")
    def _totals(self) -> EngineSpec:
        args = sum(len(a) for a in self.args)
        if args > MAX_ARGS_TOTAL_LENGTH:
            raise ValueError(
                f"spec.engine.args hold {args} characters in all, more than {MAX_ARGS_TOTAL_LENGTH}: "
                "pass long settings through a file in the image or a mounted ConfigMap"
            )
        owned = owned_flag_problem(self.type, self.args)
        if owned is not None:
            raise ValueError(owned)
        env = sum(len(e.name) + len(e.value) for e in self.env)
        if env > MAX_ENV_TOTAL_LENGTH:
            raise ValueError(
                f"spec.engine.env holds {env} characters in all, more than {MAX_ENV_TOTAL_LENGTH}: "
                "keep large values in a Secret (spec.model.credentialsSecret)"
            )
        return self


class WorkloadSpec(_Wire):
    """The traffic the service expects."""

    input_tokens: int = Field(ge=1, description="Typical prompt length in tokens.")
    output_tokens: int = Field(ge=1, description="Typical generated length in tokens.")
    max_context_tokens: int | None = Field(
        default=None,
        ge=2,
        description=(
            "Longest request served, prompt plus output (--max-model-len); at most the model's limit. Default: the "
            "model's limit, lowered only to what one sequence can hold in the planned KV cache."
        ),
    )
    requests_per_second: Annotated[
        float, Field(json_schema_extra={"maximum": MAX_REQUESTS_PER_SECOND}), AfterValidator(_rate)
    ] = Field(
        default=1.0,
        ge=0,
        description=f"Expected request rate, used for the initial plan (at most {MAX_REQUESTS_PER_SECOND:.0f}).",
    )

    @model_validator(mode="after")
    def _context(self) -> WorkloadSpec:
        if self.max_context_tokens is not None and self.max_context_tokens < self.input_tokens + self.output_tokens:
            raise ValueError("spec.workload.maxContextTokens must be at least inputTokens + outputTokens")
        return self


class SloSpec(_Wire):
    """The latency objective."""

    time_to_first_token: Duration = Field(description="TTFT target at the percentile, e.g. 500ms.")
    time_per_output_token: Duration = Field(description="TPOT target at the percentile, e.g. 50ms.")
    percentile: float = Field(default=95.0, ge=50, lt=100, description="Percentile the targets apply to.")
    max_inter_token_latency: Duration | None = Field(
        default=None,
        description="Optional bound on the p99 gap between two tokens of one request, e.g. 150ms: limits the "
        "chunk budget (--max-num-batched-tokens) so that no engine step, a full prefill chunk beside the running "
        "decodes, takes longer. The per-request TPOT averages such stalls away; a streaming user sees them.",
    )


class HardwareSpec(_Wire):
    """Which GPUs the planner may use."""

    gpu_types: list[Annotated[str, Field(max_length=MAX_GPU_TYPE_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_GPU_TYPES,
        description="Allowed GPU types (catalog names); empty: every type in the cluster.",
    )
    max_tensor_parallel: Literal[1, 2, 4, 8] = Field(
        default=8, description="Largest tensor-parallel degree to consider."
    )
    objective: Literal["cost", "latency"] = Field(
        default="cost", description="Cheapest plan meeting the SLO, or the fastest."
    )
    data_parallel_attention: bool = Field(
        default=False,
        description="MoE models on vLLM: also consider replicas of 2, 4 or 8 data-parallel attention ranks "
        "(--data-parallel-size N --enable-expert-parallel: each GPU its own attention and KV cache, the experts "
        "over all; one node).",
    )


class ScalingSpec(_Wire):
    """How many replicas, and who decides."""

    min_replicas: int = Field(default=1, ge=0, description="Lower bound on replicas.")
    max_replicas: int = Field(default=10, ge=1, description="Upper bound on replicas.")
    mode: Literal["auto", "recommend"] = Field(
        default="auto", description="auto deploys and scales; recommend only writes the plan to status."
    )
    scale_down_stabilization: Duration = Field(
        default="120s", description="How long load must stay low before scaling down."
    )
    replicas: int | None = Field(
        default=None, ge=0, description="Pinned replica count (the scale subresource); overrides the policy."
    )
    idle_window: Duration = Field(
        default="5m",
        description="With minReplicas 0: how long without requests before the last replica is released. The next "
        "request then waits at the gateway for a cold start (status.conditions ScaleToZero says how long). Needs "
        "spec.routing.inferencePool (its endpoint picker's queue) or spec.routing.kedaHttp (the KEDA HTTP "
        "add-on's pending requests): the signal to scale back.",
    )
    priority: int = Field(
        default=0,
        ge=-1000,
        le=1000,
        description="Order under a GPUBudget: higher first (after every governed service's minReplicas). "
        "Without a budget it changes nothing.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ScalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("spec.scaling.minReplicas must be <= maxReplicas")
        return self


class PortNumber(_Wire):
    number: int = Field(ge=1, le=65535, description="Port number.")


class EndpointPickerRef(_Wire):
    """The endpoint picker (EPP) the InferencePool hands routing decisions to; copied into the
    pool's spec.endpointPickerRef as written (same field names as inference.networking.k8s.io/v1)."""

    name: str = Field(
        min_length=1, max_length=253, description="Name of the endpoint picker's Service (or other kind)."
    )
    port: PortNumber | None = Field(
        default=None, description="Port of the endpoint picker's Service (its gRPC ext-proc port, e.g. 9002)."
    )
    group: str | None = Field(
        default=None,
        max_length=253,
        pattern="^$|" + DNS_SUBDOMAIN_PATTERN,
        description="API group of the referent; empty (the core group) by default.",
    )
    kind: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$",
        description="Kind of the referent; Service by default.",
    )
    failure_mode: Literal["FailOpen", "FailClose"] | None = Field(
        default=None, description="What the gateway does when the picker does not answer; FailClose by default."
    )

    @model_validator(mode="after")
    def _port(self) -> EndpointPickerRef:
        if self.kind in (None, "Service") and self.port is None:
            raise ValueError("spec.routing.inferencePool.endpointPickerRef.port is required when kind is Service")
        return self


class InferencePoolRouting(_Wire):
    """An InferencePool (Gateway API inference extension) for the engine pods: kvscale creates and
    owns it, or, when a pool of that name exists and kvscale does not own it, labels the pods to
    join it and leaves the pool alone."""

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Pool name; defaults to the InferenceService's name.",
    )
    endpoint_picker_ref: EndpointPickerRef | None = Field(
        default=None,
        description="Endpoint picker the pool uses; defaults to the Service <pool name>-epp on port 9002 "
        "(the extension's inferencepool Helm chart's names).",
    )


class KedaHttpRouting(_Wire):
    """Requests reach the Service through the KEDA HTTP add-on's interceptor, which holds them
    while no replica runs and counts them per HTTPScaledObject (its Prometheus gauge
    interceptor_pending_request_count, label host = "<namespace>/<name>"): kvscale reads that
    count to scale back from zero. The HTTPScaledObject (http.keda.sh/v1alpha1) is yours: point its
    scaleTargetRef at the InferenceService's Service and annotate it
    httpscaledobject.keda.sh/skip-scaledobject-creation: "true" so that KEDA does not scale the
    Deployment too; set the interceptor's KEDA_CONDITION_WAIT_TIMEOUT (default 1500ms) above the
    cold start, or the first requests fail while the replica starts."""

    http_scaled_object: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the HTTPScaledObject in the InferenceService's namespace; defaults to the "
        "InferenceService's name.",
    )


class RoutingSpec(_Wire):
    """How requests reach the engines beyond the plain Service."""

    inference_pool: InferencePoolRouting | None = Field(
        default=None, description="Present: route through a Gateway API inference extension InferencePool."
    )
    keda_http: KedaHttpRouting | None = Field(
        default=None,
        description="Present: requests come through the KEDA HTTP add-on's interceptor (an HTTPScaledObject); "
        "with minReplicas 0 its pending-request count brings the service back from zero.",
    )


class ServingSpec(_Wire):
    """How the model is served: aggregated replicas, or separate prefill and decode pools."""

    disaggregation: Literal["auto", "on", "off"] = Field(
        default="off",
        description="Prefill/decode disaggregation: off (default: aggregated replicas, each prefilling and "
        "decoding), on (a prefill pool and a decode pool, vLLM's NixlConnector moving the KV between them, "
        "pods labelled llm-d.ai/role prefill or decode) or auto (the pools where the planner finds them "
        "cheaper than aggregated replicas for the SLO). vLLM only. The pools run at the plan's counts within "
        "spec.scaling: the autoscaler does not scale them yet, and on GPU types a GPUBudget governs they are not "
        "deployed yet.",
    )


class InferenceServiceSpec(_Wire):
    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="The serving engine.")
    workload: WorkloadSpec = Field(description="Expected prompt and output lengths and request rate.")
    slo: SloSpec = Field(description="TTFT and TPOT targets at a percentile.")
    hardware: HardwareSpec = Field(
        default_factory=HardwareSpec, description="GPU types and tensor parallelism allowed."
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="Replica bounds and scaling mode.")
    routing: RoutingSpec = Field(
        default_factory=RoutingSpec, description="Gateway routing: an InferencePool for the engine pods."
    )
    serving: ServingSpec = Field(
        default_factory=ServingSpec, description="Aggregated replicas or prefill/decode pools."
    )


class Condition(_Status):
    type: str = Field(description="Ready, Planned, SLOMet, MetricsAvailable, ...")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str | None = Field(default=None, description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Generation the condition was computed for.")


class CandidateStatus(_Status):
    gpu_type: str = Field(description="GPU type.")
    tensor_parallel: int = Field(description="GPUs per replica.")
    expert_parallel: bool = Field(default=False, description="MoE: whole routed experts per GPU.")
    data_parallel: int = Field(default=1, description="Data-parallel attention ranks per replica.")
    precision: str = Field(description="Weight precision.")
    reason: str = Field(description="Why it lost, or why it was chosen.")
    replicas: int | None = Field(default=None, description="Replicas it would need.")
    cost_per_hour: float | None = Field(default=None, description="USD per hour for those replicas.")
    rate_per_replica: float | None = Field(
        default=None, description="Requests/s one replica sustains within the SLO (a GPUBudget converts wants with it)."
    )
    gpus_per_replica: int | None = Field(default=None, description="GPUs one replica holds (all its nodes).")


class LengthsStatus(_Status):
    """A token-length distribution, as the planner takes it: lengths and the share of requests at each."""

    tokens: list[int] = Field(default_factory=list, description="Representative lengths in tokens, ascending.")
    shares: list[float] = Field(default_factory=list, description="Share of requests at each length (sums to 1).")
    # The bins' spans: the planner reads how much of a bin lies past a TTFT cut from them, so a
    # plan read back from status (a resume) without them would be made for another workload.
    shortest: list[int] | None = Field(
        default=None, description="Shortest length in each length's bin, where known (same order as tokens)."
    )
    longest: list[int] | None = Field(
        default=None, description="Longest length in each length's bin, where known (same order as tokens)."
    )


class BurstinessStatus(_Status):
    """How bursty arrivals are at a short time scale: the index of dispersion (variance over
    mean) of the requests arriving per window. 1 is Poisson; batches of N requests give about N."""

    index_of_dispersion: float = Field(description="Variance over mean of the requests arriving per window.")
    window_seconds: float = Field(description="The window the arrivals are counted over, in seconds.")
    burst_share: float | None = Field(
        default=None,
        description="Share of the requests that arrive in bursts (the rest arrive alone); unset: all of them.",
    )
    burst_requests: float | None = Field(
        default=None,
        description="Requests in the burst a request of one finds (size-biased mean); unset: from the dispersion.",
    )


class PlannedWorkloadStatus(_Status):
    """The workload the plan was made for: spec.workload, or the observed one after a re-plan."""

    source: Literal["spec", "observed"] = Field(
        default="spec", description="spec: spec.workload; observed: the engines' metrics (a re-plan on drift)."
    )
    input_tokens: int = Field(description="Mean prompt length planned for.")
    output_tokens: int = Field(description="Mean output length planned for.")
    requests_per_second: float = Field(description="Request rate planned for.")
    prefix_cache_hit_ratio: float | None = Field(
        default=None, description="Share of prompt tokens served from the prefix cache, planned for."
    )
    input_lengths: LengthsStatus | None = Field(default=None, description="Prompt length distribution planned for.")
    output_lengths: LengthsStatus | None = Field(default=None, description="Output length distribution planned for.")
    burstiness: BurstinessStatus | None = Field(
        default=None, description="Arrival burstiness planned for; unset: Poisson arrivals."
    )


class PoolPlanStatus(_Status):
    """One pool of a disaggregated plan (kvscale plan --disaggregation's `prefill` / `decode`)."""

    gpu_type: str = Field(description="The pool's GPU type.")
    gpu_product: str = Field(description="Node label value (nvidia.com/gpu.product) the pool's pods are pinned to.")
    tensor_parallel: int = Field(description="Tensor-parallel degree of one worker.")
    precision: str = Field(description="Weight precision.")
    workers: int = Field(description="Workers the plan needs at the spec's request rate.")
    replicas: int = Field(description="Workers deployed (the plan's, within spec.scaling).")
    gpus: int = Field(description="GPUs of the planned workers.")
    max_batch: int = Field(description="Engine batch limit (--max-num-seqs).")
    max_num_batched_tokens: int = Field(description="Chunked-prefill token budget per step (--max-num-batched-tokens).")
    rate_per_worker: float = Field(description="Requests/s one worker carries within its share of the SLO.")
    cost_per_hour: float = Field(description="USD per hour for the planned workers.")
    deployment: str = Field(description="The pool's Deployment.")
    engine_args: list[str] = Field(default_factory=list, description="The engine's arguments (the KV connector's too).")
    ttft_target_seconds: float | None = Field(
        default=None,
        description="The share of the TTFT target the autoscaler scales this pool for (the plan's split: prefill "
        "wait + prefill; decode slot wait + first step).",
    )


class PlanStatus(_Status):
    gpu_type: str = Field(description="Chosen GPU type.")
    gpu_product: str = Field(description="Node label value (nvidia.com/gpu.product) the pods are pinned to.")
    tensor_parallel: int = Field(description="Tensor-parallel degree: GPUs per pipeline stage.")
    pipeline_parallel: int = Field(default=1, description="Pipeline stages per replica (across nodes when > 1).")
    nodes: int = Field(default=1, description="Nodes one replica spans (a LeaderWorkerSet group when > 1).")
    expert_parallel: bool = Field(
        default=False,
        description="MoE: whole routed experts per GPU (vLLM --enable-expert-parallel, SGLang --ep-size).",
    )
    data_parallel: int = Field(
        default=1,
        description="Data-parallel attention ranks per replica (vLLM --data-parallel-size; GPUs = tensor x pipeline x "
        "data parallel).",
    )
    precision: str = Field(description="Weight precision.")
    max_batch: int = Field(description="Engine batch limit (--max-num-seqs).")
    max_context_tokens: int = Field(description="Engine context limit (--max-model-len).")
    max_num_batched_tokens: int | None = Field(
        default=None,
        description="Chunked-prefill token budget per engine step, running decodes included (--max-num-batched-tokens).",
    )
    replicas: int = Field(description="Replicas the plan needs at the spec's request rate.")
    analytic_replicas: int | None = Field(
        default=None,
        description="Replicas the analytic model asked for, when a simulated check of the plan settled `replicas` "
        "(the two differ where the replayed sample disagreed with the model); unset when the plan was not simulated.",
    )
    predicted_ttft: str = Field(description="Predicted TTFT at the percentile and the spec's load.")
    predicted_tpot: str = Field(description="Predicted TPOT at the percentile and the spec's load.")
    predicted_ttft_seconds: float | None = Field(
        default=None, description="predictedTTFT in seconds, unrounded (what the autoscaler's gauges export)."
    )
    predicted_tpot_seconds: float | None = Field(
        default=None, description="predictedTPOT in seconds, unrounded (what the autoscaler's gauges export)."
    )
    predicted_itl_p99: str | None = Field(
        default=None,
        description="Predicted p99 gap between two tokens of one request at the spec's load (prefill chunk steps "
        "stall every running request; TPOT averages them away).",
    )
    throughput_tokens_per_second: float = Field(description="Generated tokens/s one replica sustains within the SLO.")
    rate_per_replica: float = Field(description="Requests/s one replica sustains within the SLO.")
    limited_by: str = Field(
        description="The SLO term that bounds a replica's load: ttft-tail, tpot-tail, kv-capacity, batch-slots "
        "or prefill-compute."
    )
    mbu: float = Field(description="Model bandwidth utilization of the decode step.")
    mfu: float = Field(description="Model FLOPs utilization of the decode step.")
    cost_per_hour: float = Field(description="USD per hour for the planned replicas.")
    reason: str = Field(description="Why this plan was chosen.")
    excluded_gpu_types: list[str] = Field(
        default_factory=list, description="GPU types left out after their pods stayed unschedulable."
    )
    workload: PlannedWorkloadStatus | None = Field(default=None, description="The workload the plan was made for.")
    alternatives: list[CandidateStatus] = Field(default_factory=list, description="Runners-up, best first.")
    budget_moved_from: str | None = Field(
        default=None,
        description="The GPU type the planner chose when a GPUBudget moved the service off it to this plan, the "
        "best on the type it granted (the service moves back when that type has room).",
    )
    rejected: list[CandidateStatus] = Field(
        default_factory=list,
        description="The closest few candidates that cannot meet the SLO or fit, with reasons (`kvscale plan` lists all).",
    )
    mode: Literal["aggregated", "disaggregated"] | None = Field(
        default=None,
        description="disaggregated: a prefill pool and a decode pool (prefill, decode; the fields above are the "
        "decode pool's, the costs and predictions the whole service's); unset: aggregated replicas.",
    )
    prefill: PoolPlanStatus | None = Field(default=None, description="The prefill pool of a disaggregated plan.")
    decode: PoolPlanStatus | None = Field(default=None, description="The decode pool of a disaggregated plan.")
    kv_transfer_ms: float | None = Field(
        default=None, description="A disaggregated plan's KV transfer per request at the mean prompt, in ms."
    )
    gpus_total: int | None = Field(default=None, description="A disaggregated plan's GPUs, both pools.")


class ObservedStatus(_Status):
    ttft: str | None = Field(default=None, description="Observed TTFT at the percentile.")
    tpot: str | None = Field(default=None, description="Observed TPOT at the percentile.")
    requests_per_second: float | None = Field(default=None, description="Observed arrival rate.")
    queue: float | None = Field(default=None, description="Requests waiting.")
    kv_cache_usage: float | None = Field(default=None, description="Mean KV-cache use, 0..1.")
    calibration: float | None = Field(default=None, description="Observed over predicted TPOT.")
    tpot_source: str | None = Field(
        default=None,
        description="What observed TPOT was read from: per-request TPOT (what the plan predicts), or the engine's inter-token latency when it has no per-request histogram (its tail includes prefill stalls).",
    )
    ttft_source: str | None = Field(
        default=None, description="Set when the engine reports no TTFT (TGI), saying why TTFT is unavailable."
    )


class TokenLengthsStatus(_Status):
    """Observed token lengths per request: the mean (exact) and quantiles (from the engine's
    length histogram, as coarse as its buckets)."""

    mean: float | None = Field(default=None, description="Mean tokens per request.")
    p50: float | None = Field(default=None, description="Median tokens per request.")
    p90: float | None = Field(default=None, description="90th percentile.")
    p99: float | None = Field(default=None, description="99th percentile.")


class ObservedWorkloadStatus(_Status):
    """The work arriving, from the engines' token counters and length histograms over a
    window of minutes, and how far it is from the workload the plan was made for."""

    observed_at: str | None = Field(default=None, description="When it was read (RFC 3339).")
    window: str | None = Field(default=None, description="The window rates, means and quantiles cover.")
    requests_per_second: float | None = Field(default=None, description="Requests finished per second.")
    input_tokens: TokenLengthsStatus | None = Field(default=None, description="Prompt lengths.")
    output_tokens: TokenLengthsStatus | None = Field(default=None, description="Output lengths.")
    prefill_tokens_per_second: float | None = Field(
        default=None, description="Prompt tokens computed per second: after prefix-cache hits."
    )
    decode_tokens_per_second: float | None = Field(default=None, description="Tokens generated per second.")
    prefix_cache_hit_ratio: float | None = Field(
        default=None, description="Share of the prompt tokens looked up that the prefix cache held."
    )
    peak_window: str | None = Field(default=None, description="The short window of the peak rates.")
    peak_requests_per_second_last_hour: float | None = Field(
        default=None, description="Highest short-window request rate over the last hour."
    )
    peak_requests_per_second_last_day: float | None = Field(
        default=None, description="Highest short-window request rate over the last day."
    )
    peak_prefill_tokens_per_second_last_hour: float | None = Field(
        default=None, description="Highest short-window prefill token rate over the last hour (the window's hit ratio)."
    )
    peak_prefill_tokens_per_second_last_day: float | None = Field(
        default=None, description="Highest short-window prefill token rate over the last day (the window's hit ratio)."
    )
    burstiness: BurstinessStatus | None = Field(
        default=None,
        description="Arrival burstiness over the window, from the engines' request counters and queues at scrape "
        "resolution; unset: not read (too few burst windows in the window, or no data).",
    )
    drift: str | None = Field(
        default=None, description="How the observed workload differs from the one planned for; unset: within bounds."
    )
    drifting_since: str | None = Field(
        default=None, description="Since when it has drifted (RFC 3339): a re-plan follows once it lasts long enough."
    )
    message: str | None = Field(default=None, description="Why parts are missing, if they are.")


class CalibrationStatus(_Status):
    """The calibrated profile of the planned configuration (kvscale.calibration), and its step
    times against what the engines measured."""

    profile: str | None = Field(default=None, description="ConfigMap (operator's namespace) holding the profile.")
    reason: str = Field(description="Fitted, Unchanged (within the fit's error), Pinned, NotEnoughData or Unavailable.")
    message: str = Field(default="", description="What the last calibration read and did.")
    predicted_gap_seconds: float | None = Field(
        default=None, description="Mean inter-token gap the profile predicts for the windows read."
    )
    observed_gap_seconds: float | None = Field(default=None, description="Mean inter-token gap the engines measured.")
    predicted_prefill_seconds: float | None = Field(
        default=None, description="Mean prefill time the profile predicts for the windows read."
    )
    observed_prefill_seconds: float | None = Field(default=None, description="Mean prefill time the engines measured.")
    last_time: str | None = Field(default=None, description="When the calibration last ran.")


class CapacityStatus(_Status):
    """What one replica of the plan carries within the SLO: the figure the autoscaling policy
    and the GPU budget's wants use, with the sizing model's beside it. Simulated once the
    operator's search (the simulated sizing search of `plan --trace`, on arrivals synthesized
    from the observed rate, burstiness and length histograms) replayed enough requests."""

    requests_per_second_per_replica: float = Field(
        description="Requests/s one replica carries within the SLO: what the policy and the budget use."
    )
    analytic: float = Field(description="Requests/s per replica by the sizing model at the observed lengths.")
    source: Literal["analytic", "simulated"] = Field(
        description="simulated: confirmed by the simulated sizing search on the observed traffic; analytic: the model's."
    )
    simulated: float | None = Field(
        default=None,
        description=(
            "Requests/s per replica the last search confirmed (None: none yet). Acted on where above the "
            "model's figure; below it the model's stands and the policy's SLO feedback lowers it while the "
            "observed SLO is missed."
        ),
    )
    measured_at: str | None = Field(default=None, description="When the simulated search last ran (RFC 3339).")
    requests: int = Field(default=0, description="Observed requests the last search replayed (0: none yet).")
    replicas: int | None = Field(
        default=None, description="The fewest warm replicas the last search confirmed on the replayed requests."
    )
    message: str = Field(default="", description="Why this source: the search's outcome, or why it has not run.")


class HoldingCandidateStatus(_Status):
    """One candidate setting of the burst holding, as the replay of the service's history scored it."""

    name: str = Field(description="configured, lean, thin, reserve or trailing.")
    settings: str = Field(description="Its settings: the quantile of recent need held, for how long, the headroom.")
    attainment: float = Field(description="Share of the replayed requests (after its warm-up) that met the SLO.")
    gpu_hours: float = Field(description="GPU-hours the replay spent (after its warm-up), for the whole traffic.")


class HoldingStatus(_Status):
    """The burst-holding settings the scale tick runs when the operator tunes them
    (KVSCALE_HOLDING=tuned): chosen by replaying the service's observed history through the
    simulator with a handful of candidates, the cheapest that met the SLO with a margin."""

    settings: str = Field(description="The settings the tick runs: configured, lean, thin, reserve or trailing.")
    burst_quantile: float = Field(description="Quantile of the recent need the policy holds.")
    burst_hold_seconds: float = Field(description="How long a peak counts in full.")
    headroom: float = Field(description="Headroom over the need.")
    trailing_margin: float = Field(
        default=0.0, description="The trailing floor: this times the largest recent per-minute need (0: none)."
    )
    source: Literal["tuned", "kept", "beforeHistory"] = Field(
        description=(
            "tuned: chosen on the last replay; kept: the last choice stays (too little history now); "
            "beforeHistory: the causal trailing rule, nothing replayed yet."
        )
    )
    chosen_at: str | None = Field(default=None, description="When the settings were chosen (RFC 3339).")
    replayed_at: str | None = Field(default=None, description="When the history was last read (RFC 3339).")
    requests: int = Field(default=0, description="Observed requests in the history the choice replayed.")
    replayed_requests: int = Field(default=0, description="Of them, the requests replayed (thinned to bound the CPU).")
    history_seconds: float = Field(default=0.0, description="The span of history replayed (from its first request).")
    message: str = Field(default="", description="Why these settings run.")
    candidates: list[HoldingCandidateStatus] = Field(
        default_factory=list, description="The candidates the choice replayed, with their attainment and cost."
    )


class InferenceServiceStatus(_Status):
    observed_generation: int | None = Field(default=None, description="Spec generation the status describes.")
    phase: Literal["Pending", "Planned", "Deploying", "Ready", "Recommended", "Failed"] | None = Field(
        default=None, description="Summary of the state."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Planned, Scheduled, SLOMet, MetricsAvailable, Synced."
    )
    plan: PlanStatus | None = Field(default=None, description="The chosen plan and its predictions.")
    replicas: int | None = Field(
        default=None,
        description="Replicas of the engine Deployment; for a plan across nodes, groups of the LeaderWorkerSet.",
    )
    desired_replicas: int | None = Field(default=None, description="Replicas the autoscaling policy asked for last.")
    ready_replicas: int | None = Field(
        default=None, description="Replicas ready to serve (a group when every one of its pods is ready)."
    )
    selector: str | None = Field(default=None, description="Label selector of the engine pods (scale subresource).")
    observed: ObservedStatus | None = Field(default=None, description="Live measurements.")
    observed_workload: ObservedWorkloadStatus | None = Field(
        default=None, description="The workload the engines saw over the last minutes, and its drift from the plan's."
    )
    calibration: CalibrationStatus | None = Field(
        default=None, description="The calibrated profile and predicted vs observed step times."
    )
    capacity: CapacityStatus | None = Field(
        default=None, description="Requests/s per replica the policy and the budget use, and where it comes from."
    )
    holding: HoldingStatus | None = Field(
        default=None,
        description="The burst-holding settings tuned on the service's history (KVSCALE_HOLDING=tuned), and why.",
    )
    last_scale_time: str | None = Field(default=None, description="When replicas last changed.")
    last_scale_reason: str | None = Field(default=None, description="Why replicas last changed.")


def parse_spec(spec: Mapping[str, Any]) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(dict(spec))


def parse_status(status: Mapping[str, Any] | None) -> InferenceServiceStatus:
    """The status as the operator wrote it; a status it cannot read starts over (empty)."""
    try:
        return InferenceServiceStatus.model_validate(dict(status or {}))
    except ValidationError:
        return InferenceServiceStatus()


def status_dict(status: InferenceServiceStatus) -> dict[str, Any]:
    """The wire form (camelCase, no None fields)."""
    return status.model_dump(by_alias=True, mode="json", exclude_none=True)


def _merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if old.get(key) == value:
            continue
        was = old.get(key)
        # A JSON merge patch merges objects key by key: a field gone from a nested object
        # (a drift that ended) must be sent as null, or the server keeps it.
        patch[key] = _merge_patch(was, value) if isinstance(was, dict) and isinstance(value, dict) else value
    patch.update({k: None for k in old if k not in new})
    return patch


def status_patch(before: InferenceServiceStatus, after: InferenceServiceStatus) -> dict[str, Any]:
    """The merge patch from `before` to `after`: changed keys, with null for fields gone at any
    depth; empty when nothing changed (so an unchanged status is never written)."""
    return _merge_patch(status_dict(before), status_dict(after))
