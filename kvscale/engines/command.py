"""An engine launch command as a ServingConfig: "what does the command I run today give me".

`vllm serve MODEL -tp 8 ...` (or `python -m vllm.entrypoints.openai.api_server --model ...`)
and SGLang's `python -m sglang.launch_server --model-path ...`: the flags that set
parallelism, the batch limit, the chunk budget, the context limit, the KV dtype and the
memory share are read; a flag that is absent takes the engine's default for that GPU.

Flag names and aliases are the engines' own:
- vLLM 0.11.0 vllm/engine/arg_utils.py EngineArgs.add_cli_args: --tensor-parallel-size/-tp,
  --pipeline-parallel-size/-pp, --data-parallel-size/-dp, --enable-expert-parallel,
  --max-num-seqs, --max-num-batched-tokens, --max-model-len, --kv-cache-dtype,
  --gpu-memory-utilization (default 0.9, vllm/config/cache.py), --block-size (16),
  --quantization/-q, --dtype; FlexibleArgumentParser (vllm/utils/__init__.py) takes
  underscores for dashes and `--flag=value`.
- SGLang 0.5.3 sglang/srt/server_args.py ServerArgs.add_cli_args: --model-path/--model,
  --tensor-parallel-size/--tp-size, --pipeline-parallel-size/--pp-size,
  --data-parallel-size/--dp-size, --expert-parallel-size/--ep-size/--ep,
  --max-running-requests, --chunked-prefill-size, --context-length, --kv-cache-dtype,
  --mem-fraction-static, --page-size (1), --quantization, --dtype.

Defaults that depend on the GPU:
- vLLM EngineArgs._set_default_args (OPENAI_API_SERVER): max_num_batched_tokens 8192 and
  max_num_seqs 1024 on GPUs with >= 70 GiB whose name is not an A100, else 2048 and 256;
  max_num_seqs is at most max_num_batched_tokens.
- SGLang ServerArgs._handle_gpu_memory_settings: chunked_prefill_size 2048 below 35 GiB,
  4096 below 60, 8192 below 160, else 16384; cuda_graph_max_bs (256 or 512 from TP 4 on,
  60-160 GiB); mem_fraction_static = (memory - reserved) / memory with reserved = 512 MiB +
  1.5 x max(chunk, 2048) MiB + 2 x cuda_graph_max_bs MiB + tp x pp / 8 GiB, at least 10 GiB
  above 60 GiB. tp_worker.py: max_running_requests = min(KV tokens // 2,
  model_runner max_num_reqs = min(max(KV tokens / context_len x 512, 2048), 4096)).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Literal

from kvscale.sizing.catalog import Catalog, CatalogError, GpuSpec, ModelArch
from kvscale.sizing.config import ServingConfig, default_chunk_budget_tokens

CommandEngine = Literal["vllm", "sglang"]


class EngineCommandError(ValueError):
    """A command kvscale cannot read; the message names the flag and the fix."""


@dataclass(frozen=True)
class EngineCommand:
    """The flags of a launch command kvscale's model uses; None: absent (the engine's default)."""

    engine: CommandEngine
    model: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    block_size: int | None = None
    mixed_chunk: bool = False  # SGLang --enable-mixed-chunk: prefill chunks carry the running decodes
    quantization: str | None = None
    dtype: str | None = None
    ignored: tuple[str, ...] = field(default=())  # flags read but not modelled (speculative decoding, parsers, ...)


# flag -> (field, kind); kind: int, float, str, or flag (no value)
_VLLM: dict[str, tuple[str, str]] = {
    "--model": ("model", "str"),
    "--tensor-parallel-size": ("tensor_parallel", "int"),
    "-tp": ("tensor_parallel", "int"),
    "--pipeline-parallel-size": ("pipeline_parallel", "int"),
    "-pp": ("pipeline_parallel", "int"),
    "--data-parallel-size": ("data_parallel", "int"),
    "-dp": ("data_parallel", "int"),
    "--enable-expert-parallel": ("expert_parallel", "flag"),
    "--max-num-seqs": ("max_num_seqs", "int"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", "int"),
    "--max-model-len": ("max_model_len", "int"),
    "--kv-cache-dtype": ("kv_cache_dtype", "str"),
    "--gpu-memory-utilization": ("gpu_memory_utilization", "float"),
    "--block-size": ("block_size", "int"),
    "--quantization": ("quantization", "str"),
    "-q": ("quantization", "str"),
    "--dtype": ("dtype", "str"),
}
_SGLANG: dict[str, tuple[str, str]] = {
    "--model-path": ("model", "str"),
    "--model": ("model", "str"),
    "--tensor-parallel-size": ("tensor_parallel", "int"),
    "--tp-size": ("tensor_parallel", "int"),
    "--pipeline-parallel-size": ("pipeline_parallel", "int"),
    "--pp-size": ("pipeline_parallel", "int"),
    "--data-parallel-size": ("data_parallel", "int"),
    "--dp-size": ("data_parallel", "int"),
    "--expert-parallel-size": ("expert_parallel", "size"),
    "--ep-size": ("expert_parallel", "size"),
    "--ep": ("expert_parallel", "size"),
    "--max-running-requests": ("max_num_seqs", "int"),
    "--chunked-prefill-size": ("max_num_batched_tokens", "int"),
    "--enable-mixed-chunk": ("mixed_chunk", "flag"),
    "--context-length": ("max_model_len", "int"),
    "--kv-cache-dtype": ("kv_cache_dtype", "str"),
    "--mem-fraction-static": ("gpu_memory_utilization", "float"),
    "--page-size": ("block_size", "int"),
    "--quantization": ("quantization", "str"),
    "--dtype": ("dtype", "str"),
}
# Flags that take no value (so the next word is not theirs), beyond those above.
_BOOLEAN = {
    "--async-scheduling",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--enforce-eager",
    "--trust-remote-code",
    "--enable-dp-attention",
    "--enable-auto-tool-choice",
    "--disable-radix-cache",
    "--disable-cuda-graph",
    "--enable-torch-compile",
    "--disable-log-requests",
    "--disable-log-stats",
}


def _engine_and_rest(words: list[str]) -> tuple[CommandEngine, list[str]]:
    """Which engine a command starts, and the words after its launcher."""
    for i, word in enumerate(words):
        base = word.rsplit("/", 1)[-1]
        if base == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
            return "vllm", words[i + 2 :]
        if word == "-m" and i + 1 < len(words):
            module = words[i + 1]
            if module.startswith("vllm.entrypoints"):
                return "vllm", words[i + 2 :]
            if module in ("sglang.launch_server", "sglang.srt.server"):
                return "sglang", words[i + 2 :]
        if base == "sglang" and i + 1 < len(words) and words[i + 1] == "serve":
            return "sglang", words[i + 2 :]
    raise EngineCommandError(
        "--engine-command: expected `vllm serve MODEL ...`, `python -m vllm.entrypoints.openai.api_server "
        "--model MODEL ...` or `python -m sglang.launch_server --model-path MODEL ...`"
    )


def parse_engine_command(text: str) -> EngineCommand:
    """The modelled flags of a vLLM or SGLang launch command."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise EngineCommandError(f"--engine-command: cannot split the command: {exc}") from exc
    engine, rest = _engine_and_rest(words)
    table = _VLLM if engine == "vllm" else _SGLANG
    values: dict[str, object] = {}
    ignored: list[str] = []
    i = 0
    if engine == "vllm" and rest and not rest[0].startswith("-"):
        values["model"] = rest[0]  # `vllm serve MODEL`
        i = 1
    while i < len(rest):
        word = rest[i]
        i += 1
        if not word.startswith("-") or word == "--":
            continue
        name, eq, inline = word.partition("=")
        if engine == "vllm" and name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        spec = table.get(name)
        if spec is None:
            ignored.append(name)
            if not eq and name not in _BOOLEAN and i < len(rest) and not rest[i].startswith("-"):
                i += 1  # the flag's value
            continue
        key, kind = spec
        if kind == "flag":
            values[key] = True
            continue
        if eq:
            raw = inline
        elif i < len(rest):
            raw = rest[i]
            i += 1
        else:
            raise EngineCommandError(f"--engine-command: {name} needs a value")
        values[key] = _value(name, raw, kind)
    if "model" not in values:
        raise EngineCommandError("--engine-command: no model in the command (vllm serve MODEL, or --model-path)")
    return EngineCommand(engine=engine, ignored=tuple(ignored), **values)  # type: ignore[arg-type]


def _value(name: str, raw: str, kind: str) -> object:
    try:
        if kind == "int":
            value = int(raw)
            if value < 1:
                raise ValueError
            return value
        if kind == "size":
            return int(raw) > 1
        if kind == "float":
            number = float(raw)
            if not 0 < number <= 1:
                raise ValueError
            return number
    except ValueError as exc:
        what = "a whole number >= 1" if kind in ("int", "size") else "a fraction in (0, 1]"
        raise EngineCommandError(f"--engine-command: {name} must be {what}, got {raw!r}") from exc
    return raw


@dataclass(frozen=True)
class CommandConfig:
    """A command as kvscale models it on one GPU type."""

    command: EngineCommand
    config: ServingConfig
    max_batch: int  # --max-num-seqs as given or as the engine derives it
    max_model_len: int
    notes: tuple[str, ...]


PRECISION_OF_QUANTIZATION = {
    "fp8": "fp8",
    "modelopt": "fp8",
    "mxfp4": "mxfp4",
    "modelopt_fp4": "nvfp4",
    "awq": "int4",
    "awq_marlin": "int4",
    "gptq": "int4",
    "gptq_marlin": "int4",
}


_NAMED_PRECISIONS = (("-fp8", "fp8"), ("-fp8-dynamic", "fp8"), ("-awq", "int4"), ("-mxfp4", "mxfp4"))


def named_precision_of(name: str) -> str | None:
    """The precision a checkpoint's name announces (`-FP8`: block FP8), or None."""
    return next((p for suffix, p in _NAMED_PRECISIONS if name.lower().endswith(suffix)), None)


def resolve_command_model(catalog: Catalog, name: str) -> tuple[ModelArch, str | None]:
    """The catalog model a command serves, and the precision its checkpoint name announces
    (an `-FP8` checkpoint of a catalog model: block FP8, e.g. Qwen/Qwen3-32B-FP8)."""
    try:
        return catalog.model(name), None
    except CatalogError:
        pass
    for suffix, precision in _NAMED_PRECISIONS:
        if name.lower().endswith(suffix):
            try:
                return catalog.model(name[: -len(suffix)]), precision
            except CatalogError:
                break
    return catalog.model(name), None  # the catalog's own error, with its suggestions


def _sglang_memory_fraction(gpu: GpuSpec, chunk: int, tp: int, pp: int) -> float:
    gpu_mib = gpu.memory_gib * 1024
    if gpu_mib < 35 * 1024:
        graph_bs = 16 if tp < 4 else 80
    elif gpu_mib < 60 * 1024:
        graph_bs = 32 if tp < 4 else 160
    elif gpu_mib < 160 * 1024:
        graph_bs = 256 if tp < 4 else 512
    else:
        graph_bs = 512
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def _sglang_chunk(gpu: GpuSpec) -> int:
    gib = gpu.memory_gib
    if gib < 35:
        return 2048
    if gib < 60:
        return 4096
    if gib < 160:
        return 8192
    return 16384


def command_config(
    catalog: Catalog, command: EngineCommand, gpu: GpuSpec, model: ModelArch | None = None
) -> CommandConfig:
    """The ServingConfig a command runs on `gpu`, its batch limit and context limit."""
    notes: list[str] = []
    named_precision = named_precision_of(command.model)
    if model is None:
        model, named_precision = resolve_command_model(catalog, command.model)
    precision = (
        PRECISION_OF_QUANTIZATION.get((command.quantization or "").lower())
        or model.native_precision
        or named_precision
        or ("fp16" if (command.dtype in ("half", "float16") or not gpu.bf16_supported) else "bf16")
    )
    kv = "fp8" if command.kv_cache_dtype.lower().startswith("fp8") else "auto"
    engine = catalog.engine(command.engine)
    updates: dict[str, object] = {}
    if command.block_size is not None:
        updates["kv_block_tokens"] = command.block_size
    tp, pp = command.tensor_parallel, command.pipeline_parallel
    if command.engine == "vllm":
        chunk = command.max_num_batched_tokens or default_chunk_budget_tokens(
            engine.model_copy(update={"max_num_batched_tokens": None}), _vllm_0_11_gpu(gpu)
        )
        if command.gpu_memory_utilization is not None:
            updates["gpu_memory_utilization"] = command.gpu_memory_utilization
    else:
        chunk = command.max_num_batched_tokens or _sglang_chunk(gpu)
        if command.mixed_chunk:
            # sglang/srt/managers/scheduler.py: is_mixed_chunk (chunked prefill and this flag) puts the
            # running batch's decodes beside the prefill chunk; without it they wait the chunk out.
            updates["decodes_during_prefill"] = True
        updates["gpu_memory_utilization"] = command.gpu_memory_utilization or _sglang_memory_fraction(
            gpu, chunk, tp, pp
        )
    if updates:
        engine = engine.model_copy(update=updates)
    dp = command.data_parallel
    # vLLM's --data-parallel-size with --enable-expert-parallel at TP 1 on a MoE model: the
    # data-parallel attention replica (experts over the dp ranks); otherwise one engine of dp.
    dp_attention = command.engine == "vllm" and dp > 1 and command.expert_parallel and model.is_moe and tp == 1
    if dp_attention:
        notes.append(
            f"data parallel {dp} with expert parallelism: modelled as one replica of {dp} attention ranks (each its own "
            "KV cache and --max-num-seqs), the experts over all, the busiest rank setting each step"
        )
    elif dp > 1:
        notes.append(f"data parallel {dp}: modelled as one of {dp} equal engines")
    expert_parallel = command.expert_parallel and model.is_moe and tp > 1
    if dp_attention:
        expert_parallel = True
    elif expert_parallel:
        notes.append(
            f"expert parallel: whole experts per GPU over the {tp} tensor-parallel ranks, the busiest rank setting "
            "each step"
            + (
                f" (vLLM spreads them over dp x tp = {tp * command.data_parallel} ranks)"
                if command.data_parallel > 1
                else ""
            )
        )
    elif command.expert_parallel:
        notes.append("expert parallel: no effect here (a dense model, or a single GPU)")
    if command.ignored:
        notes.append(f"not modelled: {', '.join(sorted(set(command.ignored)))}")
    cfg = ServingConfig(
        model=model,
        gpu=gpu,
        link=catalog.link(gpu, tp * (dp if dp_attention else 1)),
        precision=catalog.precision(precision),
        kv=catalog.kv_precision(kv),
        engine=engine,
        tensor_parallel=tp,
        chunk_budget_tokens=chunk,
        pipeline_parallel=pp,
        expert_parallel=expert_parallel,
        data_parallel=dp if dp_attention else 1,
    )
    max_model_len = command.max_model_len or model.max_context_tokens
    mem = cfg.memory
    if command.max_num_seqs is not None:
        max_batch = command.max_num_seqs
    elif command.engine == "vllm":
        big = gpu.memory_gib >= 70 and "a100" not in gpu.name.lower()
        max_batch = min(1024 if big else 256, chunk)
    else:
        kv_tokens = max(mem.kv_capacity_tokens, 0)
        max_reqs = min(max(int(kv_tokens / max_model_len * 512), 2048), 4096)
        max_batch = max(1, min(kv_tokens // 2, max_reqs))
    if dp_attention:
        max_batch *= dp  # each engine's --max-num-seqs
    return CommandConfig(command, cfg, max_batch, max_model_len, tuple(notes))


def _vllm_0_11_gpu(gpu: GpuSpec) -> GpuSpec:
    """vLLM 0.11.0 has no 16384 default (it came later): cap the memory the rule sees."""
    if gpu.memory_gib >= 160:
        return gpu.model_copy(update={"memory_gib": 159.0})
    return gpu
