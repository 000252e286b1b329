"""GPU memory: weights, KV cache per token (GQA and tensor parallelism), engine reserve, fit."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscale.sizing.catalog import EngineProfile, GpuSpec, KvPrecisionSpec, ModelArch, PrecisionSpec
from kvscale.sizing.experts import experts_per_rank

UNQUANTIZED_BYTES_PER_PARAM = 2.0  # what a precision that covers only the experts leaves in 16 bits


def expert_bytes_per_param(model: ModelArch, precision: PrecisionSpec) -> float:
    """Bytes per parameter of the routed experts."""
    return precision.bytes_per_param


def shared_bytes_per_param(model: ModelArch, precision: PrecisionSpec) -> float:
    """Bytes per parameter of everything but the routed experts (attention, dense and shared
    FFNs, embeddings): 16-bit when the precision quantizes only the experts (gpt-oss MXFP4)."""
    if precision.applies_to == "experts" and model.is_moe:
        return UNQUANTIZED_BYTES_PER_PARAM
    return precision.bytes_per_param


def weight_bytes(model: ModelArch, precision: PrecisionSpec) -> float:
    """All weights of the model at a precision (the whole tensor-parallel group)."""
    routed = model.routed_expert_params
    return routed * expert_bytes_per_param(model, precision) + (model.params - routed) * shared_bytes_per_param(
        model, precision
    )


def weight_bytes_per_gpu(
    model: ModelArch,
    precision: PrecisionSpec,
    tensor_parallel: int,
    pipeline_parallel: int = 1,
    expert_parallel: bool = False,
    data_parallel: int = 1,
) -> float:
    """One GPU's weights: 1/(tp x pp) of all; under expert parallelism the routed experts go
    whole, ceil(experts / (tp x dp)) to the fullest rank (vLLM determine_expert_map,
    experts.py); with data-parallel attention every rank holds the rest whole (tp 1)."""
    if not (expert_parallel and model.is_moe):
        return weight_bytes(model, precision) / (tensor_parallel * pipeline_parallel)
    routed = model.routed_expert_params
    rest = (model.params - routed) * shared_bytes_per_param(model, precision) / tensor_parallel
    local = (
        experts_per_rank(model.experts, tensor_parallel * data_parallel)
        * model.expert_params
        * expert_bytes_per_param(model, precision)
    )
    return (rest + local) / pipeline_parallel


def kv_heads_per_gpu(model: ModelArch, tensor_parallel: int) -> int:
    """KV heads each GPU stores: heads split across the group, replicated once tp > kv_heads.
    MLA caches one latent "head" that every rank keeps whole (vllm/model_executor/layers/mla.py)."""
    if model.is_mla:
        return 1
    return max(math.ceil(model.kv_heads / tensor_parallel), 1)


# vLLM 0.11.0's "fp8_ds_mla" page entry (vllm/v1/attention/backends/mla/flashmla_sparse.py, the
# format note; kv_cache_interface.py MLAAttentionSpec.page_size_bytes): 512 fp8 latent values,
# 4 float32 scales (16 bytes) and 64 bf16 rope values (128 bytes).
SPARSE_MLA_FP8_BYTES_PER_TOKEN = 512 + 16 + 128
# The indexer's key cache keeps fp8 values with one float32 scale per 128 of them
# (deepseek_v2.py Indexer: DeepseekV32IndexerCache head_dim + head_dim // 128 * 4, uint8).
INDEXER_QUANT_BLOCK = 128


def kv_bytes_per_token_per_layer(model: ModelArch, kv: KvPrecisionSpec, tensor_parallel: int = 1) -> float:
    """One token, one layer, one GPU, as vLLM 0.11.0 sizes a page (vllm/v1/kv_cache_interface.py):
    AttentionSpec 2 (K and V) x kv heads x head_dim x bytes; MLAAttentionSpec one latent of
    kv_lora_rank + qk_rope_head_dim values, no factor 2, the same on every tensor-parallel rank.
    Sparse MLA (DeepSeek V3.2) stores the latent as "fp8_ds_mla" under --kv-cache-dtype auto or
    fp8 (vllm/model_executor/models/config.py DeepseekV32ForCausalLM turns both into it), plus
    the indexer's fp8 key."""
    if model.kv_lora_rank is not None and model.qk_rope_head_dim is not None:
        latent = (model.kv_lora_rank + model.qk_rope_head_dim) * kv.bytes_per_element
        if model.index_head_dim is None:
            return latent
        if kv.name in ("auto", "fp8"):
            latent = SPARSE_MLA_FP8_BYTES_PER_TOKEN
        indexer = model.index_head_dim + model.index_head_dim // INDEXER_QUANT_BLOCK * 4
        return latent + indexer
    return 2.0 * kv_heads_per_gpu(model, tensor_parallel) * model.head_dim * kv.bytes_per_element


def kv_bytes_per_token(model: ModelArch, kv: KvPrecisionSpec, tensor_parallel: int = 1) -> float:
    """KV bytes one token of context occupies on one GPU over every layer (no sliding window)."""
    return model.layers * kv_bytes_per_token_per_layer(model, kv, tensor_parallel)


@dataclass(frozen=True)
class KvLayout:
    """How vLLM 0.11.0 groups a model's attention layers into KV-cache groups that share one
    block pool (vllm/v1/core/kv_cache_utils.py, _get_kv_cache_groups_uniform_page_size): a
    model with full and sliding-window layers gets groups of min(#full, #sliding) layers each;
    a block of the pool holds `group_layers` layers of `block` tokens. A sequence takes
    blocks for its whole context in each full group and at most the window in each
    sliding group (SlidingWindowManager frees blocks that left the window)."""

    group_layers: int
    full_groups: int
    window_groups: int
    window_tokens: int  # tokens a sliding group keeps per sequence, in whole blocks

    def sequence_tokens(self, context_tokens: int, block_tokens: int) -> int:
        """Pool tokens (block_tokens-sized blocks of group_layers layers) one sequence holds."""
        whole = tokens_per_sequence(context_tokens, block_tokens)
        return self.full_groups * whole + self.window_groups * min(whole, self.window_tokens)


def kv_layout(model: ModelArch, block_tokens: int) -> KvLayout:
    window, sliding = model.sliding_window_tokens, model.sliding_window_layers
    if window is None or sliding == 0:
        return KvLayout(model.layers, 1, 0, 0)
    # A sliding layer keeps the last window - 1 tokens plus the new one, and one more block
    # because the window need not start on a block boundary (SlidingWindowSpec.max_memory_usage_bytes).
    window_tokens = (math.ceil(window / block_tokens) + 1) * block_tokens
    full = model.layers - sliding
    if full == 0:
        return KvLayout(model.layers, 0, 1, window_tokens)
    group = min(full, sliding)
    return KvLayout(group, math.ceil(full / group), math.ceil(sliding / group), window_tokens)


def activation_peak_bytes(model: ModelArch, engine: EngineProfile, tensor_parallel: int, tokens: int) -> float:
    """Peak activations of one profiled forward pass at the engine's token budget.

    The FFN's widest intermediate (gate and up, split by tp) plus the residual stream and
    attention projections, in 16-bit, for max_num_batched_tokens tokens; plus fp32 logits
    for one token per sequence. vLLM measures this by profiling; this estimates it.
    """
    widest_bytes_per_token = (2 * model.intermediate_size / tensor_parallel + 4 * model.hidden_size) * 2
    logits_bytes = min(engine.max_num_seqs_limit, tokens) * model.vocab_size * 4 / tensor_parallel
    return tokens * widest_bytes_per_token + logits_bytes


@dataclass(frozen=True)
class MemoryBudget:
    """How one GPU's memory is split, in bytes."""

    total_bytes: float
    usable_bytes: float  # total x gpu_memory_utilization
    weights_bytes: float  # this GPU's shard
    reserve_bytes: float  # activations, CUDA graphs, context
    kv_bytes: float  # what is left for the KV cache (negative: does not fit)
    kv_bytes_per_token: float  # one pool token: a block's bytes / block tokens (all layers without windows)
    kv_capacity_tokens: int  # pool tokens; one sequence of context C takes layout.sequence_tokens(C)
    layout: KvLayout | None = None  # None: every layer caches the whole context
    block_tokens: int = 1

    @property
    def fits(self) -> bool:
        return self.kv_capacity_tokens > 0

    def sequence_tokens(self, context_tokens: int) -> int:
        """Pool tokens one sequence of `context_tokens` holds (whole blocks; windows capped)."""
        if self.layout is None:
            return tokens_per_sequence(context_tokens, self.block_tokens)
        return self.layout.sequence_tokens(context_tokens, self.block_tokens)

    def max_batch_for_context(self, context_tokens: int) -> int:
        """Sequences of `context_tokens` each that the KV cache holds at once."""
        if context_tokens <= 0:
            raise ValueError("context_tokens must be positive")
        return self.kv_capacity_tokens // self.sequence_tokens(context_tokens)


def memory_budget(
    model: ModelArch,
    gpu: GpuSpec,
    precision: PrecisionSpec,
    kv: KvPrecisionSpec,
    engine: EngineProfile,
    tensor_parallel: int,
    chunk_budget_tokens: int,
    pipeline_parallel: int = 1,
    expert_parallel: bool = False,
    data_parallel: int = 1,
) -> MemoryBudget:
    """One GPU's split. With pipeline parallelism each stage holds 1/pp of the layers (weights
    and KV); the KV capacity in tokens is then the same on every stage. With expert
    parallelism a rank holds whole routed experts, the most on one rank sizing the group. With
    data-parallel attention each of the `data_parallel` ranks (one GPU each) keeps its own
    KV cache: the capacity is the ranks' sum (chunk_budget_tokens is one rank's)."""
    total = gpu.memory_bytes
    weights = weight_bytes_per_gpu(model, precision, tensor_parallel, pipeline_parallel, expert_parallel, data_parallel)
    reserve = (
        activation_peak_bytes(model, engine, tensor_parallel, chunk_budget_tokens)
        + engine.cuda_graph_memory_bytes
        + engine.non_torch_memory_bytes
    )
    if engine.kv_memory_basis == "free":  # TensorRT-LLM: a fraction of what is free after loading
        usable = total
        kv_left = (total - weights - reserve) * engine.gpu_memory_utilization
    else:  # vLLM: a fraction of the whole GPU, weights and reserve inside it
        usable = total * engine.gpu_memory_utilization
        kv_left = usable - weights - reserve
    layout = kv_layout(model, engine.kv_block_tokens)
    per_layer = kv_bytes_per_token_per_layer(model, kv, tensor_parallel)
    per_token = layout.group_layers * per_layer / pipeline_parallel
    return MemoryBudget(
        total_bytes=total,
        usable_bytes=usable,
        weights_bytes=weights,
        reserve_bytes=reserve,
        kv_bytes=kv_left,
        kv_bytes_per_token=per_token,
        kv_capacity_tokens=kv_capacity_tokens(kv_left, per_token, engine.kv_block_tokens) * data_parallel,
        layout=layout if layout.window_groups else None,
        block_tokens=engine.kv_block_tokens,
    )


def kv_capacity_tokens(free_bytes: float, bytes_per_token: float, block_tokens: int = 1) -> int:
    """Tokens of KV cache that fit in free_bytes, in whole blocks of block_tokens."""
    if free_bytes <= 0:
        return 0
    blocks = math.floor(free_bytes / (bytes_per_token * block_tokens))
    return blocks * block_tokens


def tokens_per_sequence(context_tokens: int, block_tokens: int) -> int:
    """KV a sequence holds: its context rounded up to whole PagedAttention blocks."""
    return math.ceil(context_tokens / block_tokens) * block_tokens


def max_batch_for_context(capacity_tokens: int, context_tokens: int, block_tokens: int = 1) -> int:
    """Largest number of sequences of context_tokens each that the KV cache holds at once."""
    if context_tokens <= 0:
        raise ValueError("context_tokens must be positive")
    return capacity_tokens // tokens_per_sequence(context_tokens, block_tokens)
