"""Issue 31: plans stay on the model asked for and say what they assume (defects 3, 4, 6, 7
and the LOW items on plans), as a user of `kvscale plan` and of the operator meets them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kvscale.cli import app
from kvscale.sizing.catalog import load_catalog
from kvscale.sizing.config import mxfp4_unsupported

runner = CliRunner()
CATALOG = load_catalog()
LOAD = ["--ttft", "1s", "--tpot", "50ms", "--rps", "4", "--input", "512", "--output", "256"]


def plan_json(*args: str, code: int = 0) -> Any:
    result = runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


# --- defect 3: a precision never switches the model ------------------------------------------


def test_a_base_models_fp8_is_its_own_checkpoint_quantized_online() -> None:
    chosen = plan_json("-m", "llama-3.1-70b", *LOAD, "--precision", "fp8", "--gpu", "H100-SXM")["chosen"]
    assert chosen["checkpoint"] == "meta-llama/Llama-3.1-70B" and chosen["checkpoint_note"] is None
    args = chosen["engine_args"]
    assert args[0] == "meta-llama/Llama-3.1-70B" and args[args.index("--quantization") + 1] == "fp8"


def test_the_fp8_hint_beside_a_base_model_names_the_base_model() -> None:
    chosen = plan_json("-m", "llama-3.1-70b", *LOAD, "--gpu", "H100-SXM")["chosen"]
    assert chosen["precision"] == "bf16"
    assert chosen["fp8_beside"]["checkpoint"] == "meta-llama/Llama-3.1-70B quantized online"


def test_a_base_models_int4_is_refused_naming_source_not_swapped() -> None:
    out = runner.invoke(app, ["plan", "-m", "meta-llama/Llama-3.1-70B", *LOAD, "--precision", "int4"])
    assert out.exit_code == 2, out.output
    text = " ".join(out.output.split())
    assert "none made from meta-llama/Llama-3.1-70B" in text and "set --source" in text
    assert "made from meta-llama/Llama-3.1-70B-Instruct, a different model" in text


def test_a_quantization_of_the_model_named_is_served_and_said() -> None:
    named = ["-m", "meta-llama/Llama-3.1-70B-Instruct", *LOAD, "--precision", "int4", "--gpu", "H100-SXM"]
    chosen = plan_json(*named)["chosen"]
    assert chosen["checkpoint"] == "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"
    assert (
        "a published quantization of meta-llama/Llama-3.1-70B-Instruct (the model named)" in chosen["checkpoint_note"]
    )
    human = runner.invoke(app, ["plan", *named])
    assert human.exit_code == 0, human.output
    assert "  checkpoint: loads hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4 (int4, awq)" in human.output


# --- defect 4: the operator's refusals name the cluster's GPUs and a memory misfit as such --


def _operator_outcome(**changes: Any) -> Any:
    from kvscale.api.intent import parse_intent
    from kvscale.control.inventory import gpu_inventory
    from kvscale.control.planning import plan_service
    from kvscale.sizing.catalog import default_catalog
    from tests.cluster.harness import node_objects

    cat = default_catalog()
    nodes = list(node_objects(Path(__file__).resolve().parents[1] / "cluster" / "nodepool.yaml"))
    pools = gpu_inventory(cat, nodes, [])
    spec = {
        "model": {"name": "llama-3.1-70b"},
        "workload": {"inputTokens": 2048, "outputTokens": 256, "requestsPerSecond": 2},
        "slo": {"timeToFirstToken": "2s", "timePerOutputToken": "80ms"},
        **changes,
    }
    return cat, pools, plan_service(parse_intent(spec), cat, pools)


def test_an_infeasible_slo_suggests_only_gpu_types_the_cluster_has() -> None:
    cat, pools, outcome = _operator_outcome(slo={"timeToFirstToken": "40ms", "timePerOutputToken": "4ms"})
    assert outcome.reason == "SLOInfeasible" and not outcome.retry
    named = {g for g in cat.gpus if re.search(rf"(?<![\w-]){re.escape(g)}(?![\w-])", outcome.message)}
    assert named and named <= set(pools), outcome.message  # H100-SXM, A100-80GB, ...: never B200
    assert "spec.slo.timePerOutputToken: " in outcome.message


def test_a_model_that_fits_no_allowed_gpu_is_does_not_fit_naming_the_fields() -> None:
    model = {"name": "llama-3.1-405b"}
    _, _, outcome = _operator_outcome(model=model, hardware={"maxTensorParallel": 2})
    assert outcome.reason == "DoesNotFit" and not outcome.retry, outcome.message
    text = outcome.message
    assert "llama-3.1-405b at bf16 fits in no allowed GPU's memory" in text and "does not fit:" in text
    assert "spec.model.precision: fp8" in text and "raise spec.hardware.maxTensorParallel above 2" in text
    assert "--" not in text and "SLO" not in text
    # Narrowed to a small GPU type while the cluster has larger ones: gpuTypes names those.
    _, _, narrow = _operator_outcome(hardware={"gpuTypes": ["A10G"], "maxTensorParallel": 1})
    assert narrow.reason == "DoesNotFit", narrow.message
    assert "add A100-80GB, H100-SXM (in the cluster, larger) to spec.hardware.gpuTypes" in narrow.message


# --- LOW: what a plan assumes is said, and rates are rounded for people ---------------------

LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
}


def test_a_config_json_missing_shapes_is_planned_with_a_warning_naming_each_default(tmp_path: Path) -> None:
    from kvscale.sizing.hf_config import arch_from_hf_config, assumed_defaults

    assert assumed_defaults(LLAMA_CONFIG) == (
        "config.json has no num_hidden_layers: planned with transformers' llama default num_hidden_layers=32",
        "config.json has no intermediate_size: planned with transformers' llama default intermediate_size=11008",
        "config.json has no vocab_size: planned with transformers' llama default vocab_size=32000",
    )
    assert (
        assumed_defaults({**LLAMA_CONFIG, "num_hidden_layers": 16, "intermediate_size": 8192, "vocab_size": 128256})
        == ()
    )
    assert "assumed: config.json has no num_hidden_layers" in arch_from_hf_config(LLAMA_CONFIG).source
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_CONFIG, "num_hidden_layers": 16, "intermediate_size": 8192}))
    result = runner.invoke(app, ["plan", "-m", str(config), *LOAD, "--gpu", "L4", "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # the warning stays off the JSON
    warning = " ".join(result.stderr.split())
    assert "config.json has no vocab_size: planned with transformers' llama default vocab_size=32000" in warning
    assert "num_hidden_layers" not in warning


TRACE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "traces" / "azure-llm-conv-2023.csv"
TRACE_PLAN = ["-m", "llama-3.1-8b", "--ttft", "2s", "--tpot", "100ms", "--trace", str(TRACE), "--gpu", "H100-SXM"]


def test_plan_trace_says_the_context_limit_is_the_traces_longest_request() -> None:
    chosen = plan_json(*TRACE_PLAN)["chosen"]
    assert chosen["max_context_tokens"] < 131072
    assert chosen["max_context_reason"].startswith("the trace's longest request, not llama-3.1-8b's limit 131072")
    assert "set --max-context" in chosen["max_context_reason"]
    asked = plan_json(*TRACE_PLAN, "--max-context", "16384")["chosen"]
    assert (asked["max_context_tokens"], asked["max_context_reason"]) == (16384, "--max-context 16384")


def test_plan_rounds_the_rate_for_people_and_keeps_it_exact_in_json() -> None:
    from kvscale.cli.planning import people_rate

    assert [people_rate(r) for r in (6.766667, 10.0, 1000000.0, 0.0333333)] == ["6.77", "10", "1000000", "0.0333"]
    exact = plan_json(*TRACE_PLAN)["workload"]["requests_per_s"]
    human = runner.invoke(app, ["plan", *TRACE_PLAN])
    assert human.exit_code == 0, human.output
    assert f"llama-3.1-8b: {people_rate(exact)} req/s, " in human.output and people_rate(exact) != f"{exact:g}"


# --- defect 7: MXFP4 only where vLLM runs it; the ROCm image pinned ------------------------


def test_gpt_oss_runs_mxfp4_on_mi300x_only_with_a_rocm_image_that_runs_it() -> None:
    # The vllm-0.11 profile's ROCm image (rocm7.0.0_vllm_0.11.1, after the 0.10.2 image that added
    # GPT-OSS and FP4 models) runs MXFP4 MoE: a plan on MI300X only is found, with the ROCm image.
    only_amd = runner.invoke(app, ["plan", "-m", "gpt-oss-120b", *LOAD, "--gpu", "MI300X", "--json"])
    assert only_amd.exit_code == 0, only_amd.stdout
    chosen = json.loads(only_amd.stdout)["chosen"]
    assert (chosen["gpu"], chosen["precision"]) == ("MI300X", "mxfp4")
    # A profile whose ROCm image is not known to carry triton_kernels refuses it, saying why.
    engine = CATALOG.engine("vllm")
    old_image = engine.model_copy(
        update={"rocm_mxfp4": False, "rocm_image": "rocm/vllm:rocm6.4.1_vllm_0.10.1_20250909"}
    )
    problem = mxfp4_unsupported(CATALOG.gpu("MI300X"), old_image)
    assert problem and "triton_kernels" in problem and "rocm6.4.1_vllm_0.10.1" in problem
    assert mxfp4_unsupported(CATALOG.gpu("MI300X"), engine) is None
    assert mxfp4_unsupported(CATALOG.gpu("H100-SXM"), old_image) is None  # NVIDIA: Triton/Marlin/FlashInfer
    assert "compute capability 8.0" in (mxfp4_unsupported(CATALOG.gpu("T4"), engine) or "")


def test_vllm_images_are_pinned_on_both_platforms() -> None:
    from kvscale.sizing.catalog import default_catalog

    vllm = default_catalog().engine("vllm")
    for image in (vllm.image, vllm.rocm_image):
        assert image is not None and ":" in image and not image.endswith(":latest"), image
    assert vllm.rocm_image is not None and vllm.rocm_image.startswith("rocm/vllm:rocm")


# --- defect 6: no GPU is rated slower than its smaller sibling on the same die ---------------


def _sibling_pairs() -> list[tuple[str, str]]:
    """(larger, smaller): the same die, at least the other's peak 16-bit FLOPs, bandwidth and memory."""
    from kvscale.sizing.catalog import default_catalog

    gpus = default_catalog().gpus.values()
    return [
        (a.name, b.name)
        for a in gpus
        for b in gpus
        if a.name != b.name
        and a.chip is not None
        and a.chip == b.chip
        and a.flops_16bit_per_s >= b.flops_16bit_per_s
        and a.hbm_bandwidth_bytes_per_s >= b.hbm_bandwidth_bytes_per_s
        and a.memory_bytes >= b.memory_bytes
    ]


def test_siblings_exist_for_the_dies_the_issue_names() -> None:
    pairs = _sibling_pairs()
    assert ("A100-80GB", "A100-40GB") in pairs and ("H200", "H100-SXM") in pairs and ("L40S", "L40") in pairs


def test_no_gpu_is_rated_slower_than_its_smaller_sibling_on_any_catalog_model() -> None:
    from kvscale.sizing.batching import predict_batch
    from kvscale.sizing.catalog import default_catalog
    from kvscale.sizing.config import ServingConfig

    cat = default_catalog()
    checked = 0
    for larger, smaller in _sibling_pairs():
        for model in cat.models.values():
            precision = model.native_precision or "bf16"
            for tp in (1, 8):  # one GPU (the die alone) and a whole node
                small = ServingConfig.build(cat, model, cat.gpu(smaller), precision, tp)
                big = ServingConfig.build(cat, model, cat.gpu(larger), precision, tp)
                if small.unsupported_reason() or big.unsupported_reason() or not small.memory.fits:
                    continue
                if cat.link(cat.gpu(larger), tp) != cat.link(cat.gpu(smaller), tp) and tp > 1:
                    continue  # a slower link is not the die: compare where the links match
                for batch in (1, 16, 128):
                    s = predict_batch(small, batch, 1024, 256)
                    b = predict_batch(big, batch, 1024, 256)
                    if not s.fits:
                        continue
                    assert b.fits, (larger, smaller, model.name, tp, batch)
                    assert b.ttft_s is not None and s.ttft_s is not None and b.tpot_s is not None
                    assert s.tpot_s is not None
                    assert b.tpot_s <= s.tpot_s * (1 + 1e-9), (
                        larger,
                        smaller,
                        model.name,
                        tp,
                        batch,
                        b.tpot_s,
                        s.tpot_s,
                    )
                    assert b.ttft_s <= s.ttft_s * (1 + 1e-9), (larger, smaller, model.name, tp, batch)
                    checked += 1
    assert checked > 100


def test_the_a100_80gb_serves_at_least_the_a100_40gbs_rate_per_replica() -> None:
    args = [
        "-m",
        "llama-3.1-8b",
        "--ttft",
        "500ms",
        "--tpot",
        "50ms",
        "--rps",
        "10",
        "--input",
        "512",
        "--output",
        "256",
    ]
    rate = {}
    for gpu in ("A100-40GB", "A100-80GB"):
        chosen = plan_json(*args, "--gpu", gpu, "--tp", "1")["chosen"]
        rate[gpu] = chosen["rate_per_replica_max"]
    assert rate["A100-80GB"] >= rate["A100-40GB"], rate
