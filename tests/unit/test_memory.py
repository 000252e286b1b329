"""Memory formulas against hand-computed values."""

import pytest

from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.memory import (
    kv_bytes_per_token,
    kv_capacity_tokens,
    kv_heads_per_gpu,
    max_batch_for_context,
    tokens_per_sequence,
    weight_bytes,
)
from kvscale.sizing.units import GIB

CAT = default_catalog()


def test_kv_bytes_per_token_mha_by_hand() -> None:
    # llama-2-7b: 2 x 32 layers x 32 heads x 128 dims x 2 bytes
    assert kv_bytes_per_token(CAT.model("llama-2-7b"), CAT.kv_precision("fp16")) == 2 * 32 * 32 * 128 * 2


def test_kv_bytes_per_token_gqa_and_fp8() -> None:
    llama3 = CAT.model("llama-3.1-70b")  # 80 layers, 8 KV heads
    assert kv_bytes_per_token(llama3, CAT.kv_precision("auto")) == 2 * 80 * 8 * 128 * 2
    assert kv_bytes_per_token(llama3, CAT.kv_precision("fp8")) == 2 * 80 * 8 * 128 * 1


def test_tensor_parallel_splits_kv_heads_then_replicates() -> None:
    m = CAT.model("llama-3.1-70b")  # 8 KV heads
    assert [kv_heads_per_gpu(m, tp) for tp in (1, 2, 4, 8)] == [8, 4, 2, 1]
    qwen = CAT.model("qwen2.5-7b")  # 4 KV heads: at tp 8 each GPU still holds one
    assert kv_heads_per_gpu(qwen, 8) == 1
    assert kv_bytes_per_token(qwen, CAT.kv_precision("auto"), 8) == kv_bytes_per_token(
        qwen, CAT.kv_precision("auto"), 4
    )


def test_weight_bytes_by_precision() -> None:
    m = CAT.model("llama-2-7b")
    assert weight_bytes(m, CAT.precision("bf16")) == pytest.approx(6.74e9 * 2)
    assert weight_bytes(m, CAT.precision("fp8")) == pytest.approx(6.74e9)
    assert weight_bytes(m, CAT.precision("int4")) == pytest.approx(6.74e9 * 0.52)


def test_kv_capacity_in_whole_blocks() -> None:
    assert kv_capacity_tokens(10 * 1024, 1.0, 16) == 10 * 1024
    assert kv_capacity_tokens(100.0, 1.0, 16) == 96  # 6 whole blocks of 16
    assert kv_capacity_tokens(-5.0, 1.0, 16) == 0


def test_max_batch_rounds_each_sequence_up_to_blocks() -> None:
    assert tokens_per_sequence(17, 16) == 32
    assert max_batch_for_context(1024, 17, 16) == 32
    assert max_batch_for_context(1024, 16, 16) == 64
    with pytest.raises(ValueError):
        max_batch_for_context(1024, 0)


def test_memory_budget_adds_up() -> None:
    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu("A100-80GB"), "bf16", 1)
    mem = cfg.memory
    assert mem.usable_bytes == pytest.approx(80 * GIB * 0.90)
    assert mem.weights_bytes == pytest.approx(8.03e9 * 2)
    assert mem.kv_bytes == pytest.approx(mem.usable_bytes - mem.weights_bytes - mem.reserve_bytes)
    assert mem.kv_capacity_tokens == kv_capacity_tokens(mem.kv_bytes, mem.kv_bytes_per_token, 16)
    assert 1 * GIB < mem.reserve_bytes < 5 * GIB


def test_seventy_b_does_not_fit_one_gpu_but_fits_four() -> None:
    m = CAT.model("llama-2-70b")
    one = ServingConfig.build(CAT, m, CAT.gpu("A100-80GB"), "bf16", 1)
    four = ServingConfig.build(CAT, m, CAT.gpu("A100-80GB"), "bf16", 4)
    assert not one.memory.fits and one.memory.kv_capacity_tokens == 0
    assert four.memory.fits and four.memory.weights_bytes == pytest.approx(69e9 * 2 / 4)
