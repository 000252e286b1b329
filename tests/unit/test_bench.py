"""Issue 31, missing: `kvscale bench --endpoint URL` confirms a plan on a live endpoint.
Tested against the stand-in (kvscale.standin.openai): an OpenAI-compatible server on
loopback whose token timing is the sizing model's prefill and decode step times, so the
bench's measurements can be checked against known numbers."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvscale.cli import app
from kvscale.planner.search import PlanRequest, plan
from kvscale.sim.bench import Measured, percentile, poisson_arrivals, summarize
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo, Workload
from kvscale.standin.openai import ModelledEngine, start

CAT = default_catalog()
runner = CliRunner()
# Llama 3.1 8B on one L4: a ~90 ms prefill of 256 tokens and ~67 ms decode steps, long
# against the event loop's timer jitter on a busy 2-core machine.
CFG = ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu("L4"), "bf16", 1, "auto")
CONTRACT = (
    "requests",
    "errors",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "itl_p99_ms",
    "slo_attainment",
)
LOAD = ["--rps", "4", "--input", "256", "--output", "8", "--duration", "2s", "--timeout", "20s"]


def serve(engine: ModelledEngine) -> Iterator[str]:
    """The stand-in on its own event loop in a thread, on a free loopback port."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(start(engine))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()


@pytest.fixture
def engine() -> ModelledEngine:
    return ModelledEngine(CFG, "llama-3.1-8b")


@pytest.fixture
def endpoint(engine: ModelledEngine) -> Iterator[str]:
    yield from serve(engine)


def bench_json(endpoint: str, *extra: str) -> dict[str, Any]:
    result = runner.invoke(app, ["bench", "--endpoint", endpoint, "--model", "llama-3.1-8b", *extra, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_bench_measures_the_stand_ins_modelled_timing(engine: ModelledEngine, endpoint: str) -> None:
    data = bench_json(endpoint, *LOAD)
    assert set(CONTRACT) <= set(data)
    expected = len(poisson_arrivals(4.0, 2.0, 256, 8, 0))
    assert data["requests"] == expected == len(engine.received) > 0
    assert data["errors"] == 0
    assert engine.received == [(256, 8)] * expected  # the lengths asked for reach the server
    assert data["output_tokens"] == 8 * expected
    # Tolerance: a sleep never ends early, and the client, the server and the test share one
    # busy machine: up to 25% + 25 ms late on the p50.
    prefill_ms = engine.prefill_s(256) * 1e3
    assert prefill_ms <= data["ttft_p50_ms"] <= prefill_ms * 1.25 + 25
    # The decode step at the fewest and the most requests running at once (at most all).
    fastest_ms = engine.decode_s(1, 256) * 1e3
    slowest_ms = engine.decode_s(expected, 264) * 1e3
    assert fastest_ms <= data["tpot_p50_ms"] <= slowest_ms * 1.25 + 10
    assert data["itl_p99_ms"] >= data["tpot_p50_ms"]
    assert data["slo_attainment"] is None  # no targets given
    assert "plan" not in data


def test_bench_with_slo_options_puts_the_plans_predictions_beside(endpoint: str) -> None:
    data = bench_json(endpoint, *LOAD, "--ttft", "1s", "--tpot", "100ms", "--itl", "500ms", "--gpu", "L4")
    chosen = plan(
        CAT,
        PlanRequest(CAT.model("llama-3.1-8b"), Workload(256, 8, 4.0), Slo(1.0, 0.1, 95.0), gpus=("L4",), max_itl_s=0.5),
    ).chosen
    assert chosen is not None
    p = chosen.prediction
    assert data["plan"] == {
        "for": "fresh plan",
        "gpu": "L4",
        "tensor_parallel": chosen.tensor_parallel,
        "precision": chosen.precision,
        "replicas": p.replicas,
        "max_batch": p.max_batch,
        "max_rps_per_replica": round(p.rate_per_replica_max, 3),
        "requests_per_s": 4.0,
        "ttft_ms": round(p.ttft_p_s * 1e3, 3),
        "tpot_ms": round(p.tpot_p_s * 1e3, 3),
        "itl_p99_ms": round(p.itl_p99_s * 1e3, 3),
    }
    assert data["slo"] == {"percentile": 95.0, "ttft_ms": 1000.0, "tpot_ms": 100.0, "itl_ms": 500.0}
    # ~100 ms TTFT and ~67 ms TPOT against 1 s and 100 ms: every request meets both
    assert data["slo_attainment"] == 1.0
    assert data["ttft_at_slo_percentile_ms"] is not None


def test_slo_attainment_counts_a_request_over_either_target(endpoint: str) -> None:
    # a TPOT target below the modelled ~67 ms step: no request meets it
    data = bench_json(endpoint, *LOAD, "--ttft", "1s", "--tpot", "20ms", "--gpu", "L4")
    assert data["requests"] > 0
    assert data["slo_attainment"] == 0.0


def test_bench_human_output_is_a_table_with_the_prediction(endpoint: str) -> None:
    result = runner.invoke(
        app,
        ["bench", "--endpoint", endpoint, "--model", "llama-3.1-8b", *LOAD, "--ttft", "1s", "--tpot", "100ms"],
    )
    assert result.exit_code == 0, result.output
    assert "TTFT p95 (SLO)" in result.output
    assert "predicted ms" in result.output
    # the figure itself is test_bench_with_slo_options' (JSON); this one checks the human line's
    # shape, which a loaded machine's latency cannot move
    assert re.search(r"SLO attainment: \d+\.\d% of \d+ requests met both targets", result.output)


def test_http_500_is_counted_not_fatal() -> None:
    engine = ModelledEngine(CFG, "llama-3.1-8b", error_every=2)
    for url in serve(engine):
        data = bench_json(url, *LOAD)
        assert data["requests"] == len(engine.received) + data["errors"]
        assert data["errors"] == data["requests"] // 2 > 0
        assert data["first_errors"] == ['HTTP 500: {"error": {"message": "injected fault"}}']
        assert data["ttft_p50_ms"] is not None  # the others were measured


def test_a_trace_is_sent_at_its_times_with_its_lengths(engine: ModelledEngine, endpoint: str, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [(0, 100, 3), (300, 200, 5), (700, 50, 2), (5000, 10, 1)]  # the last is past --duration
    trace.write_text(
        "".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o}) + "\n" for t, i, o in rows)
    )
    data = bench_json(endpoint, "--trace", str(trace), "--duration", "2s")
    assert data["requests"] == 3
    assert sorted(engine.received) == sorted((i, o) for _, i, o in rows[:3])
    assert data["output_tokens"] == 3 + 5 + 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: nothing listens there


@pytest.mark.parametrize("url", ["foo", "ftp://127.0.0.1:8000", "http://", "http://127.0.0.1:99999"])
def test_a_bad_endpoint_exits_2_naming_the_flag(url: str) -> None:
    result = runner.invoke(app, ["bench", "--endpoint", url, "--model", "m", *LOAD])
    assert result.exit_code == 2, result.output
    assert "--endpoint" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_an_unreachable_server_exits_1_naming_the_flag() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["bench", "--endpoint", url, "--model", "m", *LOAD[:-2], "--duration", "1s"])
    assert result.exit_code == 1, result.output
    assert f"--endpoint {url}: cannot reach the server" in result.output
    assert isinstance(result.exception, SystemExit)


def test_the_options_are_checked_before_any_request() -> None:
    base = ["bench", "--endpoint", "http://127.0.0.1:9", "--model", "m"]
    cases = [
        ([*base, "--rps", "4"], "give --rps, --input and --output"),
        ([*base, *LOAD, "--ttft", "1s"], "give --ttft and --tpot together"),
        ([*base, "--rps", "0", "--input", "1", "--output", "1"], "--rps must be above 0"),
        ([*base, *LOAD, "--timeout", "5"], "--timeout 5: add a unit"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output


def test_poisson_schedule_is_seeded_and_at_the_rate() -> None:
    a = poisson_arrivals(50.0, 100.0, 10, 5, seed=7)
    assert a == poisson_arrivals(50.0, 100.0, 10, 5, seed=7)
    assert a != poisson_arrivals(50.0, 100.0, 10, 5, seed=8)
    assert 4700 < len(a) < 5300  # 5000 expected, sd ~71
    assert all(0 <= x.at_s < 100 for x in a)
    assert [x.at_s for x in a] == sorted(x.at_s for x in a)


def test_summary_by_hand() -> None:
    # TTFT 0.1 s, tokens at 0.1, 0.2, 0.4: TPOT (0.4 - 0.1) / 2 = 0.15 s, gaps 0.1 and 0.2
    one = Measured([0.1, 0.2, 0.4])
    assert one.tpot_s == pytest.approx(0.15)
    assert one.gaps_s == pytest.approx([0.1, 0.2])
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5  # numpy's linear interpolation
    assert percentile([], 50) is None
    out = summarize([one, Measured([0.5, 0.55]), Measured(error="HTTP 500")], 0.2, 0.2)
    assert out["requests"] == 3 and out["errors"] == 1
    assert out["slo_attainment"] == pytest.approx(1 / 3, abs=1e-5)  # only the first meets TTFT 0.2 s
    assert out["ttft_p50_ms"] == pytest.approx(300.0)


def test_a_model_name_the_server_does_not_serve_is_a_404_as_vllm_answers_it(endpoint: str) -> None:
    # vLLM 0.11.0 entrypoints/openai/serving_engine.py _check_model: 404 NotFoundError, "The model
    # `NAME` does not exist."; bench counts each one as an error and says the first.
    result = runner.invoke(app, ["bench", "--endpoint", endpoint, "--model", "llama-3.1-70b", *LOAD, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["requests"] == data["errors"] > 0
    (first,) = data["first_errors"]
    assert first.startswith("HTTP 404:") and "The model `llama-3.1-70b` does not exist." in first
    assert '"type": "NotFoundError"' in first and '"code": 404' in first


def test_bench_says_how_far_it_is_on_stderr(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress on stderr as simulate prints it (issue 39): a line every EVERY_S when stderr is
    not a terminal, whatever --json says; stdout stays one JSON document."""
    import kvscale.cli.progress as progress

    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    result = runner.invoke(app, ["bench", "--endpoint", endpoint, "--model", "llama-3.1-8b", *LOAD, "--json"])
    assert result.exit_code == 0, result.output
    n = json.loads(result.stdout)["requests"]
    lines = [line for line in result.stderr.splitlines() if line.startswith("bench: ")]
    assert lines and all(re.fullmatch(rf"bench: \d+ of {n} requests sent, \d+ ended after \d+s", x) for x in lines)
    assert f"bench: {n} of {n} requests sent, {n} ended" in lines[-1]
    monkeypatch.setattr(progress, "EVERY_S", 3600.0)  # a short run: no line before EVERY_S
    result = runner.invoke(app, ["bench", "--endpoint", endpoint, "--model", "llama-3.1-8b", *LOAD, "--json"])
    assert result.exit_code == 0 and "bench: " not in result.stderr


def test_bench_predicts_for_the_endpoints_configuration_when_given(endpoint: str) -> None:
    """Issue 39: bench put a fresh plan's predictions (a TP4 plan) beside a TP1 endpoint, a 2x
    "model error" that was not one. --gpu TYPE --tp N (--replicas, --precision) describe the
    endpoint: the predictions are that configuration's at the load spread over its replicas."""
    from kvscale.sizing.load import ReplicaModel

    slo = ["--ttft", "1s", "--tpot", "100ms"]
    pinned = plan(
        CAT,
        PlanRequest(
            CAT.model("llama-3.1-8b"), Workload(256, 8, 4.0), Slo(1.0, 0.1, 95.0), gpus=("L4",), tensor_parallel=(2,)
        ),
    ).chosen
    assert pinned is not None and pinned.tensor_parallel == 2
    planned = pinned.prediction.replicas
    # at the pinned plan's own count: the pinned plan's predictions
    data = bench_json(endpoint, *LOAD, *slo, "--gpu", "L4", "--tp", "2", "--replicas", str(planned))["plan"]
    assert (data["for"], data["gpu"], data["tensor_parallel"], data["replicas"]) == ("endpoint", "L4", 2, planned)
    assert data["ttft_ms"] == round(pinned.prediction.ttft_p_s * 1e3, 3)
    assert data["tpot_ms"] == round(pinned.prediction.tpot_p_s * 1e3, 3)
    # one replica (the default): the whole load on it, not the plan's count
    one = bench_json(endpoint, *LOAD, *slo, "--gpu", "L4", "--tp", "2")["plan"]
    assert (one["replicas"], one["planned_replicas"]) == (1, planned)
    point = ReplicaModel(pinned.config, Workload(256, 8, 4.0)).at_rate(4.0, pinned.prediction.max_batch, 95.0)
    assert one["ttft_ms"] == round(point.ttft_p_s * 1e3, 3) and one["tpot_ms"] == round(point.tpot_p_s * 1e3, 3)
    # the fresh plan is another configuration here: the table's column says which one it shows
    fresh = bench_json(endpoint, *LOAD, *slo)["plan"]
    assert fresh["for"] == "fresh plan" and (fresh["gpu"], fresh["tensor_parallel"]) != ("L4", 2)


def test_bench_says_which_configuration_it_predicts_for(endpoint: str) -> None:
    args = ["bench", "--endpoint", endpoint, "--model", "llama-3.1-8b", *LOAD, "--ttft", "1s", "--tpot", "100ms"]
    fresh = runner.invoke(app, [*args, "--gpu", "L4"], terminal_width=200)
    assert fresh.exit_code == 0, fresh.output
    assert "predicted ms (fresh plan: " in fresh.stdout
    assert "not necessarily the endpoint's configuration: give its --gpu TYPE --tp N" in fresh.stdout
    given = runner.invoke(app, [*args, "--gpu", "L4", "--tp", "1"], terminal_width=200)
    assert given.exit_code == 0, given.output
    assert "predicted ms (endpoint: 1 x TP1 L4 bf16)" in given.stdout and "fresh plan" not in given.stdout


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--ttft", "1s", "--tpot", "100ms", "--tp", "1"], "--tp 1: name the endpoint's one GPU type with --gpu TYPE"),
        (["--ttft", "1s", "--tpot", "100ms", "--tp", "1", "--gpu", "L4,L40S"], "--gpu TYPE"),
        (["--ttft", "1s", "--tpot", "100ms", "--tp", "3", "--gpu", "L4"], "--tp must be one of 1, 2, 4, 8"),
        (["--replicas", "2"], "--replicas describes the endpoint: give its --gpu TYPE and --tp N"),
        (["--tp", "1", "--gpu", "L4"], "give --ttft and --tpot too"),
        (["--ttft", "1s", "--tpot", "100ms", "--tp", "1", "--gpu", "L4", "--replicas", "0"], "--replicas must be"),
        (["--ttft", "1s", "--tpot", "100ms", "--tp", "1", "--gpu", "L4", "--precision", "bf16,fp8"], "one precision"),
    ],
)
def test_the_endpoints_configuration_is_checked_before_any_request(extra: list[str], said: str) -> None:
    # nothing listens on port 9: a request sent would fail differently (exit 1)
    result = runner.invoke(app, ["bench", "--endpoint", "http://127.0.0.1:9", "--model", "llama-3.1-8b", *LOAD, *extra])
    assert result.exit_code == 2 and said in result.stderr, result.output


def test_a_load_beyond_the_endpoints_replicas_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    from kvscale.cli import bench as bench_cmd

    measured = summarize([Measured([0.1, 0.2, 0.3])], 1.0, 0.1, 95.0)
    measured["first_errors"] = []
    measured["slo"] = {"percentile": 95.0, "ttft_ms": 1000.0, "tpot_ms": 100.0, "itl_ms": None}
    measured["plan"] = {
        "for": "endpoint",
        "gpu": "L4",
        "tensor_parallel": 1,
        "precision": "bf16",
        "replicas": 1,
        "planned_replicas": 41,
        "max_batch": 57,
        "max_rps_per_replica": 1.087,
        "requests_per_s": 40.0,
        "ttft_ms": None,
        "tpot_ms": None,
        "itl_p99_ms": 748.8,
    }
    bench_cmd._render(measured, "http://x:8000", 1)
    out = " ".join(capsys.readouterr().out.split())
    assert "unbounded" in out
    assert (
        "The load is beyond what 1 replica(s) carry within the SLO (at most 1.087 req/s each; the plan for it has 41)"
        in out
    )
