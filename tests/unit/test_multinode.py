"""A replica spanning nodes: tensor parallel within a node, pipeline parallel across nodes."""

from kvscale.planner.search import PlanRequest, plan
from kvscale.planner.serialize import candidate_to_dict
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo, Workload

CAT = default_catalog()


def test_two_stage_replica_spans_two_nodes_and_splits_weights_and_kv() -> None:
    model, gpu = CAT.model("llama-3.1-70b"), CAT.gpu("H100-SXM")
    one = ServingConfig.build(CAT, model, gpu, "bf16", 8)
    two = ServingConfig.build(CAT, model, gpu, "bf16", 8, pipeline_parallel=2)
    assert (one.gpus, one.nodes, one.gpus_per_node) == (8, 1, 8)
    assert (two.gpus, two.nodes, two.gpus_per_node) == (16, 2, 8)
    assert two.price_usd_per_hour == 16 * gpu.price_usd_per_gpu_hour
    assert two.memory.weights_bytes == one.memory.weights_bytes / 2
    assert two.memory.kv_bytes_per_token == one.memory.kv_bytes_per_token / 2
    assert two.unsupported_reason() is None


def test_pipeline_within_one_node_is_one_node() -> None:
    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu("H100-SXM"), "bf16", 2, pipeline_parallel=2)
    assert (cfg.gpus, cfg.nodes) == (4, 1)


def test_spanning_nodes_needs_whole_nodes_and_a_fabric() -> None:
    gpu = CAT.gpu("H100-SXM")
    partial = ServingConfig.build(CAT, CAT.model("llama-3.1-70b"), gpu, "bf16", 4, pipeline_parallel=3)
    assert "whole nodes" in (partial.unsupported_reason() or "")
    no_fabric = gpu.model_copy(update={"internode_bandwidth_bytes_per_s": None})
    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-70b"), no_fabric, "bf16", 8, pipeline_parallel=2)
    assert "inter-node fabric" in (cfg.unsupported_reason() or "")


def test_every_datacenter_gpu_says_where_its_internode_bandwidth_comes_from() -> None:
    for gpu in CAT.gpus.values():
        assert gpu.internode_bandwidth_bytes_per_s is not None, gpu.name
        assert gpu.internode_source, gpu.name


def _request(model: str, precision: str, gpus: tuple[str, ...], ttft: float = 3.0, tpot: float = 0.15) -> PlanRequest:
    return PlanRequest(
        model=CAT.model(model),
        workload=Workload(1000, 300, 1.0),
        slo=Slo(ttft, tpot),
        gpus=gpus,
        precisions=(precision,),
    )


def test_405b_bf16_on_h100_plans_two_nodes() -> None:
    result = plan(CAT, _request("llama-3.1-405b", "bf16", ("H100-SXM",)))
    assert result.chosen is not None
    chosen = result.chosen
    assert (chosen.tensor_parallel, chosen.pipeline_parallel, chosen.nodes) == (8, 2, 2)
    assert chosen.total_gpus == 16 * chosen.prediction.replicas
    assert "over 2 nodes (TP 8 x PP 2)" in chosen.reason
    single = [c for c in result.rejected if c.tensor_parallel == 8 and c.pipeline_parallel == 1]
    assert single and "does not fit" in single[0].reason
    out = candidate_to_dict(chosen)
    assert (out["nodes"], out["pipeline_parallel"], out["gpus_total"]) == (2, 2, 16 * chosen.prediction.replicas)


def test_deepseek_fp8_spans_two_h100_nodes_but_one_h200_node() -> None:
    h100 = plan(CAT, _request("deepseek-r1", "fp8", ("H100-SXM",)))
    assert h100.chosen is not None and h100.chosen.nodes == 2
    h200 = plan(CAT, _request("deepseek-r1", "fp8", ("H200",)))
    assert h200.chosen is not None and h200.chosen.nodes == 1


def test_a_single_node_plan_gets_no_multi_node_candidates() -> None:
    result = plan(CAT, _request("llama-3.1-70b", "bf16", ("H100-SXM",)))
    assert all(c.pipeline_parallel == 1 for c in result.candidates)


def test_suggestions_do_not_ask_for_more_tensor_parallelism_than_a_node_holds() -> None:
    result = plan(CAT, _request("llama-3.1-405b", "bf16", ("H100-SXM",), ttft=0.05, tpot=0.005))
    assert not result.feasible
    assert result.suggestions
    for line in result.suggestions:
        if "x8" in line:
            assert "larger tensor-parallel degree" not in line
            assert "whole H100-SXM node" in line
