"""The serving engine's command line for a planned configuration: vLLM, SGLang or TGI.

Flag names checked against the engines' source:
- vLLM 0.11.0 (`vllm serve MODEL`, vllm/engine/arg_utils.py): --tensor-parallel-size,
  --pipeline-parallel-size, --data-parallel-size (ParallelConfig: "MoE layers will be sharded
  according to the product of the tensor parallel size and data parallel size"; each data-parallel
  engine has its own scheduler, so --max-num-seqs and --max-num-batched-tokens are per engine),
  --enable-expert-parallel, --max-num-seqs, --max-model-len, --max-num-batched-tokens, --gpu-memory-utilization,
  --dtype, --quantization, --kv-cache-dtype, --port.
- SGLang 0.5.23 (`python -m sglang.launch_server`, sglang/srt/arg_groups/fields/*.py, flags
  are the field names with dashes): --model-path, --tp-size (alias --tensor-parallel-size),
  --pp-size (alias --pipeline-parallel-size), --ep-size (fields/parallel.py: the expert
  parallelism size; aliases --expert-parallel-size, --ep),
  --host, --port (default 30000), --enable-metrics (metrics are off without it),
  --max-running-requests, --context-length, --chunked-prefill-size, --mem-fraction-static,
  --dtype, --quantization, --kv-cache-dtype (fp8_e4m3 | fp8_e5m2 | auto ...).
- TGI 3.3.7 (`text-generation-launcher`): --model-id, --num-shard, --port,
  --max-concurrent-requests, --max-total-tokens, --max-input-tokens (must be below
  --max-total-tokens), --max-batch-prefill-tokens (must be at least --max-input-tokens),
  --dtype, --quantize. TGI ships no server on PyPI: these follow kvscale DESIGN.md and TGI's
  launcher documentation, not re-read from source here.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscale.sizing.checkpoints import (
    Checkpoint,
    ColdStart,
    EngineType,
    cold_start,
    quantization_flag,
    resolve_checkpoint,
    startup_probe_budget_s,
)
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.context_limit import ContextLimit, context_limit

ENGINE_TYPES: tuple[EngineType, ...] = ("vllm", "sglang", "tgi")


@dataclass(frozen=True)
class EngineLaunch:
    """Everything the engine's command line carries, in the plan's terms."""

    engine: EngineType
    source: str  # what the engine loads (no hf:// scheme)
    tensor_parallel: int
    max_batch: int
    max_model_len: int
    chunk_budget_tokens: int
    memory_fraction: float
    dtype: str  # bfloat16 | float16
    quantization: str | None
    kv_cache_fp8: bool
    port: int
    pipeline_parallel: int = 1  # stages (vLLM --pipeline-parallel-size, SGLang --pp-size)
    expert_parallel: bool = False  # MoE experts whole per rank (vLLM --enable-expert-parallel, SGLang --ep-size)
    data_parallel: int = (
        1  # vLLM --data-parallel-size: engines (attention ranks); max_batch and the budget are each one's
    )


def launch_for(
    cfg: ServingConfig,
    checkpoint: Checkpoint,
    max_batch: int,
    max_model_len: int,
    port: int,
) -> EngineLaunch:
    """The launch a planned configuration (built with the engine's profile) needs on its GPU type."""
    engine = engine_type(cfg.engine.name)
    dtype = cfg.precision.vllm_dtype if cfg.gpu.bf16_supported else "float16"
    return EngineLaunch(
        engine=engine,
        source=checkpoint.source,
        tensor_parallel=cfg.tensor_parallel,
        max_batch=-(-max_batch // cfg.data_parallel),  # --max-num-seqs is each engine's
        max_model_len=max_model_len,
        chunk_budget_tokens=cfg.rank_chunk_budget_tokens,
        memory_fraction=cfg.engine.gpu_memory_utilization,
        dtype=dtype,
        quantization=quantization_flag(engine, checkpoint, cfg.gpu),
        kv_cache_fp8=cfg.kv.name == "fp8",
        port=port,
        pipeline_parallel=cfg.pipeline_parallel,
        expert_parallel=cfg.expert_parallel,
        data_parallel=cfg.data_parallel,
    )


def engine_type(name: str) -> EngineType:
    for known in ENGINE_TYPES:
        if name == known:
            return known
    raise ValueError(f"unknown engine {name!r}; kvscale deploys {', '.join(ENGINE_TYPES)}")


def vllm_args(launch: EngineLaunch) -> list[str]:
    """Arguments after `vllm serve MODEL`."""
    args = [
        "--tensor-parallel-size",
        str(launch.tensor_parallel),
        *(["--pipeline-parallel-size", str(launch.pipeline_parallel)] if launch.pipeline_parallel > 1 else []),
        *(["--data-parallel-size", str(launch.data_parallel)] if launch.data_parallel > 1 else []),
        *(["--enable-expert-parallel"] if launch.expert_parallel else []),
        "--max-num-seqs",
        str(launch.max_batch),
        "--max-model-len",
        str(launch.max_model_len),
        "--max-num-batched-tokens",
        str(launch.chunk_budget_tokens),
        "--gpu-memory-utilization",
        f"{launch.memory_fraction:.2f}",
        "--dtype",
        launch.dtype,
    ]
    if launch.quantization:
        args += ["--quantization", launch.quantization]
    if launch.kv_cache_fp8:
        args += ["--kv-cache-dtype", "fp8"]
    return [*args, "--port", str(launch.port)]


def sglang_args(launch: EngineLaunch) -> list[str]:
    """Arguments after `python -m sglang.launch_server`."""
    args = [
        "--model-path",
        launch.source,
        "--tp-size",
        str(launch.tensor_parallel),
        *(["--pp-size", str(launch.pipeline_parallel)] if launch.pipeline_parallel > 1 else []),
        *(["--ep-size", str(launch.tensor_parallel)] if launch.expert_parallel else []),
        "--host",
        "0.0.0.0",
        "--port",
        str(launch.port),
        "--enable-metrics",
        "--max-running-requests",
        str(launch.max_batch),
        "--context-length",
        str(launch.max_model_len),
        "--chunked-prefill-size",
        str(launch.chunk_budget_tokens),
        "--mem-fraction-static",
        f"{launch.memory_fraction:.2f}",
        "--dtype",
        launch.dtype,
    ]
    if launch.quantization:
        args += ["--quantization", launch.quantization]
    if launch.kv_cache_fp8:
        args += ["--kv-cache-dtype", "fp8_e4m3"]
    return args


def tgi_args(launch: EngineLaunch) -> list[str]:
    """Arguments after `text-generation-launcher`. TGI limits prompt and total length separately:
    the prompt may take all but one token of the context, and the prefill budget must hold one
    whole prompt."""
    max_input = launch.max_model_len - 1
    args = [
        "--model-id",
        launch.source,
        "--num-shard",
        str(launch.tensor_parallel),
        "--port",
        str(launch.port),
        "--max-concurrent-requests",
        str(launch.max_batch),
        "--max-total-tokens",
        str(launch.max_model_len),
        "--max-input-tokens",
        str(max_input),
        "--max-batch-prefill-tokens",
        str(max(launch.chunk_budget_tokens, max_input)),
    ]
    # TGI's server refuses --dtype together with most --quantize methods ("Only 1 can be set
    # between `dtype` and `quantize`"); a quantized checkpoint keeps the dtype it was made for.
    if launch.quantization:
        return [*args, "--quantize", launch.quantization]
    return [*args, "--dtype", launch.dtype]


# The flags kvscale sets on the engine's command line (above, and the LeaderWorkerSet's for a
# replica across nodes: kvscale.control.leader_worker_set), with the engines' other spellings of
# them (kvscale.engines.command names the sources: vLLM -tp/-pp/-dp/-q; SGLang --tensor-parallel-size,
# --pipeline-parallel-size, --expert-parallel-size/--ep, --model). An engine takes the last of a
# flag given twice, and spec.engine.args come after kvscale's: one of these there would override
# the plan (a tensor parallelism the pod has no GPUs for, a port the Service does not reach).
OWNED_FLAGS: dict[EngineType, dict[str, str]] = {
    "vllm": {
        "--model": "--model",
        "--tensor-parallel-size": "--tensor-parallel-size",
        "-tp": "--tensor-parallel-size",
        "--pipeline-parallel-size": "--pipeline-parallel-size",
        "-pp": "--pipeline-parallel-size",
        "--data-parallel-size": "--data-parallel-size",
        "-dp": "--data-parallel-size",
        "--enable-expert-parallel": "--enable-expert-parallel",
        "--max-num-seqs": "--max-num-seqs",
        "--max-model-len": "--max-model-len",
        "--max-num-batched-tokens": "--max-num-batched-tokens",
        "--gpu-memory-utilization": "--gpu-memory-utilization",
        "--dtype": "--dtype",
        "--quantization": "--quantization",
        "-q": "--quantization",
        "--kv-cache-dtype": "--kv-cache-dtype",
        "--port": "--port",
        "--distributed-executor-backend": "--distributed-executor-backend",
        "--data-parallel-size-local": "--data-parallel-size-local",
        "--data-parallel-address": "--data-parallel-address",
        "--data-parallel-start-rank": "--data-parallel-start-rank",
        "--headless": "--headless",
    },
    "sglang": {
        "--model-path": "--model-path",
        "--model": "--model-path",
        "--tp-size": "--tp-size",
        "--tensor-parallel-size": "--tp-size",
        "--pp-size": "--pp-size",
        "--pipeline-parallel-size": "--pp-size",
        "--ep-size": "--ep-size",
        "--expert-parallel-size": "--ep-size",
        "--ep": "--ep-size",
        "--host": "--host",
        "--port": "--port",
        "--max-running-requests": "--max-running-requests",
        "--context-length": "--context-length",
        "--chunked-prefill-size": "--chunked-prefill-size",
        "--mem-fraction-static": "--mem-fraction-static",
        "--dtype": "--dtype",
        "--quantization": "--quantization",
        "--kv-cache-dtype": "--kv-cache-dtype",
        "--nnodes": "--nnodes",
        "--node-rank": "--node-rank",
        "--dist-init-addr": "--dist-init-addr",
    },
    "tgi": {
        "--model-id": "--model-id",
        "--num-shard": "--num-shard",
        "--port": "--port",
        "-p": "--port",
        "--max-concurrent-requests": "--max-concurrent-requests",
        "--max-total-tokens": "--max-total-tokens",
        "--max-input-tokens": "--max-input-tokens",
        "--max-batch-prefill-tokens": "--max-batch-prefill-tokens",
        "--dtype": "--dtype",
        "--quantize": "--quantize",
    },
}
# Where to ask instead for what an owned flag sets (the field the plan reads), by the canonical flag.
FIELD_OF: dict[str, str] = {
    **dict.fromkeys(("--model", "--model-path", "--model-id"), "spec.model.source"),
    **dict.fromkeys(("--tensor-parallel-size", "--tp-size", "--num-shard"), "spec.hardware.maxTensorParallel"),
    "--data-parallel-size": "spec.hardware.dataParallelAttention",
    **dict.fromkeys(
        ("--max-model-len", "--context-length", "--max-total-tokens", "--max-input-tokens"),
        "spec.workload.maxContextTokens",
    ),
    **dict.fromkeys(
        ("--max-num-batched-tokens", "--chunked-prefill-size", "--max-batch-prefill-tokens"),
        "spec.slo.maxInterTokenLatency",
    ),
    **dict.fromkeys(("--dtype", "--quantization", "--quantize"), "spec.model.precision"),
    "--kv-cache-dtype": "spec.model.kvCachePrecision",
    **dict.fromkeys(("--port", "--host"), "the operator's KVSCALE_ENGINE_PORT"),
}


def owned_flag(engine: EngineType, arg: str) -> str | None:
    """The flag kvscale sets that `arg` (an item of spec.engine.args: `--flag`, `--flag=value`,
    or `--flag_name`) would set again, or None."""
    if not arg.startswith("-"):
        return None
    # vLLM's FlexibleArgumentParser reads underscores as dashes; TGI's clap refuses them anyway,
    # so one rule serves every engine (and the CRD's CEL rule says the same).
    name = arg.split("=", 1)[0].replace("_", "-")
    return OWNED_FLAGS[engine].get(name)


def owned_flag_problem(engine: EngineType, args: list[str]) -> str | None:
    """Why spec.engine.args may not be deployed as given (a flag kvscale sets), or None."""
    for i, arg in enumerate(args):
        flag = owned_flag(engine, arg)
        if flag is None:
            continue
        field = FIELD_OF.get(flag)
        steer = f"; to change it, set {field}" if field is not None else " (kvscale plans it)"
        return (
            f"spec.engine.args[{i}]: {arg.split('=', 1)[0]} sets {flag}, which kvscale sets from the plan (the "
            f"engine takes the last one given, so it would override the plan): remove it{steer}"
        )
    return None


def engine_command(launch: EngineLaunch) -> tuple[list[str], list[str]]:
    """The container's command and args."""
    if launch.engine == "sglang":
        return ["python3", "-m", "sglang.launch_server"], sglang_args(launch)
    if launch.engine == "tgi":
        return ["text-generation-launcher"], tgi_args(launch)
    return ["vllm", "serve"], [launch.source, *vllm_args(launch)]


def unsupported_by_engine(engine: EngineType, kv_cache_precision: str) -> str | None:
    """A combination kvscale will not deploy on an engine, or None."""
    if engine == "tgi" and kv_cache_precision == "fp8":
        return "kvscale does not deploy an fp8 KV cache on TGI; use kvCachePrecision auto, or engine vllm or sglang"
    return None


@dataclass(frozen=True)
class PlannedLaunch:
    """A planned configuration as the engine will run it: the command line, the checkpoint, the
    context limit it serves and how long a new replica takes to start."""

    launch: EngineLaunch
    checkpoint: Checkpoint
    context: ContextLimit
    cold_start: ColdStart  # a start with the cache as configured (download only without one)
    first_start: ColdStart  # a start into an empty cache: budgets the startup probe

    @property
    def startup_probe_budget_s(self) -> float:
        return startup_probe_budget_s(self.first_start)

    @property
    def command(self) -> tuple[list[str], list[str]]:
        return engine_command(self.launch)


def requested_source(model_name: str | None, source: str | None, precision: str) -> str | None:
    """What the user asked the engine to load: spec.model.source, else a Hugging Face id given as
    the model's name when it serves that checkpoint as stored (16-bit, or fp8 quantized online)."""
    if source:
        return source
    if model_name and "/" in model_name and precision not in ("int4", "int8"):
        return model_name
    return None


def plan_launch(
    cfg: ServingConfig,
    source: str | None,
    requested_max_context: int | None,
    typical_context: int,
    max_batch: int,
    kv_capacity_tokens: int,
    port: int,
    cached: bool,
    context_field: str = "spec.workload.maxContextTokens",
    source_field: str = "spec.model.source",
) -> PlannedLaunch:
    """Compose the launch. Raises CheckpointError or ContextLimitError (both name the field)."""
    checkpoint = resolve_checkpoint(cfg.model, cfg.precision, source, source_field)
    context = context_limit(
        cfg.model,
        requested_max_context,
        kv_capacity_tokens,
        cfg.engine.kv_block_tokens,
        typical_context,
        field=context_field,
    )
    size = checkpoint.size_bytes(cfg.model)
    return PlannedLaunch(
        launch=launch_for(cfg, checkpoint, max_batch, context.max_model_len_tokens, port),
        checkpoint=checkpoint,
        context=context,
        cold_start=cold_start(size, cfg.tensor_parallel * cfg.data_parallel, cfg.engine, cached=cached),
        first_start=cold_start(size, cfg.tensor_parallel * cfg.data_parallel, cfg.engine, cached=False),
    )
