"""A Hugging Face config.json as the model, and the KV/weight memory of MLA, sliding windows
and MXFP4 checked against what vLLM 0.11.0's own code computes.

The configs below are written from transformers' configuration classes (5.x,
transformers/models/<type>/configuration_<type>.py): a config that gives only `model_type`
takes every class default, as AutoConfig would. Published models give their config.json
values (the ones that differ from the defaults).
"""

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvscale.api.intent import SpecError, parse_intent, resolve_model
from kvscale.cli import app
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.checkpoints import CheckpointError, quantization_flag, resolve_checkpoint
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.hf_config import SUPPORTED_MODEL_TYPES, HfConfigError, arch_from_hf_config, native_precision
from kvscale.sizing.memory import weight_bytes

CAT = default_catalog()
runner = CliRunner()

# model_type -> (layers, heads, kv heads, head_dim, experts, active experts) of the class defaults.
DEFAULTS: dict[str, tuple[int, int, int, int, int, int]] = {
    "llama": (32, 32, 32, 128, 1, 1),  # num_key_value_heads None -> heads; head_dim None -> 4096 / 32
    "mistral": (32, 32, 8, 128, 1, 1),
    "qwen2": (32, 32, 32, 128, 1, 1),
    "qwen3": (32, 32, 32, 128, 1, 1),
    "qwen3_moe": (24, 32, 4, 64, 128, 8),  # head_dim None -> 2048 / 32
    "deepseek_v2": (32, 32, 32, 192, 64, 6),  # MLA: qk_nope 128 + qk_rope 64
    "deepseek_v3": (61, 128, 128, 192, 256, 8),
    "deepseek_v32": (61, 128, 128, 192, 256, 8),  # V3's class, plus the indexer (no class default)
    "gpt_oss": (36, 64, 8, 64, 128, 4),
    "gemma3_text": (26, 8, 4, 256, 1, 1),
    "glm4_moe": (46, 96, 8, 42, 128, 8),  # no head_dim field: vLLM glm4_moe.py takes hidden // heads
    "mixtral": (32, 32, 8, 128, 8, 2),
}

DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 config.json (its values equal the class defaults but these)
    "model_type": "deepseek_v3",
    "max_position_embeddings": 163840,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}
GPT_OSS_120B = {"model_type": "gpt_oss", "quantization_config": {"quant_method": "mxfp4"}}
GEMMA3_27B = {  # google/gemma-3-27b-it config.json: the multimodal wrapper with its text_config
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "sliding_window": 1024,
    },
}


# deepseek-ai/DeepSeek-V3.2-Exp config.json: the indexer's fields.
V32_INDEXER = {"index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}


def _defaults_config(model_type: str) -> dict[str, Any]:
    if model_type == "deepseek_v2":
        return {"model_type": model_type, "num_experts_per_tok": 6}  # the class default None cannot route
    if model_type == "deepseek_v32":
        return {"model_type": model_type, **V32_INDEXER}
    return {"model_type": model_type}


@pytest.mark.parametrize("model_type", sorted(DEFAULTS))
def test_class_defaults_map_to_the_shapes(model_type: str) -> None:
    arch = arch_from_hf_config(_defaults_config(model_type))
    layers, heads, kv_heads, head_dim, experts, active = DEFAULTS[model_type]
    got = (arch.layers, arch.heads, arch.kv_heads, arch.head_dim, arch.experts, arch.active_experts)
    assert got == (layers, heads, kv_heads, head_dim, experts, active)
    assert arch.model_type == model_type


def test_every_supported_type_has_a_defaults_case() -> None:
    assert set(SUPPORTED_MODEL_TYPES) == set(DEFAULTS) | {"gemma3"}


def test_published_totals_come_out_of_the_shapes() -> None:
    # Model cards: DeepSeek-V3 671B (37B active), gpt-oss-120b 116.8B, Qwen3-30B-A3B 30.5B (3.3B active).
    v3 = arch_from_hf_config(DEEPSEEK_V3)
    assert v3.params == pytest.approx(671e9, rel=0.01)
    assert v3.params_per_token == pytest.approx(37e9, rel=0.03)
    assert arch_from_hf_config(GPT_OSS_120B).params == pytest.approx(116.8e9, rel=0.01)
    qwen = arch_from_hf_config(
        {
            "model_type": "qwen3_moe",
            "hidden_size": 2048,
            "num_hidden_layers": 48,
            "head_dim": 128,
            "num_key_value_heads": 4,
            "max_position_embeddings": 40960,
        }
    )
    assert qwen.params == pytest.approx(30.5e9, rel=0.01)
    assert qwen.params_per_token == pytest.approx(3.3e9, rel=0.05)


def test_moe_structure_deepseek_and_glm() -> None:
    v3 = arch_from_hf_config(DEEPSEEK_V3)
    assert (v3.dense_layers, v3.shared_experts, v3.expert_intermediate_size) == (3, 1, 2048)
    assert v3.moe_layers == 58
    glm = arch_from_hf_config({"model_type": "glm4_moe"})
    assert (glm.dense_layers, glm.shared_experts, glm.expert_intermediate_size) == (1, 1, 1408)


def test_native_precision_from_quantization_config() -> None:
    assert native_precision(DEEPSEEK_V3) == "fp8"
    assert native_precision(GPT_OSS_120B) == "mxfp4"
    assert native_precision({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}) == "nvfp4"
    assert native_precision({"quantization_config": {"quant_method": "awq", "bits": 4}}) == "int4"
    assert native_precision({"model_type": "llama"}) is None


def test_unknown_model_type_names_the_field_and_the_fix() -> None:
    with pytest.raises(HfConfigError, match="model_type 'falcon_h1' is not one kvscale maps"):
        arch_from_hf_config({"model_type": "falcon_h1"})
    with pytest.raises(HfConfigError, match="num_hidden_layers must be a whole number"):
        arch_from_hf_config({"model_type": "llama", "num_hidden_layers": 0})


# --- memory against vLLM 0.11.0 -----------------------------------------------------------


def test_mla_kv_per_token_is_the_latent_replicated_on_every_rank() -> None:
    # vllm/model_executor/layers/mla.py: Attention(num_kv_heads=1, head_size=kv_lora_rank + qk_rope_head_dim);
    # vllm/v1/kv_cache_interface.py MLAAttentionSpec.page_size_bytes = block x 1 x 576 x 2 (bf16), no factor 2.
    v3 = arch_from_hf_config(DEEPSEEK_V3)
    vllm_page_bytes_per_token_per_layer = 1 * (512 + 64) * 2
    for tp in (1, 8):
        cfg = ServingConfig.build(CAT, v3, CAT.gpu("H200"), "fp8", tp)
        assert cfg.memory.kv_bytes_per_token == 61 * vllm_page_bytes_per_token_per_layer  # 70,272 bytes
    # Per-head K and V (what a GQA formula would give) would be 2 x 128 x 192 x 2 bytes per layer at TP 1.
    assert 2 * 128 * 192 * 2 / vllm_page_bytes_per_token_per_layer > 80


def test_sparse_mla_kv_per_token_is_vllms_fp8_ds_mla_page_plus_the_indexer_key() -> None:
    # vllm 0.11.0 flashmla_sparse.py: "each token's KV cache is 656 Bytes" (512 fp8 + 16 scale + 128
    # bf16 rope), chosen for --kv-cache-dtype auto and fp8 (models/config.py DeepseekV32ForCausalLM);
    # the indexer's k_cache: index_head_dim + index_head_dim // 128 * 4 uint8 (deepseek_v2.py Indexer).
    v32 = arch_from_hf_config({**DEEPSEEK_V3, "model_type": "deepseek_v32", **V32_INDEXER})
    per_layer = 656 + 128 + 4
    for kv in ("auto", "fp8"):
        cfg = ServingConfig.build(CAT, v32, CAT.gpu("H200"), "fp8", 8, kv_cache_precision=kv)
        assert cfg.memory.kv_bytes_per_token == 61 * per_layer
    # A 16-bit latent where the user asks for it, the indexer key beside it.
    bf16 = ServingConfig.build(CAT, v32, CAT.gpu("H200"), "fp8", 8, kv_cache_precision="fp16")
    assert bf16.memory.kv_bytes_per_token == 61 * ((512 + 64) * 2 + 132)
    # The indexer adds its projections to V3's weights: ~0.85B (wq_b 1536x64x128, wk 7168x128,
    # weights_proj 7168x64, per layer).
    v3 = arch_from_hf_config(DEEPSEEK_V3)
    assert v32.params - v3.params == 61 * (1536 * 64 * 128 + 7168 * 128 + 7168 * 64)
    with pytest.raises(HfConfigError, match="index_n_heads"):
        arch_from_hf_config({"model_type": "deepseek_v32", "index_head_dim": 128})


def _vllm_hybrid_blocks(available: float, page_per_layer: int, full: int, sliding: int) -> int:
    # kv_cache_utils._get_kv_cache_groups_uniform_page_size: groups of min(#full, #sliding) layers;
    # get_num_blocks: available // page_size // group_size.
    group = min(full, sliding)
    return int(available // page_per_layer // group)


def _vllm_blocks_per_sequence(context: int, block: int, window: int, full_groups: int, window_groups: int) -> int:
    whole = math.ceil(context / block)
    # A sliding group keeps the window - 1 earlier tokens plus the new one, one block more for alignment.
    return full_groups * whole + window_groups * min(whole, math.ceil(window / block) + 1)


@pytest.mark.parametrize(
    ("config", "full", "sliding", "window", "kv_heads", "head_dim", "gpu"),
    [
        (GPT_OSS_120B, 18, 18, 128, 8, 64, "H100-SXM"),  # gpt_oss.py: window on layer_idx % 2 == 0
        (GEMMA3_27B, 10, 52, 1024, 16, 128, "H100-SXM"),  # layer_types: full every 6th layer
    ],
)
def test_sliding_window_capacity_matches_vllms_block_pool(
    config: dict[str, Any], full: int, sliding: int, window: int, kv_heads: int, head_dim: int, gpu: str
) -> None:
    arch = arch_from_hf_config(config)
    assert (arch.full_attention_layers, arch.sliding_window_layers, arch.sliding_window_tokens) == (
        full,
        sliding,
        window,
    )
    precision = arch.native_precision or "bf16"
    cfg = ServingConfig.build(CAT, arch, CAT.gpu(gpu), precision, 1)
    mem, block = cfg.memory, cfg.engine.kv_block_tokens
    page_per_layer = block * 2 * kv_heads * head_dim * 2  # AttentionSpec.page_size_bytes, bf16
    blocks = _vllm_hybrid_blocks(mem.kv_bytes, page_per_layer, full, sliding)
    group = min(full, sliding)
    full_groups, window_groups = math.ceil(full / group), math.ceil(sliding / group)
    for context in (1_000, 10_000, 100_000):
        need = _vllm_blocks_per_sequence(context, block, window, full_groups, window_groups)
        assert mem.max_batch_for_context(context) == blocks // need
    # A long context costs the full layers only: far more sequences than caching every layer whole.
    per_sequence_all_layers = (full + sliding) * page_per_layer * math.ceil(10_000 / block)
    assert mem.max_batch_for_context(10_000) >= 1.6 * (mem.kv_bytes // per_sequence_all_layers)


def test_mxfp4_weights_match_vllms_expert_tensors() -> None:
    # vllm/model_executor/layers/quantization/mxfp4.py Mxfp4MoEMethod.create_weights (Triton backend,
    # Hopper): w13 uint8 [E, 2I, H/2] + scales uint8 [E, 2I, H/32], w2 [E, H, I/2] + [E, H, I/32]
    # (+ bf16 biases); attention, router, embeddings and lm_head stay bf16.
    arch = arch_from_hf_config(GPT_OSS_120B)
    e, h, i, layers = 128, 2880, 2880, 36
    vllm_experts = layers * e * (2 * i * (h // 2 + h // 32) + h * (i // 2 + i // 32) + (2 * i + h) * 2)
    rest = arch.params - arch.routed_expert_params
    vllm_total = vllm_experts + rest * 2
    assert weight_bytes(arch, CAT.precision("mxfp4")) == pytest.approx(vllm_total, rel=0.002)
    # ~65 GB: the model card's single-80-GB-GPU fit.
    assert 60e9 < weight_bytes(arch, CAT.precision("mxfp4")) < 70e9


def test_native_precision_is_the_default_and_other_formats_need_a_checkpoint(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT_OSS_120B))
    out = runner.invoke(
        app,
        [
            "predict",
            "--model",
            str(config),
            "--gpu",
            "H100-SXM",
            "--batch",
            "8",
            "--input",
            "1000",
            "--output",
            "200",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["fits"] and 60 < data["weights_gib_per_gpu"] < 66


def _write(tmp_path: Path, name: str, config: dict[str, Any]) -> str:
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("model_type", sorted(DEFAULTS))
def test_predict_runs_from_a_config_json_for_every_architecture(tmp_path: Path, model_type: str) -> None:
    config = _defaults_config(model_type)
    path = _write(tmp_path, model_type, config)
    out = runner.invoke(
        app,
        [
            "predict",
            "--model",
            path,
            "--gpu",
            "H200",
            "--tp",
            "8",
            "--precision",
            "fp8",  # DeepSeek-V3 in bf16 (1.3 TB) fits no single node
            "--batch",
            "4",
            "--input",
            "512",
            "--output",
            "64",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["fits"] and data["tpot_ms"] > 0


def test_plan_from_a_checkpoint_directory_and_a_bad_config(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "Qwen3-30B-A3B",
        {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "head_dim": 128},
    )
    args = [
        "plan",
        "--ttft",
        "2s",
        "--tpot",
        "100ms",
        "--rps",
        "1",
        "--input",
        "1000",
        "--output",
        "200",
        "--gpu",
        "H100-SXM",
    ]
    out = runner.invoke(app, [*args, "--model", str(Path(path).parent), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["chosen"]["gpu"] == "H100-SXM"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model_type": "rwkv"}))
    out = runner.invoke(app, [*args, "--model", str(bad)])
    assert out.exit_code == 2
    assert "model_type 'rwkv' is not one kvscale maps" in out.output


def test_spec_model_architecture_takes_a_config_json() -> None:
    spec = {
        "model": {"name": "openai/gpt-oss-120b", "architecture": {"huggingFaceConfig": GPT_OSS_120B}},
        "workload": {"inputTokens": 512, "outputTokens": 128},
        "slo": {"timeToFirstToken": "500ms", "timePerOutputToken": "50ms"},
    }
    arch = resolve_model(parse_intent(spec), CAT)
    assert (arch.layers, arch.sliding_window_layers, arch.native_precision) == (36, 18, "mxfp4")
    bad = {**spec, "model": {"architecture": {"huggingFaceConfig": {"model_type": "rwkv"}}}}
    with pytest.raises(SpecError, match=r"huggingFaceConfig: config\.json: model_type 'rwkv'"):
        resolve_model(parse_intent(bad), CAT)
    with pytest.raises(SpecError, match=r"needs huggingFaceConfig .* missing headDim"):
        parse_intent(
            {
                **spec,
                "model": {
                    "architecture": {
                        "layers": 2,
                        "hiddenSize": 64,
                        "heads": 2,
                        "kvHeads": 2,
                        "intermediateSize": 128,
                        "vocabSize": 100,
                    }
                },
            }
        )


def test_a_native_checkpoint_loads_as_published_without_a_quantization_flag() -> None:
    r1 = CAT.model("deepseek-r1")
    for source in (None, "hf://deepseek-ai/DeepSeek-R1"):
        ckpt = resolve_checkpoint(r1, CAT.precision("fp8"), source)
        assert (ckpt.source, ckpt.stored, ckpt.method) == ("deepseek-ai/DeepSeek-R1", "native", None)
        assert quantization_flag("vllm", ckpt, CAT.gpu("H100-SXM")) is None
        with pytest.raises(CheckpointError, match="stored in fp8"):
            resolve_checkpoint(r1, CAT.precision("bf16"), source)
    oss = CAT.model("gpt-oss-120b")
    ckpt = resolve_checkpoint(oss, CAT.precision("mxfp4"), None)
    assert ckpt.size_bytes(oss) == pytest.approx(weight_bytes(oss, CAT.precision("mxfp4")))
    with pytest.raises(CheckpointError, match="mxfp4 is a checkpoint format"):
        resolve_checkpoint(CAT.model("llama-3.1-8b"), CAT.precision("mxfp4"), None)


@pytest.mark.parametrize("model_type", sorted(DEFAULTS))
def test_plan_and_simulate_run_from_a_config_json_for_every_architecture(tmp_path: Path, model_type: str) -> None:
    path = _write(tmp_path, model_type, _defaults_config(model_type))
    common = ["--model", path, "--gpu", "H200", "--precision", "fp8"]
    out = runner.invoke(
        app,
        [
            "plan",
            *common,
            "--ttft",
            "5s",
            "--tpot",
            "200ms",
            "--rps",
            "1",
            "--input",
            "512",
            "--output",
            "64",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    chosen = json.loads(out.stdout)["chosen"]
    assert chosen is not None and chosen["gpu"] == "H200"
    sim = [
        "simulate",
        *common,
        "--ttft",
        "5s",
        "--tpot",
        "200ms",
        "--concurrency",
        "2",
        "--input",
        "256",
        "--output",
        "16",
        "--duration",
        "20s",
        "--policy",
        "static",
        "--json",
    ]
    out = runner.invoke(app, sim)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)[0]["requests"] > 0
