"""Step-time formulas: hand-computed cases and the roofline's shape."""

import math

import pytest

from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.parallel import allreduce_time_s, forward_communication_s
from kvscale.sizing.roofline import decode_step, expected_experts_touched, ideal_batch, ops_per_byte, prefill

CAT = default_catalog()


def cfg(model: str = "llama-2-7b", gpu: str = "A100-80GB", tp: int = 1, precision: str = "bf16") -> ServingConfig:
    return ServingConfig.build(CAT, CAT.model(model), CAT.gpu(gpu), precision, tp)


def test_decode_step_by_hand_batch_one() -> None:
    c = cfg()
    g, e = c.gpu, c.engine
    context = 1000
    weights = 6.74e9 * 2
    kv = (context + 1) * 2 * 32 * 32 * 128 * 2  # reads its context, writes its new token
    memory_s = weights / (g.hbm_bandwidth_bytes_per_s * g.bandwidth_efficiency) + kv / (
        g.hbm_bandwidth_bytes_per_s * g.bandwidth_efficiency
    )
    overhead_s = 32 * e.decode_layer_overhead_s + e.step_overhead_s + 1 * e.sequence_overhead_s  # one sequence
    step = decode_step(c, 1, context)
    assert step.memory_s == pytest.approx(memory_s)
    assert step.communication_s == 0.0
    assert step.seconds == pytest.approx(memory_s + overhead_s)
    assert step.limited_by == "bandwidth"
    flops = 2 * 6.74e9 + 4 * 32 * 32 * 128 * context
    assert step.flops_per_gpu == pytest.approx(flops)
    assert step.mbu == pytest.approx((weights + kv) / (step.seconds * g.hbm_bandwidth_bytes_per_s))


def test_decode_turns_compute_bound_past_the_ridge() -> None:
    c = cfg(gpu="L4")
    assert decode_step(c, 1, 128).limited_by == "bandwidth"
    assert decode_step(c, 1024, 16).limited_by == "compute"  # short context: KV reads stay small


def test_ops_per_byte_and_ideal_batch() -> None:
    c = cfg(gpu="A10")
    assert ops_per_byte(c) == pytest.approx(125e12 / 600e9)
    assert ideal_batch(c) == pytest.approx(125e12 / 600e9 * 2 / 2)
    assert ideal_batch(cfg(gpu="H100-SXM", precision="fp8")) == pytest.approx(1979e12 / 3350e9 * 1 / 2)


def test_prefill_by_hand() -> None:
    c = cfg(gpu="H100-SXM")
    tokens = 2048
    step = prefill(c, 1, tokens)
    flops = tokens * 2 * 6.74e9 + 4 * 32 * 32 * 128 * tokens * tokens / 2
    assert step.flops_per_gpu == pytest.approx(flops)
    per_layer = tokens * 2 * 6.74e9 / 32  # the linear layers' GEMM size sets their efficiency
    eff = c.matmul_efficiency * per_layer / (per_layer + c.engine.prefill_half_efficiency_flops)
    assert step.compute_s == pytest.approx(flops / (989e12 * eff))
    assert step.limited_by == "compute"


def test_prefill_chunks_read_weights_per_chunk() -> None:
    c = cfg()
    budget = c.max_num_batched_tokens
    one = prefill(c, 1, budget)
    two = prefill(c, 2, budget)
    assert two.bytes_per_gpu - 2 * one.bytes_per_gpu == pytest.approx(0.0, abs=1.0)
    assert two.overhead_s == pytest.approx(2 * one.overhead_s)


def test_allreduce_ring_by_hand() -> None:
    link = CAT.links["nvlink3"]
    e = CAT.engine()
    message = 1e6
    expect = (
        link.latency_s
        + e.allreduce_hop_latency_s * 3
        + 2 * 3 / 4 * message / (link.bandwidth_bytes_per_s_per_direction * e.allreduce_efficiency)
    )
    assert allreduce_time_s(message, 4, link, e) == pytest.approx(expect)
    assert allreduce_time_s(message, 1, link, e) == 0.0
    assert forward_communication_s(10, 4096, 32, 4, link, e) == pytest.approx(
        64 * allreduce_time_s(10 * 4096 * 2, 4, link, e)
    )


def test_tensor_parallel_adds_communication() -> None:
    step = decode_step(cfg(model="llama-2-70b", gpu="A100-40GB", tp=4), 1, 512)
    assert step.communication_s > 0
    assert step.seconds == pytest.approx(max(step.compute_s, step.memory_s) + step.communication_s + step.overhead_s)


def test_moe_reads_only_touched_experts() -> None:
    assert expected_experts_touched(8, 2, 1) == pytest.approx(2.0)
    assert expected_experts_touched(8, 2, 2) == pytest.approx(8 * (1 - (6 / 8) ** 2))
    assert expected_experts_touched(8, 2, 10_000) == pytest.approx(8.0)
    mixtral = cfg(model="mixtral-8x7b", gpu="H100-SXM", tp=2)
    small, large = decode_step(mixtral, 1, 512), decode_step(mixtral, 256, 512)
    total = 46.7e9 * 2 / 2
    assert small.bytes_per_gpu < 0.45 * total  # two of eight experts
    assert large.bytes_per_gpu > total * 0.99
    assert small.flops_per_gpu == pytest.approx((2 * 12.9e9 + 4 * 32 * 32 * 128 * 512) / 2)


def test_step_metrics_are_fractions() -> None:
    for batch in (1, 8, 64, 512):
        step = decode_step(cfg(), batch, 700)
        assert 0 < step.mbu <= 1 and 0 < step.mfu <= 1
        assert math.isfinite(step.seconds)


def test_gemms_and_attention_each_pay_their_own_roofline() -> None:
    # 70B on one H200, 256 decodes over 1024 tokens: the weight GEMMs wait on the tensor cores,
    # the KV reads on HBM; they are separate kernels, so the step pays both, not the larger.
    c = cfg(model="llama-3.1-70b", gpu="H200")
    r = c.rates
    batch, context = 256, 1024
    per_layer = batch * r.linear_flops_per_token_per_layer
    rate = r.peak_flops_per_s * r.matmul_efficiency * per_layer / (per_layer + r.gemm_half_flops)
    gemm_c, gemm_m = batch * r.linear_flops_per_token / rate, r.dense_weight_bytes / r.weight_bytes_per_s
    attention_c = batch * context * r.attention_flops_per_token_per_context / rate
    attention_m = (batch * context + batch) * r.kv_full_bytes_per_token / r.kv_bytes_per_s
    assert gemm_c > gemm_m and attention_m > attention_c  # the case this test is about
    step = decode_step(c, batch, context)
    assert step.compute_s == pytest.approx(gemm_c + attention_c)
    assert step.memory_s == pytest.approx(gemm_m + attention_m)
    assert step.roofline_s == pytest.approx(gemm_c + attention_m)
    assert step.seconds == pytest.approx(gemm_c + attention_m + step.overhead_s)
    assert step.roofline_s > max(step.compute_s, step.memory_s)
