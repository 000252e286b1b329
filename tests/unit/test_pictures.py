"""The pictures say what they show (issue 20): simulate's timeline titles the SLO, the load and
the routing and keeps one baseline's outliers from flattening the rest; the roofline's roof
starts at batch 1 and the SLO is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.lines import Line2D
from typer.testing import CliRunner

from kvscale.cli import app
from kvscale.cli.roofline_plot import roofline_figure
from kvscale.cli.simulate_plot import outlier_cap, timeline_figure, timeline_title
from kvscale.sim.run import SimResult, TimelinePoint
from kvscale.sizing.batching import throughput_latency_curve
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo

runner = CliRunner()


def xdata(line: Line2D) -> list[float]:
    return [float(x) for x in np.asarray(line.get_xdata(), dtype=float)]


def test_roof_starts_at_batch_one_and_the_slo_is_drawn() -> None:
    cat = default_catalog()
    cfg = ServingConfig.build(cat, cat.model("llama-3.1-8b"), cat.gpu("H100-SXM"), "bf16", 1)
    curve = throughput_latency_curve(cfg, 512, 256)
    assert curve[0].batch == 1 and curve[0].decode is not None
    batch_one = curve[0].decode.flops_per_gpu / curve[0].decode.bytes_per_gpu
    fig = roofline_figure(cfg, curve, ttft_s=0.5, tpot_s=0.03)
    left, right = fig.axes
    roof = next(line for line in right.get_lines() if line.get_label() == "roofline (peak)")
    xs = xdata(roof)
    assert xs[0] == pytest.approx(batch_one)  # before: ridge/64, right of batch 1's point
    assert right.get_xlim()[0] < batch_one
    target = next(line for line in left.get_lines() if str(line.get_label()).startswith("TPOT target"))
    assert xdata(target) == [30.0, 30.0]
    late = next(line for line in left.get_lines() if str(line.get_label()).startswith("batch prefill over 500 ms"))
    late_ms = {round(x, 6) for x in xdata(late)}
    expected = {round(p.decode.seconds * 1e3, 6) for p in curve if p.decode and (p.ttft_s or 0) > 0.5}
    assert late_ms == expected and expected
    assert "TTFT <= 500 ms, TPOT <= 30 ms" in left.get_title()


def test_roofline_command_takes_the_slo(tmp_path: Path) -> None:
    png = tmp_path / "roof.png"
    args = ["roofline", "-m", "llama-3.1-8b", "--gpu", "H100-SXM", "--ttft", "500ms", "--tpot", "30ms"]
    out = runner.invoke(app, [*args, "--png", str(png), "--json"])
    assert out.exit_code == 0, out.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    bad = runner.invoke(app, [*args[:-1], "30", "--png", str(png)])
    assert bad.exit_code == 2 and "--tpot" in bad.output


def _result(policy: str, ready: list[int], ttft_s: list[float]) -> SimResult:
    timeline = [TimelinePoint(60.0 * i, 1.0, r, r, t, 0.02) for i, (r, t) in enumerate(zip(ready, ttft_s, strict=True))]
    return SimResult(policy, [], 0.0, 0.0, 0, 0, 60.0 * len(ready), timeline)


def test_outlier_cap() -> None:
    assert outlier_cap([100, 5, 4]) == 7.5
    assert outlier_cap([12, 10, 4]) is None  # nothing stands out
    assert outlier_cap([100]) is None
    assert outlier_cap([100.0, 0.2], floor=3.0) == 3.0


def test_timeline_caps_one_baselines_outliers() -> None:
    slo = Slo(1.0, 0.05, 99.0)
    results = [
        _result("kvscale", [1, 2, 3, 2], [0.2, 0.3, 0.4, 0.2]),
        _result("keda", [1, 100, 100, 1], [0.2, 900.0, 0.3, 0.2]),
        _result("static", [4, 4, 4, 4], [0.1, 0.2, 0.2, 0.1]),
    ]
    fig = timeline_figure(results, slo, timeline_title("m on 1 x L4 (bf16)", slo, "poisson:rate=1", "gateway"))
    _, replicas, ttft = fig.axes
    assert replicas.get_ylim()[1] == pytest.approx(6.0)  # 1.5 x the second largest (static's 4)
    labels = [line.get_label() for line in replicas.get_lines()]
    assert "keda (up to 100, off the scale)" in labels and "kvscale" in labels
    assert ttft.get_ylim()[1] == pytest.approx(3000.0)  # 3 x the TTFT target
    assert any(str(line.get_label()).startswith("keda (up to 900 s") for line in ttft.get_lines())


def test_simulate_picture_titles_slo_load_and_routing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvscale.cli.simulate_plot as plot

    seen: dict[str, Any] = {}
    monkeypatch.setattr(plot, "draw_timeline", lambda results, slo, path, title: seen.update(title=title))
    load = "poisson:rate=2,duration=2m"
    args = ["simulate", "--load", load, "-m", "llama-3.1-8b", "--ttft", "1s", "--tpot", "60ms", "--percentile", "99"]
    out = runner.invoke(
        app, [*args, "--gpu", "L4", "--policy", "static", "--routing", "gateway", "--png", str(tmp_path / "s.png")]
    )
    assert out.exit_code == 0, out.output
    title = seen["title"]
    assert title.startswith("llama-3.1-8b on ") and " x L4 (bf16)\n" in title
    assert "SLO p99: TTFT <= 1000 ms, TPOT <= 60 ms" in title
    assert f"load {load}" in title and "routing gateway" in title
