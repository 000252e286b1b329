"""A replica spanning nodes: tensor parallel within a node, pipeline parallel across nodes."""

from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig

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
