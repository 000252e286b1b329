"""`--engine NAME` and `--engine-version` on plan, predict and simulate: any catalog profile,
by engine or by release, named in the JSON; a version honoured or refused, never ignored."""

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from kvscale.cli import app
from kvscale.sizing.catalog import default_catalog

runner = CliRunner()
PLAN = ["plan", "-m", "llama-3.1-8b", "--ttft", "500ms", "--tpot", "50ms", "--rps", "10", "--input", "512"]
PLAN += ["--output", "256", "--gpu", "H100-SXM"]
PREDICT = ["predict", "-m", "llama-3.1-8b", "--gpu", "H100-SXM", "--batch", "8", "--input", "2048", "--output", "64"]
SIMULATE = ["simulate", "-m", "llama-3.1-8b", "--ttft", "1s", "--tpot", "50ms", "--gpu", "H100-SXM", "--policy"]
SIMULATE += ["static", "--concurrency", "4", "--input", "512", "--output", "32", "--duration", "20s"]
COMMAND = ["--engine-command", "vllm serve meta-llama/Llama-3.1-8B -tp 1"]


def run_json(*args: str) -> Any:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def refused(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


def newest(engine: str) -> str:
    return default_catalog().engine(engine).profile


@pytest.mark.parametrize(
    ("options", "profile"),
    [
        ((), newest("vllm")),
        (("--engine", "tensorrt-llm"), "tensorrt-llm-0.9"),
        (("--engine", "vllm-0.2"), "vllm-0.2"),
        (("--engine-version", "0.2"), "vllm-0.2"),
        (("--engine-version", "tensorrt-llm-0.9"), "tensorrt-llm-0.9"),
        (("--engine", "sglang"), newest("sglang")),
    ],
)
def test_predict_sizes_with_the_profile_named(options: tuple[str, ...], profile: str) -> None:
    assert run_json(*PREDICT, *options)["engine_profile"] == profile


def test_predict_figures_follow_the_profile() -> None:
    vllm = run_json(*PREDICT)
    trt = run_json(*PREDICT, "--engine", "tensorrt-llm")
    assert trt["ttft_ms"] != vllm["ttft_ms"]


def test_plan_names_the_profile_and_deploys_only_what_the_operator_runs() -> None:
    trt = run_json(*PLAN, "--engine", "tensorrt-llm")
    assert trt["engine_profile"] == trt["chosen"]["engine_profile"] == "tensorrt-llm-0.9"
    assert trt["chosen"]["engine_args"] is None
    assert "kvscale deploys only vllm, sglang, tgi" in trt["chosen"]["engine_args_missing"]
    human = runner.invoke(app, [*PLAN, "--engine", "tensorrt-llm"])
    assert human.exit_code == 0 and "engine profile tensorrt-llm-0.9" in human.output
    assert "kvscale deploys only" in " ".join(human.output.split())
    old = run_json(*PLAN, "--engine", "vllm-0.2")
    assert old["engine_profile"] == "vllm-0.2" and old["chosen"]["engine"] == "vllm"
    assert "--max-num-seqs" in old["chosen"]["engine_args"]
    assert run_json(*PLAN)["engine_profile"] == newest("vllm")
    assert run_json(*PLAN, "--engine-version", "0.2")["engine_profile"] == "vllm-0.2"


def test_simulate_names_the_profile_per_policy() -> None:
    rows = run_json(*SIMULATE, "--engine", "tensorrt-llm")
    assert [r["engine_profile"] for r in rows] == ["tensorrt-llm-0.9"]
    rows = run_json(*SIMULATE, "--engine-version", "vllm-0.2")
    assert [r["engine_profile"] for r in rows] == ["vllm-0.2"]


@pytest.mark.parametrize("command", [PLAN, PREDICT, SIMULATE])
def test_unknown_engine_lists_the_known_ones(command: list[str]) -> None:
    message = refused(*command, "--engine", "tensorrt")
    for name in ("vllm", "sglang", "tgi", "tensorrt-llm", "tensorrt-llm-0.9", "vllm-0.2"):
        assert name in message


@pytest.mark.parametrize("command", [PLAN, PREDICT, SIMULATE])
def test_versions_are_honoured_or_refused(command: list[str]) -> None:
    assert "no release in it" in refused(*command, "--engine-version", "newest")
    assert "names a release already" in refused(*command, "--engine", "vllm-0.2", "--engine-version", "0.11")
    assert "not sglang's" in refused(*command, "--engine", "sglang", "--engine-version", "tensorrt-llm-0.9")


def test_engine_beside_an_engine_command() -> None:
    predict = [PREDICT[0], *PREDICT[3:], *COMMAND]  # the command names the model
    assert run_json(*predict, "--engine", "vllm-0.2")["engine_profile"] == "vllm-0.2"
    assert run_json(*predict, "--engine-version", "vllm-0.2")["engine_profile"] == "vllm-0.2"
    assert run_json(*predict, "--engine", "vllm")["engine_profile"] == newest("vllm")
    assert "does not match the vllm command" in refused(*predict, "--engine", "sglang")
    assert "is a tensorrt-llm release" in refused(*predict, "--engine-version", "tensorrt-llm-0.9")


def test_predict_utilization_is_the_binding_phases_and_says_which() -> None:
    # Issue 37: one 60k-token prompt on 4 x H100 read MFU 0.3% (its ten decode steps) while its
    # prefill, 97% of the batch's time, runs at ~40% of peak FLOPs.
    long = run_json(
        "predict",
        "-m",
        "llama-3.1-70b",
        "--gpu",
        "H100-SXM",
        "--tp",
        "4",
        "--batch",
        "1",
        "--input",
        "60000",
        "--output",
        "10",
    )
    assert long["utilization_phase"] == "prefill"
    assert (long["mbu"], long["mfu"]) == (long["prefill_mbu"], long["prefill_mfu"])
    assert long["mfu"] > 0.2 and long["decode_mfu"] < 0.01
    chat = run_json(
        "predict", "-m", "llama-3.1-8b", "--gpu", "H100-SXM", "--batch", "8", "--input", "128", "--output", "1000"
    )
    assert chat["utilization_phase"] == "decode"
    assert (chat["mbu"], chat["mfu"]) == (chat["decode_mbu"], chat["decode_mfu"])
