"""Time of one engine step: prefill (compute-bound) and decode (bandwidth-bound).

Each step is the roofline max(compute, memory) plus what does not overlap with it:
tensor-parallel all-reduces and the engine's fixed per-layer and per-step costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kvscale.sizing.config import ServingConfig
from kvscale.sizing.parallel import forward_communication_s

LimitedBy = Literal["compute", "bandwidth", "communication", "overhead"]


@dataclass(frozen=True)
class StepTime:
    """One forward pass on one GPU of the tensor-parallel group."""

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
    """Weight bytes one GPU reads in a forward pass over `tokens` tokens (MoE: touched experts)."""
    model = cfg.model
    if not model.is_moe:
        return cfg.rates.dense_weight_bytes
    touched = expected_experts_touched(model.experts, model.active_experts, tokens)
    params = model.shared_params + touched * model.expert_params
    return params * cfg.precision.bytes_per_param / cfg.tensor_parallel


def _flops_per_gpu(cfg: ServingConfig, query_tokens: float, mean_context_tokens: float) -> float:
    """Linear layers (2 x active params per token) plus attention's QK^T and PV
    (4 x layers x heads x head_dim per query token per context token), split over tp."""
    r = cfg.rates
    return query_tokens * (r.linear_flops_per_token + r.attention_flops_per_token_per_context * mean_context_tokens)


def _fixed_costs_s(cfg: ServingConfig, tokens: float, layer_overhead_s: float) -> tuple[float, float]:
    m = cfg.model
    comm = forward_communication_s(tokens, m.hidden_size, m.layers, cfg.tensor_parallel, cfg.link, cfg.engine)
    overhead = m.layers * layer_overhead_s + cfg.engine.step_overhead_s
    return comm, overhead


def decode_step(cfg: ServingConfig, batch: int, context_tokens: float) -> StepTime:
    """One decode step: `batch` sequences each emit one token over `context_tokens` of KV."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    r = cfg.rates
    weights = weight_bytes_read(cfg, batch)
    kv = batch * context_tokens * cfg.memory.kv_bytes_per_token
    memory_s = weights / r.weight_bytes_per_s + kv / r.kv_bytes_per_s
    flops = _flops_per_gpu(cfg, batch, context_tokens)
    compute_s = flops / r.matmul_flops_per_s
    comm, overhead = _fixed_costs_s(cfg, batch, cfg.engine.decode_layer_overhead_s)
    return StepTime(
        seconds=max(compute_s, memory_s) + comm + overhead,
        compute_s=compute_s,
        memory_s=memory_s,
        communication_s=comm,
        overhead_s=overhead,
        flops_per_gpu=flops,
        bytes_per_gpu=weights + kv,
        peak_flops_per_s=cfg.peak_flops_per_s,
        peak_bandwidth_bytes_per_s=cfg.gpu.hbm_bandwidth_bytes_per_s,
    )


def prefill_efficiency(cfg: ServingConfig, flops_per_gpu_per_layer: float) -> float:
    """Share of peak a prefill's matmuls reach: large-matmul efficiency, less for small GEMMs."""
    half = cfg.engine.prefill_half_efficiency_flops
    size_factor = flops_per_gpu_per_layer / (flops_per_gpu_per_layer + half) if half > 0 else 1.0
    return cfg.gpu.matmul_efficiency * size_factor


def prefill(cfg: ServingConfig, sequences: int, prompt_tokens: int) -> StepTime:
    """Prefill of `sequences` prompts of `prompt_tokens` each, in chunks of the token budget.

    Compute-bound: 2 x active params FLOPs per token plus causal attention; every chunk
    also reads the weights once, which is the memory floor for short prompts.
    """
    if sequences < 1 or prompt_tokens < 1:
        raise ValueError("prefill needs at least one sequence of at least one token")
    tokens = float(sequences * prompt_tokens)
    chunks = math.ceil(tokens / cfg.max_num_batched_tokens)
    flops = _flops_per_gpu(cfg, tokens, prompt_tokens / 2.0)
    efficiency = prefill_efficiency(cfg, flops / chunks / cfg.model.layers)
    compute_s = flops / (cfg.peak_flops_per_s * efficiency)
    weights_per_chunk = weight_bytes_read(cfg, tokens / chunks)
    kv_written = tokens * cfg.memory.kv_bytes_per_token
    memory_s = (chunks * weights_per_chunk) / cfg.rates.weight_bytes_per_s + kv_written / cfg.rates.kv_bytes_per_s
    comm, overhead = _fixed_costs_s(cfg, tokens / chunks, cfg.engine.prefill_layer_overhead_s)
    return StepTime(
        seconds=max(compute_s, memory_s) + chunks * (comm + overhead),
        compute_s=compute_s,
        memory_s=memory_s,
        communication_s=chunks * comm,
        overhead_s=chunks * overhead,
        flops_per_gpu=flops,
        bytes_per_gpu=chunks * weights_per_chunk + kv_written,
        peak_flops_per_s=cfg.peak_flops_per_s,
        peak_bandwidth_bytes_per_s=cfg.gpu.hbm_bandwidth_bytes_per_s,
    )
