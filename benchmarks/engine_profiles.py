"""The engine profiles (kvscale/sizing/catalog/engines.yaml) against the GPUStack bursts.

Every replayable row of benchmarks/data/reference/gpustack-perf-lab.csv (benchmarks/gpustack.py:
all prompts at t = 0 on one replica, `simulate --engine-command ROW`) with the profile its
engine release selects (kvscale.sizing.engine_profiles.profile_for: vLLM 0.10-0.11 rows get
`vllm-0.11`, SGLang 0.5 rows `sglang-0.5`), i.e. the built-in defaults, no overlay. Prints:

1. per row: measured / replayed throughput, mean TTFT and mean TPOT, and the errors;
2. |error| median / p90 by engine, model, GPU, case, and for the MoE and sliding-window rows;
3. with --grid: the three fitted fields per engine (sequence_overhead_s,
   matmul_efficiency_factor, request_overhead_s) refitted on a grid (gpustack.grid), on all
   rows, leave-one-model-out and leave-one-GPU-out (held-out errors), and the held-out vLLM
   errors per shape (case: sharegpt, short, medium, long, very_long).

4. with --png PATH: predicted against measured, per metric, coloured by engine and marked by
   model (the README's picture).

Run: PYTHONPATH=. .venv/bin/python benchmarks/engine_profiles.py [--grid] [--png PATH]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable

from rich.console import Console
from rich.table import Table

from benchmarks import gpustack
from kvscale.engines.command import parse_engine_command
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.engine_profiles import profile_for

console = Console(width=190)
METRICS = ("throughput", "mean TTFT", "mean TPOT")
# Rows of MoE models (GLM-4.5-Air/4.6, Qwen3-235B-A22B, gpt-oss) and of sliding-window attention (gpt-oss).
MOE_MODELS = ("GLM", "235B", "gpt-oss")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _stats(errors: Iterable[float]) -> str:
    values = [abs(e) for e in errors]
    if not values:
        return "-"
    return f"{statistics.median(values):5.1%} / {_quantile(values, 0.9):5.1%}"


def summary(title: str, groups: dict[str, list[gpustack.Replayed]]) -> None:
    table = Table(title=title)
    for col in ("set", "runs", *METRICS):
        table.add_column(col)
    for name, replayed in groups.items():
        table.add_row(name, str(len(replayed)), *(_stats(r.errors()[m] for r in replayed) for m in METRICS))
    console.print(table)


def by(replayed: list[gpustack.Replayed], key: Callable[[gpustack.Run], str]) -> dict[str, list[gpustack.Replayed]]:
    groups: dict[str, list[gpustack.Replayed]] = defaultdict(list)
    for r in replayed:
        groups[key(r.run)].append(r)
    return dict(sorted(groups.items()))


def per_row(replayed: list[gpustack.Replayed]) -> None:
    catalog = default_catalog()
    table = Table(title="GPUStack bursts with the default engine profiles (measured / replayed; error)")
    for col in ("row", "profile", "case", "N", "in/out", "tok/s", "TTFT s", "TPOT ms", "thr", "TTFT", "TPOT"):
        table.add_column(col)
    for r in sorted(replayed, key=lambda r: r.run.row_id):
        run, e = r.run, r.errors()
        command = parse_engine_command(run.command, run.engine_version or None)
        table.add_row(
            run.row_id,
            profile_for(catalog, command.engine, command.version).profile,
            run.case,
            str(run.requests),
            f"{run.input_tokens}/{run.output_tokens}",
            f"{run.output_tok_s:.0f} / {r.output_tok_s:.0f}",
            f"{run.ttft_mean_s:.1f} / {r.ttft_mean_s:.1f}",
            f"{run.tpot_mean_s * 1e3:.0f} / {r.tpot_mean_s * 1e3:.0f}",
            *(f"{e[m]:+.0%}" for m in METRICS),
        )
    console.print(table)


def draw(replayed: list[gpustack.Replayed], path: str) -> None:
    """Predicted against measured on log axes, one panel per metric; the diagonal is exact and
    the band is +-25%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    Pick = Callable[[gpustack.Replayed], tuple[float, float]]
    metrics: tuple[tuple[str, str, Pick], ...] = (
        ("throughput", "output tok/s", lambda r: (r.run.output_tok_s, r.output_tok_s)),
        ("mean TTFT", "mean TTFT s", lambda r: (r.run.ttft_mean_s, r.ttft_mean_s)),
        ("mean TPOT", "mean TPOT ms", lambda r: (r.run.tpot_mean_s * 1e3, r.tpot_mean_s * 1e3)),
    )
    models = sorted({r.run.model for r in replayed})
    markers = dict(zip(models, "osD^v<>phX*P", strict=False))
    colours = {"vllm": "tab:blue", "sglang": "tab:orange"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 5))
    for ax, (metric, title, pick) in zip(axes, metrics, strict=True):
        lo, hi = float("inf"), 0.0
        for r in replayed:
            measured, predicted = pick(r)
            lo, hi = min(lo, measured, predicted), max(hi, measured, predicted)
            ax.scatter(
                measured,
                predicted,
                s=22,
                alpha=0.75,
                marker=markers.get(r.run.model, "o"),
                color=colours.get(r.run.engine, "tab:gray"),
            )
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
        ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="gray", alpha=0.15)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {title}")
        ax.set_ylabel(f"predicted {title}")
        errors = [abs(r.errors()[metric]) for r in replayed]
        ax.set_title(f"{title}: median |error| {statistics.median(errors):.0%}")
    handles = [Line2D([], [], marker="o", linestyle="", color=c, label=e) for e, c in colours.items()]
    handles += [Line2D([], [], marker=m, linestyle="", color="black", label=k) for k, m in markers.items()]
    fig.legend(handles=handles, loc="lower center", ncol=6, fontsize=8, frameon=False)
    fig.suptitle("GPUStack bursts (vLLM 0.10-0.11, SGLang 0.5; A100 and H100): kvscale's default engine profiles")
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description="engine profiles against the GPUStack bursts")
    parser.add_argument("--grid", action="store_true", help="refit the three fields on a grid (a few minutes)")
    parser.add_argument("--png", help="draw predicted against measured into this file")
    args = parser.parse_args()
    catalog = default_catalog()
    selected, skipped = gpustack.runs()
    replayed, refused = gpustack.replay_all(selected, catalog)
    if args.png:
        draw(replayed, args.png)
    per_row(replayed)
    console.print(f"left out before replay: {skipped}")
    console.print(f"replay refused: {refused}")
    moe = [r for r in replayed if any(k.lower() in r.run.model.lower() for k in MOE_MODELS)]
    summary(
        "Default profiles: |error| median / p90",
        {
            "all": replayed,
            **{f"engine {k}": v for k, v in by(replayed, lambda run: run.engine).items()},
            **{f"GPU {k}": v for k, v in by(replayed, lambda run: run.gpu).items()},
            **{f"case {k}": v for k, v in by(replayed, lambda run: run.case).items()},
            **{f"model {k}": v for k, v in by(replayed, lambda run: run.model).items()},
            "MoE models (GLM, Qwen3-235B, gpt-oss)": moe,
            "sliding window (gpt-oss)": [r for r in replayed if "gpt-oss" in r.run.model.lower()],
        },
    )
    if not args.grid:
        return
    table = gpustack.grid(selected, catalog)
    fitted = gpustack.fit(table, lambda run: True)
    console.print(f"fit on all rows (sequence_overhead_s, matmul_efficiency_factor, request_overhead_s): {fitted}")
    model_fits, lomo = gpustack.leave_one_model_out(table)
    gpu_fits, logo = gpustack.leave_one_gpu_out(table)
    console.print(f"leave-one-model-out fits: {model_fits}")
    console.print(f"leave-one-GPU-out fits: {gpu_fits}")
    summary(
        "Grid refit: |error| median / p90 (held-out sets predict each model / GPU from a fit to the others)",
        {
            "fitted on all rows": gpustack.predictions(table, fitted),
            "leave-one-model-out": lomo,
            **{f"  leave-one-model-out, {k}": v for k, v in by(lomo, lambda run: run.engine).items()},
            "leave-one-GPU-out": logo,
            **{f"  leave-one-GPU-out, {k}": v for k, v in by(logo, lambda run: run.gpu).items()},
        },
    )
    # The aim is per shape too (each case within 25%): the held-out errors by case, vLLM
    # rows (the profile the modern replays use) and all engines.
    summary(
        "Held out per shape: |error| median / p90 (vLLM rows; leave-one-model-out, then leave-one-GPU-out)",
        {
            **{
                f"LOMO {k}": v for k, v in by([r for r in lomo if r.run.engine == "vllm"], lambda run: run.case).items()
            },
            **{
                f"LOGO {k}": v for k, v in by([r for r in logo if r.run.engine == "vllm"], lambda run: run.case).items()
            },
        },
    )


if __name__ == "__main__":
    main()
