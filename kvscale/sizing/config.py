"""One serving configuration: a model on a GPU type at a precision and tensor-parallel degree."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from kvscale.sizing.catalog import (
    Catalog,
    EngineProfile,
    GpuSpec,
    KvPrecisionSpec,
    LinkSpec,
    ModelArch,
    PrecisionSpec,
)
from kvscale.sizing.experts import block_fp8_split_problem
from kvscale.sizing.memory import (
    MemoryBudget,
    expert_bytes_per_param,
    kv_bytes_per_token_per_layer,
    memory_budget,
    shared_bytes_per_param,
    weight_bytes,
)
from kvscale.sizing.parallel import allreduce_terms_s, data_parallel_moe_terms_s, pipeline_terms_s


def default_chunk_budget_tokens(engine: EngineProfile, gpu: GpuSpec) -> int:
    """The engine's `--max-num-batched-tokens` when none is given.

    vLLM (`vllm serve`, vllm/engine/arg_utils.py, EngineArgs._set_default_args in 0.11.0):
    8192 on GPUs with >= 70 GiB whose name does not contain "a100" (H100-class, MI300X),
    2048 on every other GPU (A100, L40S, L4, A10(G), T4); recent releases use 16384 on
    GPUs with >= 160 GiB. An engine profile with a fixed budget uses that instead.
    """
    if engine.max_num_batched_tokens is not None:
        return engine.max_num_batched_tokens
    if gpu.memory_gib >= 160:
        return 16384
    if gpu.memory_gib >= 70 and "a100" not in gpu.name.lower():
        return 8192
    return 2048


_DERIVED_CACHE_ENTRIES = 20_000  # a full catalog is ~300 configurations x a few budgets
_RATES: dict[tuple[int, ...], tuple[tuple[object, ...], Rates]] = {}
_MEMORY: dict[tuple[int, ...], tuple[tuple[object, ...], MemoryBudget]] = {}


@dataclass(frozen=True)
class Rates:
    matmul_flops_per_s: float  # peak x large-matmul efficiency
    weight_bytes_per_s: float  # HBM x efficiency x the precision's dequantization factor
    kv_bytes_per_s: float
    linear_flops_per_token: float  # 2 x active params / tp
    attention_flops_per_token_per_context: float  # 4 x layers x heads x head_dim / tp
    dense_weight_bytes: float  # this GPU's whole weight shard
    # Derived once for the step formula (kvscale.sizing.roofline.step):
    peak_flops_per_s: float
    matmul_efficiency: float
    gemm_half_flops: float  # per-layer GEMM size at half efficiency (engine)
    linear_flops_per_token_per_layer: float
    allreduce_fixed_s: float  # per forward pass: layers x all-reduces x (link + hop latency)
    allreduce_s_per_token: float  # per forward pass per token: the bytes on the wire over the link
    decode_overhead_s: float  # per step without a prefill chunk: layers x per-layer + per-step
    shared_weight_bytes: float  # MoE: what every token reads (attention, embeddings), this GPU
    expert_weight_bytes: float  # MoE: one expert's FFN, this GPU (0 for dense models)
    prefill_overhead_s: float  # per step with a chunk
    # Sliding-window layers (gpt-oss, Gemma 3): their attention and KV reads stop at the window.
    attention_window_flops_per_token_per_context: float = 0.0
    window_tokens: float = 0.0
    kv_full_bytes_per_token: float = 0.0  # KV read per context token on the full-attention layers
    kv_window_bytes_per_token: float = 0.0  # ... on the sliding layers, up to window_tokens
    sequence_overhead_s: float = 0.0  # per running sequence per step (the engine's CPU work)
    # Pipeline parallelism: a token crosses pp - 1 stage boundaries per forward pass.
    pipeline_fixed_s: float = 0.0
    pipeline_s_per_token: float = 0.0
    # Expert parallelism (kvscale.sizing.experts): ranks holding whole experts (0: experts
    # split by tensor parallelism), and the routed experts' FLOPs per token on one GPU at an
    # even spread (the busiest rank does more: roofline.step).
    expert_ranks: int = 0
    routed_flops_per_token: float = 0.0
    # Data-parallel attention (roofline.step): ranks, and the MoE all-gather/reduce-scatter
    # as fixed + per token of all ranks.
    data_parallel: int = 1
    dispatch_fixed_s: float = 0.0
    dispatch_s_per_token: float = 0.0


class UnsupportedConfig(ValueError):
    """The combination cannot run at all (not a matter of memory or speed)."""


def mxfp4_unsupported(gpu: GpuSpec, engine: EngineProfile) -> str | None:
    """Where vLLM 0.11.0 cannot run an MXFP4 MoE checkpoint (gpt-oss), or None.

    vllm/model_executor/layers/quantization/mxfp4.py: `Mxfp4Config.get_min_capability` is 80;
    `get_mxfp4_backend` picks, on CUDA, FlashInfer on SM100 (Blackwell) and SM90 (opt-in), else
    Marlin below SM90 (Ampere, Ada) or the Triton `triton_kernels` matmul on Hopper: all of them
    dequantize the FP4 weights for 16-bit GEMMs (FP4 tensor cores only with the opt-in MXFP8
    activations on SM100), which precisions.yaml's mxfp4 entry models. On ROCm it returns the
    Triton backend only when the `triton_kernels` package is installed, else NONE, and
    `Mxfp4MoEMethod.__init__` asserts "No MXFP4 MoE backend (FlashInfer/Marlin/Triton)
    available": the engine does not start. So MXFP4 is planned on AMD GPUs only with a profile
    whose ROCm image is known to run it (`rocm_mxfp4`, engines.yaml says where from); there the
    same dequantize-to-16-bit GEMMs run (MI300X has no FP4 hardware)."""
    if gpu.vendor == "amd":
        if engine.rocm_mxfp4:
            return None
        image = engine.rocm_image or "no ROCm image"
        return (
            f"{gpu.name} cannot run mxfp4 on {engine.profile}'s ROCm image ({image}): vLLM runs MXFP4 MoE on "
            "ROCm only with the triton_kernels package (mxfp4.py get_mxfp4_backend), which that image is not "
            "known to carry; use a ROCm image that does (spec.engine.rocmImage) or plan it on NVIDIA GPUs "
            "(compute capability 8.0 on)"
        )
    if not gpu.bf16_supported:
        return f"{gpu.name} cannot run mxfp4: vLLM's MXFP4 kernels need compute capability 8.0 (Ampere)"
    return None


@dataclass(frozen=True)
class ServingConfig:
    model: ModelArch
    gpu: GpuSpec
    link: LinkSpec
    precision: PrecisionSpec
    kv: KvPrecisionSpec
    engine: EngineProfile
    tensor_parallel: int
    chunk_budget_tokens: int | None = None  # --max-num-batched-tokens; None: the engine's default here
    pipeline_parallel: int = 1  # pipeline stages; > 1 when one replica spans nodes (TP within a node)
    expert_parallel: bool = False  # MoE: whole routed experts per rank (vLLM --enable-expert-parallel)
    # Data-parallel attention (vLLM --data-parallel-size with --enable-expert-parallel, TP 1):
    # this many engines, each with its own attention weights, KV cache and scheduler, the
    # experts spread over all of them. Modelled as one replica: batch and KV capacity summed,
    # each step that of the busiest rank (kvscale.sizing.roofline.step).
    data_parallel: int = 1

    @classmethod
    def build(
        cls,
        catalog: Catalog,
        model: ModelArch,
        gpu: GpuSpec,
        precision: str = "bf16",
        tensor_parallel: int = 1,
        kv_cache_precision: str = "auto",
        engine: str = "vllm",
        max_num_batched_tokens: int | None = None,
        pipeline_parallel: int = 1,
        expert_parallel: bool = False,
        data_parallel: int = 1,
    ) -> ServingConfig:
        return cls(
            model=model,
            gpu=gpu,
            link=catalog.link(gpu, tensor_parallel * data_parallel),
            precision=catalog.precision(precision),
            kv=catalog.kv_precision(kv_cache_precision),
            engine=catalog.engine(engine),
            tensor_parallel=tensor_parallel,
            chunk_budget_tokens=max_num_batched_tokens,
            pipeline_parallel=pipeline_parallel,
            expert_parallel=expert_parallel,
            data_parallel=data_parallel,
        )

    @property
    def max_num_batched_tokens(self) -> int:
        """Tokens one engine step may carry: running decodes plus prefill chunks (with data-parallel
        attention, over all the ranks: each rank's budget times the ranks)."""
        return self.rank_chunk_budget_tokens * self.data_parallel

    @property
    def rank_chunk_budget_tokens(self) -> int:
        """`--max-num-batched-tokens`: one engine's (one data-parallel rank's) step budget."""
        if self.chunk_budget_tokens is not None:
            return self.chunk_budget_tokens
        return default_chunk_budget_tokens(self.engine, self.gpu)

    def with_chunk_budget(self, tokens: int) -> ServingConfig:
        """The same configuration with another `--max-num-batched-tokens` (rates carried over:
        they do not depend on the budget; memory does, through the activation reserve)."""
        other = replace(self, chunk_budget_tokens=tokens)
        for derived in ("peak_flops_per_s", "rates"):
            if derived in self.__dict__:
                other.__dict__[derived] = self.__dict__[derived]
        return other

    @property
    def compute_path(self) -> str:
        """The tensor-core path the GEMMs take. FP8 weights on an NVIDIA GPU without FP8 tensor
        cores but with compute capability >= 8.0 (Ampere: bf16 support in the catalog) run as
        FP8 Marlin, weight-only with 16-bit GEMMs (vLLM 0.11.0
        vllm/model_executor/layers/quantization/fp8.py: `use_marlin = not
        current_platform.has_device_capability(89)`; Fp8Config.get_min_capability 80)."""
        c = self.precision.compute
        if c == "fp8" and self.gpu.flops_fp8_per_s is None and self.gpu.vendor == "nvidia" and self.gpu.bf16_supported:
            return "16bit"
        return c

    @cached_property
    def peak_flops_per_s(self) -> float:
        """Dense peak of one GPU on the precision's compute path."""
        peak = self.gpu.peak_flops_per_s(self.compute_path)
        if peak is None:
            raise UnsupportedConfig(self.unsupported_reason() or "unsupported precision")
        return peak

    @property
    def matmul_efficiency(self) -> float:
        """Share of this precision's peak that large GEMMs reach on this GPU (a weight-only
        fallback runs 16-bit GEMMs at the GPU's own 16-bit efficiency)."""
        engine = self.engine.matmul_efficiency_factor
        if self.compute_path != self.precision.compute:
            return self.gpu.matmul_efficiency * engine
        return self.gpu.matmul_efficiency * self.precision.matmul_efficiency_factor * engine

    def _derived_key(self) -> tuple[int, ...]:
        """Identity of the catalog entries this configuration is made of. The derived-value
        caches below keep those entries alive, so an id is never reused while it is a key."""
        return (
            id(self.model),
            id(self.gpu),
            id(self.link),
            id(self.precision),
            id(self.kv),
            id(self.engine),
            self.tensor_parallel,
            self.pipeline_parallel,
            self.expert_parallel,
            self.data_parallel,
        )

    @cached_property
    def rates(self) -> Rates:
        """Per-GPU rates the step-time formulas divide by, derived once per catalog entry
        combination (the operator and the benchmarks plan the same catalog over and over)."""
        key = self._derived_key()
        hit = _RATES.get(key)
        if hit is None:
            if len(_RATES) > _DERIVED_CACHE_ENTRIES:
                _RATES.clear()
            hit = _RATES[key] = (self._parts(), self._rates_uncached())
        return hit[1]

    def _parts(self) -> tuple[object, ...]:
        return (self.model, self.gpu, self.link, self.precision, self.kv, self.engine)

    def _rates_uncached(self) -> Rates:
        m, tp, e = self.model, self.tensor_parallel, self.engine
        kv_bandwidth = self.gpu.hbm_bandwidth_bytes_per_s * self.gpu.bandwidth_efficiency
        linear = 2.0 * m.params_per_token / tp
        fixed, per_token = allreduce_terms_s(m.hidden_size, m.layers, tp, self.link, e)
        # Step times are those of one GPU of a stage summed over the stages (the stages run one
        # after another for a token), so weights and KV are counted for all layers / tp.
        per_layer_kv = kv_bytes_per_token_per_layer(m, self.kv, tp)
        windowed = m.layers - m.full_attention_layers
        attention = m.attention_flops_per_token_per_context / m.layers / tp
        shared_bpp = shared_bytes_per_param(m, self.precision)
        expert_bpp = expert_bytes_per_param(m, self.precision)
        pp_fixed, pp_per_token = pipeline_terms_s(m.hidden_size, self.pipeline_parallel, self.gpu)
        # Under expert parallelism a rank reads whole experts (its own); else 1/tp of each.
        ep = self.expert_parallel and m.is_moe
        expert_bytes = m.expert_params * expert_bpp / (1 if ep else tp) if m.is_moe else 0.0
        dp = self.data_parallel
        link = self.link
        if dp > 1 and self.nodes > 1 and self.gpu.internode_bandwidth_bytes_per_s:  # the ring crosses the fabric
            link = LinkSpec(
                bandwidth_bytes_per_s_per_direction=self.gpu.internode_bandwidth_bytes_per_s,
                latency_s=self.gpu.internode_latency_s,
                source="the GPU's inter-node fabric (gpus.yaml)",
            )
        dispatch_fixed, dispatch_per_token = data_parallel_moe_terms_s(m.hidden_size, m.moe_layers, dp, link, e)
        return Rates(
            matmul_flops_per_s=self.peak_flops_per_s * self.matmul_efficiency,
            weight_bytes_per_s=kv_bandwidth * self.precision.weight_bandwidth_efficiency,
            kv_bytes_per_s=kv_bandwidth,
            linear_flops_per_token=linear,
            attention_flops_per_token_per_context=attention * m.full_attention_layers,
            dense_weight_bytes=weight_bytes(m, self.precision) / tp,
            peak_flops_per_s=self.peak_flops_per_s,
            matmul_efficiency=self.matmul_efficiency,
            gemm_half_flops=e.prefill_half_efficiency_flops,
            linear_flops_per_token_per_layer=linear / m.layers,
            allreduce_fixed_s=fixed,
            allreduce_s_per_token=per_token,
            decode_overhead_s=m.layers * e.decode_layer_overhead_s + e.step_overhead_s,
            prefill_overhead_s=m.layers * e.prefill_layer_overhead_s + e.step_overhead_s,
            shared_weight_bytes=m.shared_params * shared_bpp / tp,
            expert_weight_bytes=expert_bytes,
            attention_window_flops_per_token_per_context=attention * windowed,
            window_tokens=float(m.sliding_window_tokens or 0),
            kv_full_bytes_per_token=per_layer_kv * m.full_attention_layers,
            kv_window_bytes_per_token=per_layer_kv * windowed,
            sequence_overhead_s=e.sequence_overhead_s,
            pipeline_fixed_s=pp_fixed,
            pipeline_s_per_token=pp_per_token,
            expert_ranks=tp * dp if ep else 0,
            routed_flops_per_token=2.0 * m.active_experts * m.expert_params / tp if ep else 0.0,
            data_parallel=dp,
            dispatch_fixed_s=dispatch_fixed,
            dispatch_s_per_token=dispatch_per_token,
        )

    @cached_property
    def memory(self) -> MemoryBudget:
        key = (*self._derived_key(), self.max_num_batched_tokens)
        hit = _MEMORY.get(key)
        if hit is None:
            if len(_MEMORY) > _DERIVED_CACHE_ENTRIES:
                _MEMORY.clear()
            budget = memory_budget(
                self.model,
                self.gpu,
                self.precision,
                self.kv,
                self.engine,
                self.tensor_parallel,
                self.rank_chunk_budget_tokens,
                self.pipeline_parallel,
                self.expert_parallel,
                self.data_parallel,
            )
            hit = _MEMORY[key] = (self._parts(), budget)
        return hit[1]

    @property
    def gpus(self) -> int:
        """GPUs one replica uses: tensor x pipeline x data parallel."""
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel

    @property
    def nodes(self) -> int:
        """Nodes one replica spans (a LeaderWorkerSet group of this size when > 1)."""
        return max(1, math.ceil(self.gpus / self.gpu.max_gpus_per_node))

    @property
    def gpus_per_node(self) -> int:
        """GPUs one replica asks of each of its nodes."""
        return self.gpus // self.nodes

    @property
    def price_usd_per_hour(self) -> float:
        return self.gpu.price_usd_per_gpu_hour * self.gpus

    @property
    def cold_start_s(self) -> float:
        """A new replica's start: container and engine start plus loading this GPU's weight shard."""
        return self.engine.cold_start_fixed_s + self.memory.weights_bytes / self.engine.weight_load_bytes_per_s

    def unsupported_reason(self) -> str | None:
        """Why this combination cannot run regardless of load, or None."""
        tp = self.tensor_parallel
        if tp not in (1, 2, 4, 8):
            return f"tensor parallel {tp} is not one of 1, 2, 4, 8"
        if tp > self.gpu.max_gpus_per_node:
            return f"tensor parallel {tp} exceeds the {self.gpu.max_gpus_per_node} {self.gpu.name} GPUs a node holds"
        pp = self.pipeline_parallel
        if pp < 1:
            return f"pipeline parallel {pp} must be at least 1"
        if pp > self.model.layers:
            return f"pipeline parallel {pp} exceeds the model's {self.model.layers} layers"
        if self.nodes > 1:
            if self.gpus % self.gpu.max_gpus_per_node:
                return (
                    f"{self.gpus} GPUs per replica do not fill whole nodes of {self.gpu.max_gpus_per_node} "
                    f"{self.gpu.name} (tensor parallel within a node, pipeline parallel across nodes)"
                )
            if self.gpu.internode_bandwidth_bytes_per_s is None:
                return f"{self.gpu.name} has no inter-node fabric in the catalog for a replica spanning nodes"
        dp = self.data_parallel
        if dp > 1:
            if not (self.expert_parallel and self.model.is_moe):
                return "data-parallel attention is modelled for MoE models with expert parallelism"
            if tp != 1 or pp != 1:
                return "data-parallel attention is modelled at tensor and pipeline parallel 1 per rank"
            if self.engine.name != "vllm":
                return (
                    "data-parallel attention is modelled as vLLM runs it (--data-parallel-size, attention and dense "
                    "layers whole per rank); SGLang's --attn-dp-size keeps its FFN tensor parallel"
                )
            if self.nodes > 1 and self.gpus_per_node != self.gpu.max_gpus_per_node:
                return "data-parallel attention across nodes takes whole nodes"
        if self.expert_parallel:
            if not self.model.is_moe:
                return f"expert parallelism needs a mixture-of-experts model; {self.model.name} is dense"
            if tp * dp < 2:
                return "expert parallelism needs tensor parallel 2 or more (the experts are split over those ranks)"
            if self.engine.name not in ("vllm", "sglang"):
                return f"kvscale deploys expert parallelism on vLLM and SGLang, not {self.engine.name}"
        m = self.model
        block = m.fp8_weight_block
        if block and self.precision.name == "fp8" and m.is_moe and not self.expert_parallel:
            problem = block_fp8_split_problem(m.expert_width, tp, block) if self.engine.name == "vllm" else None
            if problem:
                return problem
        if self.model.heads % tp:
            return f"{self.model.heads} attention heads do not split evenly over {tp} GPUs"
        if self.model.kv_heads % tp and tp % self.model.kv_heads:
            return f"{self.model.kv_heads} KV heads and tensor parallel {tp} do not divide each other"
        if self.gpu.peak_flops_per_s(self.compute_path) is None:
            return f"{self.gpu.name} has no {self.precision.compute} tensor cores for {self.precision.name}"
        if self.precision.name == "mxfp4":
            problem = mxfp4_unsupported(self.gpu, self.engine)
            if problem:
                return problem
        if self.precision.name == "bf16" and not self.gpu.bf16_supported:
            return f"{self.gpu.name} has no bfloat16 support; use fp16"
        if self.kv.name == "fp8" and self.gpu.flops_fp8_per_s is None:
            return f"{self.gpu.name} has no FP8 support for an fp8 KV cache"
        return None
