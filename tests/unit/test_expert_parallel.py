"""Expert parallelism for MoE models (vLLM --enable-expert-parallel, SGLang --ep-size): whole
experts per rank, the busiest rank setting the step; planned where tensor parallelism cannot
split block-FP8 experts, and carried into the engine line, status and the Deployment.

Engine facts cited in kvscale/sizing/experts.py (vLLM 0.11.0 fused_moe/config.py, layer.py,
quantization/fp8.py; SGLang 0.5.23 arg_groups/fields/parallel.py)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from kvscale.api.intent import parse_intent, serving_config
from kvscale.control.inventory import gpu_inventory
from kvscale.control.planning import Planned, plan_service
from kvscale.control.resources import deployment
from kvscale.control.status import plan_status
from kvscale.engines.args import engine_command, launch_for, sglang_args, vllm_args
from kvscale.engines.command import command_config, parse_engine_command
from kvscale.planner.search import PlanRequest, plan
from kvscale.planner.serialize import candidate_to_dict
from kvscale.sizing.catalog import ModelArch, default_catalog
from kvscale.sizing.checkpoints import resolve_checkpoint
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.experts import (
    block_fp8_split_problem,
    busiest_rank_experts_touched,
    busiest_rank_load_factor,
    experts_per_rank,
)
from kvscale.sizing.hf_config import arch_from_hf_config
from kvscale.sizing.memory import weight_bytes_per_gpu
from kvscale.sizing.roofline import decode_step, expected_experts_touched, prefill
from kvscale.sizing.workload import Slo, Workload
from tests.cluster.harness import node_objects

CAT = default_catalog()
NODES = list(node_objects(Path(__file__).resolve().parents[1] / "cluster" / "nodepool.yaml"))
# Qwen3-235B-A22B's shapes (the catalog entry's config.json values) with a block-FP8
# quantization_config in DeepSeek-V3's form: what an -FP8 release's config.json carries.
QWEN3_235B_FP8: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
}


def _vllm_expert_counts(experts: int, ranks: int) -> list[int]:
    """vLLM 0.11.0 fused_moe/layer.py determine_expert_map, per rank: base, the remainder one
    each to the first ranks."""
    base, remainder = divmod(experts, ranks)
    return [base + 1 if rank < remainder else base for rank in range(ranks)]


@pytest.mark.parametrize(("experts", "ranks"), [(256, 8), (160, 8), (128, 8), (8, 8), (6, 4), (60, 8)])
def test_the_fullest_rank_holds_what_vllm_places_there(experts: int, ranks: int) -> None:
    counts = _vllm_expert_counts(experts, ranks)
    assert sum(counts) == experts
    assert experts_per_rank(experts, ranks) == max(counts)


def test_the_busiest_rank_reads_more_than_an_even_share_until_every_expert_is_touched() -> None:
    experts, k, ranks = 256, 8, 8
    for tokens in (1, 4, 16, 64):
        even = expected_experts_touched(experts, k, tokens) / ranks
        busiest = busiest_rank_experts_touched(experts, k, tokens, ranks)
        assert even < busiest <= experts / ranks
    # one token's 8 experts over 8 ranks: one each on average, the busiest about 2.4
    assert busiest_rank_experts_touched(experts, k, 1, ranks) == pytest.approx(2.4, abs=0.1)
    assert busiest_rank_experts_touched(experts, k, 4096, ranks) == pytest.approx(32, abs=0.01)
    assert busiest_rank_experts_touched(experts, k, 10, 1) == pytest.approx(expected_experts_touched(experts, k, 10))


def test_routed_pairs_even_out_over_many_tokens() -> None:
    assert busiest_rank_load_factor(8, 1, 1) == 1.0
    small, large = busiest_rank_load_factor(8, 1, 8), busiest_rank_load_factor(8, 4096, 8)
    assert small > 1.8 and 1.0 < large < 1.03
    assert busiest_rank_load_factor(2, 1, 8) <= 8.0  # never more than every pair on one rank


def _configs(model: str, gpu: str, precision: str, tp: int) -> tuple[ServingConfig, ServingConfig]:
    arch, g = CAT.model(model), CAT.gpu(gpu)
    split = ServingConfig.build(CAT, arch, g, precision, tp)
    return split, ServingConfig.build(CAT, arch, g, precision, tp, expert_parallel=True)


def test_expert_parallel_steps_cost_at_least_tensor_parallel_ones() -> None:
    split, whole = _configs("deepseek-r1", "H200", "fp8", 8)
    assert whole.unsupported_reason() is None
    assert whole.memory.weights_bytes == pytest.approx(split.memory.weights_bytes)  # 256 experts / 8
    one_split, one_whole = decode_step(split, 1, 2000), decode_step(whole, 1, 2000)
    assert one_whole.memory_s > one_split.memory_s * 1.5  # the busiest rank's ~2.4 whole experts vs 1
    assert one_whole.communication_s == one_split.communication_s  # all-reduce both ways without dp
    big_split, big_whole = prefill(split, 2, 4096), prefill(whole, 2, 4096)
    assert big_split.seconds <= big_whole.seconds <= big_split.seconds * 1.05


def test_uneven_experts_size_memory_by_the_fullest_rank() -> None:
    arch = ModelArch.from_architecture(
        "six-experts",
        layers=8,
        hidden_size=1024,
        heads=16,
        kv_heads=4,
        head_dim=64,
        intermediate_size=2048,
        vocab_size=32000,
        experts=6,
        active_experts=2,
    )
    bf16 = CAT.precision("bf16")
    split = weight_bytes_per_gpu(arch, bf16, 4)
    whole = weight_bytes_per_gpu(arch, bf16, 4, expert_parallel=True)
    expert = arch.expert_params * 2.0
    assert whole - split == pytest.approx((math.ceil(6 / 4) - 6 / 4) * expert)


def test_expert_parallelism_needs_experts_ranks_and_an_engine_that_has_it() -> None:
    dense = ServingConfig.build(CAT, CAT.model("llama-3.1-70b"), CAT.gpu("H100-SXM"), "bf16", 4, expert_parallel=True)
    assert "mixture-of-experts" in (dense.unsupported_reason() or "")
    one = ServingConfig.build(CAT, CAT.model("mixtral-8x7b"), CAT.gpu("H100-SXM"), "bf16", 1, expert_parallel=True)
    assert "tensor parallel 2 or more" in (one.unsupported_reason() or "")
    tgi = ServingConfig.build(
        CAT, CAT.model("mixtral-8x7b"), CAT.gpu("H100-SXM"), "bf16", 4, engine="tgi", expert_parallel=True
    )
    assert "not tgi" in (tgi.unsupported_reason() or "")


def test_block_fp8_experts_that_do_not_split_need_expert_parallelism() -> None:
    assert block_fp8_split_problem(2048, 8) is None  # DeepSeek-V3: 256 columns per GPU
    assert CAT.model("deepseek-r1").fp8_weight_block == 128
    assert block_fp8_split_problem(1536, 2) is None  # 768 = 6 blocks
    assert "192 columns" in (block_fp8_split_problem(1536, 8) or "")  # GPUStack: "TP8 only is not compatible"
    arch = arch_from_hf_config(QWEN3_235B_FP8, "qwen3-235b-fp8")
    assert (arch.native_precision, arch.fp8_weight_block) == ("fp8", 128)
    tp8 = ServingConfig.build(CAT, arch, CAT.gpu("H200"), "fp8", 8)
    assert "--enable-expert-parallel" in (tp8.unsupported_reason() or "")
    assert ServingConfig.build(CAT, arch, CAT.gpu("H200"), "fp8", 8, expert_parallel=True).unsupported_reason() is None


def _request(arch: ModelArch, gpus: tuple[str, ...], precision: str, objective: str = "cost") -> PlanRequest:
    return PlanRequest(
        model=arch,
        workload=Workload(1000, 300, 2.0),
        slo=Slo(3.0, 0.15),
        gpus=gpus,
        precisions=(precision,),
        objective="latency" if objective == "latency" else "cost",
    )


def test_the_planner_chooses_expert_parallelism_where_tensor_parallelism_cannot_split() -> None:
    arch = arch_from_hf_config(QWEN3_235B_FP8, "qwen3-235b-fp8")
    # the fastest plan is a whole node: tensor parallel 8 cannot split the 1536-wide experts
    result = plan(CAT, _request(arch, ("H200",), "fp8", "latency"))
    assert result.chosen is not None and result.chosen.expert_parallel, [c.label for c in result.candidates]
    assert result.chosen.label.endswith(" ep fp8")
    assert "expert parallel" in result.chosen.reason
    assert candidate_to_dict(result.chosen)["expert_parallel"] is True
    refused = [
        c for c in result.rejected if c.tensor_parallel == result.chosen.tensor_parallel and not c.expert_parallel
    ]
    assert refused and "weight blocks" in refused[0].reason
    checkpoint = resolve_checkpoint(arch, CAT.precision("fp8"), "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8")
    command, args = engine_command(launch_for(result.chosen.config, checkpoint, 64, 8192, 8000))
    assert command == ["vllm", "serve"] and "--enable-expert-parallel" in args


def test_where_tensor_parallelism_runs_expert_parallelism_is_listed_not_evaluated() -> None:
    result = plan(CAT, _request(CAT.model("deepseek-r1"), ("H200",), "fp8"))
    assert result.chosen is not None and not result.chosen.expert_parallel
    twin = next(c for c in result.rejected if c.expert_parallel and c.tensor_parallel == 8)
    assert "no faster than tensor parallel 8" in twin.reason and twin.label == "H200 x8 ep fp8"
    unfit = next(c for c in result.rejected if c.expert_parallel and c.tensor_parallel == 4)
    assert unfit.reason.startswith("does not fit")  # its twin's reason
    dense = plan(CAT, _request(CAT.model("llama-3.1-70b"), ("H100-SXM",), "bf16"))
    assert not any(c.label.endswith(" ep bf16") for c in dense.candidates)


def test_engine_lines_carry_expert_parallelism() -> None:
    arch = arch_from_hf_config(QWEN3_235B_FP8, "qwen3-235b-fp8")
    checkpoint = resolve_checkpoint(arch, CAT.precision("fp8"), "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8")
    for engine, check in (("vllm", vllm_args), ("sglang", sglang_args)):
        cfg = ServingConfig.build(CAT, arch, CAT.gpu("H200"), "fp8", 8, engine=engine, expert_parallel=True)
        args = check(launch_for(cfg, checkpoint, 64, 8192, 8000))
        if engine == "vllm":
            assert "--enable-expert-parallel" in args
        else:
            assert args[args.index("--ep-size") + 1] == "8"


def test_engine_command_with_and_without_expert_parallelism() -> None:
    gpu = CAT.gpu("A100-80GB")
    text = "vllm serve Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 -tp 8"
    # a config.json with weight_block_size: vLLM would refuse TP 8 alone
    arch = arch_from_hf_config(QWEN3_235B_FP8, "qwen3-235b-fp8")
    refused = command_config(CAT, parse_engine_command(text), gpu, arch)
    assert "--enable-expert-parallel" in (refused.config.unsupported_reason() or "")
    # a name alone does not say the blocks (GPUStack ran zai-org/GLM-4.6-FP8 at TP 8 without EP)
    glm = command_config(CAT, parse_engine_command("vllm serve zai-org/GLM-4.6-FP8 -tp 8"), gpu)
    assert glm.config.unsupported_reason() is None and glm.config.precision.name == "fp8"
    cc = command_config(CAT, parse_engine_command(text + " --enable-expert-parallel"), gpu, arch)
    assert cc.config.expert_parallel and cc.config.precision.name == "fp8"
    assert cc.config.unsupported_reason() is None
    assert any("busiest rank" in n for n in cc.notes)
    named = command_config(CAT, parse_engine_command(text), gpu, CAT.model("qwen3-235b-a22b"))
    assert named.config.precision.name == "fp8"  # an -FP8 name is fp8 also when the model is given
    sglang = command_config(
        CAT,
        parse_engine_command("python -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B --tp-size 4 --ep 4"),
        gpu,
    )
    assert sglang.config.expert_parallel


def test_the_operator_deploys_and_records_expert_parallelism() -> None:
    raw: dict[str, Any] = {
        "model": {
            "name": "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8",
            "architecture": {"huggingFaceConfig": copy.deepcopy(QWEN3_235B_FP8)},
        },
        # one replica for 25 req/s: more than tensor parallel 4 carries (about 17), so a whole node,
        # where tensor parallelism cannot split the experts
        "workload": {"inputTokens": 1000, "outputTokens": 300, "requestsPerSecond": 25},
        "slo": {"timeToFirstToken": "3s", "timePerOutputToken": "150ms"},
        "hardware": {"gpuTypes": ["H100-SXM"]},
        "scaling": {"maxReplicas": 1},
    }
    intent = parse_intent(raw)
    pools = gpu_inventory(CAT, NODES, [])
    planned = plan_service(intent, CAT, pools)
    assert isinstance(planned, Planned), planned.message
    assert planned.chosen.expert_parallel and planned.chosen.precision == "fp8"
    status = plan_status(planned, 8192, ())
    assert status.expert_parallel
    assert status.model_dump(by_alias=True)["expertParallel"] is True
    cfg = serving_config(intent, status, CAT)
    assert cfg.expert_parallel
    dep = deployment("svc", "uid", intent.spec, planned.model, cfg, planned.chosen, planned.pool, 1, 8000)
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--enable-expert-parallel" in args and args[0] == "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"


# --- data-parallel attention (vLLM --data-parallel-size N --enable-expert-parallel, TP 1) ------


def _dp(model: str, gpu: str, precision: str, ranks: int, engine: str = "vllm") -> ServingConfig:
    return ServingConfig.build(
        CAT, CAT.model(model), CAT.gpu(gpu), precision, 1, engine=engine, expert_parallel=True, data_parallel=ranks
    )


def test_data_parallel_attention_keeps_mla_kv_once_per_gpu_and_weights_whole_but_experts() -> None:
    dp8, tp8 = (
        _dp("deepseek-r1", "H200", "fp8", 8),
        ServingConfig.build(CAT, CAT.model("deepseek-r1"), CAT.gpu("H200"), "fp8", 8),
    )
    assert dp8.unsupported_reason() is None and dp8.gpus == 8 and dp8.nodes == 1
    m = dp8.model
    rest = m.params - m.routed_expert_params  # attention, dense and shared layers, embeddings: whole on every rank
    assert dp8.memory.weights_bytes == pytest.approx(rest * 1.0 + 32 * m.expert_params * 1.0)  # fp8: 1 byte
    # MLA's latent is cached whole on every tensor-parallel rank; data-parallel ranks each cache their own sequences
    assert dp8.memory.kv_bytes_per_token == pytest.approx(tp8.memory.kv_bytes_per_token)
    assert dp8.memory.kv_capacity_tokens > 4 * tp8.memory.kv_capacity_tokens
    assert not _dp("deepseek-r1", "H100-SXM", "fp8", 8).memory.fits  # 92 GiB per GPU


def test_a_data_parallel_step_is_its_busiest_ranks() -> None:
    dp8 = _dp("deepseek-r1", "H200", "fp8", 8)
    lone = prefill(dp8, 1, 2000)  # one prompt: one rank prefills it, whole
    m = dp8.model
    shared_flops = 2.0 * (m.params_per_token - m.active_experts * m.expert_params) * 2000
    assert lone.flops_per_gpu > shared_flops
    step = decode_step(dp8, 64, 2000)
    assert step.communication_s > 0  # all-gather and reduce-scatter around each MoE layer
    assert dp8.rates.allreduce_fixed_s == 0.0
    with_one = decode_step(dp8, 8, 2000)  # one sequence per rank
    assert with_one.seconds < step.seconds


def test_data_parallel_attention_is_vllm_moe_only() -> None:
    assert "SGLang" in (_dp("deepseek-r1", "H200", "fp8", 8, "sglang").unsupported_reason() or "")
    dense = ServingConfig.build(
        CAT, CAT.model("llama-3.1-70b"), CAT.gpu("H100-SXM"), "bf16", 1, expert_parallel=True, data_parallel=4
    )
    assert "MoE" in (dense.unsupported_reason() or "")


def test_plan_with_data_parallel_attention_for_deepseek_on_h200() -> None:
    request = PlanRequest(
        model=CAT.model("deepseek-r1"),
        workload=Workload(2000, 500, 20.0),
        slo=Slo(2.0, 0.08),
        gpus=("H200",),
        precisions=("fp8",),
        data_parallel_attention=True,
    )
    result = plan(CAT, request)
    assert result.chosen is not None and result.chosen.data_parallel == 8, result.chosen
    assert result.chosen.label == "H200 x8dp fp8"
    tp8 = next(c for c in result.alternatives if c.tensor_parallel == 8 and c.data_parallel == 1)
    assert result.chosen.prediction.rate_per_replica_max > tp8.prediction.rate_per_replica_max
    out = candidate_to_dict(result.chosen)
    assert (out["data_parallel"], out["expert_parallel"], out["tensor_parallel"]) == (8, True, 1)
    checkpoint = resolve_checkpoint(CAT.model("deepseek-r1"), CAT.precision("fp8"), None)
    launch = launch_for(result.chosen.config, checkpoint, result.chosen.prediction.max_batch, 163840, 8000)
    args = vllm_args(launch)
    assert args[args.index("--tensor-parallel-size") + 1] == "1"
    assert args[args.index("--data-parallel-size") + 1] == "8" and "--enable-expert-parallel" in args
    assert int(args[args.index("--max-num-seqs") + 1]) == math.ceil(result.chosen.prediction.max_batch / 8)
    assert int(args[args.index("--max-num-batched-tokens") + 1]) == result.chosen.max_num_batched_tokens
    without = plan(CAT, PlanRequest(**{**request.__dict__, "data_parallel_attention": False}))
    assert all(c.label != "H200 x8dp fp8" for c in without.candidates)


def test_engine_command_with_data_parallel_attention() -> None:
    text = "vllm serve deepseek-ai/DeepSeek-R1 -dp 8 --enable-expert-parallel"
    cc = command_config(CAT, parse_engine_command(text), CAT.gpu("H200"))
    assert (cc.config.data_parallel, cc.config.expert_parallel, cc.config.gpus) == (8, True, 8)
    assert cc.max_batch == 8 * 1024  # vLLM's default --max-num-seqs per engine on a >= 70 GiB GPU
    assert cc.config.memory.fits and any("attention ranks" in n for n in cc.notes)
    plain = command_config(CAT, parse_engine_command("vllm serve Qwen/Qwen3-30B-A3B -dp 2"), CAT.gpu("H200"))
    assert plain.config.data_parallel == 1 and any("one of 2 equal engines" in n for n in plain.notes)


def test_kvscale_plan_dp_attention() -> None:
    from typer.testing import CliRunner

    from kvscale.cli import app

    args = ["plan", "--model", "deepseek-ai/DeepSeek-R1", "--gpu", "H200", "--ttft", "2s", "--tpot", "80ms"]
    args += ["--rps", "20", "--input", "2000", "--output", "500", "--json"]
    result = CliRunner().invoke(app, [*args, "--dp-attention"])
    assert result.exit_code == 0, result.output
    chosen = json.loads(result.output)["chosen"]
    assert chosen["data_parallel"] == 8 and "--data-parallel-size" in chosen["engine_args"]
    plain = json.loads(CliRunner().invoke(app, args).output)["chosen"]
    assert plain["data_parallel"] == 1 and plain["tensor_parallel"] == 8


CHAT_SPEC: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 2000, "outputTokens": 500, "requestsPerSecond": 2},
    "slo": {"timeToFirstToken": "2s", "timePerOutputToken": "80ms"},
}
H200_NODES = [
    {
        "metadata": {"name": f"h200-{i}", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    for i in range(3)
]


def test_the_operator_deploys_data_parallel_attention_when_the_spec_allows_it() -> None:
    raw: dict[str, Any] = {
        "model": {"name": "deepseek-ai/DeepSeek-R1"},
        "workload": {"inputTokens": 2000, "outputTokens": 500, "requestsPerSecond": 20},
        "slo": {"timeToFirstToken": "2s", "timePerOutputToken": "80ms"},
        "hardware": {"gpuTypes": ["H200"]},
    }
    pools = gpu_inventory(CAT, H200_NODES, [])
    plain = plan_service(parse_intent(raw), CAT, pools)
    assert isinstance(plain, Planned) and plain.chosen.data_parallel == 1  # not asked for
    raw["hardware"]["dataParallelAttention"] = True
    intent = parse_intent(raw)
    planned = plan_service(intent, CAT, pools)
    assert isinstance(planned, Planned), planned.message
    assert planned.chosen.data_parallel == 8 and planned.prediction.replicas == 2
    status = plan_status(planned, 163840, ())
    dumped = status.model_dump(by_alias=True)
    assert (dumped["dataParallel"], dumped["expertParallel"], dumped["tensorParallel"]) == (8, True, 1)
    cfg = serving_config(intent, status, CAT)
    assert (cfg.data_parallel, cfg.gpus) == (8, 8)
    dep = deployment("svc", "uid", intent.spec, planned.model, cfg, planned.chosen, planned.pool, 2, 8000)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--data-parallel-size") + 1] == "8" and "--enable-expert-parallel" in args
    assert args[args.index("--tensor-parallel-size") + 1] == "1"
    assert int(args[args.index("--max-num-seqs") + 1]) == math.ceil(status.max_batch / 8)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_data_parallel_attention_across_two_nodes_runs_as_a_leader_worker_set() -> None:
    from kvscale.api import labels
    from kvscale.control import leader_worker_set as lws
    from kvscale.control.inventory import GpuPool
    from kvscale.engines.args import plan_launch

    h100 = CAT.gpu("H100-SXM")
    dp16 = _dp("deepseek-r1", "H100-SXM", "fp8", 16)
    assert dp16.unsupported_reason() is None and (dp16.nodes, dp16.gpus_per_node) == (2, 8)
    assert dp16.memory.fits  # 16 experts per GPU: 58 GiB of weights
    within = _dp("deepseek-r1", "H100-SXM", "fp8", 8)  # NVLink only (it does not fit, but its rates exist)
    assert dp16.rates.dispatch_s_per_token > within.rates.dispatch_s_per_token  # the ring crosses the fabric
    planned = plan_launch(dp16, "deepseek-ai/DeepSeek-R1", 163840, 2500, 1024, 100_000, 8000, cached=False)
    intent = parse_intent({**copy.deepcopy(CHAT_SPEC), "model": {"name": "deepseek-ai/DeepSeek-R1"}})
    pool = GpuPool("H100-SXM", h100.node_labels[0], h100.label_key, h100.resource_name, 32, 0, 8)
    obj = lws.leader_worker_set("ds", intent.spec, dp16, planned, pool, 1, 8000, labels("ds"))
    t = obj["spec"]["leaderWorkerTemplate"]
    assert t["size"] == 2
    leader = t["leaderTemplate"]["spec"]["containers"][0]
    worker = t["workerTemplate"]["spec"]["containers"][0]
    assert leader["command"] == ["vllm", "serve"]
    args = leader["args"]
    assert args[args.index("--data-parallel-size") + 1] == "16"
    assert args[args.index("--data-parallel-size-local") + 1] == "8"
    assert args[args.index("--data-parallel-address") + 1] == "$(LWS_LEADER_ADDRESS)"
    assert "--enable-expert-parallel" in args and "--distributed-executor-backend" not in args
    assert args[args.index("--max-num-seqs") + 1] == "64"  # 1024 over 16 engines
    script = worker["args"][0]
    assert worker["command"] == ["/bin/sh", "-c"] and "--headless" in script
    assert script.endswith("--data-parallel-start-rank $$((LWS_WORKER_INDEX * 8))")
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
