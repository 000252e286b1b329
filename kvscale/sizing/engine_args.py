"""The serving engine's command line for a planned configuration (vLLM)."""

from __future__ import annotations

from kvscale.sizing.config import ServingConfig


def vllm_args(cfg: ServingConfig, max_batch: int, max_model_len: int, port: int = 8000) -> list[str]:
    """Arguments after `vllm serve MODEL` that reproduce what the plan assumed."""
    args = [
        "--tensor-parallel-size",
        str(cfg.tensor_parallel),
        "--max-num-seqs",
        str(max_batch),
        "--max-model-len",
        str(max_model_len),
        "--max-num-batched-tokens",
        str(cfg.max_num_batched_tokens),
        "--gpu-memory-utilization",
        f"{cfg.engine.gpu_memory_utilization:.2f}",
        "--dtype",
        "float16" if not cfg.gpu.bf16_supported else cfg.precision.vllm_dtype,
    ]
    if cfg.precision.vllm_quantization:
        args += ["--quantization", cfg.precision.vllm_quantization]
    if cfg.kv.name == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    args += ["--port", str(port)]
    return args
