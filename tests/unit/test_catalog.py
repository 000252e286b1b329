"""Catalog data: every DESIGN.md entry present, aliases, overlays, clear errors."""

from pathlib import Path

import pytest

from kvscale.sizing.catalog import CatalogError, ModelArch, default_catalog, load_catalog

CAT = default_catalog()
DESIGN_GPUS = [
    "T4",
    "L4",
    "A10",
    "A10G",
    "L40S",
    "A100-40GB",
    "A100-80GB",
    "H100-SXM",
    "H100-PCIE",
    "H200",
    "B200",
    "MI300X",
]
DESIGN_MODELS = [
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.3-70b",
    "llama-3.1-405b",
    "mistral-7b",
    "mixtral-8x7b",
    "qwen2.5-7b",
    "qwen2.5-72b",
    "mpt-7b",
    "mpt-30b",
    "falcon-40b",
    "falcon-180b",
    "gpt-j-6b",
    "gemma-7b",
]


def test_every_design_entry_is_present_with_a_source() -> None:
    assert set(DESIGN_GPUS) <= set(CAT.gpus)
    assert set(DESIGN_MODELS) <= set(CAT.models)
    for gpu in CAT.gpus.values():
        assert gpu.source
    for model in CAT.models.values():
        assert model.source


def test_gpu_facts_match_design_table() -> None:
    h100 = CAT.gpu("H100-SXM")
    assert (h100.hbm_bandwidth_bytes_per_s, h100.flops_16bit_per_s, h100.flops_fp8_per_s) == (3350e9, 989e12, 1979e12)
    a100 = CAT.gpu("A100-80GB")
    assert a100.flops_fp8_per_s is None and a100.ops_int8_per_s == 624e12
    assert 0 < a100.matmul_efficiency <= 1


def test_aliases_are_case_insensitive() -> None:
    assert CAT.model("META-LLAMA/llama-3.1-8b-instruct").name == "llama-3.1-8b"
    assert CAT.model("Llama-3.3-70B").name == "llama-3.3-70b"
    assert CAT.gpu("nvidia-a100-sxm4-80gb").name == "A100-80GB"
    assert CAT.gpu("h100-sxm").name == "H100-SXM"


def test_unknown_names_say_what_is_allowed() -> None:
    with pytest.raises(CatalogError, match=r"unknown model 'llama-9b'.*Known: .*llama-2-7b"):
        CAT.model("llama-9b")
    with pytest.raises(CatalogError, match="Did you mean"):
        CAT.gpu("H100-SMX")


def test_moe_params() -> None:
    mixtral = CAT.model("mixtral-8x7b")
    assert mixtral.params_per_token == pytest.approx(12.9e9)
    assert mixtral.shared_params < mixtral.params_per_token < mixtral.params


def test_custom_architecture_derives_params() -> None:
    arch = ModelArch.from_architecture(
        "mine",
        layers=32,
        hidden_size=4096,
        heads=32,
        kv_heads=32,
        head_dim=128,
        intermediate_size=11008,
        vocab_size=32000,
    )
    assert arch.params == pytest.approx(6.74e9, rel=0.01)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ModelArch.from_architecture(
            "bad", layers=1, hidden_size=64, heads=6, kv_heads=4, head_dim=16, intermediate_size=128, vocab_size=10
        )


def test_overlay_adds_gpus_and_overrides_prices(tmp_path: Path) -> None:
    overlay = tmp_path / "extra.yaml"
    overlay.write_text(
        "gpus:\n"
        "  H100-SXM: {price_usd_per_gpu_hour: 1.23}\n"
        "  RTX-6000-ADA:\n"
        "    vendor: nvidia\n    memory_gb: 48\n    memory_gib: 47.5\n    hbm_bandwidth_bytes_per_s: 960.0e+9\n"
        "    flops_16bit_per_s: 364.0e+12\n    flops_fp8_per_s: 728.0e+12\n    ops_int8_per_s: 728.0e+12\n"
        "    link: pcie4\n    gpus_per_node: [1, 2, 4]\n    price_usd_per_gpu_hour: 0.9\n"
        "    node_labels: [NVIDIA-RTX-6000-Ada-Generation]\n    matmul_efficiency: 0.7\n    bandwidth_efficiency: 0.85\n"
        "    source: test\n"
    )
    cat = load_catalog(overlay)
    assert cat.gpu("H100-SXM").price_usd_per_gpu_hour == 1.23
    assert cat.gpu("H100-SXM").hbm_bandwidth_bytes_per_s == 3350e9
    assert cat.gpu("RTX-6000-ADA").memory_gib == 47.5
    assert default_catalog().gpu("H100-SXM").price_usd_per_gpu_hour != 1.23


def test_overlay_errors_name_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpuz: {}\n")
    with pytest.raises(CatalogError, match="unknown sections"):
        load_catalog(bad)
    bad.write_text("gpus:\n  H100-SXM: {matmul_efficiency: 1.5}\n")
    with pytest.raises(CatalogError, match="matmul_efficiency"):
        load_catalog(bad)
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(tmp_path / "missing.yaml")
