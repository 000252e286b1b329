"""GPU memory: weights, KV cache per token (GQA and tensor parallelism), engine reserve, fit."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscale.sizing.catalog import EngineProfile, GpuSpec, KvPrecisionSpec, ModelArch, PrecisionSpec


def weight_bytes(model: ModelArch, precision: PrecisionSpec) -> float:
    """All weights of the model at a precision (the whole tensor-parallel group)."""
    return model.params * precision.bytes_per_param


def kv_heads_per_gpu(model: ModelArch, tensor_parallel: int) -> int:
    """KV heads each GPU stores: heads split across the group, replicated once tp > kv_heads."""
    return max(math.ceil(model.kv_heads / tensor_parallel), 1)


def kv_bytes_per_token(model: ModelArch, kv: KvPrecisionSpec, tensor_parallel: int = 1) -> float:
    """KV bytes one token occupies on one GPU: 2 (K and V) x layers x kv_heads x head_dim x bytes."""
    return 2.0 * model.layers * kv_heads_per_gpu(model, tensor_parallel) * model.head_dim * kv.bytes_per_element


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
    kv_bytes_per_token: float
    kv_capacity_tokens: int

    @property
    def fits(self) -> bool:
        return self.kv_capacity_tokens > 0


def memory_budget(
    model: ModelArch,
    gpu: GpuSpec,
    precision: PrecisionSpec,
    kv: KvPrecisionSpec,
    engine: EngineProfile,
    tensor_parallel: int,
    chunk_budget_tokens: int,
    pipeline_parallel: int = 1,
) -> MemoryBudget:
    """One GPU's split. With pipeline parallelism each stage holds 1/pp of the layers (weights
    and KV); the KV capacity in tokens is then the same on every stage."""
    total = gpu.memory_bytes
    weights = weight_bytes(model, precision) / (tensor_parallel * pipeline_parallel)
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
    per_token = kv_bytes_per_token(model, kv, tensor_parallel) / pipeline_parallel
    return MemoryBudget(
        total_bytes=total,
        usable_bytes=usable,
        weights_bytes=weights,
        reserve_bytes=reserve,
        kv_bytes=kv_left,
        kv_bytes_per_token=per_token,
        kv_capacity_tokens=kv_capacity_tokens(kv_left, per_token, engine.kv_block_tokens),
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
