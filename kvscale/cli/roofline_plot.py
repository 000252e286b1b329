"""Roofline and throughput-latency pictures (matplotlib, imported only when asked for)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kvscale.sizing.batching import BatchPrediction
from kvscale.sizing.config import ServingConfig


def draw_roofline(cfg: ServingConfig, curve: list[BatchPrediction], path: Path) -> None:
    points = [p for p in curve if p.decode is not None and p.throughput_tokens_per_s is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    tpot_ms = [p.decode.seconds * 1e3 for p in points if p.decode]
    tput = [p.throughput_tokens_per_s or 0.0 for p in points]
    left.plot(tpot_ms, tput, marker="o")
    for p, x, y in zip(points, tpot_ms, tput, strict=True):
        left.annotate(str(p.batch), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    left.set_xlabel("time per output token (ms)")
    left.set_ylabel("generated tokens/s (whole TP group)")
    left.set_title(f"{cfg.model.name} on {cfg.tensor_parallel} x {cfg.gpu.name}: one point per batch size")
    left.grid(True, alpha=0.3)

    peak = cfg.peak_flops_per_s
    bandwidth = cfg.gpu.hbm_bandwidth_bytes_per_s
    ridge = peak / bandwidth
    xs = [ridge / 64 * 2**k for k in range(0, 13)]
    right.loglog(xs, [min(peak, x * bandwidth) / 1e12 for x in xs], color="black", label="roofline (peak)")
    right.axvline(ridge, color="grey", linestyle=":", label=f"ridge {ridge:.0f} FLOP/byte")
    intensity = [p.decode.flops_per_gpu / p.decode.bytes_per_gpu for p in points if p.decode]
    achieved = [p.decode.flops_per_gpu / p.decode.seconds / 1e12 for p in points if p.decode]
    right.loglog(intensity, achieved, marker="o", linestyle="", label="decode step (predicted)")
    for p, x, y in zip(points, intensity, achieved, strict=True):
        right.annotate(str(p.batch), (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    right.set_xlabel("arithmetic intensity (FLOP/byte)")
    right.set_ylabel("TFLOP/s per GPU")
    right.set_title(f"roofline, {cfg.precision.name}")
    right.legend(fontsize=8)
    right.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
