"""Monotonicity properties the model must keep whatever its factors."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscale.planner.search import PlanRequest, plan
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.load import ReplicaModel, chunk_budget_for
from kvscale.sizing.memory import kv_bytes_per_token
from kvscale.sizing.roofline import decode_step, prefill
from kvscale.sizing.workload import Slo, Workload

CAT = default_catalog()
MODELS = ["llama-2-7b", "llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "mixtral-8x7b", "gemma-7b"]
GPUS = ["A100-80GB", "H100-SXM", "H200", "L40S", "B200", "MI300X"]


def config(model: str, gpu: str, tp: int = 1) -> ServingConfig:
    return ServingConfig.build(CAT, CAT.model(model), CAT.gpu(gpu), "bf16", tp)


@given(st.sampled_from(MODELS), st.sampled_from(GPUS), st.floats(1.01, 4.0), st.integers(1, 512), st.integers(16, 8192))
def test_more_bandwidth_never_slower(model: str, gpu: str, factor: float, batch: int, context: int) -> None:
    base = config(model, gpu)
    faster_gpu = base.gpu.model_copy(update={"hbm_bandwidth_bytes_per_s": base.gpu.hbm_bandwidth_bytes_per_s * factor})
    faster = ServingConfig(base.model, faster_gpu, base.link, base.precision, base.kv, base.engine, 1)
    assert decode_step(faster, batch, context).seconds <= decode_step(base, batch, context).seconds
    assert prefill(faster, 1, context).seconds <= prefill(base, 1, context).seconds


@given(st.sampled_from(MODELS), st.sampled_from(GPUS), st.integers(1, 1023), st.integers(16, 4096))
def test_larger_batch_never_lower_throughput_before_the_knee(model: str, gpu: str, batch: int, context: int) -> None:
    c = config(model, gpu)
    small, large = decode_step(c, batch, context), decode_step(c, batch + 1, context)
    if large.limited_by == "bandwidth":
        assert (batch + 1) / large.seconds >= batch / small.seconds
    assert large.seconds >= small.seconds  # a bigger step never takes less time


@given(st.sampled_from(MODELS), st.integers(1, 16))
def test_more_kv_per_token_never_more_capacity(model: str, extra_kv_heads_factor: int) -> None:
    base = config(model, "A100-80GB")
    heavier_model = base.model.model_copy(update={"head_dim": base.model.head_dim * (1 + extra_kv_heads_factor)})
    heavier = ServingConfig(heavier_model, base.gpu, base.link, base.precision, base.kv, base.engine, 1)
    assert kv_bytes_per_token(heavier_model, base.kv) > kv_bytes_per_token(base.model, base.kv)
    assert heavier.memory.kv_capacity_tokens <= base.memory.kv_capacity_tokens


@settings(max_examples=40)
@given(st.sampled_from(MODELS), st.sampled_from(GPUS), st.floats(0.05, 0.95))
def test_ttft_grows_with_load(model: str, gpu: str, share: float) -> None:
    replica = ReplicaModel(config(model, gpu), Workload(512, 128, 1.0))
    batch = max(1, replica.kv_max_batch // 2)
    capacity = replica.capacity_rate_per_s(batch)
    lighter = replica.at_rate(capacity * share * 0.5, batch, 95)
    heavier = replica.at_rate(capacity * share, batch, 95)
    assert heavier.ttft_p_s >= lighter.ttft_p_s
    assert heavier.tpot_p_s >= lighter.tpot_p_s


@given(st.sampled_from(MODELS), st.sampled_from(["A100-80GB", "H100-SXM"]))
def test_more_tensor_parallel_never_less_kv_capacity(model: str, gpu: str) -> None:
    capacities = [
        config(model, gpu, tp).memory.kv_capacity_tokens
        for tp in (1, 2, 4, 8)
        if config(model, gpu, tp).unsupported_reason() is None
    ]
    assert capacities == sorted(capacities)


@settings(max_examples=40)
@given(
    st.sampled_from(MODELS),
    st.sampled_from(GPUS),
    st.sampled_from([128, 512, 2048, 8192]),
    st.floats(0.005, 0.2),
    st.floats(0.3, 1.0),
)
def test_tighter_tpot_never_gets_a_larger_chunk_budget(
    model: str, gpu: str, prompt: int, tpot_s: float, tighter: float
) -> None:
    cfg = config(model, gpu)
    workload = Workload(prompt, 64, 1.0)
    assert chunk_budget_for(cfg, workload, tpot_s * tighter) <= chunk_budget_for(cfg, workload, tpot_s)


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-SXM", "L40S"])
def test_tighter_tpot_never_lets_a_replica_carry_more(gpu: str) -> None:
    # The budget is chosen jointly with the load (it may grow again once no budget's full
    # step fits under the target and chunks must be rare), but a tighter target never
    # lets one replica carry more: every budget's feasible rates shrink with it.
    rates = []
    for tpot_s in (0.2, 0.1, 0.06, 0.04, 0.03):
        request = PlanRequest(
            model=CAT.model("llama-3.1-8b"),
            workload=Workload(2048, 28, 20.0),
            slo=Slo(2.0, tpot_s),
            gpus=(gpu,),
            tensor_parallel=(1,),
        )
        chosen = plan(CAT, request).chosen
        if chosen is not None:
            rates.append(chosen.prediction.rate_per_replica_max)
    assert len(rates) >= 2
    assert all(tighter <= looser * 1.002 for looser, tighter in itertools.pairwise(rates))  # bisection grain


def test_a_full_step_under_the_target_is_preferred_when_it_carries_more() -> None:
    # llama-3.1-8b on A100, 2048-token prompts, 28 out, TPOT 40 ms: a 256-token budget's full
    # mixed step (~35 ms) is under the target, so TPOT can never break and TTFT sets the rate.
    request = PlanRequest(
        model=CAT.model("llama-3.1-8b"),
        workload=Workload(2048, 28, 20.0),
        slo=Slo(2.0, 0.04),
        gpus=("A100-80GB",),
        tensor_parallel=(1,),
    )
    chosen = plan(CAT, request).chosen
    assert chosen is not None
    cfg = chosen.config
    replica = ReplicaModel(cfg, request.workload)
    assert replica.mixed(0, cfg.max_num_batched_tokens).seconds <= 0.04
    for budget in (1024, 4096):
        other = ReplicaModel(cfg.with_chunk_budget(budget), request.workload)
        rate = other.max_rate_meeting(request.slo, other.tpot_batch_limit(0.04))
        assert rate <= chosen.prediction.rate_per_replica_max
