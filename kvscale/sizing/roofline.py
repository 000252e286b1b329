"""Time of one engine step: prefill (compute-bound) and decode (bandwidth-bound).

Each step is a roofline per op, max(compute, memory) for the weight GEMMs and for the
attention (each a kernel of its own, run one after the other in every layer, so neither
hides under the other), summed, plus what does not overlap with them: tensor-parallel
all-reduces and the engine's fixed per-layer and per-step costs.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

from kvscale.sizing.config import Rates, ServingConfig
from kvscale.sizing.experts import busiest_rank_experts_touched, busiest_rank_load_factor

GEMM_TILE_TOKENS = 128  # rows of a tensor-core GEMM tile (CUTLASS/cuBLAS 128 x N tiles)

LimitedBy = Literal["compute", "bandwidth", "communication", "overhead"]


class StepTime(NamedTuple):
    """One forward pass on one GPU of the tensor-parallel group (a NamedTuple: the planner
    builds thousands, and a frozen dataclass costs several times more to construct).

    compute_s and memory_s are the step's compute and memory times summed over its ops (the
    GEMMs, the attention): what the step would take if every op waited on that side alone.
    The step pays each op's larger side, so its roofline part (roofline_s) lies between
    max(compute_s, memory_s) and their sum; limited_by names the larger side of the step.
    """

    seconds: float
    compute_s: float
    memory_s: float
    communication_s: float
    overhead_s: float
    flops_per_gpu: float
    bytes_per_gpu: float
    peak_flops_per_s: float
    peak_bandwidth_bytes_per_s: float

    @property
    def roofline_s(self) -> float:
        """The ops' rooflines summed: the step less its communication and overheads."""
        return self.seconds - self.communication_s - self.overhead_s

    @property
    def limited_by(self) -> LimitedBy:
        parts: dict[LimitedBy, float] = {
            "compute": self.compute_s,
            "bandwidth": self.memory_s,
            "communication": self.communication_s,
            "overhead": self.overhead_s,
        }
        return max(parts, key=lambda k: parts[k])

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization: useful FLOPs over peak FLOPs for the step's duration."""
        return self.flops_per_gpu / (self.seconds * self.peak_flops_per_s)

    @property
    def mbu(self) -> float:
        """Model bandwidth utilization: bytes that had to move over peak bandwidth x duration."""
        return self.bytes_per_gpu / (self.seconds * self.peak_bandwidth_bytes_per_s)


def ops_per_byte(cfg: ServingConfig) -> float:
    """The GPU's ridge point on this precision's compute path (FLOP per byte of HBM traffic)."""
    return cfg.peak_flops_per_s / cfg.gpu.hbm_bandwidth_bytes_per_s


def ideal_batch(cfg: ServingConfig, flops_per_param: float = 2.0) -> float:
    """B*: the batch at which a decode step's matmul time equals its weight-read time.

    Each token costs flops_per_param FLOPs per weight (2 = a multiply and an add) and each
    weight is read once per step (bytes_per_param), so B* = ops:byte x bytes_per_param /
    flops_per_param. Below B* decode is bandwidth-bound, above it compute-bound.
    """
    return ops_per_byte(cfg) * cfg.precision.bytes_per_param / flops_per_param


def expected_experts_touched(experts: int, active_experts: int, tokens: float) -> float:
    """Distinct experts a layer loads when `tokens` tokens each pick active_experts at random."""
    if experts <= 1:
        return 1.0
    untouched_share: float = (1.0 - active_experts / experts) ** tokens
    return experts * (1.0 - untouched_share)


def weight_bytes_read(cfg: ServingConfig, tokens: float) -> float:
    """Weight bytes one GPU reads in a forward pass over `tokens` tokens (MoE: touched experts;
    under expert parallelism the busiest rank's own touched experts, whole)."""
    model, r = cfg.model, cfg.rates
    if not model.is_moe:
        return r.dense_weight_bytes
    if r.expert_ranks:
        local = busiest_rank_experts_touched(model.experts, model.active_experts, tokens, r.expert_ranks)
        return r.shared_weight_bytes + local * r.expert_weight_bytes
    touched = expected_experts_touched(model.experts, model.active_experts, tokens)
    return r.shared_weight_bytes + touched * r.expert_weight_bytes


def _flops_per_gpu(cfg: ServingConfig, query_tokens: float, mean_context_tokens: float) -> float:
    """Linear layers (2 x active params per token) plus attention's QK^T and PV
    (4 x layers x heads x head_dim per query token per context token), split over tp."""
    r = cfg.rates
    return query_tokens * (r.linear_flops_per_token + r.attention_flops_per_token_per_context * mean_context_tokens)


def gemm_efficiency(cfg: ServingConfig, tokens: float) -> float:
    """Share of peak the step's matmuls reach: the large-matmul efficiency, less for small GEMMs.

    A layer's linear FLOPs on one GPU are 2 x tokens x (params per layer / tp): few tokens
    or a thin tensor-parallel shard make small GEMMs that cannot fill the GPU. Efficiency
    falls as flops / (flops + F_half), F_half the engine's half-efficiency size. A GEMM
    tile has GEMM_TILE_TOKENS rows: with fewer tokens the rows idle while the weights
    stream in, which the memory side already counts, so the size is taken at no fewer.
    """
    half = cfg.engine.prefill_half_efficiency_flops
    per_layer = max(tokens, GEMM_TILE_TOKENS) * cfg.rates.linear_flops_per_token / cfg.model.layers
    size_factor = per_layer / (per_layer + half) if half > 0 else 1.0
    return cfg.matmul_efficiency * size_factor


def _ops_roofline_s(
    gemm_flops: float,
    weights: float,
    attention_flops: float,
    kv: float,
    window_flops: float,
    kv_window: float,
    rates: Rates,
    efficiency: float,
) -> tuple[float, float, float]:
    """(roofline, compute, memory) seconds of a step's ops: the weight GEMMs (linear FLOPs
    against weight bytes), the full-attention layers' attention (their FLOPs against their KV
    bytes) and the sliding-window layers' attention. Each op is its own kernels, run after the
    others in every layer, so each pays max(compute, memory) and the step pays their sum;
    attention FLOPs go at the GEMMs' rate (the same tensor cores and size curve)."""
    flops_s = rates.peak_flops_per_s * efficiency
    gemm_c, attention_c, window_c = gemm_flops / flops_s, attention_flops / flops_s, window_flops / flops_s
    gemm_m = weights / rates.weight_bytes_per_s
    attention_m, window_m = kv / rates.kv_bytes_per_s, kv_window / rates.kv_bytes_per_s
    roofline = (
        (gemm_c if gemm_c > gemm_m else gemm_m)
        + (attention_c if attention_c > attention_m else attention_m)
        + (window_c if window_c > window_m else window_m)
    )
    return roofline, gemm_c + attention_c + window_c, gemm_m + attention_m + window_m


def step(
    cfg: ServingConfig,
    decode_seqs: float,
    decode_context_tokens: float,
    prefill_tokens: float = 0.0,
    prefill_context_tokens: float = 0.0,
    prefill_seqs: float = 1.0,
) -> StepTime:
    """One engine step on one GPU of the group: `decode_seqs` running sequences each emit a
    token over `decode_context_tokens` of KV, and `prefill_tokens` prompt tokens (chunks of
    `prefill_seqs` prompts) attend to `prefill_context_tokens` on average.

    Time = max(matmul compute, weight traffic) + max(attention compute, KV traffic) (full and
    sliding-window layers apart) + the two all-reduces per layer on (decode + prefill) tokens
    + fixed per-layer and per-step engine costs.
    """
    tokens = decode_seqs + prefill_tokens
    if tokens <= 0:
        raise ValueError("a step carries at least one token")
    r = cfg.rates  # the terms below are those of _flops_per_gpu, gemm_efficiency and parallel.py
    if r.data_parallel > 1:
        return _data_parallel_step(
            cfg, decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens, prefill_seqs
        )
    kv_token = r.kv_full_bytes_per_token
    gemm_flops = tokens * r.linear_flops_per_token
    if r.expert_ranks:  # the busiest rank's share of the routed (token, expert) pairs
        gemm_flops += (
            tokens
            * r.routed_flops_per_token
            * (busiest_rank_load_factor(cfg.model.active_experts, tokens, r.expert_ranks) - 1.0)
        )
    attention_flops = r.attention_flops_per_token_per_context * (
        decode_seqs * decode_context_tokens + prefill_tokens * prefill_context_tokens
    )
    window = r.window_tokens
    window_flops = 0.0
    if window:  # sliding-window layers attend to (and read) at most the window
        window_flops = r.attention_window_flops_per_token_per_context * (
            decode_seqs * min(decode_context_tokens, window) + prefill_tokens * min(prefill_context_tokens, window)
        )
    per_layer = (tokens if tokens > GEMM_TILE_TOKENS else GEMM_TILE_TOKENS) * r.linear_flops_per_token_per_layer
    half = r.gemm_half_flops
    efficiency = r.matmul_efficiency * (per_layer / (per_layer + half) if half > 0 else 1.0)
    weights = weight_bytes_read(cfg, tokens) if r.expert_weight_bytes else r.dense_weight_bytes
    # KV read: every decode reads its context; a chunk reads the prompt's earlier chunks.
    seqs = prefill_seqs if prefill_seqs > 1.0 else 1.0
    prior = prefill_context_tokens - prefill_tokens / seqs / 2.0
    prior = prior * prefill_seqs if prior > 0 else 0.0
    kv = (decode_seqs * decode_context_tokens + prior + tokens) * kv_token
    kv_window = 0.0
    if window:
        kv_window = (decode_seqs * min(decode_context_tokens, window) + min(prior, window) + tokens) * (
            r.kv_window_bytes_per_token
        )
    roofline, compute_s, memory_s = _ops_roofline_s(
        gemm_flops, weights, attention_flops, kv, window_flops, kv_window, r, efficiency
    )
    comm = r.allreduce_fixed_s + r.allreduce_s_per_token * tokens if cfg.tensor_parallel > 1 else 0.0
    if cfg.pipeline_parallel > 1:
        comm += r.pipeline_fixed_s + r.pipeline_s_per_token * tokens
    overhead = r.prefill_overhead_s if prefill_tokens > 0 else r.decode_overhead_s
    if r.sequence_overhead_s:
        overhead += r.sequence_overhead_s * (decode_seqs + (prefill_seqs if prefill_tokens > 0 else 0.0))
    return StepTime(
        seconds=roofline + comm + overhead,
        compute_s=compute_s,
        memory_s=memory_s,
        communication_s=comm,
        overhead_s=overhead,
        flops_per_gpu=gemm_flops + attention_flops + window_flops,
        bytes_per_gpu=weights + kv + kv_window,
        peak_flops_per_s=cfg.peak_flops_per_s,
        peak_bandwidth_bytes_per_s=cfg.gpu.hbm_bandwidth_bytes_per_s,
    )


def _data_parallel_step(
    cfg: ServingConfig,
    decode_seqs: float,
    decode_context_tokens: float,
    prefill_tokens: float,
    prefill_context_tokens: float,
    prefill_seqs: float,
) -> StepTime:
    """A step of a replica of data-parallel attention ranks (one GPU each), as its busiest rank
    runs it: the running sequences spread evenly over the ranks (vLLM's data-parallel load
    balancing), a chunk's prompts each on one rank (a lone prompt's chunk on a single rank, no
    rank more than its own --max-num-batched-tokens);
    attention, the dense and shared layers and the KV reads for the rank's own tokens; the
    routed experts for its share of every rank's tokens (all-gathered before each MoE layer,
    reduce-scattered after it), with the busiest rank's imbalance; no all-reduce (TP 1).
    The ops' rooflines add as in step()."""
    r, m = cfg.rates, cfg.model
    n = r.data_parallel
    decode = decode_seqs / n
    # a rank's chunk is at most its own budget: more prompt tokens than that are other ranks'
    budget_ranks = math.ceil(prefill_tokens / cfg.rank_chunk_budget_tokens)
    prefilling = min(float(n), max(1.0, prefill_seqs, float(budget_ranks))) if prefill_tokens > 0 else 1.0
    chunk = prefill_tokens / prefilling
    rank_seqs = max(prefill_seqs / prefilling, 1.0) if prefill_tokens > 0 else 1.0
    rank_tokens = decode + chunk
    everyone = decode_seqs + prefill_tokens
    routed = r.routed_flops_per_token
    gemm_flops = rank_tokens * (r.linear_flops_per_token - routed)
    gemm_flops += everyone / n * routed * busiest_rank_load_factor(m.active_experts, everyone, r.expert_ranks)
    attention_flops = r.attention_flops_per_token_per_context * (
        decode * decode_context_tokens + chunk * prefill_context_tokens
    )
    window = r.window_tokens
    window_flops = 0.0
    if window:
        window_flops = r.attention_window_flops_per_token_per_context * (
            decode * min(decode_context_tokens, window) + chunk * min(prefill_context_tokens, window)
        )
    per_layer = max(rank_tokens, GEMM_TILE_TOKENS) * r.linear_flops_per_token_per_layer
    half = r.gemm_half_flops
    efficiency = r.matmul_efficiency * (per_layer / (per_layer + half) if half > 0 else 1.0)
    local = busiest_rank_experts_touched(m.experts, m.active_experts, everyone, r.expert_ranks)
    weights = r.shared_weight_bytes + local * r.expert_weight_bytes
    prior = prefill_context_tokens - chunk / rank_seqs / 2.0
    prior = prior * rank_seqs if prior > 0 and chunk > 0 else 0.0
    kv = (decode * decode_context_tokens + prior + rank_tokens) * r.kv_full_bytes_per_token
    kv_window = 0.0
    if window:
        kv_window = (decode * min(decode_context_tokens, window) + min(prior, window) + rank_tokens) * (
            r.kv_window_bytes_per_token
        )
    roofline, compute_s, memory_s = _ops_roofline_s(
        gemm_flops, weights, attention_flops, kv, window_flops, kv_window, r, efficiency
    )
    comm = r.dispatch_fixed_s + r.dispatch_s_per_token * everyone
    overhead = r.prefill_overhead_s if prefill_tokens > 0 else r.decode_overhead_s
    if r.sequence_overhead_s:
        overhead += r.sequence_overhead_s * (decode + (rank_seqs if prefill_tokens > 0 else 0.0))
    return StepTime(
        seconds=roofline + comm + overhead,
        compute_s=compute_s,
        memory_s=memory_s,
        communication_s=comm,
        overhead_s=overhead,
        flops_per_gpu=gemm_flops + attention_flops + window_flops,
        bytes_per_gpu=weights + kv + kv_window,
        peak_flops_per_s=cfg.peak_flops_per_s,
        peak_bandwidth_bytes_per_s=cfg.gpu.hbm_bandwidth_bytes_per_s,
    )


def decode_step(cfg: ServingConfig, batch: int, context_tokens: float) -> StepTime:
    """One decode step: `batch` sequences each emit one token over `context_tokens` of KV."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    return step(cfg, batch, context_tokens)


def mixed_step(
    cfg: ServingConfig, decode_seqs: int, decode_context_tokens: float, chunk_tokens: float, prompt_tokens: float
) -> StepTime:
    """A continuous-batching step: the running decodes plus a prefill chunk of a prompt of
    `prompt_tokens` (the chunk attends, on average, to half the prompt)."""
    return step(cfg, decode_seqs, decode_context_tokens, chunk_tokens, prompt_tokens / 2.0)


def prefill(cfg: ServingConfig, sequences: int, prompt_tokens: int) -> StepTime:
    """Prefill of `sequences` prompts of `prompt_tokens` each, alone, in chunks of the budget.

    Compute-bound: 2 x active params FLOPs per token plus causal attention; every chunk
    also reads the weights once, which is the memory floor for short prompts. The chunks
    are equal steps of tokens / chunks each; the sum is returned as one StepTime.
    """
    if sequences < 1 or prompt_tokens < 1:
        raise ValueError("prefill needs at least one sequence of at least one token")
    tokens = float(sequences * prompt_tokens)
    chunks = math.ceil(tokens / cfg.max_num_batched_tokens)
    per_chunk = tokens / chunks
    one = step(cfg, 0.0, 0.0, per_chunk, prompt_tokens / 2.0, max(per_chunk / prompt_tokens, 1.0))
    return StepTime(
        seconds=chunks * one.seconds,
        compute_s=chunks * one.compute_s,
        memory_s=chunks * one.memory_s,
        communication_s=chunks * one.communication_s,
        overhead_s=chunks * one.overhead_s,
        flops_per_gpu=chunks * one.flops_per_gpu,
        bytes_per_gpu=chunks * one.bytes_per_gpu,
        peak_flops_per_s=one.peak_flops_per_s,
        peak_bandwidth_bytes_per_s=one.peak_bandwidth_bytes_per_s,
    )
