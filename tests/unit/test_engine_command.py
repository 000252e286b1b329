"""--engine-command: the engine's own flags (vLLM 0.11.0 arg_utils.py, SGLang 0.5.3 server_args.py)
and, for what a command leaves out, the engine's defaults on that GPU."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscale.cli import app
from kvscale.engines.command import EngineCommandError, command_config, parse_engine_command
from kvscale.sizing.catalog import default_catalog

CAT = default_catalog()
runner = CliRunner()


def test_vllm_flags_aliases_underscores_and_equals() -> None:
    cmd = parse_engine_command(
        "vllm serve Qwen/Qwen3-32B -tp 2 --pipeline_parallel_size=2 --max-num-seqs 128 "
        "--max-num-batched-tokens=4096 --kv-cache-dtype fp8 --gpu-memory-utilization 0.85 --async-scheduling "
        "--reasoning-parser qwen3"
    )
    assert (cmd.engine, cmd.model, cmd.tensor_parallel, cmd.pipeline_parallel) == ("vllm", "Qwen/Qwen3-32B", 2, 2)
    assert (cmd.max_num_seqs, cmd.max_num_batched_tokens, cmd.kv_cache_dtype) == (128, 4096, "fp8")
    assert cmd.gpu_memory_utilization == 0.85
    assert set(cmd.ignored) == {"--async-scheduling", "--reasoning-parser"}


def test_sglang_launcher_flags() -> None:
    cmd = parse_engine_command(
        "python3 -m sglang.launch_server --model-path zai-org/GLM-4.5-Air --tp-size 4 --ep-size 4 "
        "--cuda-graph-max-bs 512 --chunked-prefill-size 4096 --max-running-requests 64"
    )
    assert (cmd.engine, cmd.model, cmd.tensor_parallel, cmd.expert_parallel) == (
        "sglang",
        "zai-org/GLM-4.5-Air",
        4,
        True,
    )
    assert (cmd.max_num_batched_tokens, cmd.max_num_seqs) == (4096, 64)
    assert cmd.ignored == ("--cuda-graph-max-bs",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("trtllm-serve openai/gpt-oss-20b", "expected `vllm serve MODEL ...`"),
        ("vllm serve m -tp two", "-tp must be a whole number >= 1, got 'two'"),
        ("vllm serve m --gpu-memory-utilization 1.5", "a fraction in (0, 1]"),
        ("python -m sglang.launch_server --tp-size 2", "no model in the command"),
    ],
)
def test_bad_commands_name_the_flag(text: str, message: str) -> None:
    with pytest.raises(EngineCommandError) as exc:
        parse_engine_command(text)
    assert message in str(exc.value)


def test_absent_flags_take_vllms_defaults_for_the_gpu() -> None:
    # EngineArgs._set_default_args: >= 70 GiB and not an A100: 8192 tokens, 1024 seqs; else 2048 and 256.
    cmd = parse_engine_command("vllm serve Qwen/Qwen3-8B")
    h100 = command_config(CAT, cmd, CAT.gpu("H100-SXM"))
    a100 = command_config(CAT, cmd, CAT.gpu("A100-80GB"))
    assert (h100.config.max_num_batched_tokens, h100.max_batch) == (8192, 1024)
    assert (a100.config.max_num_batched_tokens, a100.max_batch) == (2048, 256)
    assert h100.config.engine.gpu_memory_utilization == 0.9
    assert h100.max_model_len == CAT.model("qwen3-8b").max_context_tokens


def test_absent_flags_take_sglangs_defaults_for_the_gpu() -> None:
    cmd = parse_engine_command("python -m sglang.launch_server --model-path Qwen/Qwen3-8B")
    h100 = command_config(CAT, cmd, CAT.gpu("H100-SXM"))
    assert h100.config.max_num_batched_tokens == 8192
    # reserved = max(512 + 1.5 x 8192 + 2 x 256 + 1/8 x 1024, 10240) MiB = 13440 MiB of 79.65 GiB
    gpu_mib = 79.65 * 1024
    assert h100.config.engine.gpu_memory_utilization == round((gpu_mib - 13440) / gpu_mib, 3)
    assert h100.config.engine.kv_block_tokens == 1


def test_fp8_checkpoint_names_and_native_formats_set_the_precision() -> None:
    qwen_fp8 = command_config(CAT, parse_engine_command("vllm serve Qwen/Qwen3-32B-FP8"), CAT.gpu("H100-SXM"))
    assert (qwen_fp8.config.model.name, qwen_fp8.config.precision.name) == ("qwen3-32b", "fp8")
    oss = command_config(CAT, parse_engine_command("vllm serve openai/gpt-oss-20b"), CAT.gpu("A100-80GB"))
    assert oss.config.precision.name == "mxfp4"
    kv8 = command_config(
        CAT, parse_engine_command("vllm serve Qwen/Qwen3-8B --kv-cache-dtype fp8_e4m3"), CAT.gpu("H100-SXM")
    )
    assert kv8.config.kv.name == "fp8"


def test_predict_and_simulate_take_an_engine_command(tmp_path: Path) -> None:
    out = runner.invoke(
        app,
        [
            "predict",
            "--engine-command",
            "vllm serve Qwen/Qwen3-32B -tp 2 --max-num-batched-tokens 4096",
            "--gpu",
            "H100-SXM",
            "--batch",
            "16",
            "--input",
            "1000",
            "--output",
            "100",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["max_num_batched_tokens"] == 4096
    trace = tmp_path / "burst.jsonl"
    trace.write_text(
        "".join(json.dumps({"timestamp": 0, "input_length": 500, "output_length": 50}) + "\n" for _ in range(40))
    )
    args = [
        "simulate",
        "--ttft",
        "60s",
        "--tpot",
        "1s",
        "--trace",
        str(trace),
        "--policy",
        "static",
        "--gpu",
        "H100-SXM",
    ]
    out = runner.invoke(app, [*args, "--engine-command", "vllm serve Qwen/Qwen3-8B --max-num-seqs 8", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert rows[0]["requests"] == 40
    bad = runner.invoke(app, [*args, "--engine-command", "vllm serve Qwen/Qwen3-8B", "--tp", "2"])
    assert bad.exit_code == 2
    assert "leave out --tp and --precision" in bad.output


def test_per_sequence_cost_and_gemm_factor_of_an_engine() -> None:
    from kvscale.sizing.config import ServingConfig
    from kvscale.sizing.roofline import step

    base = ServingConfig.build(CAT, CAT.model("qwen3-8b"), CAT.gpu("H100-SXM"))
    engine = base.engine.model_copy(update={"sequence_overhead_s": 50e-6, "matmul_efficiency_factor": 0.5})
    tuned = ServingConfig(base.model, base.gpu, base.link, base.precision, base.kv, engine, 1)
    for seqs in (1, 100, 400):
        extra = step(tuned, seqs, 1000).overhead_s - step(base, seqs, 1000).overhead_s
        assert extra == pytest.approx(50e-6 * seqs)
    assert tuned.matmul_efficiency == pytest.approx(base.matmul_efficiency / 2)
    assert step(tuned, 0, 0, 4096, 2048).compute_s == pytest.approx(2 * step(base, 0, 0, 4096, 2048).compute_s)


def test_the_burst_fit_overlay_loads_over_the_catalog() -> None:
    from kvscale.sizing.catalog import load_catalog

    overlay = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "gpustack-engine-fit.yaml"
    cat = load_catalog(overlay)
    assert cat.engine("vllm").sequence_overhead_s == pytest.approx(120e-6)
    assert cat.engine("sglang").matmul_efficiency_factor == pytest.approx(0.6)
    assert cat.engine("sglang").kv_block_tokens == 1  # the rest of the profile is kept
    assert CAT.engine("vllm").sequence_overhead_s == 0.0  # not the built-in default
