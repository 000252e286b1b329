"""Issue 38, LOW: inputs refused at the edge with the field named, before they reach the
planner or a pod: a request rate the queueing code cannot hold (1e308 became infinity and
failed every reconcile without a status), engine args that repeat a flag kvscale sets from the
plan (the engine takes the last one), and an image that is not an image reference."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from kvscale.api.crd import crd
from kvscale.api.intent import SpecError, read_spec
from kvscale.api.models import MAX_REQUESTS_PER_SECOND
from kvscale.engines.args import OWNED_FLAGS, EngineLaunch, engine_command, owned_flag
from kvscale.sizing.checkpoints import EngineType

BASE: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": 4},
    "slo": {"timeToFirstToken": "500ms", "timePerOutputToken": "50ms"},
}


def with_(**patch: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    for key, value in patch.items():
        out[key] = {**out.get(key, {}), **value}
    return out


def refused(body: dict[str, Any]) -> str:
    got = read_spec(body)
    assert isinstance(got, SpecError), body
    return got.message


@pytest.mark.parametrize("rate", [1e308, math.inf, MAX_REQUESTS_PER_SECOND * 1.01])
def test_a_rate_beyond_the_bound_is_refused_naming_the_field(rate: float) -> None:
    message = refused(with_(workload={"requestsPerSecond": rate}))
    assert "spec.workload.requestsPerSecond" in message and f"{MAX_REQUESTS_PER_SECOND:.0f}" in message


def test_nan_is_refused() -> None:
    assert "spec.workload.requestsPerSecond" in refused(with_(workload={"requestsPerSecond": math.nan}))


def test_the_bound_is_in_the_crd() -> None:
    workload = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert workload["workload"]["properties"]["requestsPerSecond"]["maximum"] == MAX_REQUESTS_PER_SECOND


def _launch(engine: EngineType) -> EngineLaunch:
    """Every option on, so every flag the builder can emit is emitted."""
    return EngineLaunch(
        engine=engine,
        source="org/model",
        tensor_parallel=4,
        max_batch=64,
        max_model_len=8192,
        chunk_budget_tokens=2048,
        memory_fraction=0.9,
        dtype="bfloat16",
        quantization="fp8",
        kv_cache_fp8=True,
        port=8000,
        pipeline_parallel=2,
        expert_parallel=True,
        data_parallel=2,
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi"])
def test_every_flag_kvscale_sets_is_owned(engine: EngineType) -> None:
    _, args = engine_command(_launch(engine))
    # SGLang's --enable-metrics is always set and takes no value: given again, it changes nothing.
    flags = {a for a in args if a.startswith("-")} - {"--enable-metrics"}
    assert flags and flags <= set(OWNED_FLAGS[engine]), flags - set(OWNED_FLAGS[engine])
    if engine == "vllm":
        assert owned_flag(engine, "--model") is not None  # the positional source has a flag spelling too


@pytest.mark.parametrize(
    ("engine", "arg", "flag"),
    [
        ("vllm", "--tensor-parallel-size", "--tensor-parallel-size"),
        ("vllm", "-tp", "--tensor-parallel-size"),
        ("vllm", "--tensor_parallel_size=8", "--tensor-parallel-size"),
        ("vllm", "--port=9000", "--port"),
        ("vllm", "--max-model-len", "--max-model-len"),
        ("sglang", "--tensor-parallel-size", "--tp-size"),
        ("sglang", "--port", "--port"),
        ("tgi", "-p", "--port"),
        ("tgi", "--num-shard=2", "--num-shard"),
    ],
)
def test_owned_flags_in_engine_args_are_refused(engine: str, arg: str, flag: str) -> None:
    message = refused(with_(engine={"type": engine, "args": ["--enable-prefix-caching", arg, "8"]}))
    assert f"spec.engine.args[1]: {arg.split('=')[0]} sets {flag}" in message and "remove it" in message


@pytest.mark.parametrize("args", [["--enable-prefix-caching"], ["--seed=7", "--enforce-eager"], ["--max-loras", "4"]])
def test_other_engine_args_pass(args: list[str]) -> None:
    assert not isinstance(read_spec(with_(engine={"args": args})), SpecError)


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm openai:v0.11.0",
        "vllm/vllm-öpenai:v0.11.0",
        "Vllm/vllm-openai:v0.11.0",
        "vllm/vllm-openai:v0.11.0 ",
        "vllm/vllm-openai:",
        "vllm/vllm-openai@sha256:abc",
    ],
)
def test_an_image_that_is_not_a_reference_is_refused(image: str) -> None:
    for field, key in (("image", "spec.engine.image"), ("rocmImage", "spec.engine.rocmImage")):
        message = refused(with_(engine={field: image}))
        assert key in message and "image reference" in message, message


@pytest.mark.parametrize(
    "image",
    [
        "busybox",
        "ledger:1.0",
        "vllm/vllm-openai:v0.11.0",
        "registry.local:5000/vllm/vllm-openai:v0.11.0",
        "ghcr.io/huggingface/text-generation-inference:3.3.7-rocm",
        "rocm/vllm:rocm7.0.0_vllm_0.11.1_20251103",
        "localhost/my_org/engine@sha256:" + "a" * 64,
        "Registry.Example.com/vllm/vllm-openai:v0.11.0@sha256:" + "0" * 64,
    ],
)
def test_image_references_pass(image: str) -> None:
    assert not isinstance(read_spec(with_(engine={"image": image})), SpecError)
