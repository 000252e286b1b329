"""Expert parallelism for MoE models: each rank holds whole routed experts instead of a
1/tp slice of every expert.

Engine facts (vLLM 0.11.0 wheel):
- vllm/engine/arg_utils.py: `--enable-expert-parallel` (ParallelConfig.enable_expert_parallel,
  vllm/config/parallel.py: "Use expert parallelism instead of tensor parallelism for MoE layers").
- vllm/model_executor/layers/fused_moe/config.py FusedMoEParallelConfig.make: with the flag
  and tp x dp > 1 the MoE layers run with tp_size 1 and ep_size = tp x dp ("each device owns
  a set of experts fully"); attention stays tensor parallel. All-to-all kernels
  (use_all2all_kernels) only when dp > 1: with one data-parallel rank the routed output is
  still all-reduced over the group (layer.py FusedMoE.forward_impl, reduce_output:
  `self.tp_size > 1 or self.ep_size > 1`), so communication is that of tensor parallelism.
- layer.py determine_expert_map: ep_size ranks get global_num_experts // ep_size experts each,
  the first (global_num_experts % ep_size) ranks one more ("linear" placement).
- quantization/fp8.py Fp8MoEMethod.create_weights: the expert width per partition is
  intermediate_size // tp_size, tp_size 1 under EP (whole experts).
SGLang 0.5.23 sglang/srt/arg_groups/fields/parallel.py: `--ep-size` (aliases
--expert-parallel-size, --ep), the expert parallelism size, default 1.

What changes in a step: a rank reads and multiplies only its own experts, at full width. The
step waits for the busiest rank, so with few tokens (decode) the rank whose experts the
batch happens to pick most sets the time (per-rank expert load imbalance), where tensor
parallelism reads 1/tp of every touched expert on every rank. Over many tokens every expert
is touched and the ranks even out.
"""

from __future__ import annotations

import math

# E[max] of n independent standard normals (n = 1, 2, 4, 8, 16, 32): Tippett's tables; the
# busiest of n ranks sits this many standard deviations above the mean.
EXPECTED_MAX_OF_NORMALS = {1: 0.0, 2: 0.5642, 4: 1.0294, 8: 1.4236, 16: 1.7660, 32: 2.0697}


def expected_max_z(ranks: int) -> float:
    """Standard deviations the busiest of `ranks` equally loaded ranks sits above the mean."""
    if ranks <= 1:
        return 0.0
    known = EXPECTED_MAX_OF_NORMALS.get(ranks)
    if known is not None:
        return known
    return math.sqrt(2.0 * math.log(ranks))  # the large-n asymptote, above the tabled values


def experts_per_rank(experts: int, ranks: int) -> int:
    """Experts on the rank with the most (determine_expert_map: the remainder goes one each
    to the first ranks)."""
    return math.ceil(experts / max(ranks, 1))


def busiest_rank_experts_touched(experts: int, active_experts: int, tokens: float, ranks: int) -> float:
    """Distinct local experts the busiest rank loads when `tokens` tokens each pick
    `active_experts` of `experts` at random: each of its experts is touched with probability
    p = 1 - (1 - k/E)^tokens; the count is binomial over the rank's experts, and the busiest
    of `ranks` ranks is its mean plus E[max] standard deviations, at most all its experts."""
    if experts <= 1:
        return 1.0
    local = experts_per_rank(experts, ranks)
    p: float = 1.0 - (1.0 - active_experts / experts) ** tokens
    mean = local * p
    spread = math.sqrt(local * p * (1.0 - p))
    return min(float(local), mean + expected_max_z(ranks) * spread)


def busiest_rank_load_factor(active_experts: int, tokens: float, ranks: int) -> float:
    """Routed (token, expert) pairs on the busiest rank over the mean: tokens x k pairs, each
    on a given rank with probability 1/ranks; at most all of them on one rank."""
    if ranks <= 1 or tokens <= 0:
        return 1.0
    pairs = tokens * active_experts
    mean = pairs / ranks
    spread = math.sqrt(pairs * (1.0 / ranks) * (1.0 - 1.0 / ranks))
    return min(float(ranks), 1.0 + expected_max_z(ranks) * spread / mean)


# Block-scaled FP8 checkpoints (DeepSeek-V3/R1 config.json quantization_config
# weight_block_size [128, 128]; ModelArch.fp8_weight_block, read from config.json) cut each expert's weights
# into 128 x 128 blocks with one scale each. vLLM 0.11.0 quantization/fp8.py
# Fp8MoEMethod.create_weights refuses an expert width per partition (intermediate_size // tp)
# that is not a multiple of the block ("The output_size of gate's and up's weight = ... is not
# divisible by weight quantization block_n = 128"); under expert parallelism the width is whole.
# GPUStack's Qwen3-235B-A22B-FP8 runs say the same: "TP8 only is not compatible for the model
# weight. Use EP as well." (benchmarks/data/reference/gpustack-perf-lab.csv). Not every -FP8
# release is block-scaled (GPUStack ran zai-org/GLM-4.6-FP8, 1536-wide experts, at TP 8
# without EP), so only a config.json that gives weight_block_size is checked.
FP8_WEIGHT_BLOCK = 128


def block_fp8_split_problem(expert_width: int, tensor_parallel: int, block: int = FP8_WEIGHT_BLOCK) -> str | None:
    """Why vLLM refuses to split block-FP8 experts of `expert_width` over `tensor_parallel`
    GPUs (the fix: expert parallelism), or None."""
    if tensor_parallel <= 1:
        return None
    per_gpu, rest = divmod(expert_width, tensor_parallel)
    if rest == 0 and per_gpu % block == 0:
        return None
    return (
        f"block-FP8 experts {expert_width} wide split over {tensor_parallel} GPUs give {expert_width / tensor_parallel:g} "
        f"columns each, not a multiple of the {block}-wide weight blocks (vLLM refuses it): use expert "
        "parallelism (--enable-expert-parallel) or fewer GPUs"
    )
