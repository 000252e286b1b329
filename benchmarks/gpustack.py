"""GPUStack Performance Lab runs replayed: every prompt at time 0 on one replica running the
row's own launch command (`kvscale simulate --engine-command ... --trace` of N requests at t=0).

The rows (benchmarks/data/reference/gpustack-perf-lab.csv; GPUStack authors, Apache-2.0) are
vLLM and SGLang runs of Qwen3 (dense and MoE), GLM-4.5-Air/4.6 and gpt-oss on A100-SXM4-80GB
and H100-SXM, measured with `vllm bench serve`. Kept: status ok, no duplicate, not copied from
another page, no concurrency cap or request rate (a burst), a vLLM or SGLang command.
TensorRT-LLM rows and speculative decoding are not modelled and are counted as skipped.

Each request is replayed at the row's mean input and output length (ShareGPT rows vary in
length; the burst's total prefill and decode work is the same, the tail is not).
Metrics: output tokens/s over the run, mean TTFT, mean TPOT (first token excluded), as the
summary of `vllm bench serve` reports them.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvscale.engines.command import EngineCommandError, command_config, parse_engine_command
from kvscale.sim.policies import StaticPolicy
from kvscale.sim.run import SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import Catalog, CatalogError, default_catalog
from kvscale.sizing.workload import Slo

CSV = Path(__file__).resolve().parent / "data" / "reference" / "gpustack-perf-lab.csv"
GPUS = {"A100": "A100-80GB", "H100": "H100-SXM"}
NOT_MODELLED_FLAGS = ("--speculative-algorithm", "--speculative-config")


@dataclass(frozen=True)
class Run:
    row_id: str
    model: str
    gpu: str
    engine: str
    command: str
    case: str
    requests: int
    input_tokens: int
    output_tokens: int
    output_tok_s: float
    ttft_mean_s: float
    tpot_mean_s: float


@dataclass(frozen=True)
class Replayed:
    run: Run
    output_tok_s: float
    ttft_mean_s: float
    tpot_mean_s: float

    def errors(self) -> dict[str, float]:
        r = self.run
        return {
            "throughput": self.output_tok_s / r.output_tok_s - 1,
            "mean TTFT": self.ttft_mean_s / r.ttft_mean_s - 1,
            "mean TPOT": self.tpot_mean_s / r.tpot_mean_s - 1,
        }


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def runs(path: Path = CSV) -> tuple[list[Run], dict[str, int]]:
    """The replayable rows, and why the others were left out (reason -> count)."""
    kept: list[Run] = []
    skipped: dict[str, int] = {}

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["status"] != "ok" or row["duplicate_of"] or "copied_from_other_page" in row["quality_flags"]:
                skip("not ok, duplicate or copied")
                continue
            if row["max_concurrency"] or row["request_rate"]:
                skip("concurrency cap or request rate (not a burst)")
                continue
            if row["engine"] not in ("vllm", "sglang"):
                skip(f"engine {row['engine']} not modelled")
                continue
            if any(flag in row["serving_command"] for flag in NOT_MODELLED_FLAGS):
                skip("speculative decoding not modelled")
                continue
            values = [
                _float(row[k])
                for k in ("mean_input_len", "mean_output_len", "output_tok_s", "ttft_mean_ms", "tpot_mean_ms")
            ]
            requests = _float(row["successful_requests"]) or _float(row["num_prompts"])
            if any(v is None or v <= 0 for v in values) or not requests:
                skip("a metric or length missing")
                continue
            mean_in, mean_out, thr, ttft_ms, tpot_ms = (float(v) for v in values)  # type: ignore[arg-type]
            kept.append(
                Run(
                    row["row_id"],
                    row["model"],
                    row["gpu"],
                    row["engine"],
                    row["serving_command"],
                    row["case"],
                    int(requests),
                    max(1, round(mean_in)),
                    max(2, round(mean_out)),
                    thr,
                    ttft_ms / 1e3,
                    tpot_ms / 1e3,
                )
            )
    return kept, skipped


def replay(run: Run, catalog: Catalog | None = None) -> Replayed | str:
    """The run through the simulator, or why it cannot be replayed."""
    catalog = catalog or default_catalog()
    try:
        command = parse_engine_command(run.command)
        cc = command_config(catalog, command, catalog.gpu(GPUS[run.gpu]))
    except (EngineCommandError, CatalogError, KeyError) as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:100]}"
    cfg = cc.config
    reason = cfg.unsupported_reason()
    if reason:
        return reason
    if not cfg.memory.fits:
        return f"does not fit on {cfg.gpus} x {cfg.gpu.name} at {cfg.precision.name}"
    context = min(cc.max_model_len, run.input_tokens + run.output_tokens)
    if cfg.memory.sequence_tokens(context) > cfg.memory.kv_capacity_tokens:
        return "one sequence exceeds the modelled KV cache"
    setup = SimSetup(cfg, Slo(3600.0, 60.0), cc.max_batch, cold_start_s=0.0, initial_replicas=1)
    trace = [TraceRequest(0.0, run.input_tokens, run.output_tokens) for _ in range(run.requests)]
    result = simulate(setup, Source(trace=trace), StaticPolicy(1))
    done = [r for r in result.requests if r.done]
    if not done:
        return "no request finished"
    span = max(r.finish_s for r in done)
    generated = sum(r.output_tokens for r in done)
    return Replayed(
        run,
        generated / span,
        statistics.fmean(r.ttft_s for r in done),
        statistics.fmean(r.tpot_s for r in done),
    )


def replay_all(
    selected: list[Run], catalog: Catalog | None = None, progress: Callable[[int], None] | None = None
) -> tuple[list[Replayed], dict[str, str]]:
    done: list[Replayed] = []
    failed: dict[str, str] = {}
    for i, run in enumerate(selected):
        out = replay(run, catalog)
        if isinstance(out, str):
            failed[run.row_id] = out
        else:
            done.append(out)
        if progress:
            progress(i)
    return done, failed


# --- calibration: a few engine factors fitted to the runs ----------------------------------

# (per-sequence step cost, GEMM factor): the engine's CPU cost per running sequence per step
# (scheduling, sampling, detokenizing, output processing; EngineProfile.sequence_overhead_s),
# and the share of the GPU's GEMM efficiency its steps reach (EngineProfile.matmul_efficiency_factor). Fitted per engine (vLLM and SGLang
# rows apart) on a small grid: every point replays every run.
SEQUENCE_OVERHEADS_S = (0.0, 60e-6, 120e-6, 180e-6, 250e-6, 350e-6)
COMPUTE_SCALES = (0.45, 0.6, 0.75, 1.0)
Point = tuple[float, float]


def scaled_catalog(catalog: Catalog, sequence_overhead_s: float, compute: float) -> Catalog:
    """The catalog with vLLM's and SGLang's two fitted fields set to a grid point."""
    engines = dict(catalog.engines)
    for name in ("vllm", "sglang"):
        engines[name] = engines[name].model_copy(
            update={"sequence_overhead_s": sequence_overhead_s, "matmul_efficiency_factor": compute}
        )
    return catalog.model_copy(update={"engines": engines})


def loss(replayed: list[Replayed]) -> float:
    """Mean squared log error over throughput, mean TTFT and mean TPOT."""
    terms = [math.log1p(e) ** 2 for r in replayed for e in r.errors().values() if e > -1]
    return statistics.fmean(terms) if terms else float("inf")


def grid(selected: list[Run], catalog: Catalog) -> dict[Point, list[Replayed]]:
    """Every grid point's replays of `selected`."""
    return {
        (seq, compute): replay_all(selected, scaled_catalog(catalog, seq, compute))[0]
        for seq in SEQUENCE_OVERHEADS_S
        for compute in COMPUTE_SCALES
    }


def fit(table: dict[Point, list[Replayed]], keep: Callable[[Run], bool]) -> dict[str, Point]:
    """Per engine, the grid point with the least loss over the runs `keep` admits."""
    engines = sorted({r.run.engine for r in next(iter(table.values()))})
    return {
        engine: min(table, key=lambda k: loss([r for r in table[k] if r.run.engine == engine and keep(r.run)]))
        for engine in engines
    }


def predictions(table: dict[Point, list[Replayed]], fitted: dict[str, Point]) -> list[Replayed]:
    """Each run at its engine's fitted point."""
    return [r for engine, point in fitted.items() for r in table[point] if r.run.engine == engine]


def leave_one_model_out(table: dict[Point, list[Replayed]]) -> tuple[dict[str, dict[str, Point]], list[Replayed]]:
    """For each model: the points fitted on the other models' runs, and their replays of the
    held-out model's runs."""
    models = sorted({r.run.model for r in next(iter(table.values()))})
    fits: dict[str, dict[str, Point]] = {}
    held_out: list[Replayed] = []
    for model in models:
        fits[model] = fit(table, lambda run, model=model: run.model != model)  # type: ignore[misc]
        held_out += [r for r in predictions(table, fits[model]) if r.run.model == model]
    return fits, held_out
