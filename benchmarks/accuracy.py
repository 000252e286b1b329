"""How close kvscale's model is to published measurements. Prints five tables:

1. the figures in benchmarks/data/reference/published-figures.md (vLLM-era articles), as before;
2. the TensorRT-LLM 0.9.0 static table by GPU, tensor-parallel degree and regime (small
   batch <= 8, long prompt 2048 in, large batch otherwise), with the tensorrt-llm profile;
3. memory: rows that ran which the model calls "does not fit";
4. leave-one-GPU-out: each GPU predicted from a fit to the other five (benchmarks/calibrate.py);
5. the NIM closed-loop sweeps replayed through the simulator with N users (throughput,
   mean TTFT, mean ITL per point; warm-up requests left out, as genai-perf does);
6. the GPUStack Performance Lab bursts (Qwen3, GLM-4.5-Air/4.6, gpt-oss; vLLM and SGLang on
   A100/H100) replayed with each row's engine command (benchmarks/gpustack.py), with the
   catalog as is, two engine factors fitted on all runs, and leave-one-model-out.

Aim: median |error| <= 10% and p90 <= 25% on each.
Run: PYTHONPATH=. .venv/bin/python benchmarks/accuracy.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.calibrate import NOT_FITTED, columns, config, leave_one_gpu_out, start_point
from benchmarks.data.published import FIGURES, NOT_COMPARED, bounds_hold
from benchmarks.reference import SweepPoint, static_rows, sweep_points
from kvscale.sim.policies import StaticPolicy
from kvscale.sim.run import SimSetup, Source, simulate
from kvscale.sizing.batching import predict_batch
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.load import ReplicaModel
from kvscale.sizing.workload import Slo, Workload

ENGINE = "tensorrt-llm"
console = Console(width=170)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _stats(errors: Iterable[float]) -> str:
    values = [abs(e) for e in errors]
    if not values:
        return "-"
    return f"{statistics.median(values):5.1%} / {_quantile(values, 0.9):5.1%}"


def published() -> None:
    table = Table(title="1. kvscale sizing model (vllm profile) vs published figures")
    for col in ("group", "figure", "source", "basis", "published", "predicted", "error", "tolerance", "ok"):
        table.add_column(col)
    errors: dict[str, list[float]] = {"all": [], "model": [], "arithmetic": []}
    for f in FIGURES:
        err = f.error()
        errors["all"].append(abs(err))
        errors[f.basis].append(abs(err))
        ok = abs(err) <= f.tolerance + 1e-12
        table.add_row(
            f.group,
            f.what,
            f.source,
            f.basis,
            f"{f.published:g} {f.unit}",
            f"{f.predicted():.4g} {f.unit}",
            f"{err:+.1%}",
            f"±{f.tolerance:.0%}",
            "yes" if ok else "NO",
        )
    console.print(table)
    summary = Table(title="Published figures: absolute relative error")
    for col in ("figures", "count", "median", "p90"):
        summary.add_column(col)
    for name, values in errors.items():
        summary.add_row(name, str(len(values)), f"{statistics.median(values):.1%}", f"{_quantile(values, 0.9):.1%}")
    console.print(summary)
    for claim, holds in bounds_hold().items():
        console.print(f"{'holds' if holds else 'FAILS'}: {claim}")
    console.print("Not compared:")
    for figure, why in NOT_COMPARED:
        console.print(f"  - {figure}: {why}")


def static_table() -> None:
    catalog = default_catalog()
    groups: dict[tuple[str, int, str], list[tuple[float, float, float]]] = defaultdict(list)
    overall: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    not_fit: list[str] = []
    for r in static_rows():
        cfg = config(catalog, r)
        p = predict_batch(cfg, r.batch, r.input_tokens, r.output_tokens)
        if not p.fits:
            not_fit.append(
                f"{r.model} {r.gpu} x{r.tensor_parallel} {r.precision} batch {r.batch} {r.input_tokens}/{r.output_tokens}: "
                f"KV holds {p.kv_cache_tokens} tokens"
            )
        if p.prefill is None or p.decode is None or p.throughput_tokens_per_s is None:
            continue
        errs = (
            p.prefill.seconds / r.ttft_s - 1,
            p.decode.seconds / r.tpot_s - 1,
            p.throughput_tokens_per_s / r.throughput_tokens_per_s - 1,
        )
        if r.model in NOT_FITTED:
            overall[f"{r.model} (not fitted)"].append(errs)
            continue
        groups[(r.gpu, r.tensor_parallel, r.regime)].append(errs)
        overall["all fitted rows"].append(errs)
        overall[r.regime].append(errs)
    table = Table(title="2. TensorRT-LLM 0.9.0 static table (tensorrt-llm profile): |error| median / p90")
    for col in ("GPU", "TP", "regime", "rows", "first-token latency", "token-to-token", "throughput"):
        table.add_column(col)
    for (gpu, tp, regime), group in sorted(groups.items()):
        table.add_row(gpu, str(tp), regime, str(len(group)), *(_stats(e[i] for e in group) for i in range(3)))
    console.print(table)
    totals = Table(title="Static table totals: |error| median / p90")
    for col in ("rows", "count", "first-token latency", "token-to-token", "throughput"):
        totals.add_column(col)
    for name, group in overall.items():
        totals.add_row(name, str(len(group)), *(_stats(e[i] for e in group) for i in range(3)))
    console.print(totals)
    console.print(
        f"3. Memory: {len(not_fit)} of {len(static_rows())} rows that ran are called 'does not fit' or over the KV "
        "capacity by the tensorrt-llm profile"
    )
    for line in not_fit[:10]:
        console.print(f"   {line}")


def leave_one_out() -> None:
    catalog = default_catalog()
    rows = static_rows()
    c = columns(catalog, rows)
    usable = np.array([r.model not in NOT_FITTED for r in rows])
    cv = leave_one_gpu_out(c, start_point(catalog, c), usable)
    table = Table(title="4. Leave-one-GPU-out: fit on five GPU types, predict the sixth with their mean factors")
    for col in ("held-out GPU", "rows", "first-token latency", "token-to-token", "throughput"):
        table.add_column(col)
    for gpu, errs in cv.items():
        table.add_row(gpu, str(len(errs["ttft"])), *(_stats(errs[k].tolist()) for k in ("ttft", "tpot", "throughput")))
    every = {k: np.concatenate([e[k] for e in cv.values()]).tolist() for k in ("ttft", "tpot", "throughput")}
    table.add_row("all", str(len(every["ttft"])), *(_stats(every[k]) for k in ("ttft", "tpot", "throughput")))
    console.print(table)


def replay(point: SweepPoint) -> tuple[float, float, float]:
    """Throughput, mean TTFT and mean ITL of N closed-loop users, warm-up left out."""
    catalog = default_catalog()
    precision = "fp16" if point.precision == "fp16" else "bf16"
    cfg = ServingConfig.build(
        catalog, catalog.model(point.model), catalog.gpu(point.gpu), precision, point.tensor_parallel, "auto", ENGINE
    )
    replica = ReplicaModel(cfg, Workload(point.input_tokens, point.output_tokens, 0.0))
    batch = max(1, min(point.concurrency, replica.kv_max_batch))
    latency = replica.own_prefill(0).seconds + point.output_tokens * replica.decode(batch).seconds
    duration = max(60.0, 6.0 * latency)
    setup = SimSetup(cfg, Slo(60.0, 10.0), batch, cold_start_s=0.0, initial_replicas=1)
    closed = (point.concurrency, point.input_tokens, point.output_tokens, duration)
    result = simulate(setup, Source(closed=closed), StaticPolicy(1))
    warm = duration / 3.0
    kept = [r for r in result.requests if r.done and r.arrival_s >= warm]
    window_end = max(r.finish_s for r in result.requests if r.done)
    generated = sum(
        r.output_tokens for r in result.requests if r.done and r.finish_s >= warm and r.first_token_s >= warm
    )
    throughput = generated / max(window_end - warm, 1e-9)
    ttft = statistics.fmean(r.ttft_s for r in kept) if kept else float("nan")
    itl = statistics.fmean(r.tpot_s for r in kept) if kept else float("nan")
    return throughput, ttft, itl


def sweeps(quick: bool) -> None:
    points = sweep_points()
    if quick:
        points = [p for p in points if p.concurrency in (1, 50, 250)]
    table = Table(title="5. NIM closed-loop sweeps replayed with `simulate --concurrency N` (tensorrt-llm profile)")
    for col in (
        "model",
        "GPU x TP",
        "in/out",
        "N",
        "thr meas",
        "thr sim",
        "TTFT meas ms",
        "TTFT sim ms",
        "ITL meas ms",
        "ITL sim ms",
    ):
        table.add_column(col)
    errs: dict[str, list[float]] = defaultdict(list)
    for p in points:
        thr, ttft, itl = replay(p)
        errs["throughput"].append(thr / p.throughput_tokens_per_s - 1)
        errs["mean TTFT"].append(ttft / p.ttft_mean_s - 1)
        errs["mean ITL"].append(itl / p.itl_mean_s - 1)
        table.add_row(
            p.model,
            f"{p.gpu} x{p.tensor_parallel}",
            f"{p.input_tokens}/{p.output_tokens}",
            str(p.concurrency),
            f"{p.throughput_tokens_per_s:.0f}",
            f"{thr:.0f}",
            f"{p.ttft_mean_s * 1e3:.0f}",
            f"{ttft * 1e3:.0f}",
            f"{p.itl_mean_s * 1e3:.1f}",
            f"{itl * 1e3:.1f}",
        )
    console.print(table)
    totals = Table(title="Closed-loop sweeps: |error| median / p90")
    for col in ("metric", "points", "median / p90"):
        totals.add_column(col)
    for name, values in errs.items():
        totals.add_row(name, str(len(values)), _stats(values))
    console.print(totals)


def modern(quick: bool) -> None:
    """6. GPUStack Performance Lab bursts replayed with each row's own engine command."""
    from benchmarks import gpustack

    catalog = default_catalog()
    selected, skipped = gpustack.runs()
    as_is = gpustack.replay_all(selected, catalog)
    unfitted: gpustack.Point = (-1.0, -1.0, -1.0)  # the catalog's own profiles
    table = {unfitted: as_is[0]} if quick else gpustack.grid(selected, catalog)
    fitted = {"vllm": unfitted, "sglang": unfitted} if quick else gpustack.fit(table, lambda run: True)
    best = gpustack.predictions(table, fitted)
    rows = Table(title="6. GPUStack bursts replayed with `simulate --engine-command` (all prompts at t=0), as fitted")
    for col in ("row", "engine", "GPU", "case", "N", "in/out", "thr meas/sim", "TTFT meas/sim s", "TPOT meas/sim ms"):
        rows.add_column(col)
    for r in sorted(best, key=lambda r: r.run.row_id):
        run = r.run
        rows.add_row(
            run.row_id,
            run.engine,
            run.gpu,
            run.case,
            str(run.requests),
            f"{run.input_tokens}/{run.output_tokens}",
            f"{run.output_tok_s:.0f} / {r.output_tok_s:.0f}",
            f"{run.ttft_mean_s:.2f} / {r.ttft_mean_s:.2f}",
            f"{run.tpot_mean_s * 1e3:.1f} / {r.tpot_mean_s * 1e3:.1f}",
        )
    console.print(rows)
    console.print(f"left out before replay: {skipped}")
    console.print(f"replay refused: {as_is[1]}")
    totals = Table(title="GPUStack replays: |error| median / p90")
    for col in ("set", "runs", "throughput", "mean TTFT", "mean TPOT"):
        totals.add_column(col)

    def add(name: str, replayed: list[gpustack.Replayed]) -> None:
        errs: dict[str, list[float]] = defaultdict(list)
        for r in replayed:
            for k, v in r.errors().items():
                errs[k].append(v)
        totals.add_row(name, str(len(replayed)), *(_stats(errs[k]) for k in ("throughput", "mean TTFT", "mean TPOT")))

    add("catalog as is", as_is[0])
    for engine in ("vllm", "sglang"):
        add(f"  catalog as is, {engine}", [r for r in as_is[0] if r.run.engine == engine])
    if not quick:
        add(f"fitted on all runs {fitted}", best)
        fits, held_out = gpustack.leave_one_model_out(table)
        add("leave-one-model-out", held_out)
        for engine in ("vllm", "sglang"):
            add(f"  leave-one-model-out, {engine}", [r for r in held_out if r.run.engine == engine])
        console.print(
            f"leave-one-model-out fits (sequence overhead s, compute scale, request overhead s) per engine: {fits}"
        )
    console.print(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description="kvscale model accuracy against published measurements")
    parser.add_argument("--quick", action="store_true", help="replay only N = 1, 50, 250 of the sweeps")
    parser.add_argument("--only-modern", action="store_true", help="only section 6 (the GPUStack replays)")
    args = parser.parse_args()
    if not args.only_modern:
        published()
        static_table()
        leave_one_out()
        sweeps(args.quick)
    modern(args.quick)


if __name__ == "__main__":
    main()
