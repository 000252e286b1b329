"""Deployments a real engine accepts: context limits, checkpoints and quantization, images per
accelerator, the model cache and start-up budget, vLLM / SGLang / TGI command lines.

Engine facts cited from the wheels (vLLM 0.11.0, SGLang 0.5.23) in kvscale/sizing/checkpoints.py,
context_limit.py and engine_args.py; `make conformance` runs vLLM's own parser over these args.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from kvscale.api.intent import parse_intent
from kvscale.api.models import parse_spec
from kvscale.control.inventory import GpuPool, gpu_inventory
from kvscale.control.planning import Planned, Unplanned, plan_service
from kvscale.control.pod_policy import DEFAULT_POLICY, PodPolicy
from kvscale.control.resources import EngineImageError, deployment, engine_image, planned_launch
from kvscale.control.status import plan_status
from kvscale.engines.args import engine_command, launch_for
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.checkpoints import (
    CheckpointError,
    cold_start,
    method_from_name,
    quantization_flag,
    replica_cold_start,
    resolve_checkpoint,
    startup_probe_budget_s,
    substitution,
)
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.context_limit import ContextLimitError, check_requested_context, context_limit
from tests.cluster.harness import node_objects

CAT = default_catalog()
NODES = list(node_objects(Path(__file__).resolve().parents[1] / "cluster" / "nodepool.yaml"))
MI300X_NODE = {
    "metadata": {"name": "mi300x-0", "labels": {"amd.com/gpu.product-name": "AMD-Instinct-MI300X"}},
    "spec": {},
    "status": {"allocatable": {"amd.com/gpu": "8"}},
}
CHAT: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 512, "outputTokens": 256, "requestsPerSecond": 2},
    "slo": {"timeToFirstToken": "1s", "timePerOutputToken": "80ms"},
}
# vllm/model_executor/layers/quantization/__init__.py (0.11.0) QuantizationMethods, the names kvscale emits
VLLM_QUANTIZATION_METHODS = {"fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors"}


def spec_with(**patch: Any) -> dict[str, Any]:
    spec = copy.deepcopy(CHAT)
    for key, value in patch.items():
        spec[key] = {**spec.get(key, {}), **value}
    return spec


def build(
    raw: dict[str, Any], nodes: list[dict[str, Any]] | None = None, policy: PodPolicy = DEFAULT_POLICY
) -> tuple[Planned, dict[str, Any]]:
    spec = parse_spec(raw)
    pools = gpu_inventory(CAT, nodes if nodes is not None else NODES, [])
    result = plan_service(parse_intent(raw), CAT, pools)
    assert isinstance(result, Planned), result.message
    chosen = result.chosen
    cfg = ServingConfig.build(
        CAT,
        result.model,
        CAT.gpu(chosen.gpu),
        chosen.precision,
        chosen.tensor_parallel,
        chosen.kv_cache_precision,
        spec.engine.type,
    )
    dep = deployment("svc", "uid", spec, result.model, cfg, chosen, pools[chosen.gpu], 1, 8000, policy=policy)
    return result, dep


def container(dep: dict[str, Any]) -> dict[str, Any]:
    return dict(dep["spec"]["template"]["spec"]["containers"][0])


def arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# --- max-model-len ---------------------------------------------------------------------------


def test_context_given_is_served_and_never_above_the_models_limit() -> None:
    llama8b = CAT.model("llama-3.1-8b")
    given = context_limit(llama8b, 32768, kv_capacity_tokens=500_000, block_tokens=16)
    assert given.max_model_len_tokens == 32768 and not given.lowered
    with pytest.raises(ContextLimitError) as refused:
        context_limit(llama8b, 200_000, kv_capacity_tokens=10**7, block_tokens=16)
    assert "200000" in str(refused.value) and "131072" in str(refused.value)
    # llama-2-7b's limit is 4096: a typical 3000 + 2000 request can never be served.
    with pytest.raises(ContextLimitError, match=r"5000 .* 4096"):
        check_requested_context(CAT.model("llama-2-7b"), None, "--max-context", 5000)


def test_default_context_is_the_limit_lowered_to_one_sequence_of_kv() -> None:
    llama8b = CAT.model("llama-3.1-8b")
    roomy = context_limit(llama8b, None, kv_capacity_tokens=400_000, block_tokens=16)
    assert roomy.max_model_len_tokens == 131072 and not roomy.lowered
    # 50 000 KV tokens: 90% of them in whole 16-token blocks = 45 000 (hand-computed: 45000 / 16 = 2812.5 -> 2812 x 16).
    tight = context_limit(llama8b, None, kv_capacity_tokens=50_000, block_tokens=16)
    assert tight.max_model_len_tokens == 2812 * 16 == 44992 and tight.lowered
    assert "131072" in tight.reason and "50000" in tight.reason
    # Never below the typical request the plan sized the cache for.
    assert context_limit(llama8b, None, 1000, 16, typical_tokens=960).max_model_len_tokens == 960


def test_operator_refuses_a_context_above_the_limit_naming_both_numbers() -> None:
    pools = gpu_inventory(CAT, NODES, [])
    result = plan_service(parse_intent(spec_with(workload={"maxContextTokens": 200_000})), CAT, pools)
    assert isinstance(result, Unplanned) and not result.retry and result.reason == "ContextTooLong"
    assert "spec.workload.maxContextTokens 200000" in result.message and "131072" in result.message


def test_status_and_engine_agree_on_the_longest_request() -> None:
    _, dep = build(spec_with(workload={"maxContextTokens": 16384}))
    assert arg(container(dep)["args"], "--max-model-len") == "16384"
    _, default = build(CHAT)
    served = int(arg(container(default)["args"], "--max-model-len"))
    assert 768 < served <= 131072  # not the typical 512 + 256 any more


# --- checkpoints and quantization ------------------------------------------------------------


def test_int4_and_int8_need_a_quantized_checkpoint() -> None:
    mistral = CAT.model("mistral-7b")
    with pytest.raises(CheckpointError) as no_source:
        resolve_checkpoint(mistral, CAT.precision("int4"), None)
    assert "spec.model.source" in str(no_source.value) and no_source.value.field == "spec.model.source"
    with pytest.raises(CheckpointError, match=r"spec.model.source .*16-bit"):
        resolve_checkpoint(mistral, CAT.precision("int8"), "hf://mistralai/Mistral-7B-v0.1")
    mine = resolve_checkpoint(mistral, CAT.precision("int4"), "hf://someone/Mistral-7B-AWQ")
    assert (mine.source, mine.method, mine.stored) == ("someone/Mistral-7B-AWQ", "awq", "int4")
    unknown = resolve_checkpoint(mistral, CAT.precision("int8"), "hf://someone/mistral-int8")
    assert unknown.method is None  # the engine reads quantization_config from its config.json


INSTRUCT_70B = "meta-llama/Llama-3.1-70B-Instruct"


def test_catalog_quantized_sources_and_online_fp8() -> None:
    llama70 = CAT.model(INSTRUCT_70B)
    awq = resolve_checkpoint(llama70, CAT.precision("int4"), None)
    assert awq.source == "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4" and awq.method == "awq"
    w8a8 = resolve_checkpoint(llama70, CAT.precision("int8"), None)
    assert w8a8.method == "compressed-tensors"
    online = resolve_checkpoint(CAT.model("mistral-7b"), CAT.precision("fp8"), None)
    assert online.online_fp8 and online.stored == "16bit" and online.method == "fp8"
    assert online.size_bytes(CAT.model("mistral-7b")) == pytest.approx(7.24e9 * 2)
    with pytest.raises(CheckpointError, match=r"int4 checkpoint but spec\.model\.precision is int8"):
        resolve_checkpoint(llama70, CAT.precision("int8"), "hf://hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4")


def test_quantization_flag_per_gpu_and_engine() -> None:
    llama70 = CAT.model(INSTRUCT_70B)
    awq = resolve_checkpoint(llama70, CAT.precision("int4"), None)
    assert quantization_flag("vllm", awq, CAT.gpu("H100-SXM")) == "awq_marlin"
    assert quantization_flag("vllm", awq, CAT.gpu("T4")) == "awq"  # marlin needs compute capability 8.0
    assert quantization_flag("vllm", awq, CAT.gpu("MI300X")) == "awq"  # ROCm has no marlin
    assert quantization_flag("tgi", awq, CAT.gpu("H100-SXM")) == "awq"
    gptq = resolve_checkpoint(CAT.model("Qwen/Qwen2.5-7B-Instruct"), CAT.precision("int8"), None)
    assert quantization_flag("vllm", gptq, CAT.gpu("A100-80GB")) == "gptq_marlin"
    w8a8 = resolve_checkpoint(llama70, CAT.precision("int8"), None)
    assert quantization_flag("vllm", w8a8, CAT.gpu("L4")) == "compressed-tensors"
    assert quantization_flag("sglang", w8a8, CAT.gpu("L4")) is None
    flags = {
        quantization_flag("vllm", resolve_checkpoint(CAT.model(named), CAT.precision(p), None), g)
        for m in CAT.models.values()
        for named in {m.hf_id, *(q.of[0] for q in m.quantized_sources)}
        for p in ("fp8", "int8", "int4")
        if p == "fp8" or any(q.precision == p and named in q.of for q in m.quantized_sources)
        for g in CAT.gpus.values()
    }
    assert flags - {None} <= VLLM_QUANTIZATION_METHODS


def test_method_from_name() -> None:
    assert method_from_name("TheBloke/Llama-2-7B-Chat-AWQ") == "awq"
    assert method_from_name("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8") == "gptq"
    assert method_from_name("neuralmagic/Meta-Llama-3.1-8B-Instruct-quantized.w8a8") == "compressed-tensors"
    assert method_from_name("meta-llama/Llama-3.1-405B-Instruct-FP8") == "fp8"
    assert method_from_name("org/hawqward-model") is None


def test_operator_refuses_int4_without_a_checkpoint() -> None:
    pools = gpu_inventory(CAT, NODES, [])
    raw = spec_with(model={"name": "mistral-7b", "precision": "int4"})
    result = plan_service(parse_intent(raw), CAT, pools)
    assert isinstance(result, Unplanned) and not result.retry and result.reason == "NoMatchingCheckpoint"
    assert "spec.model.source" in result.message
    raw["model"]["source"] = "hf://mistralai/Mistral-7B-v0.1"
    again = plan_service(parse_intent(raw), CAT, pools)
    assert isinstance(again, Unplanned) and again.reason == "NoMatchingCheckpoint"


def test_unset_precision_is_the_checkpoints_own_in_the_operator() -> None:
    """spec.model.precision unset: the checkpoint's own precision (DeepSeek's block-scaled fp8,
    gpt-oss's mxfp4), loaded as published without a --quantization flag; else bf16. The CLI's
    --precision defaults the same way (kvscale.sizing.checkpoints.default_precision)."""
    assert parse_spec(spec_with(model={"name": "gpt-oss-20b"})).model.precision is None
    oss, dep = build(spec_with(model={"name": "gpt-oss-20b"}))
    args = container(dep)["args"]
    assert oss.chosen.precision == "mxfp4" and args[0] == "openai/gpt-oss-20b" and "--quantization" not in args
    dense, _ = build(spec_with(model={"name": "llama-3.1-8b"}))
    assert dense.chosen.precision == "bf16"
    pools = gpu_inventory(CAT, NODES, [])
    deepseek = spec_with(
        model={"name": "deepseek-v3"},
        workload={"requestsPerSecond": 0.2},
        slo={"timeToFirstToken": "5s", "timePerOutputToken": "150ms"},
        hardware={"gpuTypes": ["H100-SXM"]},
    )
    planned = plan_service(parse_intent(deepseek), CAT, pools)
    assert isinstance(planned, Planned), planned.message
    assert planned.chosen.precision == "fp8" and planned.chosen.nodes == 2
    deepseek["model"]["precision"] = "bf16"  # asked for explicitly: still refused, naming the fix
    refused = plan_service(parse_intent(deepseek), CAT, pools)
    assert isinstance(refused, Unplanned) and refused.reason == "NoMatchingCheckpoint"
    assert "use precision fp8" in refused.message


def test_int4_deploys_the_catalog_awq_checkpoint_with_marlin() -> None:
    planned, dep = build(spec_with(model={"name": "meta-llama/Llama-3.1-8B-Instruct", "precision": "int4"}))
    args = container(dep)["args"]
    assert args[0] == "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
    assert arg(args, "--quantization") == "awq_marlin"
    assert dep["spec"]["template"]["metadata"]["annotations"]["kvscale.io/checkpoint"] == args[0]
    # Another repository than the one named: status.plan.reason (and the Planned condition) say so.
    assert planned.chosen.reason.startswith(
        "loads hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4 (int4, awq), a published quantization of "
        "meta-llama/Llama-3.1-8B-Instruct (the model named)"
    )
    assert plan_status(planned, 4096, ()).reason.startswith("loads hugging-quants/")


# Issue 31, defect 3: a precision switched the checkpoint to another model (the base model's
# int4 or fp8 was an Instruct model's quantization).


@pytest.mark.parametrize(
    "named", ["llama-3.1-70b", "meta-llama/Llama-3.1-70B", "llama-3.1-8b", "llama-2-7b", "qwen2.5-72b", "mixtral-8x7b"]
)
def test_a_base_models_int4_is_never_its_instruct_siblings_quantization(named: str) -> None:
    model = CAT.model(named)
    with pytest.raises(CheckpointError) as refused:
        resolve_checkpoint(model, CAT.precision("int4"), None)
    message = str(refused.value)
    assert f"none made from {model.hf_id}" in message and "set spec.model.source" in message
    sibling = next(q for q in model.quantized_sources if q.precision == "int4")
    assert f"made from {sibling.of[0]}, a different model than {model.hf_id}" in message  # offered, by name


def test_a_base_models_fp8_is_its_own_weights_quantized_online() -> None:
    base = CAT.model("llama-3.1-70b")
    fp8 = resolve_checkpoint(base, CAT.precision("fp8"), None)
    assert (fp8.source, fp8.online_fp8, substitution(fp8)) == ("meta-llama/Llama-3.1-70B", True, None)
    instruct = resolve_checkpoint(CAT.model("meta-llama/Meta-Llama-3.1-70B-Instruct"), CAT.precision("int4"), None)
    assert instruct.source == "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"  # the renamed repository too
    assert instruct.quantizes == "meta-llama/Meta-Llama-3.1-70B-Instruct"


def test_the_operator_refuses_a_base_models_int4_naming_the_source_field() -> None:
    pools = gpu_inventory(CAT, NODES, [])
    raw = spec_with(model={"name": "meta-llama/Llama-3.1-8B", "precision": "int4"})
    refused = plan_service(parse_intent(raw), CAT, pools)
    assert isinstance(refused, Unplanned) and refused.reason == "NoMatchingCheckpoint" and not refused.retry
    assert "spec.model.source" in refused.message and "meta-llama/Llama-3.1-8B-Instruct" in refused.message
    # Named by its 16-bit id, the model is served as named; nothing to say.
    planned, dep = build(spec_with(model={"name": "meta-llama/Llama-3.1-8B", "precision": "fp8"}))
    assert container(dep)["args"][0] == "meta-llama/Llama-3.1-8B" and not planned.chosen.reason.startswith("loads")


def test_every_catalog_quantization_names_a_checkpoint_of_its_model() -> None:
    for m in CAT.models.values():
        for q in m.quantized_sources:
            assert q.of and all(CAT.model(o).name == m.name for o in q.of), (m.name, q.source)


# --- images per accelerator ------------------------------------------------------------------


def test_mi300x_gets_the_rocm_image_overridable_per_service() -> None:
    raw = spec_with(hardware={"gpuTypes": ["MI300X"]})
    _, dep = build(raw, [MI300X_NODE])
    c = container(dep)
    assert c["image"].startswith("rocm/vllm:") and c["resources"]["limits"] == {"amd.com/gpu": "1"}
    term = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "amd.com/gpu.product-name"
    raw["engine"] = {"rocmImage": "rocm/vllm:pinned", "image": "vllm/vllm-openai:v0.12.0"}
    assert container(build(raw, [MI300X_NODE])[1])["image"] == "rocm/vllm:pinned"
    _, nvidia = build(spec_with(engine={"image": "vllm/vllm-openai:v0.12.0"}))
    assert container(nvidia)["image"] == "vllm/vllm-openai:v0.12.0"


def test_engines_without_a_rocm_image_leave_amd_gpus_out() -> None:
    pools = gpu_inventory(CAT, [*NODES, MI300X_NODE], [])
    raw = spec_with(engine={"type": "sglang"}, hardware={"gpuTypes": ["MI300X"]})
    # Only MI300X allowed, no ROCm image for SGLang in the catalog: nothing left to plan on.
    refused = plan_service(parse_intent(raw), CAT, pools)
    assert isinstance(refused, Unplanned) and refused.reason == "NoEngineImage"
    assert "spec.engine.rocmImage" in refused.message
    anywhere = plan_service(parse_intent(spec_with(engine={"type": "sglang"})), CAT, pools)
    assert isinstance(anywhere, Planned) and anywhere.chosen.gpu != "MI300X"
    assert all(c.gpu != "MI300X" for c in anywhere.plan.candidates)
    raw["engine"]["rocmImage"] = "lmsysorg/sglang:my-rocm"
    assert isinstance(plan_service(parse_intent(raw), CAT, pools), Planned)
    with pytest.raises(EngineImageError, match=r"spec.engine.rocmImage"):
        engine_image(parse_spec(spec_with(engine={"type": "sglang"})), CAT.engine("sglang"), CAT.gpu("MI300X"))


# --- model cache, cold start, startup probe --------------------------------------------------


def test_cache_volume_is_mounted_where_each_engine_keeps_weights() -> None:
    _, pvc = build(spec_with(model={"name": "llama-3.1-8b", "cache": {"persistentVolumeClaim": "weights"}}))
    c, pod = container(pvc), pvc["spec"]["template"]["spec"]
    assert {"name": "model-cache", "mountPath": "/root/.cache/huggingface"} in c["volumeMounts"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "weights"}} in pod["volumes"]
    assert {"name": "HF_HOME", "value": "/root/.cache/huggingface"} in c["env"]
    _, host = build(
        spec_with(model={"name": "llama-3.1-8b", "cache": {"hostPath": "/mnt/models"}}, engine={"type": "tgi"}),
        policy=PodPolicy(host_path_prefixes=("/mnt/models",), host_path_writable=True),
    )
    c, pod = container(host), host["spec"]["template"]["spec"]
    assert {"name": "model-cache", "mountPath": "/data"} in c["volumeMounts"]
    assert {"name": "HUGGINGFACE_HUB_CACHE", "value": "/data"} in c["env"]
    assert {"name": "model-cache", "hostPath": {"path": "/mnt/models", "type": "DirectoryOrCreate"}} in pod["volumes"]
    _, none = build(CHAT)
    assert {"name": "model-cache", "emptyDir": {"sizeLimit": "20Gi"}} in none["spec"]["template"]["spec"]["volumes"]


@pytest.mark.parametrize("bad", [{}, {"persistentVolumeClaim": "a", "hostPath": "/b"}, {"hostPath": "relative"}])
def test_cache_needs_exactly_one_absolute_place(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="cache"):
        parse_spec(spec_with(model={"name": "llama-3.1-8b", "cache": bad}))


def test_cold_start_counts_download_when_uncached_and_load_per_shard() -> None:
    engine = CAT.engine("vllm")
    # 405B in bf16: 811.8 GB. Downloaded at 250 MB/s = 3247 s; 8 shards of 101.5 GB at 1 GB/s = 101.5 s.
    size = CAT.model("llama-3.1-405b").params * 2.0
    first = cold_start(size, 8, engine, cached=False)
    assert first.download_s == pytest.approx(405.9e9 * 2 / 250e6)
    assert first.load_s == pytest.approx(405.9e9 * 2 / 8 / 1e9)
    assert first.total_s == pytest.approx(engine.cold_start_fixed_s + first.download_s + first.load_s)
    assert cold_start(size, 8, engine, cached=True).download_s == 0.0
    assert cold_start(size, 8, engine, cached=False, download_bytes_per_s=1e9).download_s == pytest.approx(811.8)
    assert startup_probe_budget_s(first) == pytest.approx(2 * first.total_s)
    assert startup_probe_budget_s(cold_start(1e9, 1, engine, cached=True)) == 600.0


def test_startup_probe_budget_covers_a_first_download() -> None:
    _, dep = build(spec_with(model={"name": "llama-3.1-70b"}, slo={"timeToFirstToken": "3s"}))
    probe = container(dep)["startupProbe"]
    budget_s = probe["periodSeconds"] * probe["failureThreshold"]
    download_s = 70.6e9 * 2 / CAT.engine("vllm").download_bytes_per_s
    assert budget_s >= 2 * download_s  # 141 GB: the old 20-minute probe would have killed it


# --- engines ---------------------------------------------------------------------------------


def test_sglang_command_line() -> None:
    _, dep = build(spec_with(engine={"type": "sglang"}, model={"name": "llama-3.1-8b", "kvCachePrecision": "fp8"}))
    c = container(dep)
    args = c["args"]
    assert c["command"] == ["python3", "-m", "sglang.launch_server"] and c["image"].startswith("lmsysorg/sglang")
    assert arg(args, "--model-path") == "meta-llama/Llama-3.1-8B" and "--enable-metrics" in args
    assert arg(args, "--host") == "0.0.0.0" and arg(args, "--port") == "8000"
    for flag in ("--tp-size", "--max-running-requests", "--context-length", "--chunked-prefill-size"):
        assert int(arg(args, flag)) >= 1
    assert arg(args, "--mem-fraction-static") == "0.88" and arg(args, "--kv-cache-dtype") == "fp8_e4m3"
    assert c["startupProbe"]["httpGet"]["path"] == "/health"


def test_tgi_command_line() -> None:
    _, dep = build(spec_with(engine={"type": "tgi"}, workload={"maxContextTokens": 8192}))
    c = container(dep)
    args = c["args"]
    assert c["command"] == ["text-generation-launcher"] and "text-generation-inference" in c["image"]
    assert arg(args, "--model-id") == "meta-llama/Llama-3.1-8B"
    assert arg(args, "--max-total-tokens") == "8192" and arg(args, "--max-input-tokens") == "8191"
    assert int(arg(args, "--max-batch-prefill-tokens")) >= 8191  # TGI: must hold one whole prompt
    assert int(arg(args, "--num-shard")) >= 1 and int(arg(args, "--max-concurrent-requests")) >= 1


def test_tgi_refuses_an_fp8_kv_cache() -> None:
    pools = gpu_inventory(CAT, NODES, [])
    raw = spec_with(engine={"type": "tgi"}, model={"name": "llama-3.1-8b", "kvCachePrecision": "fp8"})
    result = plan_service(parse_intent(raw), CAT, pools)
    assert isinstance(result, Unplanned) and result.reason == "EngineUnsupported"
    assert "spec.engine.type" in result.message


def test_the_planner_uses_each_engines_profile() -> None:
    model = CAT.model("llama-3.1-8b")
    gpu = CAT.gpu("L4")
    memory = {e: ServingConfig.build(CAT, model, gpu, engine=e).memory.usable_bytes for e in ("vllm", "sglang", "tgi")}
    assert memory["sglang"] == pytest.approx(gpu.memory_bytes * 0.88)
    assert memory["tgi"] == pytest.approx(gpu.memory_bytes * 0.93)


def test_vllm_args_carry_chunk_budget_dtype_and_port() -> None:
    model = CAT.model("llama-3.1-8b")
    cfg = ServingConfig.build(CAT, model, CAT.gpu("T4"), "fp16", 2)
    ckpt = resolve_checkpoint(model, cfg.precision, None)
    command, args = engine_command(launch_for(cfg, ckpt, 32, 4096, 9000))
    assert command == ["vllm", "serve"] and args[0] == "meta-llama/Llama-3.1-8B"
    assert arg(args, "--max-num-batched-tokens") == "2048" and arg(args, "--dtype") == "float16"
    assert args[-2:] == ["--port", "9000"] and "--quantization" not in args


def test_planned_launch_is_what_the_builder_deploys() -> None:
    result, dep = build(CHAT)
    chosen, model = result.chosen, result.model
    assert chosen is not None and chosen.prediction is not None and model is not None
    cfg = ServingConfig.build(CAT, model, CAT.gpu(chosen.gpu), chosen.precision, chosen.tensor_parallel)
    planned = planned_launch(
        parse_spec(CHAT), cfg, chosen.prediction.max_batch, chosen.prediction.kv_cache_tokens, 8000
    )
    assert container(dep)["args"] == engine_command(planned.launch)[1]
    probe = container(dep)["startupProbe"]
    assert probe["failureThreshold"] == math.ceil(planned.startup_probe_budget_s / probe["periodSeconds"])


def test_pool_product_label_is_used_as_is() -> None:
    pool = GpuPool("MI300X", "AMD-Instinct-MI300X", "amd.com/gpu.product-name", "amd.com/gpu", 8, 0, 8)
    assert pool.free == 8


def test_replica_cold_start_is_what_a_policy_defaults_to() -> None:
    model, engine = CAT.model(INSTRUCT_70B), CAT.engine("vllm")
    uncached = replica_cold_start(model, CAT.precision("int4"), 2, engine, None, cached=False)
    # The AWQ checkpoint (0.52 bytes per parameter), not the 16-bit one, is downloaded.
    assert uncached.download_s == pytest.approx(70.6e9 * 0.52 / 250e6)
    assert replica_cold_start(model, CAT.precision("int4"), 2, engine, None, cached=True).download_s == 0.0
    with pytest.raises(CheckpointError):
        replica_cold_start(CAT.model("mistral-7b"), CAT.precision("int4"), 1, engine, None, cached=True)


def test_the_policy_defaults_to_the_modelled_start_with_download() -> None:
    from kvscale.api.intent import parse_intent
    from kvscale.control.scaling import default_cold_start_s

    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-70b"), CAT.gpu("H100-SXM"), "bf16", 4)
    uncached = default_cold_start_s(parse_intent(spec_with(model={"name": "llama-3.1-70b"})), cfg)
    cached = default_cold_start_s(
        parse_intent(spec_with(model={"name": "llama-3.1-70b", "cache": {"persistentVolumeClaim": "w"}})), cfg
    )
    assert uncached == pytest.approx(45 + 70.6e9 * 2 / 250e6 + 70.6e9 * 2 / 4 / 1e9)  # 645 s
    assert cached == pytest.approx(cfg.cold_start_s)  # engine start + shard load only


def test_tgi_quantized_checkpoints_take_no_dtype() -> None:
    model = {"name": "meta-llama/Llama-3.1-8B-Instruct", "precision": "int8"}
    _, dep = build(spec_with(engine={"type": "tgi"}, model=model))
    args = container(dep)["args"]
    assert arg(args, "--quantize") == "compressed-tensors" and "--dtype" not in args
    assert arg(args, "--model-id") == "neuralmagic/Meta-Llama-3.1-8B-Instruct-quantized.w8a8"
