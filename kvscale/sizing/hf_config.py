"""A model as its users have it: a Hugging Face `config.json`, mapped to kvscale's ModelArch.

Field names and their defaults are those of transformers' configuration classes (5.x wheel,
transformers/models/<type>/configuration_<type>.py): a key absent from config.json takes
the class default, exactly as `AutoConfig.from_pretrained` would. How the engine lays out the
KV cache follows vLLM 0.11.0:

- GQA/MHA: K and V of `num_key_value_heads` heads of `head_dim` per layer, the heads split over
  tensor-parallel ranks (vllm/v1/kv_cache_interface.py, AttentionSpec.page_size_bytes).
- MLA (deepseek_v2/v3): one latent of `kv_lora_rank + qk_rope_head_dim` values per token and
  layer, one "KV head" that every tensor-parallel rank keeps whole
  (vllm/model_executor/layers/mla.py: `num_kv_heads=1`, `head_size=kv_lora_rank +
  qk_rope_head_dim`; kv_cache_interface.py, MLAAttentionSpec.page_size_bytes has no factor 2).
- Sparse MLA (deepseek_v32, DeepSeek V3.2: a DeepseekV3Config with `index_topk`,
  vllm/transformers_utils/config.py): the latent is stored in vLLM's "fp8_ds_mla" format and a
  lightning indexer keeps an fp8 key of its own per token and layer (see sizing/memory.py).
- Sliding windows: gpt-oss windows every even layer (vllm/model_executor/models/gpt_oss.py,
  `layer_idx % 2 == 0`); Gemma 3 and Qwen follow `config.layer_types`
  (models/gemma3.py `is_sliding`); a `sliding_window` without `layer_types` windows every
  layer (vllm/attention/layer.py falls back to cache_config.sliding_window).
- MoE: routed experts of `moe_intermediate_size`, `n_shared_experts` shared ones, the first
  `first_k_dense_replace` layers dense (models/deepseek_v2.py DeepseekV2DecoderLayer).

A checkpoint's `quantization_config` names its native precision (DeepSeek's block FP8,
gpt-oss's MXFP4, NVFP4 from ModelOpt or compressed-tensors), which becomes the default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvscale.sizing.catalog import ModelArch

# transformers' defaults for the fields kvscale reads, per model_type (configuration_<type>.py).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "head_dim": None,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
    },
    "qwen2": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": None,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "qwen3": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "qwen3_moe": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": None,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 768,
        "num_experts_per_tok": 8,
        "num_experts": 128,
        "mlp_only_layers": None,
    },
    "deepseek_v2": {
        "vocab_size": 102400,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "first_k_dense_replace": 0,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "num_experts_per_tok": None,
        "moe_intermediate_size": 1407,
    },
    "deepseek_v3": {
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "qk_nope_head_dim": 128,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    },
    "gpt_oss": {
        "num_hidden_layers": 36,
        "num_local_experts": 128,
        "vocab_size": 201088,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "head_dim": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "sliding_window": 128,
        "tie_word_embeddings": False,
        "max_position_embeddings": 131072,
        "num_experts_per_tok": 4,
        "layer_types": None,
    },
    "gemma3_text": {
        "vocab_size": 262_208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131_072,
        "tie_word_embeddings": True,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "layer_types": None,
    },
    "glm4_moe": {
        "vocab_size": 151552,
        "hidden_size": 4096,
        "intermediate_size": 10944,
        "num_hidden_layers": 46,
        "num_attention_heads": 96,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "moe_intermediate_size": 1408,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "n_routed_experts": 128,
        "first_k_dense_replace": 1,
    },
    "mixtral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
        "sliding_window": None,
        "num_experts_per_tok": 2,
        "num_local_experts": 8,
    },
}
# DeepSeek V3.2 ships config.json with model_type deepseek_v32, which vLLM 0.11.0 reads as a
# DeepseekV3Config (vllm/transformers_utils/config.py, _CONFIG_REGISTRY deepseek_v32) plus the
# indexer's index_head_dim / index_n_heads / index_topk, which have no class default.
_DEFAULTS["deepseek_v32"] = _DEFAULTS["deepseek_v3"]
_MLA_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32")
_DEEPSEEK_MOE_TYPES = (*_MLA_TYPES, "glm4_moe")
_DEFAULTS["gemma3"] = _DEFAULTS["gemma3_text"]  # the multimodal wrapper: its text_config is read
SUPPORTED_MODEL_TYPES = tuple(sorted(_DEFAULTS))


class HfConfigError(ValueError):
    """A config.json kvscale cannot map; the message names the field and the fix."""


# Shapes a config.json normally states: one missing is planned with transformers' class default
# (as AutoConfig.from_pretrained would load it), which for a smaller or larger model is wrong:
# say so rather than plan a 32-layer, 32000-token model in silence.
STATED_SHAPES = ("num_hidden_layers", "intermediate_size", "vocab_size")


def assumed_defaults(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """The shapes `raw` (a config.json) leaves out that kvscale takes from transformers'
    defaults for its model_type, each as a warning naming the field and the value used."""
    model_type = str(raw.get("model_type", "")).lower()
    if model_type == "gemma3" and isinstance(raw.get("text_config"), Mapping):
        return assumed_defaults({"model_type": "gemma3_text", **raw["text_config"]})
    defaults = _DEFAULTS.get(model_type)
    if defaults is None:
        return ()
    return tuple(
        f"config.json has no {key}: planned with transformers' {model_type} default {key}={defaults[key]}"
        for key in STATED_SHAPES
        if raw.get(key) is None and defaults.get(key) is not None
    )


def _int(cfg: Mapping[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HfConfigError(f"{where}: {key} must be a whole number >= 1, got {value!r}")
    return value


def fp8_weight_block(cfg: Mapping[str, Any]) -> int | None:
    """The block rows of a block-scaled FP8 checkpoint (quant_method fp8 with weight_block_size,
    vLLM quantization/fp8.py Fp8Config), or None (per-tensor or per-channel scales, or not fp8)."""
    q = cfg.get("quantization_config")
    if not isinstance(q, Mapping) or str(q.get("quant_method", "")).lower() != "fp8":
        return None
    block = q.get("weight_block_size")
    if isinstance(block, list) and block and isinstance(block[0], int) and block[0] > 0:
        return int(block[0])
    return None


def native_precision(cfg: Mapping[str, Any]) -> str | None:
    """The precision a checkpoint's `quantization_config` stores its weights in, or None (16-bit).

    quant_method values are vLLM's (vllm/model_executor/layers/quantization/__init__.py):
    "fp8" (DeepSeek-V3/R1: block-scaled E4M3, weight_block_size [128, 128]), "mxfp4"
    (gpt-oss), "modelopt"/"modelopt_fp4" with quant_algo FP8 or NVFP4, "compressed-tensors"
    with an nvfp4 or float format, "awq"/"gptq" (4 or 8 bits).
    """
    q = cfg.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method", "")).lower()
    algo = str(q.get("quant_algo", "") or q.get("format", "")).lower()
    if method == "fp8":
        return "fp8"
    if method == "mxfp4":
        return "mxfp4"
    if method.startswith("modelopt"):
        if "nvfp4" in algo or method == "modelopt_fp4":
            return "nvfp4"
        if "fp8" in algo:
            return "fp8"
    if method == "compressed-tensors":
        if "nvfp4" in algo:
            return "nvfp4"
        if "float" in algo:
            return "fp8"
        if "int" in algo:
            return "int8" if "w8" in str(q).lower() else "int4"
    if method in ("awq", "gptq"):
        return "int8" if q.get("bits") == 8 else "int4"
    return None


def _sliding_layers(model_type: str, cfg: Mapping[str, Any], layers: int) -> tuple[int | None, int]:
    """(window, layers with the window)."""
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window"):
        window = None  # configuration_qwen*.py: sliding_window = None unless use_sliding_window
    if window is None:
        return None, 0
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise HfConfigError(f"config.json: sliding_window must be a whole number >= 1, got {window!r}")
    if isinstance(layer_types, list) and layer_types:
        return window, sum(1 for t in layer_types[:layers] if t == "sliding_attention")
    if model_type == "gpt_oss":
        return window, sum(1 for i in range(layers) if i % 2 == 0)  # vllm gpt_oss.py: layer_idx % 2 == 0
    if model_type in ("gemma3_text", "gemma3"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return window, sum(1 for i in range(layers) if (i + 1) % pattern)
    if model_type in ("qwen2", "qwen3", "qwen3_moe"):
        start = int(cfg.get("max_window_layers") or 0)
        return window, max(layers - start, 0)
    return window, layers  # every layer windowed (vllm/attention/layer.py: cache_config.sliding_window)


def arch_from_hf_config(raw: Mapping[str, Any], name: str | None = None, source: str | None = None) -> ModelArch:
    """A ModelArch from a Hugging Face config.json (a parsed mapping)."""
    model_type = str(raw.get("model_type", "")).lower()
    if model_type == "gemma3" and isinstance(raw.get("text_config"), Mapping):
        text = dict(raw["text_config"])
        text.setdefault("model_type", "gemma3_text")
        if "quantization_config" in raw:
            text.setdefault("quantization_config", raw["quantization_config"])
        return arch_from_hf_config(text, name or raw.get("_name_or_path"), source)
    if model_type not in _DEFAULTS:
        raise HfConfigError(
            f"config.json: model_type {model_type or '(missing)'!r} is not one kvscale maps; known: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (or describe the shapes in a YAML architecture file)"
        )
    cfg: dict[str, Any] = {
        **_DEFAULTS[model_type],
        **{k: v for k, v in raw.items() if v is not None or k == "head_dim"},
    }
    where = f"config.json ({model_type})"
    layers = _int(cfg, "num_hidden_layers", where)
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    vocab = _int(cfg, "vocab_size", where)
    intermediate = _int(cfg, "intermediate_size", where)
    kv_heads = cfg.get("num_key_value_heads") or heads
    mla = model_type in _MLA_TYPES
    fields: dict[str, Any] = {}
    if model_type == "deepseek_v32":
        fields["index_head_dim"] = _int(cfg, "index_head_dim", where)
        _int(cfg, "index_n_heads", where)  # read by hf_params: a clear error here when it is missing
    if mla:
        rope = _int(cfg, "qk_rope_head_dim", where)
        nope = _int(cfg, "qk_nope_head_dim", where)
        head_dim = nope + rope
        fields.update(kv_lora_rank=_int(cfg, "kv_lora_rank", where), qk_rope_head_dim=rope)
        fields["v_head_dim"] = _int(cfg, "v_head_dim", where)
        kv_heads = heads  # the latent is shared by all heads; vLLM keeps it whole on every rank
    else:
        head_dim = cfg.get("head_dim") or hidden // heads
    experts, active, expert_width, shared, dense = 1, 1, None, 0, 0
    if model_type in ("qwen3_moe",):
        experts, active = _int(cfg, "num_experts", where), _int(cfg, "num_experts_per_tok", where)
        expert_width = _int(cfg, "moe_intermediate_size", where)
        step = int(cfg.get("decoder_sparse_step") or 1)
        only_mlp = set(cfg.get("mlp_only_layers") or [])
        dense = sum(1 for i in range(layers) if i in only_mlp or (i + 1) % step)
    elif model_type in _DEEPSEEK_MOE_TYPES:
        experts = _int(cfg, "n_routed_experts", where)
        active = _int(cfg, "num_experts_per_tok", where)
        expert_width = _int(cfg, "moe_intermediate_size", where)
        shared = int(cfg.get("n_shared_experts") or 0)
        dense = min(int(cfg.get("first_k_dense_replace") or 0), layers)
    elif model_type in ("gpt_oss", "mixtral"):
        experts = _int(cfg, "num_local_experts", where)
        active = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0)
        if active < 1:
            raise HfConfigError(f"{where}: num_experts_per_tok must be a whole number >= 1")
    window, sliding = _sliding_layers(model_type, cfg, layers)
    tied = bool(cfg.get("tie_word_embeddings"))
    params = hf_params(cfg, model_type, layers, hidden, heads, int(kv_heads), int(head_dim), vocab, intermediate)
    label = name or str(raw.get("_name_or_path") or model_type)
    assumed = assumed_defaults(raw)
    said = (source or "Hugging Face config.json") + (f" (assumed: {'; '.join(assumed)})" if assumed else "")
    try:
        return ModelArch(
            name=label,
            layers=layers,
            hidden_size=hidden,
            heads=heads,
            kv_heads=int(kv_heads),
            head_dim=int(head_dim),
            intermediate_size=intermediate,
            vocab_size=vocab,
            params=params,
            experts=experts,
            active_experts=active,
            expert_intermediate_size=expert_width,
            shared_experts=shared,
            dense_layers=dense if experts > 1 else 0,
            sliding_window_tokens=window if sliding else None,
            sliding_window_layers=sliding,
            tied_embeddings=tied,
            max_context_tokens=_int(cfg, "max_position_embeddings", where),
            native_precision=native_precision(raw),
            fp8_weight_block=fp8_weight_block(raw),
            model_type=model_type,
            source=said,
            **fields,
        )
    except ValueError as exc:
        raise HfConfigError(f"{where}: {exc}") from exc


def hf_params(
    cfg: Mapping[str, Any],
    model_type: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    intermediate: int,
) -> float:
    """Weights from the shapes: embeddings, attention (GQA or MLA projections), dense and MoE
    FFNs (gated: gate, up and down), routers; norms and biases left out (< 0.1%)."""
    if model_type in _MLA_TYPES:
        rope, nope = int(cfg["qk_rope_head_dim"]), int(cfg["qk_nope_head_dim"])
        kv_lora, v = int(cfg["kv_lora_rank"]), int(cfg["v_head_dim"])
        q_lora = cfg.get("q_lora_rank")
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        attention = q + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v) + heads * v * hidden
        if model_type == "deepseek_v32":
            # The indexer (deepseek_v2.py Indexer): wq_b from the q latent, wk and weights_proj from
            # the hidden state.
            index_dim, index_heads = int(cfg["index_head_dim"]), int(cfg["index_n_heads"])
            attention += (q_lora or hidden) * index_heads * index_dim + hidden * index_dim + hidden * index_heads
    else:
        attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    dense_ffn = 3 * hidden * intermediate
    if model_type == "qwen3_moe":
        experts, width, shared = int(cfg["num_experts"]), int(cfg["moe_intermediate_size"]), 0
        step = int(cfg.get("decoder_sparse_step") or 1)
        only_mlp = set(cfg.get("mlp_only_layers") or [])
        dense = sum(1 for i in range(layers) if i in only_mlp or (i + 1) % step)
    elif model_type in _DEEPSEEK_MOE_TYPES:
        experts, width = int(cfg["n_routed_experts"]), int(cfg["moe_intermediate_size"])
        shared, dense = int(cfg.get("n_shared_experts") or 0), min(int(cfg.get("first_k_dense_replace") or 0), layers)
    elif model_type in ("gpt_oss", "mixtral"):
        experts, width, shared, dense = int(cfg["num_local_experts"]), intermediate, 0, 0
    else:
        experts, width, shared, dense = 1, intermediate, 0, layers
    moe_ffn = (experts + shared) * 3 * hidden * width + hidden * experts if experts > 1 else dense_ffn
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return float(layers * attention + dense * dense_ffn + (layers - dense) * moe_ffn + embeddings)


def is_hf_config(fields: Mapping[str, Any]) -> bool:
    """Whether a mapping reads as a Hugging Face config.json (rather than kvscale's own shape fields)."""
    return "model_type" in fields or "num_hidden_layers" in fields
