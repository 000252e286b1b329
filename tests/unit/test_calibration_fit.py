"""The calibration fit (kvscale.calibration.fit): windows measured on an engine whose profile
differs from the catalog's (tests/data/slower.yaml: half the GEMM efficiency, a 180 us
per-sequence cost) give back that profile's fields and step times within 10%; too little data
is an error that names the metric, never a fit."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from kvscale.calibration.fit import (
    FIELDS,
    NotEnoughData,
    Window,
    config_key,
    fit,
    predicted_gap_s,
    predicted_prefill_s,
    with_fields,
)
from kvscale.sizing.catalog import default_catalog, load_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.roofline import step

SLOWER = Path(__file__).resolve().parents[1] / "data" / "slower.yaml"


def _configs(gpu: str = "H100-SXM") -> tuple[ServingConfig, ServingConfig]:
    cat, slow = default_catalog(), load_catalog(SLOWER)
    return (
        ServingConfig.build(cat, cat.model("llama-3.1-8b"), cat.gpu(gpu)),
        ServingConfig.build(slow, slow.model("llama-3.1-8b"), slow.gpu(gpu)),
    )


def _measured(true: ServingConfig, batches: tuple[float, ...], noise: float = 0.02, seed: int = 1) -> list[Window]:
    """Windows as the engine running `true` would report them, with 2% noise on each mean."""
    rng = random.Random(seed)
    out = []
    for b in batches:
        for prompt in (256.0, 1024.0, 3000.0):
            shape = Window(b, prompt + 100, 1000, 1.0, 20, 1.0, prompt, 5000)
            out.append(
                Window(
                    b,
                    prompt + 100,
                    1000,
                    predicted_gap_s(true, shape) * rng.gauss(1, noise),
                    20,
                    predicted_prefill_s(true, shape) * rng.gauss(1, noise),
                    prompt,
                    5000,
                )
            )
    return out


@pytest.mark.parametrize("gpu", ["H100-SXM", "A100-80GB"])
def test_fit_recovers_the_slower_profile_within_10_percent(gpu: str) -> None:
    base, true = _configs(gpu)
    # half the default's GEMM share, three times its per-sequence cost (tests/data/slower.yaml)
    assert true.engine.matmul_efficiency_factor == pytest.approx(base.engine.matmul_efficiency_factor / 2)
    assert true.engine.sequence_overhead_s == pytest.approx(3 * base.engine.sequence_overhead_s)
    c = fit(base, _measured(true, (2, 4, 8, 16, 24, 32, 48, 64)))
    for name in ("matmul_efficiency_factor", "sequence_overhead_s"):
        got, want = c.field(name).value, getattr(true.engine, name)
        assert abs(got / want - 1) < 0.10, (name, got, want)
    # Step times under the calibrated profile: within 10% of the engine's, decode and prefill.
    calibrated = with_fields(base, c.updates())
    for batch in (1, 8, 32, 64):
        for ctx in (300.0, 2000.0):
            got, want = step(calibrated, batch, ctx).seconds, step(true, batch, ctx).seconds
            assert abs(got / want - 1) < 0.10, (batch, ctx, got, want)
    got, want = step(calibrated, 4, 500, 2048, 1024).seconds, step(true, 4, 500, 2048, 1024).seconds
    assert abs(got / want - 1) < 0.10
    assert c.rms_error < 0.05 < c.prior_rms_error


def test_each_field_has_an_uncertainty_and_its_samples() -> None:
    base, true = _configs()
    c = fit(base, _measured(true, (2, 8, 32, 64)))
    assert [f.name for f in c.fields] == list(FIELDS)
    for f in c.fields:
        assert 0 < f.stderr < 0.2 * f.value, f
        assert f.samples > 0 and f.windows > 0 and f.data.startswith("vllm:")
    assert c.field("matmul_efficiency_factor").samples == 4 * 3 * 20  # timed prefills
    assert c.field("sequence_overhead_s").samples == 4 * 3 * 1000  # token gaps
    # More noise, a wider error.
    noisy = fit(base, _measured(true, (2, 8, 32, 64), noise=0.10))
    assert noisy.field("sequence_overhead_s").stderr > c.field("sequence_overhead_s").stderr


def test_the_overlay_is_a_catalog_overlay_with_the_fitted_fields(tmp_path: Path) -> None:
    base, true = _configs()
    c = fit(base, _measured(true, (2, 8, 32, 64)))
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(c.overlay()))
    engine = load_catalog(path).engine("vllm")
    assert abs(engine.matmul_efficiency_factor / true.engine.matmul_efficiency_factor - 1) < 0.1
    assert abs(engine.sequence_overhead_s / true.engine.sequence_overhead_s - 1) < 0.1
    assert engine.fitted is not None and config_key(base) in engine.fitted
    assert config_key(base) == "llama-3.1-8b/H100-SXM/tp1/bf16/vllm@vllm/vllm-openai:v0.11.0"


def test_too_few_windows_name_what_is_missing() -> None:
    base, true = _configs()
    few = _measured(true, (2, 8))[:4]
    with pytest.raises(NotEnoughData, match=r"vllm:inter_token_latency_seconds: 4 window\(s\)"):
        fit(base, few)
    no_prefill = [
        Window(w.batch, w.context_tokens, w.gaps, w.gap_s, 0, float("nan"), 0, w.steps)
        for w in _measured(true, (2, 8, 32))
    ]
    with pytest.raises(NotEnoughData, match=r"vllm:request_prefill_time_seconds: 0 window\(s\)"):
        fit(base, no_prefill)
    thin = [
        Window(w.batch, w.context_tokens, 10, w.gap_s, w.prefills, w.prefill_s, w.prompt_tokens)
        for w in _measured(true, (2, 8, 32))
    ]
    with pytest.raises(NotEnoughData, match=">= 50 token gaps"):
        fit(base, thin)


def test_one_batch_size_cannot_tell_the_per_sequence_cost_from_the_per_step_cost() -> None:
    base, true = _configs()
    with pytest.raises(
        NotEnoughData, match=r"vllm:num_requests_running: the running batch stayed between 16.0 and 16.0"
    ):
        fit(base, _measured(true, (16, 16, 16)))


# -- the reads (kvscale.metrics.calibration): PromQL and the answers into windows ------------


def test_selector_and_queries() -> None:
    from kvscale.metrics.calibration import SelectorError, matchers, window_queries
    from kvscale.metrics.engines import ENGINES

    assert matchers("ns", '{pod=~"llama-.*", job="vllm"}') == 'namespace="ns",pod=~"llama-.*", job="vllm"'
    assert matchers(None, None) == ""
    for bad in ("pod=llama", 'pod=~"a" job="b"', "up{}"):
        with pytest.raises(SelectorError, match="--selector"):
            matchers(None, bad)
    q = window_queries(ENGINES["vllm"], 'namespace="ns"', "60s")
    # Every name checked in vLLM 0.11.0 vllm/v1/metrics/loggers.py, and its escaped form.
    assert 'increase({__name__="vllm:inter_token_latency_seconds_sum",namespace="ns"}[60s])' in q["gap_sum"]
    assert "vllm_inter_token_latency_seconds_sum" in q["gap_sum"]
    assert "vllm:time_per_output_token_seconds_count" in q["gap_count"]  # 0.11's deprecated twin
    assert "vllm:request_prefill_time_seconds_sum" in q["prefill_sum"]
    assert "vllm:request_decode_time_seconds_count" in q["decode_count"]
    assert "vllm:iteration_tokens_total_count" in q["steps"]
    assert 'avg_over_time({__name__="vllm:kv_cache_usage_perc"' in q["kv_usage"]
    assert "vllm:num_requests_running" in q["running"]
    assert all(p.startswith("sum by (namespace, pod, instance)") or p.startswith("avg by") for p in q.values())


def _matrix(values: dict[str, float]) -> dict[str, object]:
    return {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {"metric": {"namespace": "ns", "pod": "p-1"}, "values": [[100.0, str(v)] for v in values.values()]}
            ],
        },
    }


def test_windows_from_range_answers() -> None:
    from kvscale.metrics.calibration import cache_tokens, matrix, windows

    def one(value: float) -> dict[tuple[tuple[str, ...], float], float]:
        return matrix(_matrix({"x": value}))

    series = {
        "gap_sum": one(2.0),
        "gap_count": one(100.0),
        "prefill_sum": one(0.5),
        "prefill_count": one(10.0),
        "prompt_sum": one(5120.0),
        "prompt_count": one(10.0),
        "steps": one(50.0),
        "generated": one(400.0),
        "running": one(8.0),
        "kv_usage": one(0.25),
    }
    cache = cache_tokens([{"namespace": "ns", "pod": "p-1", "num_gpu_blocks": "1000", "block_size": "16"}])
    (w,) = windows(series, lambda key: cache.get(key, 0.0))
    assert (w.gap_s, w.gaps, w.prefill_s, w.prompt_tokens) == (0.02, 100.0, 0.05, 512.0)
    assert w.batch == 8.0  # generated tokens per step
    assert w.context_tokens == 0.25 * 16000 / 8.0
    assert w.steps == 50.0 and w.label.startswith("p-1 @ ")
    # No ITL histogram: the finished requests' decode time over their gaps (tokens less one each).
    del series["gap_sum"], series["gap_count"]
    series |= {"decode_sum": one(3.0), "decode_count": one(10.0), "generated_sum": one(160.0)}
    (w,) = windows(series, lambda key: 0.0)
    assert w.gaps == 150.0 and w.gap_s == 3.0 / 150.0
    with pytest.raises(ValueError, match="matrix"):
        matrix({"status": "success", "data": {"resultType": "vector", "result": []}})


# -- the command's input checks --------------------------------------------------------------


def _calibrate(*args: str) -> tuple[int, str]:
    import socket

    from typer.testing import CliRunner

    from kvscale.cli import app

    with socket.socket() as s:  # a port nothing listens on: a Prometheus that is not there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = CliRunner().invoke(app, ["calibrate", "--prometheus", f"http://127.0.0.1:{port}", *args])
    return result.exit_code, result.output


def test_calibrate_input_errors_name_the_option() -> None:
    code, out = _calibrate("--gpu", "H100-SXM", "--selector", "pod=llama")
    assert code == 2 and "--selector" in out
    code, out = _calibrate("--gpu", "H100-SXM", "--window", "5s")
    assert code == 2 and "--window 5s" in out
    code, out = _calibrate("--gpu", "H100-SXM", "--since", "2m", "--window", "1m")
    assert code == 2 and "five windows" in out
    code, out = _calibrate("--gpu", "B300-Imaginary")
    assert code == 2 and "unknown GPU type" in out
    code, out = _calibrate("--gpu", "H100-SXM", "--engine", "tgi")
    assert code == 2 and "--engine tgi" in out


def test_calibrate_says_when_prometheus_is_not_there() -> None:
    code, out = _calibrate("--gpu", "H100-SXM", "--model", "llama-3.1-8b")
    assert code == 1 and "unreachable" in out
