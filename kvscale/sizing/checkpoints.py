"""Which checkpoint the engine loads for a weight precision, the quantization flag it needs, and
how long a new replica takes to start (download, load, engine start).

Engine facts (vLLM 0.11.0 wheel):
- vllm/config/model.py `_verify_quantization`: the method comes from the checkpoint's
  config.json (quantization_config.quant_method); a --quantization that disagrees with it is
  refused ("Quantization method specified in the model config ... does not match"). So int4
  and int8 need a checkpoint quantized that way; only fp8 can quantize 16-bit weights online:
  vllm/model_executor/layers/quantization/fp8.py `Fp8Config` defaults to
  is_checkpoint_fp8_serialized=False (`--quantization fp8` on a config.json without a
  quantization_config), and `Fp8LinearMethod.process_weights_after_loading` then quantizes
  the loaded 16-bit weights itself ("If checkpoint not serialized fp8, quantize the weights":
  ops.scaled_fp8_quant, one per-tensor scale); `Fp8MoEMethod` does the same for the experts.
- A quantized checkpoint is another repository: kvscale picks a published one only when it
  was made from the very checkpoint named (catalog `of`); a base model's int4 is never an
  Instruct model's AWQ. The plan says which repository it loads instead (`substitution`).
- vllm/model_executor/layers/quantization/__init__.py QuantizationMethods lists "fp8",
  "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors".
- awq_marlin.py `override_quantization_method` upgrades an AWQ checkpoint to awq_marlin when
  the GPU can run it (gptq_marlin.py likewise); marlin_utils.py
  `query_marlin_supported_quant_types` offers nothing below compute capability 8.0, and
  awq_marlin needs CUDA (vllm/platforms/rocm.py supported_quantization has awq and gptq, not
  the marlin variants). Naming plain `awq` on a GPU that could run marlin forces the slower
  kernel, so kvscale names the marlin variant exactly where vLLM would pick it.
SGLang 0.5.23 sglang/srt/arg_groups/choices.py QUANTIZATION_CHOICES has awq, awq_marlin,
gptq, gptq_marlin, fp8, compressed-tensors. TGI's --quantize takes awq, gptq,
compressed-tensors, fp8 (TGI is not on PyPI: per kvscale DESIGN.md, not re-checked here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from kvscale.sizing.catalog import EngineProfile, GpuSpec, ModelArch, PrecisionSpec, QuantizedSource
from kvscale.sizing.catalog.loader import QuantizationMethod

SIXTEEN_BIT = ("bf16", "fp16")
QUANTIZED = ("fp8", "int8", "int4")
NATIVE_ONLY = ("mxfp4", "nvfp4")  # formats only a checkpoint published in them provides
CHECKPOINT_16BIT_BYTES_PER_PARAM = 2.0
SOURCE_FIELD = "spec.model.source"
EngineType = Literal["vllm", "sglang", "tgi"]


class CheckpointError(ValueError):
    """No checkpoint matches the precision; the message names the field to set."""

    def __init__(self, message: str, field: str = SOURCE_FIELD) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class Checkpoint:
    """What the engine loads and how its weights are stored."""

    source: str  # as the engine takes it (no hf:// scheme)
    stored: Literal[
        "16bit", "fp8", "int8", "int4", "native"
    ]  # the weights in the checkpoint ("native": its own format)
    method: QuantizationMethod | None  # how it was quantized; None: 16-bit, or read from its config.json
    online_fp8: bool  # fp8 from 16-bit weights, quantized while loading
    origin: Literal["catalog", "catalog-quantized", "spec"]
    bytes_per_param: float
    quantizes: str | None = None  # catalog-quantized: the named 16-bit checkpoint it was made from

    def size_bytes(self, model: ModelArch) -> float:
        """What a download moves and a load reads: every parameter as stored."""
        if self.stored == "native" and model.native_precision == "mxfp4":  # experts only (hf_config.py)
            routed = model.routed_expert_params
            return routed * self.bytes_per_param + (model.params - routed) * CHECKPOINT_16BIT_BYTES_PER_PARAM
        return model.params * self.bytes_per_param


# Hugging Face repositories known to be gated (the license must be accepted on the model page,
# and the download needs that account's token): Meta's Llama repositories and Google's Gemma.
# Not a complete list: other repositories may be gated too.
GATED_PREFIXES = ("meta-llama/", "google/gemma")


def known_gated(source: str) -> bool:
    """Whether the checkpoint is in a Hugging Face repository known to be gated."""
    return strip_scheme(source).lower().startswith(GATED_PREFIXES)


def strip_scheme(source: str) -> str:
    return source.strip().removeprefix("hf://")


def sixteen_bit_ids(model: ModelArch) -> frozenset[str]:
    """The catalog's Hugging Face ids for the model: 16-bit checkpoints."""
    return frozenset(a.lower() for a in (model.hf_id, *model.aliases) if "/" in a)


def method_from_name(source: str) -> QuantizationMethod | None:
    """The method a checkpoint's name announces (AWQ, GPTQ, compressed-tensors w8a8/w4a16, FP8)."""
    name = source.lower()
    if re.search(r"(^|[-_/.])awq($|[-_/.])", name):
        return "awq"
    if re.search(r"(^|[-_/.])gptq($|[-_/.])", name):
        return "gptq"
    if re.search(r"w8a8|w4a16|w8a16|quantized\.", name):
        return "compressed-tensors"
    if re.search(r"(^|[-_/.])fp8($|[-_/.])", name):
        return "fp8"
    return None


def default_precision(precision: str | None, model: ModelArch) -> str:
    """The precision as asked, else the checkpoint's own (DeepSeek-V3/R1's block-scaled fp8,
    gpt-oss's mxfp4: what the published checkpoint loads as without a --quantization flag),
    else bf16. The CLI's --precision and spec.model.precision both default this way."""
    return precision if precision else (model.native_precision or "bf16")


def _made_from(q: QuantizedSource, checkpoint: str) -> bool:
    return strip_scheme(checkpoint).lower() in (o.lower() for o in q.of)


def _catalog_quantized(model: ModelArch, precision: str, checkpoint: str) -> QuantizedSource | None:
    """The catalog's published quantization of exactly `checkpoint` (never of a sibling: a base
    model's and its Instruct model's weights differ), or None."""
    return next((q for q in model.quantized_sources if q.precision == precision and _made_from(q, checkpoint)), None)


def _siblings_hint(model: ModelArch, precision: str, checkpoint: str, field: str) -> str:
    """The catalog's quantizations of other checkpoints of this architecture, offered by name."""
    others = [q for q in model.quantized_sources if q.precision == precision and not _made_from(q, checkpoint)]
    if not others:
        return ""
    q = others[0]
    return (
        f". kvscale knows {strip_scheme(q.source)} ({precision}, {q.method}), but it is made from {q.of[0]}, "
        f"a different model than {strip_scheme(checkpoint)} (a base model and its instruction-tuned sibling "
        f"differ): to serve that one, set {field} to {q.source}"
    )


def substitution(checkpoint: Checkpoint) -> str | None:
    """What the plan says when the engine loads another repository than the one named: a
    published quantization of the same model. None when it loads what was named."""
    if checkpoint.quantizes is None:
        return None
    how = f"{checkpoint.stored}, {checkpoint.method}" if checkpoint.method else checkpoint.stored
    return (
        f"loads {checkpoint.source} ({how}), a published quantization of {checkpoint.quantizes} (the model "
        "named), not that 16-bit repository itself"
    )


def resolve_checkpoint(
    model: ModelArch, precision: PrecisionSpec, source: str | None, field: str = SOURCE_FIELD
) -> Checkpoint:
    """The checkpoint for a weight precision, or a CheckpointError naming the source field."""
    name = precision.name
    quantized_bytes = precision.bytes_per_param
    native = model.native_precision
    if source is None and native is not None:
        if name == native:  # the published checkpoint itself; the engine reads its quantization_config
            return Checkpoint(model.hf_id, "native", None, False, "catalog", quantized_bytes)
        if name in SIXTEEN_BIT or name in NATIVE_ONLY:
            raise CheckpointError(
                f"{model.name}'s published checkpoint {model.hf_id} is stored in {native}; precision {name} needs "
                f"a checkpoint stored that way: set {field} to one, or use precision {native}",
                field,
            )
    if source is None and name in NATIVE_ONLY:
        raise CheckpointError(
            f"precision {name} is a checkpoint format ({model.name} is not published in it): set {field} to a "
            f"{name} checkpoint, or use bf16 or fp8",
            field,
        )
    if source is None:
        if name in SIXTEEN_BIT:
            return Checkpoint(model.hf_id, "16bit", None, False, "catalog", CHECKPOINT_16BIT_BYTES_PER_PARAM)
        known = _catalog_quantized(model, name, model.hf_id)
        if known is not None:
            return Checkpoint(
                strip_scheme(known.source),
                known.precision,
                known.method,
                False,
                "catalog-quantized",
                quantized_bytes,
                quantizes=model.hf_id,
            )
        if name == "fp8":
            return Checkpoint(model.hf_id, "16bit", "fp8", True, "catalog", CHECKPOINT_16BIT_BYTES_PER_PARAM)
        raise CheckpointError(
            f"precision {name} needs a checkpoint quantized to {name}, and kvscale's catalog knows none made "
            f"from {model.hf_id} (16-bit, which vLLM cannot load as {name}): set {field} to an {name} "
            f"checkpoint of it (AWQ, GPTQ or compressed-tensors), or use precision fp8 (quantized online from "
            f"the 16-bit weights) or bf16" + _siblings_hint(model, name, model.hf_id, field),
            field,
        )
    loaded = strip_scheme(source)
    if native is not None and loaded.lower() in sixteen_bit_ids(model):  # the published checkpoint, by name
        if name == native:
            return Checkpoint(loaded, "native", None, False, "spec", quantized_bytes)
        raise CheckpointError(
            f"{field} {source} is stored in {native}; precision {name} needs a checkpoint stored that way: "
            f"set {field} to one, or use precision {native}",
            field,
        )
    if name in SIXTEEN_BIT:
        return Checkpoint(loaded, "16bit", None, False, "spec", CHECKPOINT_16BIT_BYTES_PER_PARAM)
    known = next((q for q in model.quantized_sources if strip_scheme(q.source).lower() == loaded.lower()), None)
    if known is not None:
        if known.precision != name:
            raise CheckpointError(
                f"{field} {source} is a {known.precision} checkpoint but spec.model.precision is {name}: "
                f"set the precision to {known.precision} or name a {name} checkpoint",
                field,
            )
        return Checkpoint(loaded, known.precision, known.method, False, "spec", quantized_bytes)
    is_16bit = loaded.lower() in sixteen_bit_ids(model)
    if name == "fp8" and (is_16bit or method_from_name(loaded) is None):
        return Checkpoint(loaded, "16bit", "fp8", True, "spec", CHECKPOINT_16BIT_BYTES_PER_PARAM)
    if is_16bit:
        same = _catalog_quantized(model, name, loaded)
        hint = f" (kvscale knows {same.source}, made from it)" if same is not None else ""
        raise CheckpointError(
            f"{field} {source} is {model.name}'s 16-bit checkpoint; precision {name} needs a checkpoint "
            f"quantized to {name} (AWQ, GPTQ or compressed-tensors): set {field} to one{hint}, or use fp8 or bf16",
            field,
        )
    stored: Literal["fp8", "int8", "int4"] = "fp8" if name == "fp8" else ("int8" if name == "int8" else "int4")
    return Checkpoint(loaded, stored, method_from_name(loaded), False, "spec", quantized_bytes)


def marlin_capable(gpu: GpuSpec) -> bool:
    """vLLM's marlin kernels need CUDA compute capability >= 8.0 (Ampere on): in the catalog the
    NVIDIA parts with bfloat16 support, which arrived with the same generation (T4 is 7.5)."""
    return gpu.vendor == "nvidia" and gpu.bf16_supported


def quantization_flag(engine: EngineType, checkpoint: Checkpoint, gpu: GpuSpec) -> str | None:
    """The engine's quantization argument value, or None to let it read the checkpoint's config."""
    method = checkpoint.method
    if method is None:
        return None
    if engine == "tgi":
        return method  # --quantize awq | gptq | compressed-tensors | fp8
    if method in ("awq", "gptq"):
        return f"{method}_marlin" if marlin_capable(gpu) else method
    if method == "compressed-tensors" and engine == "sglang":
        return None  # SGLang reads compressed-tensors configs from config.json (choices.py)
    return method


@dataclass(frozen=True)
class ColdStart:
    """Time from pod start to the engine serving, in seconds, by phase."""

    fixed_s: float  # container start, engine init, CUDA graph capture
    download_s: float  # checkpoint from the hub into the cache (0 when it is already there)
    load_s: float  # this GPU's shard from the cache into GPU memory

    @property
    def total_s(self) -> float:
        return self.fixed_s + self.download_s + self.load_s


STARTUP_PROBE_FACTOR = 2.0  # the probe allows twice the modelled start before restarting the pod
STARTUP_PROBE_MIN_S = 600.0


def cold_start(
    checkpoint_bytes: float,
    tensor_parallel: int,
    engine: EngineProfile,
    cached: bool,
    download_bytes_per_s: float | None = None,
) -> ColdStart:
    """A new replica's start: download the checkpoint when it is not cached, then each GPU loads
    its shard. Pure: the autoscaling policy takes its default cold start from here."""
    if tensor_parallel < 1:
        raise ValueError(f"tensor parallel must be at least 1, got {tensor_parallel}")
    rate = download_bytes_per_s if download_bytes_per_s is not None else engine.download_bytes_per_s
    if rate <= 0:
        raise ValueError(f"download bandwidth must be positive, got {rate}")
    return ColdStart(
        fixed_s=engine.cold_start_fixed_s,
        download_s=0.0 if cached else checkpoint_bytes / rate,
        load_s=checkpoint_bytes / tensor_parallel / engine.weight_load_bytes_per_s,
    )


def startup_probe_budget_s(first_start: ColdStart) -> float:
    """How long the startup probe waits before restarting the pod. Budgeted on a start that
    downloads (a new cache volume is empty), with room for a slower network."""
    return max(STARTUP_PROBE_MIN_S, STARTUP_PROBE_FACTOR * first_start.total_s)


def replica_cold_start(
    model: ModelArch,
    precision: PrecisionSpec,
    tensor_parallel: int,
    engine: EngineProfile,
    source: str | None,
    cached: bool,
) -> ColdStart:
    """A new replica's modelled start for a planned configuration: the checkpoint it loads
    (quantized or 16-bit), downloaded unless `cached` (spec.model.cache set), then loaded.
    The autoscaling policy's default cold start; observed start-to-ready times refine it."""
    checkpoint = resolve_checkpoint(model, precision, source)
    return cold_start(checkpoint.size_bytes(model), tensor_parallel, engine, cached=cached)
