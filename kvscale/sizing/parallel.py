"""Tensor-parallel communication: the all-reduces each layer pays when weights are split."""

from __future__ import annotations

from kvscale.sizing.catalog import EngineProfile, GpuSpec, LinkSpec

ALLREDUCES_PER_LAYER = 2  # after attention's output projection and after the MLP
ACTIVATION_BYTES = 2.0  # all-reduced activations are 16-bit


def allreduce_time_s(message_bytes: float, tensor_parallel: int, link: LinkSpec, engine: EngineProfile) -> float:
    """Ring all-reduce: 2(n-1)/n of the message crosses each link, plus a latency per hop."""
    if tensor_parallel <= 1:
        return 0.0
    n = tensor_parallel
    wire_bytes = 2.0 * (n - 1) / n * message_bytes
    bandwidth = link.bandwidth_bytes_per_s_per_direction * engine.allreduce_efficiency
    latency = link.latency_s + engine.allreduce_hop_latency_s * (n - 1)
    return latency + wire_bytes / bandwidth


def allreduce_terms_s(
    hidden_size: int, layers: int, tensor_parallel: int, link: LinkSpec, engine: EngineProfile
) -> tuple[float, float]:
    """A forward pass's all-reduce time as fixed + per_token x tokens: (fixed, per_token).

    The same ring as allreduce_time_s, split into its latency term and its bandwidth term.
    """
    if tensor_parallel <= 1:
        return 0.0, 0.0
    n = tensor_parallel
    count = layers * ALLREDUCES_PER_LAYER
    latency = link.latency_s + engine.allreduce_hop_latency_s * (n - 1)
    bandwidth = link.bandwidth_bytes_per_s_per_direction * engine.allreduce_efficiency
    per_token = 2.0 * (n - 1) / n * hidden_size * ACTIVATION_BYTES / bandwidth
    return count * latency, count * per_token


def forward_communication_s(
    tokens: float, hidden_size: int, layers: int, tensor_parallel: int, link: LinkSpec, engine: EngineProfile
) -> float:
    """All-reduce time of one forward pass over `tokens` tokens."""
    message = tokens * hidden_size * ACTIVATION_BYTES
    return layers * ALLREDUCES_PER_LAYER * allreduce_time_s(message, tensor_parallel, link, engine)


def data_parallel_moe_terms_s(
    hidden_size: int, moe_layers: int, data_parallel: int, link: LinkSpec, engine: EngineProfile
) -> tuple[float, float]:
    """Data-parallel attention with expert parallelism, as fixed + per_token x tokens summed over
    the data-parallel ranks: vLLM 0.11.0's default all-to-all (envs.py VLLM_ALL2ALL_BACKEND
    "allgather_reducescatter"; distributed/device_communicators/all2all.py AgRsAll2AllManager)
    all-gathers every rank's hidden states before each MoE layer and reduce-scatters the
    expert outputs after it: two collectives per MoE layer, each moving (n-1)/n of all ranks'
    16-bit activations through every link, with a latency per hop."""
    if data_parallel <= 1:
        return 0.0, 0.0
    n = data_parallel
    count = moe_layers * 2
    latency = link.latency_s + engine.allreduce_hop_latency_s * (n - 1)
    bandwidth = link.bandwidth_bytes_per_s_per_direction * engine.allreduce_efficiency
    return count * latency, count * (n - 1) / n * hidden_size * ACTIVATION_BYTES / bandwidth


def pipeline_terms_s(hidden_size: int, pipeline_parallel: int, gpu: GpuSpec) -> tuple[float, float]:
    """A forward pass's pipeline hand-offs as fixed + per_token x tokens: each of the pp - 1
    stage boundaries sends the tokens' 16-bit activations once, over the inter-node fabric
    (each GPU of a stage sends its share: tensor-parallel ranks send in parallel, so the
    per-GPU bandwidth carries hidden / tp of each token; taken whole here, conservatively)."""
    if pipeline_parallel <= 1:
        return 0.0, 0.0
    hops = pipeline_parallel - 1
    bandwidth = gpu.internode_bandwidth_bytes_per_s or gpu.hbm_bandwidth_bytes_per_s
    return hops * gpu.internode_latency_s, hops * hidden_size * ACTIVATION_BYTES / bandwidth
