"""Roofline and throughput-latency pictures (matplotlib, imported only when asked for)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from kvscale.sizing.batching import BatchPrediction
from kvscale.sizing.config import ServingConfig


def roof_span(intensities: list[float], ridge: float) -> tuple[float, float]:
    """Where the drawn roof starts and ends (FLOP/byte): at the lowest point's intensity (batch 1,
    on the bandwidth slope far left of the ridge) to past the ridge and the highest point."""
    low = min([*intensities, ridge])
    high = max([*intensities, ridge]) * 4
    return low, high


def roofline_figure(
    cfg: ServingConfig, curve: list[BatchPrediction], ttft_s: float | None = None, tpot_s: float | None = None
) -> Figure:
    """Left: throughput against TPOT, one point per batch size (with an SLO: its TPOT target as a
    line; with a TTFT target, the points whose batch prefill misses it hollow). Right: each decode step on the roofline."""
    points = [p for p in curve if p.decode is not None and p.throughput_tokens_per_s is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    tpot_ms = [p.decode.seconds * 1e3 for p in points if p.decode]
    tput = [p.throughput_tokens_per_s or 0.0 for p in points]
    left.plot(tpot_ms, tput, marker="o", label="batch size (labelled)")
    for p, x, y in zip(points, tpot_ms, tput, strict=True):
        left.annotate(str(p.batch), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    title = f"{cfg.model.name} on {cfg.tensor_parallel} x {cfg.gpu.name}: one point per batch size"
    targets = []
    if tpot_s is not None:
        left.axvline(tpot_s * 1e3, color="red", linestyle="--", label=f"TPOT target {tpot_s * 1e3:g} ms")
        targets.append(f"TPOT <= {tpot_s * 1e3:g} ms")
    if ttft_s is not None:
        late = [(x, y) for p, x, y in zip(points, tpot_ms, tput, strict=True) if (p.ttft_s or 0.0) > ttft_s]
        targets.insert(0, f"TTFT <= {ttft_s * 1e3:g} ms")
        if late:
            left.plot(
                [x for x, _ in late],
                [y for _, y in late],
                marker="o",
                linestyle="",
                markerfacecolor="white",
                color="red",
                label=f"batch prefill over {ttft_s * 1e3:g} ms",
            )
    if targets:
        title += f"\nSLO: {', '.join(targets)}"
    left.set_xlabel("time per output token (ms)")
    left.set_ylabel("generated tokens/s (whole TP group)")
    left.set_title(title, fontsize=10)
    left.legend(fontsize=8)
    left.grid(True, alpha=0.3)

    peak = cfg.peak_flops_per_s
    bandwidth = cfg.gpu.hbm_bandwidth_bytes_per_s
    ridge = peak / bandwidth
    intensity = [p.decode.flops_per_gpu / p.decode.bytes_per_gpu for p in points if p.decode]
    low, high = roof_span(intensity, ridge)
    steps = 64
    xs = [low * (high / low) ** (k / steps) for k in range(steps + 1)]
    right.loglog(xs, [min(peak, x * bandwidth) / 1e12 for x in xs], color="black", label="roofline (peak)")
    right.axvline(ridge, color="grey", linestyle=":", label=f"ridge {ridge:.0f} FLOP/byte")
    achieved = [p.decode.flops_per_gpu / p.decode.seconds / 1e12 for p in points if p.decode]
    right.loglog(intensity, achieved, marker="o", linestyle="", label="decode step (predicted)")
    for p, x, y in zip(points, intensity, achieved, strict=True):
        right.annotate(str(p.batch), (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    right.set_xlim(low / 1.5, high)
    right.set_xlabel("arithmetic intensity (FLOP/byte)")
    right.set_ylabel("TFLOP/s per GPU")
    right.set_title(f"roofline, {cfg.precision.name}")
    right.legend(fontsize=8)
    right.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def draw_roofline(
    cfg: ServingConfig,
    curve: list[BatchPrediction],
    path: Path,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
) -> None:
    fig = roofline_figure(cfg, curve, ttft_s, tpot_s)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
