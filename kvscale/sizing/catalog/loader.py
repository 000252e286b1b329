"""Loads the YAML catalogs into frozen pydantic models and answers look-ups by name."""

from __future__ import annotations

import difflib
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvscale.sizing.units import GIB


class NumberLoader(yaml.SafeLoader):
    """YAML as people write numbers: `8.03e9` and `1e9` are floats (YAML 1.2 and JSON), not the
    strings YAML 1.1 makes of an exponent without a sign or of a mantissa without a dot."""


NumberLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """One YAML document with `NumberLoader`'s numbers."""
    return yaml.load(text, Loader=NumberLoader)


def load_yaml_all(text: str) -> list[Any]:
    """Every document of a multi-document YAML stream, with `NumberLoader`'s numbers."""
    return list(yaml.load_all(text, Loader=NumberLoader))


class CatalogError(ValueError):
    """An unknown name or a malformed catalog entry; the message lists what is allowed."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


Efficiency = float


class LinkSpec(_Frozen):
    bandwidth_bytes_per_s_per_direction: float = Field(gt=0)
    latency_s: float = Field(ge=0)
    source: str


class GpuSpec(_Frozen):
    name: str
    vendor: Literal["nvidia", "amd"]
    memory_gb: float = Field(gt=0, description="Marketed capacity, decimal GB")
    memory_gib: float = Field(gt=0, description="Capacity the driver reports, GiB")
    hbm_bandwidth_bytes_per_s: float = Field(gt=0)
    flops_16bit_per_s: float = Field(gt=0)
    flops_fp8_per_s: float | None = Field(default=None, gt=0)
    ops_int8_per_s: float | None = Field(default=None, gt=0)
    flops_fp4_per_s: float | None = Field(default=None, gt=0, description="Dense FP4 tensor-core peak (Blackwell)")
    bf16_supported: bool = True
    link: str
    pair_link: str | None = Field(
        default=None, description="Link between the two GPUs of a bridged pair (tensor parallel 2), if faster"
    )
    gpus_per_node: tuple[int, ...]
    internode_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Per GPU, per direction: this GPU's share of its node's InfiniBand/RoCE NICs to other nodes "
        "(pipeline-parallel hand-offs cross it); None: no multi-node fabric known, so no multi-node plans",
    )
    internode_latency_s: float = Field(default=5.0e-6, ge=0, description="One message across the inter-node fabric")
    internode_source: str | None = Field(default=None, description="Where the inter-node figures come from")
    price_usd_per_gpu_hour: float = Field(gt=0)
    node_labels: tuple[str, ...]
    label_key: str = "nvidia.com/gpu.product"
    resource_name: str = "nvidia.com/gpu"
    matmul_efficiency: Efficiency = Field(gt=0, le=1)
    bandwidth_efficiency: Efficiency = Field(gt=0, le=1)
    chip: str | None = Field(
        default=None,
        description="The GPU die (GA100, GH100, AD102, ...): siblings on one die share matmul_efficiency, and "
        "bandwidth_efficiency unless measurements of each say otherwise (benchmarks/calibrate.py)",
    )
    source: str
    efficiency_source: str = Field(
        default="assumed: datasheet-class priors (no measurements of this GPU in benchmarks/data/reference)",
        description="Where matmul_efficiency and bandwidth_efficiency come from",
    )

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def max_gpus_per_node(self) -> int:
        return max(self.gpus_per_node)

    def peak_flops_per_s(self, compute: str) -> float | None:
        """Dense peak for a compute path ('16bit', 'fp8', 'int8'); None when unsupported."""
        if compute == "16bit":
            return self.flops_16bit_per_s
        if compute == "fp8":
            return self.flops_fp8_per_s
        if compute == "int8":
            return self.ops_int8_per_s
        if compute == "fp4":
            return self.flops_fp4_per_s
        raise CatalogError(f"unknown compute path {compute!r}")


QuantizationMethod = Literal["awq", "gptq", "compressed-tensors", "fp8"]


class QuantizedSource(_Frozen):
    """A published checkpoint already quantized for one precision, and the method it was made with."""

    precision: Literal["fp8", "int8", "int4"]
    source: str = Field(min_length=1, description="What the engine loads, e.g. hf://org/name")
    method: QuantizationMethod
    # A base model and its instruction-tuned sibling share an architecture (one catalog entry)
    # but are different models: a quantization is chosen only for the checkpoint it was made from.
    of: tuple[str, ...] = Field(
        min_length=1,
        description="The 16-bit checkpoint it was quantized from (Hugging Face ids; a renamed repository under "
        "each of its names)",
    )


DEFAULT_MAX_CONTEXT_TOKENS = 4096  # a custom architecture's context limit when it gives none


class ModelArch(_Frozen):
    name: str
    layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    params: float = Field(gt=0, description="Total parameters (all experts)")
    active_params: float | None = Field(default=None, gt=0, description="Parameters per token (MoE)")
    experts: int = Field(default=1, ge=1)
    active_experts: int = Field(default=1, ge=1)
    ffn_activation: Literal["swiglu", "gelu"] = "swiglu"
    tied_embeddings: bool = False
    max_context_tokens: int = Field(default=DEFAULT_MAX_CONTEXT_TOKENS, gt=0)
    # True when max_context_tokens is the default, not the model's own (a custom architecture
    # that did not give it): what the plan says about its context limit.
    max_context_assumed: bool = False
    aliases: tuple[str, ...] = ()
    # Checkpoints published already quantized (int4/int8 need one; fp8 can also quantize online).
    quantized_sources: tuple[QuantizedSource, ...] = ()
    # Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): one compressed latent of
    # kv_lora_rank + qk_rope_head_dim values per token and layer, not K and V per head.
    kv_lora_rank: int | None = Field(default=None, gt=0, description="MLA latent width (config.json kv_lora_rank)")
    qk_rope_head_dim: int | None = Field(default=None, gt=0, description="MLA rotary part of each key")
    v_head_dim: int | None = Field(default=None, gt=0, description="Value head width when it differs from head_dim")
    # Sparse MLA (DeepSeek V3.2): a lightning indexer picks the keys each query attends to and
    # caches a key of its own per token and layer (config.json index_head_dim).
    index_head_dim: int | None = Field(default=None, gt=0, description="Sparse-MLA indexer key width (DeepSeek V3.2)")
    # Sliding-window attention on some layers (gpt-oss: every other layer, 128 tokens; Gemma 3: 5 of 6).
    sliding_window_tokens: int | None = Field(default=None, gt=0, description="Window of the local layers")
    sliding_window_layers: int = Field(default=0, ge=0, description="Layers that attend only to the window")
    # MoE beyond Mixtral: routed experts of their own width, always-on shared experts, and
    # leading layers with a dense FFN (DeepSeek first_k_dense_replace, GLM-4.5).
    expert_intermediate_size: int | None = Field(
        default=None, gt=0, description="Width of one routed expert (config.json moe_intermediate_size)"
    )
    shared_experts: int = Field(default=0, ge=0, description="Shared experts every token goes through, per MoE layer")
    dense_layers: int = Field(default=0, ge=0, description="Layers with a dense FFN of intermediate_size")
    native_precision: str | None = Field(
        default=None, description="Precision the published checkpoint is stored in (fp8, mxfp4, nvfp4): the default"
    )
    fp8_weight_block: int | None = Field(
        default=None,
        gt=0,
        description="Block-scaled FP8 checkpoint: the weight block's rows (quantization_config.weight_block_size[0])",
    )
    model_type: str | None = Field(default=None, description="config.json model_type, when known")
    source: str = "user-supplied architecture"

    @model_validator(mode="after")
    def _consistent(self) -> ModelArch:
        if self.kv_heads > self.heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) cannot exceed heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.active_experts > self.experts:
            raise ValueError("active_experts cannot exceed experts")
        if self.active_params is not None and self.active_params > self.params:
            raise ValueError("active_params cannot exceed params")
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError("multi-head latent attention needs both kv_lora_rank and qk_rope_head_dim")
        if self.index_head_dim is not None and self.kv_lora_rank is None:
            raise ValueError("index_head_dim (a sparse-MLA indexer) needs kv_lora_rank and qk_rope_head_dim")
        if self.sliding_window_layers > self.layers:
            raise ValueError(f"sliding_window_layers ({self.sliding_window_layers}) exceeds layers ({self.layers})")
        if self.sliding_window_layers and self.sliding_window_tokens is None:
            raise ValueError("sliding_window_layers needs sliding_window_tokens")
        if self.dense_layers > self.layers:
            raise ValueError(f"dense_layers ({self.dense_layers}) exceeds layers ({self.layers})")
        return self

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def full_attention_layers(self) -> int:
        """Layers whose KV grows with the whole context."""
        return self.layers - (self.sliding_window_layers if self.sliding_window_tokens is not None else 0)

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def expert_width(self) -> int:
        return self.expert_intermediate_size or self.intermediate_size

    @property
    def attention_flops_per_token_per_context(self) -> float:
        """QK^T and PV: 2 x heads x (key width + value width) per layer, per query token per
        context token (MLA prefill attends with qk_nope + qk_rope keys and v_head_dim values)."""
        value = self.v_head_dim or self.head_dim
        return 2.0 * self.layers * self.heads * (self.head_dim + value)

    @property
    def hf_id(self) -> str:
        """What an engine loads: the first Hugging Face id among the aliases, else the name."""
        return next((a for a in self.aliases if "/" in a), self.name)

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.ffn_activation == "swiglu" else 2

    @property
    def expert_params(self) -> float:
        """Parameters of one routed expert's FFN across the MoE layers (the whole FFN for dense models)."""
        if not self.is_moe:
            return float(self.ffn_matrices * self.hidden_size * self.intermediate_size * self.layers)
        return float(self.ffn_matrices * self.hidden_size * self.expert_width * self.moe_layers)

    @property
    def routed_expert_params(self) -> float:
        """All routed experts of all MoE layers (0 for dense models)."""
        return self.experts * self.expert_params if self.is_moe else 0.0

    @property
    def params_per_token(self) -> float:
        """Parameters each token multiplies through: active params for MoE, all for dense."""
        if self.active_params is not None:
            return self.active_params
        if not self.is_moe:
            return self.params
        return self.params - (self.experts - self.active_experts) * self.expert_params

    @property
    def shared_params(self) -> float:
        """Parameters every token reads regardless of routing (attention, norms, embeddings)."""
        if not self.is_moe:
            return self.params
        return max(self.params - self.experts * self.expert_params, 0.0)

    @classmethod
    def from_architecture(cls, name: str, **fields: Any) -> ModelArch:
        """A custom architecture; params derived from the shapes when not given."""
        required = ("layers", "hidden_size", "heads", "kv_heads", "head_dim", "intermediate_size", "vocab_size")
        missing = [f for f in required if f not in fields]
        if missing:
            raise ValueError(f"architecture {name!r} lacks {', '.join(missing)}; give all of {', '.join(required)}")
        if "params" not in fields or fields["params"] is None:
            fields["params"] = estimate_params(**fields)
        if fields.get("max_context_tokens") is None:
            fields.pop("max_context_tokens", None)
            fields["max_context_assumed"] = True
        return cls(name=name, **fields)


def estimate_params(
    *,
    layers: int,
    hidden_size: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    vocab_size: int,
    experts: int = 1,
    ffn_activation: str = "swiglu",
    tied_embeddings: bool = False,
    **_: Any,
) -> float:
    """Weights of a decoder-only transformer from its shapes (norms and biases ignored)."""
    attention = hidden_size * heads * head_dim * 2 + hidden_size * kv_heads * head_dim * 2
    ffn = (3 if ffn_activation == "swiglu" else 2) * hidden_size * intermediate_size * experts
    router = hidden_size * experts if experts > 1 else 0
    embeddings = vocab_size * hidden_size * (1 if tied_embeddings else 2)
    return float(layers * (attention + ffn + router) + embeddings)


class PrecisionSpec(_Frozen):
    name: str
    bytes_per_param: float = Field(gt=0)
    compute: Literal["16bit", "fp8", "int8", "fp4"]
    applies_to: Literal["linear", "experts"] = Field(
        default="linear",
        description="Which weights are stored at this precision: every linear layer, or only the routed "
        "experts of a MoE model (the rest stays 16-bit, as in gpt-oss's MXFP4 checkpoints)",
    )
    weight_bandwidth_efficiency: Efficiency = Field(gt=0, le=1)
    matmul_efficiency_factor: Efficiency = Field(
        default=1.0, gt=0, le=1, description="GEMM efficiency on this path relative to the GPU's 16-bit efficiency"
    )
    vllm_dtype: Literal["bfloat16", "float16"]
    source: str


class KvPrecisionSpec(_Frozen):
    name: str
    bytes_per_element: float = Field(gt=0)
    source: str


# The fields of a profile that model the engine's speed (not its memory rules or deployment
# facts): each profile names, per field, the data it was fitted on or why it is what it is.
PERFORMANCE_FIELDS = (
    "decode_layer_overhead_s",
    "prefill_layer_overhead_s",
    "step_overhead_s",
    "matmul_efficiency_factor",
    "sequence_overhead_s",
    "request_overhead_s",
    "prefill_half_efficiency_flops",
    "allreduce_efficiency",
    "allreduce_hop_latency_s",
)


def version_key(version: str) -> tuple[int, ...]:
    """`0.11.0`, `v0.5.4.post2`, `3.3.7-rocm` -> (0, 11, 0), (0, 5, 4), (3, 3, 7): the leading
    dotted numbers, for ordering releases; () when the text starts with no number."""
    match = re.match(r"v?(\d+(?:\.\d+)*)", version.strip().lower())
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


class EngineProfile(_Frozen):
    name: str = Field(description="The engine (vllm, sglang, tgi, tensorrt-llm): what deploys it and reads its metrics")
    profile: str = Field(default="", description="The catalog key of this profile, e.g. vllm-0.11 (defaults to name)")
    version: str | None = Field(default=None, description="The engine release the profile describes")
    covers_from: str = Field(
        default="0",
        description="The oldest release this profile is chosen for (kvscale.sizing.engine_profiles.profile_for)",
    )
    gpu_memory_utilization: Efficiency = Field(gt=0, le=1)
    kv_memory_basis: Literal["total", "free"] = Field(
        default="total",
        description="total: the engine takes utilization x GPU memory, KV gets what weights and reserve leave "
        "(vLLM); free: KV gets utilization x the memory weights and reserve leave (TensorRT-LLM)",
    )
    non_torch_memory_bytes: float = Field(ge=0)
    cuda_graph_memory_bytes: float = Field(ge=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0, description="None: the per-GPU default")
    kv_block_tokens: int = Field(gt=0)
    max_num_seqs_limit: int = Field(gt=0)
    decode_layer_overhead_s: float = Field(ge=0)
    prefill_layer_overhead_s: float = Field(ge=0)
    step_overhead_s: float = Field(ge=0)
    matmul_efficiency_factor: Efficiency = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Share of the GPU's GEMM efficiency (gpus.yaml, fitted to TensorRT-LLM) this engine's steps reach",
    )
    sequence_overhead_s: float = Field(
        default=0.0,
        ge=0,
        description="Per running sequence per step: the engine's CPU work for it (scheduling, sampling, "
        "detokenizing, output processing), which grows with the batch",
    )
    request_overhead_s: float = Field(
        default=0.0,
        ge=0,
        description="Per admitted request, once: the engine's work to take a new request in (HTTP, tokenization, "
        "admission), serial with its steps",
    )
    prefill_half_efficiency_flops: float = Field(ge=0)
    chunked_prefill: bool = Field(
        default=True,
        description="The engine's default: a prompt longer than the step's token budget is prefilled in chunks "
        "over several steps (vLLM V1, SGLang); false: whole prompts, as many as the budget holds (TensorRT-LLM)",
    )
    decodes_during_prefill: bool = Field(
        default=True,
        description="A step that prefills also advances every running decode (vLLM V1's one token budget); "
        "false: prefill steps run alone and the running decodes wait for them (SGLang without "
        "--enable-mixed-chunk, TensorRT-LLM as its closed-loop sweeps show)",
    )
    allreduce_efficiency: Efficiency = Field(gt=0, le=1)
    allreduce_hop_latency_s: float = Field(ge=0)
    cold_start_fixed_s: float = Field(ge=0)
    weight_load_bytes_per_s: float = Field(gt=0)
    fitted: str | None = Field(default=None, description="Which fields were fitted to what data, if any")
    fitted_on: dict[str, str] = Field(
        default_factory=dict,
        description="Per performance field (PERFORMANCE_FIELDS): the data it was fitted on, or why it is set as it is",
    )
    # Deployment facts (kvscale.control.resources builds the pod from them).
    image: str | None = Field(default=None, description="Container image on NVIDIA GPUs")
    rocm_image: str | None = Field(default=None, description="Container image on AMD GPUs (ROCm); None: not offered")
    rocm_mxfp4: bool = Field(
        default=False,
        description="The catalog's ROCm image runs MXFP4 MoE checkpoints (gpt-oss): its vLLM build carries "
        "the triton_kernels package that get_mxfp4_backend needs on ROCm",
    )
    cache_dir: str = Field(default="/root/.cache/huggingface", description="Where the engine keeps downloaded weights")
    cache_env: str = Field(default="HF_HOME", description="Environment variable that points the engine at cache_dir")
    health_path: str = "/health"
    download_bytes_per_s: float = Field(
        default=250.0e6, gt=0, description="Checkpoint download rate from the model hub into an empty cache"
    )
    source: str

    @model_validator(mode="after")
    def _fitted_on_known(self) -> EngineProfile:
        unknown = set(self.fitted_on) - set(PERFORMANCE_FIELDS)
        if unknown:
            raise ValueError(f"engine {self.profile or self.name}: fitted_on names unknown fields {sorted(unknown)}")
        if not self.profile:
            object.__setattr__(self, "profile", self.name)
        return self


class Catalog(_Frozen):
    gpus: dict[str, GpuSpec]
    models: dict[str, ModelArch]
    links: dict[str, LinkSpec]
    precisions: dict[str, PrecisionSpec]
    kv_cache_precisions: dict[str, KvPrecisionSpec]
    engines: dict[str, EngineProfile]

    @model_validator(mode="after")
    def _links_known(self) -> Catalog:
        for gpu in self.gpus.values():
            for link in (gpu.link, gpu.pair_link):
                if link is not None and link not in self.links:
                    raise ValueError(f"GPU {gpu.name}: unknown link {link!r}; known: {sorted(self.links)}")
        return self

    def gpu(self, name: str) -> GpuSpec:
        return self.gpus[_resolve(name, self.gpus, _gpu_aliases(self.gpus), "GPU type", "kvscale gpus")]

    def model(self, name: str) -> ModelArch:
        """The model by catalog key or alias. Named by one of its Hugging Face ids, that id is its
        `hf_id` (what the engine loads, and what a quantized checkpoint must be made from): the
        architecture is shared, the checkpoint (base or instruction-tuned) is the one named."""
        aliases = {alias.lower(): key for key, m in self.models.items() for alias in m.aliases}
        found = self.models[_resolve(name, self.models, aliases, "model", "kvscale models")]
        named = next((a for a in found.aliases if "/" in a and a.lower() == name.strip().lower()), None)
        if named is None or named == found.hf_id:
            return found
        return found.model_copy(update={"aliases": (named, *(a for a in found.aliases if a != named))})

    def precision(self, name: str) -> PrecisionSpec:
        return self.precisions[_resolve(name, self.precisions, {}, "precision", None)]

    def kv_precision(self, name: str) -> KvPrecisionSpec:
        return self.kv_cache_precisions[_resolve(name, self.kv_cache_precisions, {}, "KV-cache precision", None)]

    def engine(self, name: str = "vllm") -> EngineProfile:
        """A profile by its key (`vllm-0.11`), or an engine's newest profile by the engine's name
        (`vllm`)."""
        newest = default_engine_profiles(self.engines)
        return self.engines[_resolve(name, self.engines, newest, "engine", None)]

    def engine_profiles(self, engine: str) -> list[EngineProfile]:
        """Every profile of one engine, oldest release first."""
        found = [p for p in self.engines.values() if p.name == engine.strip().lower()]
        return sorted(found, key=lambda p: (version_key(p.covers_from), version_key(p.version or "")))

    def link(self, gpu: GpuSpec, tensor_parallel: int = 1) -> LinkSpec:
        """The link a tensor-parallel ring crosses: a bridged pair's own link at TP 2."""
        if tensor_parallel == 2 and gpu.pair_link is not None:
            return self.links[gpu.pair_link]
        return self.links[gpu.link]

    def gpu_for_node_label(self, label_value: str) -> GpuSpec | None:
        for gpu in self.gpus.values():
            if label_value in gpu.node_labels:
                return gpu
        return None

    def with_prices(self, prices_usd_per_gpu_hour: dict[str, float]) -> Catalog:
        gpus = dict(self.gpus)
        for name, price in prices_usd_per_gpu_hour.items():
            gpu = self.gpu(name)
            gpus[gpu.name] = gpu.model_copy(update={"price_usd_per_gpu_hour": price})
        return self.model_copy(update={"gpus": gpus})


def default_engine_profiles(engines: dict[str, Any]) -> dict[str, str]:
    """Engine name -> the key of its newest profile (the release it covers from, then its
    version): what `--engine vllm` and an engine image without a known tag mean. `engines` is
    the catalog's section, profiles or the raw YAML mappings."""

    def field(entry: Any, key: str, default: str) -> str:
        value = entry.get(key) if isinstance(entry, dict) else getattr(entry, key, None)
        return str(value) if value is not None else default

    newest: dict[str, tuple[tuple[tuple[int, ...], tuple[int, ...]], str]] = {}
    for key, entry in engines.items():
        engine = field(entry, "engine" if isinstance(entry, dict) else "name", key)
        rank = (version_key(field(entry, "covers_from", "0")), version_key(field(entry, "version", "")))
        if engine not in newest or rank > newest[engine][0]:
            newest[engine] = (rank, key)
    return {engine: key for engine, (_, key) in newest.items() if engine not in engines}


def _gpu_aliases(gpus: dict[str, GpuSpec]) -> dict[str, str]:
    aliases = {label.lower(): key for key, g in gpus.items() for label in g.node_labels}
    aliases.update({"h100": "H100-SXM", "a100": "A100-80GB", "h100-80gb": "H100-SXM"})
    return aliases


def _resolve(name: str, table: dict[str, Any], aliases: dict[str, str], what: str, hint: str | None) -> str:
    if name in table:
        return name
    lowered = name.strip().lower()
    for key in table:
        if key.lower() == lowered:
            return key
    if lowered in aliases:
        return aliases[lowered]
    candidates = list(table) + list(aliases)
    close = difflib.get_close_matches(lowered, [c.lower() for c in candidates], n=3, cutoff=0.6)
    # An alias is named with the entry it stands for: the list after "Known:" holds entries only.
    keys = {key.lower(): key for key in table}
    named: dict[str, str] = {}  # entry -> how it is suggested, once per entry
    for c in close:
        entry = keys.get(c) or aliases[c]
        named.setdefault(entry, entry if c in keys else f"{entry} ({c})")
    suggestion = f" Did you mean {', '.join(named.values())}?" if named else ""
    listing = f" Run `{hint}` to list them." if hint else ""
    raise CatalogError(f"unknown {what} {name!r}.{suggestion} Known: {', '.join(sorted(table))}.{listing}")


def _named(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {key: {"name": key, **value} for key, value in (entries or {}).items()}


def _engine_profiles(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Profiles keyed `vllm-0.11`: `name` is the engine (the YAML's `engine`, else the key)."""
    profiles = {}
    for key, value in (entries or {}).items():
        fields = dict(value or {})
        engine = fields.pop("engine", key)
        profiles[key] = {"name": engine, "profile": key, **fields}
    return profiles


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = load_yaml(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"cannot read catalog file {path}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CatalogError(f"catalog file {path}: top level must be a mapping")
    return data


def _builtin_raw() -> dict[str, Any]:
    raw: dict[str, Any] = {}
    package = resources.files("kvscale.sizing.catalog")
    for filename in ("gpus.yaml", "models.yaml", "precisions.yaml", "engines.yaml"):
        # libyaml's loader where PyYAML was built with it: the same SafeLoader rules, ~5x faster
        # (the catalog is read on every `kvscale plan`).
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        raw.update(yaml.load(package.joinpath(filename).read_text(), Loader=loader) or {})
    return raw


def load_catalog(*overlays: Path) -> Catalog:
    """The built-in catalog with user files laid over it (new GPUs, models, prices, links).

    An overlay entry for an existing name is merged field by field, so a file holding
    only `gpus: {H100-SXM: {price_usd_per_gpu_hour: 2.10}}` overrides one price.
    """
    raw = _builtin_raw()
    for path in overlays:
        extra = _read_yaml(path)
        unknown = set(extra) - {"gpus", "models", "links", "precisions", "kv_cache_precisions", "engines"}
        if unknown:
            raise CatalogError(
                f"catalog file {path}: unknown sections {sorted(unknown)}; allowed: gpus, models, "
                "links, precisions, kv_cache_precisions, engines"
            )
        for section, entries in extra.items():
            merged = dict(raw.get(section) or {})
            # An overlay's `engines: {vllm: ...}` sets the engine's newest profile (what `vllm` means).
            renamed = default_engine_profiles(merged) if section == "engines" else {}
            for key, value in (entries or {}).items():
                key = renamed.get(key, key)
                merged[key] = {**merged.get(key, {}), **(value or {})}
            raw[section] = merged
    try:
        return Catalog.model_validate(
            {
                **{
                    section: _named(raw.get(section, {}))
                    for section in ("gpus", "models", "precisions", "kv_cache_precisions")
                },
                "engines": _engine_profiles(raw.get("engines", {})),
                "links": raw.get("links", {}),
            }
        )
    except ValidationError as exc:
        raise CatalogError(f"invalid catalog: {exc}") from exc


@cache
def default_catalog() -> Catalog:
    return load_catalog()
