"""The CLI contract: names, JSON keys, exit codes and messages for bad input."""

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvscale.cli import app

runner = CliRunner()
PLAN = [
    "plan",
    "--model",
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


def run_json(*args: str) -> Any:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_gpus_and_models_list_the_catalog() -> None:
    gpus = run_json("gpus")
    assert {g["name"] for g in gpus} >= {"H100-SXM", "T4", "MI300X"}
    models = run_json("models")
    assert "llama-3.3-70b" in {m["name"] for m in models}


def test_plan_json_contract() -> None:
    data = run_json(*PLAN)
    assert isinstance(data, dict) and data["feasible"] is True
    chosen = data["chosen"]
    for key in (
        "gpu",
        "tensor_parallel",
        "precision",
        "max_batch",
        "replicas",
        "ttft_ms",
        "tpot_ms",
        "limited_by",
        "mbu",
        "mfu",
        "cost_usd_per_hour",
        "reason",
        "engine_args",
    ):
        assert key in chosen
    assert chosen["ttft_ms"] <= 500 and chosen["tpot_ms"] <= 50
    assert "--max-num-seqs" in chosen["engine_args"]
    assert all(r["reason"] for r in data["rejected"]) and all(a["reason"] for a in data["alternatives"])


def test_plan_pins_narrow_the_search() -> None:
    data = run_json(*PLAN, "--gpu", "H100-SXM", "--tp", "2", "--precision", "fp8")
    assert isinstance(data, dict)
    chosen = data["chosen"]
    assert (chosen["gpu"], chosen["tensor_parallel"], chosen["precision"]) == ("H100-SXM", 2, "fp8")
    assert "--quantization" in chosen["engine_args"]


def test_predict_json_contract() -> None:
    data = run_json(
        "predict",
        "--model",
        "llama-2-7b",
        "--gpu",
        "A100-80GB",
        "--tp",
        "1",
        "--precision",
        "bf16",
        "--batch",
        "8",
        "--input",
        "512",
        "--output",
        "128",
    )
    assert isinstance(data, dict)
    for key in (
        "fits",
        "ttft_ms",
        "tpot_ms",
        "throughput_tokens_per_s",
        "kv_cache_tokens",
        "max_batch",
        "limited_by",
        "mbu",
        "mfu",
    ):
        assert key in data
    assert data["fits"] is True
    expected = 8 * 128 / (data["ttft_ms"] / 1e3 + 128 * data["tpot_ms"] / 1e3)
    assert data["throughput_tokens_per_s"] == pytest.approx(expected, rel=1e-3)


def test_roofline_png(tmp_path: Path) -> None:
    png = tmp_path / "roof.png"
    result = runner.invoke(
        app, ["roofline", "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--png", str(png), "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ideal_batch"] > 100 and len(data["points"]) >= 5
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_percentile_names_the_option() -> None:
    for command in (
        PLAN,
        [
            "simulate",
            "--concurrency",
            "1",
            "--input",
            "1",
            "--output",
            "1",
            "--duration",
            "1s",
            "--model",
            "llama-2-7b",
            "--ttft",
            "1s",
            "--tpot",
            "50ms",
        ],
    ):
        result = runner.invoke(app, [*command, "--percentile", "100"])
        assert result.exit_code == 2 and "--percentile must be in [50, 100)" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "plan",
                "--model",
                "gpt-9",
                "--ttft",
                "1s",
                "--tpot",
                "50ms",
                "--rps",
                "1",
                "--input",
                "10",
                "--output",
                "10",
            ],
            "unknown model 'gpt-9'",
        ),
        (
            [
                "plan",
                "--model",
                "llama-2-7b",
                "--ttft",
                "soon",
                "--tpot",
                "50ms",
                "--rps",
                "1",
                "--input",
                "10",
                "--output",
                "10",
            ],
            "--ttft: cannot read 'soon'",
        ),
        (
            [
                "plan",
                "--model",
                "llama-2-7b",
                "--ttft",
                "1s",
                "--tpot",
                "-5ms",
                "--rps",
                "1",
                "--input",
                "10",
                "--output",
                "10",
            ],
            "--tpot",
        ),
        (
            [
                "plan",
                "--model",
                "llama-2-7b",
                "--ttft",
                "1s",
                "--tpot",
                "50ms",
                "--rps",
                "1",
                "--input",
                "10",
                "--output",
                "10",
                "--gpu",
                "V100",
            ],
            "unknown GPU type 'V100'",
        ),
        (
            [
                "plan",
                "--model",
                "llama-2-7b",
                "--ttft",
                "1s",
                "--tpot",
                "50ms",
                "--rps",
                "1",
                "--input",
                "0",
                "--output",
                "10",
            ],
            "--input must be a positive",
        ),
        (
            [
                "plan",
                "--model",
                "llama-2-7b",
                "--ttft",
                "1s",
                "--tpot",
                "50ms",
                "--rps",
                "1",
                "--input",
                "10",
                "--output",
                "10",
                "--tp",
                "3",
            ],
            "--tp must be one of",
        ),
        (
            [
                "predict",
                "--model",
                "llama-2-7b",
                "--gpu",
                "T4",
                "--precision",
                "fp8",
                "--batch",
                "1",
                "--input",
                "1",
                "--output",
                "1",
            ],
            "no fp8",
        ),
    ],
)
def test_bad_input_exits_non_zero_naming_the_field(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())


def test_model_that_fits_nowhere_exits_with_the_fix() -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "llama-3.1-405b",
            "--ttft",
            "2s",
            "--tpot",
            "100ms",
            "--rps",
            "1",
            "--input",
            "512",
            "--output",
            "128",
            "--gpu",
            "L4,T4,A10G",
        ],
    )
    assert result.exit_code == 1
    assert "No candidate meets the SLO" in result.stdout
    assert "does not fit" in result.stdout


def test_custom_architecture_file(tmp_path: Path) -> None:
    arch = tmp_path / "tiny.yaml"
    arch.write_text(
        "name: tiny\nlayers: 4\nhidden_size: 512\nheads: 8\nkv_heads: 2\nhead_dim: 64\nintermediate_size: 1024\nvocab_size: 1000\n"
    )
    data = run_json(
        "plan",
        "--model",
        str(arch),
        "--ttft",
        "500ms",
        "--tpot",
        "50ms",
        "--rps",
        "1",
        "--input",
        "100",
        "--output",
        "10",
    )
    assert isinstance(data, dict) and data["model"] == "tiny" and data["feasible"]
    arch.write_text("layers: four\n")
    result = runner.invoke(
        app,
        ["plan", "--model", str(arch), "--ttft", "1s", "--tpot", "1s", "--rps", "1", "--input", "1", "--output", "1"],
    )
    assert result.exit_code == 2 and "invalid architecture" in result.stderr


def test_console_script_runs_as_a_process() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvscale.cli", *PLAN, "--json"], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout)["feasible"] is True


SIM_KEYS = (
    "policy",
    "requests",
    "slo_attainment",
    "ttft_mean_ms",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "tpot_mean_ms",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "throughput_tokens_per_s",
    "gpu_hours",
    "cost_usd",
    "scale_events",
)


def test_simulate_all_policies_json(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": i * 250, "input_length": 300 + i % 700, "output_length": 20 + i % 150}) + "\n"
            for i in range(1200)
        )
    )
    png = tmp_path / "sim.png"
    data = run_json(
        "simulate",
        "--trace",
        str(trace),
        "--model",
        "llama-3.1-8b",
        "--ttft",
        "1s",
        "--tpot",
        "60ms",
        "--gpu",
        "L4",
        "--policy",
        "all",
        "--png",
        str(png),
    )
    assert [row["policy"] for row in data] == [
        "kvscale",
        "static",
        "hpa",
        "keda",
        "saturation",
        "trailing",
        "oracle",
        "bound",
        "peak",
    ]
    for row in data:
        assert set(SIM_KEYS) <= set(row)
        assert row["gpu_hours_vs_bound"] > 0 and row["gpu_hours_vs_peak"] > 0
        assert row["requests"] == 1200
    assert png.read_bytes()[:4] == b"\x89PNG"


CLOSED_LOOP = ["simulate", "--concurrency", "4", "--input", "200", "--output", "50", "--duration", "30s",
               "--model", "llama-3.1-8b", "--ttft", "1s", "--tpot", "60ms"]  # fmt: skip


def test_simulate_closed_loop_and_bad_input() -> None:
    data = run_json(*CLOSED_LOOP, "--policy", "static", "--replicas", "1")
    assert data[0]["policy"] == "static" and data[0]["requests"] > 4
    result = runner.invoke(app, ["simulate", "--model", "llama-3.1-8b", "--ttft", "1s", "--tpot", "60ms"])
    assert result.exit_code == 2 and "--trace" in result.stderr
    result = runner.invoke(app, [*CLOSED_LOOP, "--policy", "oracle"])
    assert result.exit_code == 1 and "oracle needs a trace" in " ".join(result.stderr.split())
    result = runner.invoke(
        app, ["simulate", "--trace", "nope.csv", "--model", "llama-3.1-8b", "--ttft", "1s", "--tpot", "60ms"]
    )
    assert result.exit_code == 2 and "does not exist" in result.stderr


def _stderr(result: Any) -> str:
    return " ".join(result.stderr.split())


PLAN_ARGS = dict(zip(PLAN[1::2], PLAN[2::2], strict=True))


def _with(command: list[str], **changes: str) -> list[str]:
    """`command` (its options as pairs after the command name) with some options replaced."""
    options = dict(zip(command[1::2], command[2::2], strict=True))
    options.update({k.replace("_", "-") if k.startswith("--") else k: v for k, v in changes.items()})
    return [command[0], *(x for pair in options.items() for x in pair)]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"--rps": "nan"}, "--rps must be a finite number"),
        ({"--rps": "inf"}, "--rps must be a finite number"),
        ({"--headroom": "nan"}, "--headroom must be a finite number"),
        ({"--headroom": "-1"}, "--headroom must be in [0, 10)"),
        ({"--max-replicas": "0"}, "--max-replicas must be a positive whole number, got 0"),
        ({"--max-replicas": "-1"}, "--max-replicas must be a positive whole number, got -1"),
        ({"--ttft": "500"}, "--ttft 500: add a unit: 500ms or 500s"),
        ({"--tpot": "0.05"}, "--tpot 0.05: add a unit: 0.05ms or 0.05s"),
        ({"--ttft": "9" * 400 + "s"}, "is not a finite duration"),
        ({"--input": "99999999999"}, "--input must be at most 10,000,000"),
        ({"--model": "[/x]"}, "unknown model '[/x]'"),
    ],
)
def test_plan_refuses_bad_numbers_by_name(changes: dict[str, str], message: str) -> None:
    result = runner.invoke(app, _with(PLAN, **changes))
    assert result.exit_code == 2, result.output
    assert message in _stderr(result)
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"--replicas": "0"}, "--replicas must be a positive whole number, got 0"),
        ({"--replicas": "-2"}, "--replicas must be a positive whole number, got -2"),
        ({"--max-replicas": "0"}, "--max-replicas must be a positive whole number"),
        ({"--headroom": "-1"}, "--headroom must be in [0, 10)"),
        ({"--headroom": "nan"}, "--headroom must be a finite number"),
        ({"--rate-scale": "inf"}, "--rate-scale must be a finite number in (0, 1000]"),
        ({"--time-scale": "1e-300"}, "--time-scale must be in [0.001, 1e+06]"),
        ({"--cold-start": "90"}, "--cold-start 90: add a unit: 90ms or 90s"),
        ({"--duration": "10000h"}, "--duration must be at most 31 days"),
    ],
)
def test_simulate_refuses_bad_options_by_name(changes: dict[str, str], message: str) -> None:
    result = runner.invoke(app, _with(CLOSED_LOOP, **changes))
    assert result.exit_code == 2, result.output
    assert message in _stderr(result)


def test_png_checked_before_the_simulation_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvscale.sim.session

    def must_not_run(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the simulation ran before --png was checked")

    monkeypatch.setattr(kvscale.sim.session, "run_policies", must_not_run)
    for png, message in (
        (tmp_path / "missing" / "sim.png", "directory"),
        (tmp_path / "sim.txt", "must end in one of .png"),
        (tmp_path, "must end in one of .png"),
    ):
        result = runner.invoke(app, [*CLOSED_LOOP, "--png", str(png)])
        assert result.exit_code == 2 and "--png" in _stderr(result) and message in _stderr(result), result.output
    result = runner.invoke(
        app, ["roofline", "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--png", str(tmp_path / "no" / "r.png")]
    )
    assert result.exit_code == 2 and "mkdir -p" in _stderr(result)


def test_simulate_writes_svg_and_keeps_results_when_asked(tmp_path: Path) -> None:
    svg = tmp_path / "sim.svg"
    data = run_json(*CLOSED_LOOP, "--policy", "static", "--replicas", "1", "--png", str(svg))
    assert data[0]["policy"] == "static"
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_simulate_bad_traces_exit_2_naming_the_file(tmp_path: Path) -> None:
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    cases = {
        "nan.csv": (header + "nan,1,1\n").encode(),
        "huge.csv": (header + "1,1e400,1\n").encode(),
        "neg.csv": (header + "1,-4,1\n").encode(),
        "utf16.csv": (header + "1,2,3\n").encode("utf-16"),
        "binary.csv": b"\x00\x01\x02\xff\xfe\xfd" * 10,
        "decades.jsonl": b'{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
        b'{"timestamp": 1e12, "input_length": 1, "output_length": 1}\n',
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        result = runner.invoke(
            app, ["simulate", "--trace", str(path), "--model", "llama-3.1-8b", "--ttft", "1s", "--tpot", "60ms"]
        )
        assert result.exit_code == 2, (name, result.output)
        assert name in _stderr(result) and "error:" in result.stderr


def test_simulate_accepts_a_csv_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    rows = "".join(f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.5,300,40\n" for i in range(120))
    path.write_bytes(b"\xef\xbb\xbf" + ("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows).encode())
    data = run_json(
        "simulate",
        "--trace",
        str(path),
        "--model",
        "llama-3.1-8b",
        "--ttft",
        "1s",
        "--tpot",
        "60ms",
        "--policy",
        "static",
    )
    assert data[0]["requests"] == 120


def test_progress_goes_to_stderr_with_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stdout stays one JSON document; progress lines go to stderr even with --json."""
    import kvscale.cli.simulate as simulate_cmd

    monkeypatch.setattr(simulate_cmd, "PROGRESS_EVERY_S", 0.0)
    result = runner.invoke(app, [*CLOSED_LOOP, "--policy", "static", "--replicas", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["policy"] == "static"
    assert "simulating static:" in result.stderr and "% of" in result.stderr


def test_sim_serve_checks_options_before_the_cluster() -> None:
    result = runner.invoke(app, ["sim", "serve", "--name", "x", "--cold-start", "30"])
    assert result.exit_code == 2 and "--cold-start 30: add a unit" in _stderr(result)
    result = runner.invoke(app, ["sim", "serve", "--name", "x", "--port", "70000"])
    assert result.exit_code == 2 and "--port must be in [1, 65535]" in _stderr(result)
    result = runner.invoke(app, ["sim", "serve", "--name", "x", "--load", "sometimes"])
    assert result.exit_code == 2 and result.stderr.strip()


@pytest.mark.parametrize(
    ("load", "message"),
    [
        ("poisson:rate=1e9,duration=1h", "more than 2,000,000; lower the rate or the duration"),
        ("poisson:rate=1,duration=100000h", "duration must be at most 31 days"),
    ],
)
def test_simulate_refuses_a_generated_load_too_large_before_generating(load: str, message: str) -> None:
    started = time.monotonic()
    result = runner.invoke(
        app, ["simulate", "--model", "llama-3.1-8b", "--ttft", "1s", "--tpot", "60ms", "--load", load]
    )
    assert result.exit_code == 2 and message in _stderr(result)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("load", "message"),
    [
        ("constant:nan", "a rate must be a number of requests per second in [0, 10000], got nan"),
        ("constant:-1", "got -1"),
        ("constant:1e9", "got 1e+09"),
        ("ramp:1:2:0", "the ramp's SECONDS must be positive"),
        ("steps:1@0,inf@5", "got inf"),
        ("steps:1@-5", "times must be finite seconds >= 0"),
    ],
)
def test_sim_serve_load_numbers_checked_before_the_cluster(load: str, message: str) -> None:
    result = runner.invoke(app, ["sim", "serve", "--name", "x", "--load", load])
    assert result.exit_code == 2 and message in _stderr(result)


def test_simulate_shows_the_slos_percentile() -> None:
    # Issue 39: a p99 SLO was shown against p50/p95 columns only.
    args = ["simulate", "-m", "llama-3.1-8b", "--ttft", "1s", "--tpot", "50ms", "--percentile", "99"]
    args += ["--concurrency", "8", "--input", "512", "--output", "32", "--duration", "30s", "--policy", "static"]
    human = runner.invoke(app, args)
    assert human.exit_code == 0, human.output
    assert "TTFT p50/p99 ms" in human.stdout and "TPOT p50/p99 ms" in human.stdout
    (row,) = run_json(*args)
    assert row["ttft_p99_ms"] >= row["ttft_p95_ms"] and row["tpot_p99_ms"] >= row["tpot_p95_ms"]
    assert f"/ {row['ttft_p99_ms']:.0f}" in human.stdout


def test_calibrate_refuses_a_url_without_a_scheme_as_bench_does() -> None:
    # Issue 39: `calibrate --prometheus localhost:9090` exited 1 (a connection error) where
    # bench exits 2 naming the option.
    for url in ("localhost:9090", "http://127.0.0.1:99999", "ftp://prometheus"):
        result = runner.invoke(app, ["calibrate", "--prometheus", url, "--gpu", "H100-SXM"])
        assert result.exit_code == 2, result.output
        assert "--prometheus" in result.stderr


def test_a_gpu_name_shared_by_several_types_is_said_and_suggestions_name_entries() -> None:
    # Issue 39: `--gpu H100` silently meant H100-SXM, and "Did you mean h100" named an alias
    # missing from the `Known:` list.
    args = ["predict", "-m", "llama-3.1-8b", "--batch", "1", "--input", "100", "--output", "10", "--json"]
    result = runner.invoke(app, [*args, "--gpu", "H100"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "--gpu H100 means H100-SXM" in said and "H100-PCIE" in said and "H100-NVL" in said
    assert json.loads(result.stdout)["fits"] is True  # stdout stays one JSON document
    exact = runner.invoke(app, [*args, "--gpu", "H100-SXM"])
    assert exact.exit_code == 0 and "means" not in exact.stderr
    typo = runner.invoke(app, [*args, "--gpu", "H10"])
    assert typo.exit_code == 2
    message = " ".join(typo.stderr.split())
    assert "Did you mean H100-SXM (h100)" in message and "Known:" in message
