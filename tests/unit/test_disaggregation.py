"""Prefill/decode disaggregation: the KV transfer, each pool's model, rate matching against the
published pool arithmetic (docs/disaggregation.md), and the layout choice with its reason."""

import math
from statistics import NormalDist

import pytest

from kvscale.planner.disaggregated import (
    kv_transfer_config,
    plan_disaggregated,
    plan_layouts,
    pool_engine_args,
    pool_launch,
)
from kvscale.planner.search import PlanRequest, plan
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.disaggregation import (
    DecodeWorker,
    PrefillWorker,
    kv_transfer_bytes_per_gpu,
    kv_transfer_path,
    kv_transfer_s,
    prefill_per_decode,
    prefill_workload,
    rate_matched_workers,
    transfer_path_specs,
    workers_for_rate,
)
from kvscale.sizing.workload import Slo, Workload

CAT = default_catalog()
AUTO = CAT.kv_precision("auto")


# The KV transfer ------------------------------------------------------------------------------


def test_gqa_transfer_is_one_prefill_gpus_shard_over_its_nic() -> None:
    # Llama-3.1-70B bf16: 2 x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 bytes (320 KiB) a
    # token; at TP 4 each GPU holds 2 heads: 81,920 bytes a token.
    model = CAT.model("llama-3.1-70b")
    assert kv_transfer_bytes_per_gpu(model, AUTO, 1, 1) == 327_680
    assert kv_transfer_bytes_per_gpu(model, AUTO, 4, 8000) == 81_920 * 8000
    h100 = CAT.gpu("H100-SXM")
    path = kv_transfer_path(CAT, h100, h100)
    assert path is not None and path.name == "network"
    # 50 GB/s per GPU (one 400 Gb/s NDR port) x 0.475 (Mooncake's 190 of 400 GB/s) = 23.75 GB/s
    assert path.bandwidth_bytes_per_s == pytest.approx(23.75e9)
    # 655.36 MB / 23.75 GB/s = 27.594 ms, + 1 ms setup
    assert kv_transfer_s(model, AUTO, 4, 8000, path) == pytest.approx(0.001 + 655.36e6 / 23.75e9)
    assert kv_transfer_s(model, AUTO, 4, 0, path) == 0.0


def test_mla_transfers_the_latent_whole_at_every_tp() -> None:
    # DeepSeek-V3: kv_lora_rank 512 + rope 64 = 576 bf16 values (1,152 bytes) a layer, 61 layers.
    model = CAT.model("deepseek-v3")
    for tp in (1, 8):
        assert kv_transfer_bytes_per_gpu(model, AUTO, tp, 1000) == 61 * 1152 * 1000


def test_nvlink_within_a_node_and_the_slower_nic_between_types() -> None:
    h100, a100 = CAT.gpu("H100-SXM"), CAT.gpu("A100-80GB")
    near = kv_transfer_path(CAT, h100, h100, within_node=True)
    assert near is not None and near.name == "nvlink"
    assert near.bandwidth_bytes_per_s == pytest.approx(450e9 * 0.80)
    assert near.setup_s == pytest.approx(0.2e-3)
    # two GPU types never share a node: the network, at the A100's 25 GB/s share
    mixed = kv_transfer_path(CAT, h100, a100, within_node=True)
    assert mixed is not None and mixed.name == "network"
    assert mixed.bandwidth_bytes_per_s == pytest.approx(25e9 * 0.475)


def test_transfer_paths_are_data_with_sources() -> None:
    for name, spec in transfer_path_specs().items():
        assert 0.0 < spec.efficiency <= 1.0, name
        assert spec.setup_latency_s >= 0.0 and spec.source, name


# Rate matching: the published pool arithmetic ---------------------------------------------------


def test_deepseek_production_pools_ratio() -> None:
    # One day: 608e9 input tokens at 73.7k per prefill node, 168e9 output at 14.8k per decode node.
    prefill = rate_matched_workers(608e9 / 86400, 73.7e3)
    decode = rate_matched_workers(168e9 / 86400, 14.8e3)
    assert prefill == pytest.approx(95.5, abs=0.05)
    assert decode == pytest.approx(131.4, abs=0.05)
    assert prefill + decode == pytest.approx(226.75, rel=0.002)  # reported: 226.75 nodes on average
    assert decode / prefill == pytest.approx(1.38, abs=0.005)


def test_rtp_llm_prefill_instances_per_decode_instance() -> None:
    # 4k in / 2k out; 42.6k prefill tokens/s per node (instances of 4), 14.7k decode tokens/s per
    # node (one instance of 18): 264.6k tokens/s = 129 req/s need 529k prompt tokens/s = 3.1 instances.
    ratio = prefill_per_decode(4096, 2048, 4 * 42.6e3, 18 * 14.7e3)
    assert ratio == pytest.approx(3.1, abs=0.01)
    assert math.ceil(ratio) == 4  # deployed: 4 prefill instances


def test_whole_workers_with_headroom() -> None:
    assert workers_for_rate(10.0, 2.0, 0.10) == 6  # 10 x 1.1 / 2 = 5.5
    assert workers_for_rate(10.0, 5.5, 0.0) == 2
    assert workers_for_rate(0.0, 5.0, 0.1) == 1


# Each pool's model ---------------------------------------------------------------------------------


def _cfg(model: str = "llama-3.1-70b", gpu: str = "H100-SXM", tp: int = 4) -> ServingConfig:
    return ServingConfig.build(CAT, CAT.model(model), CAT.gpu(gpu), "bf16", tp)


def test_prefill_worker_is_an_engine_of_one_token_requests() -> None:
    w = Workload(4000, 500, 5.0)
    pw = prefill_workload(w)
    assert (pw.input_tokens, pw.output_tokens, pw.requests_per_s) == (4000, 1, 5.0)
    assert pw.engine_max_context_tokens == w.engine_max_context_tokens  # the same --max-model-len
    worker = PrefillWorker(_cfg().with_chunk_budget(8192), w)
    idle = worker.replica.zero_load(95.0)
    assert worker.idle_ttft_p_s(95.0) == pytest.approx(
        worker.replica.intake_s + worker.replica.own_prefill(0).seconds + worker.replica.decode(1).seconds
    )
    assert idle.ttft_p_s == worker.idle_ttft_p_s(95.0)
    # TTFT grows with the rate and a budget of 1 s bounds the rate below it
    rate = worker.max_rate(1.0, 95.0)
    assert 0 < rate < worker.capacity_rate_per_s()
    assert worker.ttft_p_s(rate, 95.0) <= 1.0 < worker.ttft_p_s(rate * 1.05, 95.0)


def test_decode_worker_by_hand() -> None:
    w = Workload(4000, 500, 5.0)
    slo = Slo(2.0, 0.03)
    worker = DecodeWorker(_cfg(), w, slo.tpot_s)
    b = worker.max_batch
    assert b >= 1
    assert worker.replica.decode(b).seconds <= slo.tpot_s
    rate = 1.0
    point = worker.at_rate(rate, 95.0)
    intake = 1.0 - rate * worker.intake_s
    # Little: concurrency = rate x output x gap; the gap is the step at that running batch over 1 - intake
    assert point.concurrency == pytest.approx(rate * 500 * point.gap_s, rel=1e-9)
    z = NormalDist().inv_cdf(0.95)
    running_p = min(b, point.concurrency + z * math.sqrt(point.concurrency))  # Poisson: dispersion 1
    assert point.running_p == pytest.approx(running_p)
    assert point.tpot_p_s == pytest.approx(max(worker.step_s(running_p) / intake, point.gap_s))
    top = worker.max_rate(slo)
    assert worker.meets(top, slo) and not worker.meets(top * 1.01, slo)
    assert top <= worker.capacity_rate_per_s()


# The planner --------------------------------------------------------------------------------------


def _request(model: str, i: int, o: int, rps: float, ttft: float, tpot: float, **kw: object) -> PlanRequest:
    return PlanRequest(model=CAT.model(model), workload=Workload(i, o, rps), slo=Slo(ttft, tpot), **kw)  # type: ignore[arg-type]


def test_auto_plans_aggregated_for_short_balanced_requests_with_a_tight_ttft() -> None:
    request = _request("llama-3.1-8b", 200, 200, 20.0, 0.2, 0.05)
    layouts = plan_layouts(CAT, request)
    assert layouts.mode == "aggregated"
    assert layouts.aggregated == plan(CAT, request)  # the aggregated plan as it was
    assert layouts.disaggregated is not None
    assert layouts.reason.startswith("aggregated: ") and "200/200" in layouts.reason
    assert "KV transfer" in layouts.reason and "second queue" in layouts.reason
    chosen = layouts.aggregated.chosen
    assert chosen is not None
    assert chosen.prediction.cost_usd_per_hour < layouts.disaggregated.cost_usd_per_hour


def test_auto_plans_disaggregated_for_long_prompts_with_a_tight_tpot() -> None:
    request = _request("llama-3.1-70b", 8000, 500, 10.0, 3.0, 0.02)
    layouts = plan_layouts(CAT, request)
    d = layouts.disaggregated
    assert layouts.mode == "disaggregated" and d is not None
    agg = layouts.aggregated
    assert agg is not None and agg.chosen is not None
    assert d.cost_usd_per_hour < agg.chosen.prediction.cost_usd_per_hour
    assert d.reason.startswith("disaggregated: ") and "decode-only worker" in d.reason
    # within the SLO, TTFT made of its parts
    assert d.ttft_p_s <= 3.0 and d.tpot_p_s <= 0.02
    assert d.ttft_p_s >= d.prefill_ttft_s + d.kv_transfer_p_s + d.decode_first_step_s - 1e-12
    # the connector's rule, and the pools' counts carry the load with the headroom
    assert d.decode.cfg.tensor_parallel % d.prefill.cfg.tensor_parallel == 0
    for pool in (d.prefill, d.decode):
        assert pool.workers == workers_for_rate(10.0, pool.rate_per_worker_max, request.headroom)
    assert d.gpus_total == d.prefill.workers * d.prefill.cfg.gpus + d.decode.workers * d.decode.cfg.gpus
    assert d.tokens_per_s_per_gpu == pytest.approx(10.0 * 500 / d.gpus_total)


def test_on_and_off_search_one_layout() -> None:
    request = _request("llama-3.1-8b", 2000, 200, 5.0, 1.0, 0.03, gpus=("H100-SXM",))
    off = plan_layouts(CAT, request, "off")
    assert off.mode == "aggregated" and off.disaggregated is None
    on = plan_layouts(CAT, request, "on")
    assert on.mode == "disaggregated" and on.aggregated is None and on.disaggregated is not None
    assert on.disaggregated.prefill.cfg.gpu.name == "H100-SXM"
    with pytest.raises(ValueError):
        plan_layouts(CAT, request, "maybe")  # type: ignore[arg-type]


def test_no_disaggregated_plan_says_why() -> None:
    # TPOT 1 ms: no decode worker takes one step that fast
    why = plan_disaggregated(CAT, _request("llama-3.1-70b", 2000, 200, 1.0, 2.0, 0.001))
    assert isinstance(why, str) and "TPOT" in why


def test_pool_engine_args_carry_the_kv_connector() -> None:
    d = plan_disaggregated(CAT, _request("llama-3.1-8b", 2000, 200, 5.0, 1.0, 0.03, gpus=("H100-SXM",)))
    assert not isinstance(d, str)
    for pool in (d.prefill, d.decode):
        launch = pool_launch(pool, None, None, 2200)
        args = pool_engine_args(launch, pool.role)
        assert args[-2:] == ["--kv-transfer-config", kv_transfer_config(pool.role)]
        assert args[args.index("--max-num-seqs") + 1] == str(pool.max_batch)
        assert args[args.index("--max-num-batched-tokens") + 1] == str(pool.max_num_batched_tokens)
    assert kv_transfer_config("prefill") == '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def test_pools_pair_within_one_vendor_and_engine_release() -> None:
    for model, prec in (("qwen3-235b-a22b", "bf16"), ("llama-3.1-405b", "fp8")):
        request = PlanRequest(
            model=CAT.model(model), workload=Workload(2000, 300, 3.0), slo=Slo(2.0, 0.05), precisions=(prec,)
        )
        d = plan_disaggregated(CAT, request)
        assert not isinstance(d, str)
        assert d.prefill.cfg.gpu.vendor == d.decode.cfg.gpu.vendor
        assert d.prefill.cfg.engine.profile == d.decode.cfg.engine.profile


def test_plan_json_carries_the_layout() -> None:
    from kvscale.cli.plan_layouts import layout_lines, layouts, with_layouts
    from kvscale.planner.serialize import plan_to_dict

    # disaggregated wins: its pools are `chosen`, the aggregated plan beside it
    request = _request("llama-3.1-70b", 8000, 500, 10.0, 3.0, 0.02)
    result = plan(CAT, request)
    found = layouts(CAT, result, "auto")
    out = with_layouts(plan_to_dict(result), found, None, None)
    chosen = out["chosen"]
    assert chosen["mode"] == "disaggregated" and out["feasible"] is True
    for role in ("prefill", "decode"):
        pool = chosen[role]
        assert {"gpu", "tensor_parallel", "workers", "gpus", "engine_args"} <= set(pool)
        assert "--kv-transfer-config" in pool["engine_args"]
    assert "max_num_batched_tokens" in chosen["prefill"] and "max_batch" in chosen["decode"]
    assert chosen["gpus_total"] == chosen["prefill"]["gpus"] + chosen["decode"]["gpus"]
    assert chosen["kv_transfer_ms"] > 0 and chosen["tokens_per_s_per_gpu"] > 0
    beside = out["aggregated_beside"]
    assert beside["mode"] == "aggregated" and beside["cost_usd_per_hour"] > chosen["cost_usd_per_hour"]
    assert layout_lines(found)[0].startswith("Layout: disaggregated (auto): disaggregated: ")
    # a plan sized by the simulated check keeps its layout under auto, and says why
    kept = layouts(CAT, result, "auto", checked=True)
    assert kept.mode == "aggregated" and "does not replay two pools" in kept.reason

    # aggregated wins: `chosen` as it was, with its mode and the pools beside it
    request = _request("llama-3.1-8b", 200, 200, 20.0, 0.2, 0.05)
    result = plan(CAT, request)
    before = plan_to_dict(result)
    out = with_layouts(plan_to_dict(result), layouts(CAT, result, "auto"), None, None)
    assert out["chosen"]["mode"] == "aggregated"
    assert {k: v for k, v in out["chosen"].items() if k in before["chosen"]} == before["chosen"]
    assert out["chosen"]["disaggregated_beside"]["mode"] == "disaggregated"
    assert out["chosen"]["disaggregated_beside"]["reason"].startswith("aggregated: ")
    off = with_layouts(plan_to_dict(result), layouts(CAT, result, "off"), None, None)
    assert off["chosen"]["disaggregated_beside"] == {"why": "not searched (--disaggregation off)"}


def test_a_model_no_single_node_holds_has_no_pools_yet() -> None:
    # DeepSeek-R1 in bf16 (~1.3 TB) on 8 x 80 GB: only pipeline stages over nodes hold it
    why = plan_disaggregated(CAT, _request("deepseek-r1", 2000, 500, 1.0, 2.0, 0.08, gpus=("H100-SXM",)))
    assert isinstance(why, str) and why.startswith("no worker of one node holds the model")


def test_monotone_in_the_load_and_the_targets() -> None:
    model = CAT.model("llama-3.1-70b")
    h100 = CAT.gpu("H100-SXM")
    path = kv_transfer_path(CAT, h100, h100)
    assert path is not None
    times = [kv_transfer_s(model, AUTO, 4, t, path) for t in (100, 1000, 10_000)]
    assert times == sorted(times)
    # more TP: a smaller shard per GPU, a shorter transfer (GQA)
    assert kv_transfer_s(model, AUTO, 8, 4000, path) < kv_transfer_s(model, AUTO, 2, 4000, path)
    w = Workload(4000, 500, 5.0)
    loose, tight = Slo(2.0, 0.05), Slo(2.0, 0.025)
    # a tighter TPOT: a smaller batch limit and less rate per decode worker
    a, b = DecodeWorker(_cfg(), w, loose.tpot_s), DecodeWorker(_cfg(), w, tight.tpot_s)
    assert b.max_batch <= a.max_batch and b.max_rate(tight) <= a.max_rate(loose)
    # a longer TTFT share: more rate per prefill worker
    prefill = PrefillWorker(_cfg().with_chunk_budget(8192), w)
    assert prefill.max_rate(0.8, 95.0) <= prefill.max_rate(1.6, 95.0)
    # more load: never fewer GPUs, nor a lower cost
    sized = []
    for rps in (2.0, 8.0, 32.0):
        d = plan_disaggregated(CAT, _request("llama-3.1-70b", 4000, 500, rps, 2.0, 0.04, gpus=("H100-SXM",)))
        assert not isinstance(d, str)
        sized.append((d.gpus_total, d.cost_usd_per_hour))
    assert sized == sorted(sized)


def test_plan_json_under_on() -> None:
    from kvscale.cli.plan_layouts import infeasible, layouts, with_layouts
    from kvscale.planner.serialize import plan_to_dict

    request = _request("llama-3.1-8b", 2000, 200, 5.0, 1.0, 0.03, gpus=("H100-SXM",))
    result = plan(CAT, request)
    found = layouts(CAT, result, "on")
    out = with_layouts(plan_to_dict(result), found, None, None, result.feasible)
    assert out["chosen"]["mode"] == "disaggregated" and out["feasible"] is True
    assert out["aggregated_beside"]["mode"] == "aggregated"  # computed anyway: shown, not chosen
    assert not infeasible(found, result.feasible)
    # no pools meet TPOT 1 ms: nothing chosen, exit 1, the reason first among the suggestions
    request = _request("llama-3.1-70b", 2000, 200, 1.0, 2.0, 0.001, gpus=("H100-SXM",))
    result = plan(CAT, request)
    found = layouts(CAT, result, "on")
    out = with_layouts(plan_to_dict(result), found, None, None, result.feasible)
    assert out["chosen"] is None and out["feasible"] is False
    assert "TPOT" in out["suggestions"][0] and infeasible(found, result.feasible)


def test_no_layout_line_under_auto_without_pools() -> None:
    from kvscale.cli.plan_layouts import layout_lines, layouts

    result = plan(CAT, _request("deepseek-r1", 2000, 500, 1.0, 2.0, 0.08, gpus=("H100-SXM",)))
    assert layout_lines(layouts(CAT, result, "auto")) == []  # the plan's output as it was
    assert layout_lines(layouts(CAT, result, "on"))[0].startswith("Layout: none (on): no worker of one node")
