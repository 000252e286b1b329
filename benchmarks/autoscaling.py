"""The autoscaling trace suite: every policy, both routings, on the bundled traces at several
rate scales and on the seeded load generators, for several model/GPU pairs, at a p99 SLO.

Per case it prints a table (SLO attainment, GPU-hours, GPU-hours over the bound and over
peak, for every policy behind a plain Service and behind a gateway) and whether kvscale met
the aim (issue 17): >= 99% attainment, or within 1 point of the bound where the bound itself
falls short; <= 0.75x the GPU-hours of peak (the cheapest fixed fleet meeting the SLO) and
<= 2x the bound's; fewer GPU-hours than every baseline that also reaches the target.
`--png-dir` draws one picture per case.

Run: .venv/bin/python benchmarks/autoscaling.py [--cases NAME,...] [--jobs N] [--png-dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvscale.autoscaling.capacity import SizingCapacity, default_cold_start_s
from kvscale.planner.search import PlanRequest, plan
from kvscale.sim.compare import make_policies, run_bound, run_oracle, run_peak
from kvscale.sim.fit import fit_trace
from kvscale.sim.generators import generate, parse_load
from kvscale.sim.policies import KvscalePolicy
from kvscale.sim.report import attainment_from, gpu_hours_from, summary
from kvscale.sim.run import SimResult, SimSetup, Source, simulate
from kvscale.sim.session import SimulationError, setup_from_plan, starting_fleet
from kvscale.sim.trace import TraceRequest, rate_scale, read_trace
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.workload import Slo

TRACES = Path(__file__).resolve().parent / "data" / "traces"
POLICIES = ("kvscale", "static", "hpa", "keda", "saturation", "trailing")
ROUTINGS = ("service", "gateway")
HEADROOM = 0.10
MAX_REPLICAS = 64  # maxReplicas for every policy (and the bound's search)
COLD_START_JITTER = 0.2  # each replica's start takes the default x U(0.8, 1.2)
AIM_ATTAINMENT, AIM_VS_PEAK, AIM_VS_BOUND = 0.99, 0.75, 2.0


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    gpu: str
    tp: int
    ttft_s: float
    tpot_s: float
    load: str  # a trace file name under benchmarks/data/traces, or a generator spec
    rate_scale: float = 1.0
    weights_cached: bool = False  # the cold start includes downloading the weights unless cached
    seed: int = 0
    # Generated loads run this long before the measured part: every policy learns the load
    # first (attainment and GPU-hours are counted from here; the whole run is printed too).
    warmup_s: float = 0.0
    # The GPU-hours aim over peak: issue 17's 0.75x; issue 27's bursty shapes (a burst shorter
    # than the cold start cannot be chased, so the best fixed fleet is the yardstick) 1.0x.
    aim_vs_peak: float = AIM_VS_PEAK

    @property
    def slo(self) -> Slo:
        return Slo(self.ttft_s, self.tpot_s, 99.0)

    def trace(self) -> list[TraceRequest]:
        if self.load.endswith((".csv", ".jsonl")):
            base = read_trace(TRACES / self.load)
        else:
            spec = parse_load(self.load)
            spec = replace(spec, values={**spec.values, "duration": spec.duration_s + self.warmup_s})
            base = generate(spec, seed=self.seed)
        return rate_scale(base, self.rate_scale, seed=self.seed) if self.rate_scale != 1.0 else base


AZURE, MOONCAKE = "azure-llm-conv-2023.csv", "mooncake-synthetic.jsonl"
CASES = (
    Case("azure-x1", "llama-3.1-8b", "L40S", 1, 1.0, 0.05, AZURE),
    Case("azure-x4", "llama-3.1-8b", "L40S", 1, 1.0, 0.05, AZURE, rate_scale=4.0),
    # The long-context case (TTFT 5 s), and the same trace with a TTFT target its longest
    # prompts can meet, at two rate scales.
    Case("mooncake-x1", "llama-3.1-70b", "H100-SXM", 4, 5.0, 0.08, MOONCAKE, weights_cached=True),
    Case("mooncake-x1-10s", "llama-3.1-70b", "H100-SXM", 4, 10.0, 0.08, MOONCAKE, weights_cached=True),
    Case("mooncake-x2-10s", "llama-3.1-70b", "H100-SXM", 4, 10.0, 0.08, MOONCAKE, rate_scale=2.0, weights_cached=True),
    Case(
        "bursty-prefill",
        "llama-3.1-8b",
        "H100-SXM",
        1,
        2.0,
        0.06,
        "bursty:base=0.5,peak=90,on=90s,off=6m,rise=45s,input=2000,output=120,duration=1h",
        warmup_s=1200.0,
    ),
    Case(
        "diurnal",
        "qwen2.5-7b",
        "L40S",
        1,
        1.0,
        0.05,
        "diurnal:low=2,high=30,period=40m,input=800,output=200,duration=1h",
    ),
    Case("step", "mistral-7b", "L4", 1, 1.5, 0.08, "step:before=1,after=6,at=15m,input=600,output=150,duration=40m"),
    # The shape of production traffic (not a file we have): batch submissions of ~60
    # requests within seconds over a base load, heavy-tailed prompts, outputs of ~13 tokens at
    # the median; and the mean prompt moving 2-3x between minutes at a constant rate.
    Case(
        "batches-short",
        "llama-3.1-8b",
        "H100-SXM",
        1,
        2.0,
        0.06,
        "batches:base=2,every=40s,size=60,spread=3s,input=1500,output=25,lengths=heavy,duration=40m",
        warmup_s=600.0,
    ),
    Case(
        "drift",
        "llama-3.1-8b",
        "L40S",
        1,
        2.0,
        0.06,
        "drift:rate=4,swing=2.5,input=1500,output=150,duration=40m",
        warmup_s=600.0,
    ),
    Case(
        "flash-heavy",
        "llama-3.1-8b",
        "A100-80GB",
        1,
        2.0,
        0.06,
        "flash:base=3,peak=30,at=15m,rise=1m,decay=8m,input=1000,output=200,lengths=heavy,duration=45m",
    ),
    # Held out: added 2026-11-26 after the policy's last change and never tuned on (other
    # rate scales of the traces, larger and rarer batches, another model and GPU per shape).
    Case("azure-x2", "llama-3.1-8b", "L40S", 1, 1.0, 0.05, AZURE, rate_scale=2.0, seed=1),
    Case(
        "mooncake-x1.5-10s",
        "llama-3.1-70b",
        "H100-SXM",
        4,
        10.0,
        0.08,
        MOONCAKE,
        rate_scale=1.5,
        weights_cached=True,
        seed=1,
    ),
    Case(
        "batches-big",
        "llama-3.1-8b",
        "H100-SXM",
        1,
        3.0,
        0.06,
        "batches:base=1,every=90s,size=200,spread=5s,input=3000,output=40,lengths=heavy,duration=50m",
        warmup_s=600.0,
        seed=1,
    ),
    Case(
        "bursty-qwen",
        "qwen2.5-7b",
        "A100-80GB",
        1,
        1.5,
        0.06,
        "bursty:base=1,peak=40,on=2m,off=4m,rise=30s,input=1200,output=300,duration=1h",
        warmup_s=1200.0,
        seed=7,
    ),
    # Issue 27's shapes, added 2026-11-28 with burst-aware holding. Tuned on: batch submissions
    # of hundreds of requests within seconds over a base load (index of dispersion ~20-25 over
    # 5 s windows) with short outputs, and bursts of 40 s (shorter than the cold start) at
    # random intervals. The aim for these is issue 27's: <= 1.0x peak.
    Case(
        "batches-prod",
        "llama-3.1-8b",
        "H100-SXM",
        1,
        2.0,
        0.06,
        "batches:base=10,every=2m,size=200,spread=3s,input=1000,output=30,lengths=heavy,duration=1h",
        warmup_s=1200.0,
        aim_vs_peak=1.0,
    ),
    Case(
        "spikes",
        "llama-3.1-8b",
        "L40S",
        1,
        2.0,
        0.06,
        "spikes:base=2,peak=30,every=3m,length=40s,input=800,output=100,duration=1h",
        warmup_s=1200.0,
        aim_vs_peak=1.0,
    ),
    # p99 TTFT 4 s: at 3 s no fleet meets p99 (the simulator's p99 TTFT is 3.17 s at 32 warm
    # replicas behind a gateway: its p99 prompt, ~9.2k tokens, takes 3.1 s to prefill on an idle
    # L4), which the planner has said since prompt bins keep their spans.
    Case(
        "drift-l4",
        "mistral-7b",
        "L4",
        1,
        4.0,
        0.08,
        "drift:rate=2,swing=3,input=2500,output=80,duration=40m",
        warmup_s=600.0,
        seed=2,
    ),
    # Held out for issue 27 (never run while tuning): other rates, sizes, models, GPUs and
    # cold starts (weights cached) of the same two shapes.
    Case(
        "batches-prod-l40s",
        "llama-3.1-8b",
        "L40S",
        1,
        2.0,
        0.06,
        "batches:base=20,every=90s,size=300,spread=4s,input=600,output=20,lengths=heavy,duration=1h",
        warmup_s=1200.0,
        seed=3,
        aim_vs_peak=1.0,
    ),
    Case(
        "batches-qwen-cached",
        "qwen2.5-7b",
        "H100-SXM",
        1,
        1.5,
        0.05,
        "batches:base=20,every=3m,size=400,spread=5s,input=1500,output=40,lengths=heavy,duration=1h",
        weights_cached=True,
        warmup_s=1200.0,
        seed=5,
        aim_vs_peak=1.0,
    ),
    Case(
        "spikes-cached",
        "mistral-7b",
        "A100-80GB",
        1,
        1.5,
        0.06,
        "spikes:base=4,peak=25,every=5m,length=45s,input=1200,output=150,duration=1h",
        weights_cached=True,
        warmup_s=1200.0,
        seed=4,
        aim_vs_peak=1.0,
    ),
)
HELD_OUT_27 = ("batches-prod-l40s", "batches-qwen-cached", "spikes-cached")


def build_setup(case: Case, trace: list[TraceRequest], routing: str) -> SimSetup:
    catalog = default_catalog()
    span = max(trace[-1].arrival_s, 1.0)
    workload = fit_trace(trace).workload.at_rate(len(trace) / span)  # lengths and burstiness, mean rate
    request = PlanRequest(
        model=catalog.model(case.model),
        workload=workload,
        slo=case.slo,
        gpus=(case.gpu,),
        tensor_parallel=(case.tp,),
        precisions=("bf16",),
        headroom=HEADROOM,
        least_loaded=routing == "gateway",  # as the operator plans behind an InferencePool
    )
    setup = setup_from_plan(catalog, plan(catalog, request), None, None)
    cold_start_s = default_cold_start_s(setup.cfg, case.weights_cached)
    # every policy starts from the plan within maxReplicas, as the operator runs it
    setup = starting_fleet(setup, MAX_REPLICAS)
    return replace(
        setup, cold_start_s=cold_start_s, routing=routing, seed=case.seed, cold_start_jitter=COLD_START_JITTER
    )


def _light(result: SimResult) -> SimResult:
    """The result without its requests (small enough to send between processes, for plots)."""
    return replace(result, requests=[], decisions=[])


def run_unit(case: Case, routing: str, name: str) -> tuple[str, str, str, dict[str, Any], SimResult, float]:
    started = time.perf_counter()
    trace = case.trace()
    setup = build_setup(case, trace, routing)
    span = max(trace[-1].arrival_s, 1.0)
    shape = fit_trace(trace).workload.at_rate(len(trace) / span)
    capacity = SizingCapacity(setup.cfg, setup.slo, setup.max_batch, shape, least_loaded=routing == "gateway")
    policy: object = None
    if name == "oracle":
        result = run_oracle(setup, trace, capacity, MAX_REPLICAS)
    elif name == "bound":
        result = run_bound(setup, trace, MAX_REPLICAS)
    elif name == "peak":
        result = run_peak(setup, trace, MAX_REPLICAS)
    else:
        (policy,) = make_policies((name,), setup, capacity, trace, HEADROOM, None, MAX_REPLICAS)
        result = simulate(setup, Source(trace), policy)
    row = summary(result, setup.slo)
    row["slo_attainment_whole"] = row["slo_attainment"]
    row["gpu_hours_whole"] = row["gpu_hours"]
    row["slo_attainment"] = round(attainment_from(result, setup.slo, case.warmup_s), 5)
    row["gpu_hours"] = round(gpu_hours_from(result, setup.cfg.tensor_parallel, case.warmup_s), 4)
    row["ttft_p99_ms"] = _p99([r.ttft_s * 1e3 for r in result.requests if r.done and r.arrival_s >= case.warmup_s])
    if isinstance(policy, KvscalePolicy):
        row["decision_kinds"] = dict(sorted(policy.kinds.items()))
    if (choices := getattr(policy, "choices", None)) is not None:  # kvscale-tuned: which holding ran from when
        row["holding_choices"] = [(t, choice.settings.name) for t, choice in choices]
    return case.name, routing, name, row, _light(result), time.perf_counter() - started


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1)


def describe(case: Case, trace: list[TraceRequest], setup: SimSetup) -> str:
    span_min = trace[-1].arrival_s / 60
    warmup = f", measured after a {case.warmup_s / 60:.0f} min warm-up" if case.warmup_s else ""
    held = " (held out for issue 27)" if case.name in HELD_OUT_27 else ""
    return (
        f"{case.name}{held}: {case.model} on {case.tp} x {case.gpu}, max batch {setup.max_batch}, cold start "
        f"{setup.cold_start_s:.0f}s ±{COLD_START_JITTER:.0%} ({'weights cached' if case.weights_cached else 'with weight download'}); "
        f"p99 TTFT <= {case.ttft_s:g}s, TPOT <= {case.tpot_s * 1e3:g}ms; {len(trace)} requests over {span_min:.0f} min "
        f"({len(trace) / max(trace[-1].arrival_s, 1):.1f} req/s mean); load {case.load}"
        + (f" x{case.rate_scale:g}" if case.rate_scale != 1 else "")
        + warmup
    )


def verdict(
    rows: dict[tuple[str, str], dict[str, Any]], routing: str, name: str = "kvscale", aim_vs_peak: float = AIM_VS_PEAK
) -> list[tuple[str, bool]]:
    ours = rows[(routing, name)]
    bound = rows[("gateway", "bound")]
    peak = rows[(routing, "peak")]
    target = min(AIM_ATTAINMENT, bound["slo_attainment"] - 0.01)
    rivals = [rows[(routing, p)] for p in POLICIES if p != name and rows[(routing, p)]["slo_attainment"] >= target]
    return [
        (
            f">= {AIM_ATTAINMENT:.0%} attainment (or within 1 pt of the bound's {bound['slo_attainment']:.2%})",
            ours["slo_attainment"] >= target,
        ),
        (f"<= {aim_vs_peak:g}x peak's GPU-hours", ours["gpu_hours"] <= aim_vs_peak * peak["gpu_hours"]),
        (f"<= {AIM_VS_BOUND:g}x the bound's GPU-hours", ours["gpu_hours"] <= AIM_VS_BOUND * bound["gpu_hours"]),
        ("fewer GPU-hours than every baseline at the target", all(ours["gpu_hours"] < r["gpu_hours"] for r in rivals)),
    ]


def draw(case: Case, results: dict[tuple[str, str], SimResult], slo: Slo, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (load_ax, svc_ax, gw_ax) = plt.subplots(3, 1, figsize=(9, 6.5), sharex=True)
    first = results[("service", "kvscale")].timeline
    load_ax.plot([p.time_s / 60 for p in first], [p.arrival_rate_per_s for p in first], color="black", linewidth=1)
    load_ax.set_ylabel("req/s (60 s)")
    load_ax.set_title(title, fontsize=9)
    for ax, routing in ((svc_ax, "service"), (gw_ax, "gateway")):
        for name in ("bound", "peak", "oracle", *POLICIES):
            result = results.get((routing, name)) or results.get(("gateway", name))
            if result is None:
                continue
            style = {"bound": ":", "oracle": "--", "peak": "-."}.get(name, "-")
            width = 1.8 if name == "kvscale" else 0.9
            ax.step(
                [p.time_s / 60 for p in result.timeline],
                [p.ready for p in result.timeline],
                where="post",
                linestyle=style,
                linewidth=width,
                label=name,
            )
        ax.set_ylabel(f"ready replicas\n({routing})")
        ax.grid(True, alpha=0.3)
    svc_ax.legend(fontsize=7, ncol=4, loc="upper left")
    load_ax.grid(True, alpha=0.3)
    gw_ax.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="all", help="comma-separated case names, or all")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--png-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write every row here")
    args = parser.parse_args()
    cases = CASES if args.cases == "all" else tuple(c for c in CASES if c.name in args.cases.split(","))
    if not cases:
        parser.error(f"--cases: choose from {', '.join(c.name for c in CASES)} or all")
    console = Console(width=200)
    started = time.perf_counter()
    feasible = []
    for case in cases:  # a case no plan serves is said, not a crash of the suite
        try:
            build_setup(case, case.trace(), "service")
        except SimulationError as exc:
            console.print(f"{case.name}: not run, no plan meets its SLO as configured: {exc}")
            continue
        feasible.append(case)
    cases = tuple(feasible)
    units = [(c, r, p) for c in cases for r in ROUTINGS for p in (*POLICIES, "oracle", "peak")] + [
        (c, "gateway", "bound") for c in cases
    ]
    units.sort(key=lambda u: (u[2] != "bound", u[2] != "peak", u[2] != "oracle"))  # the slow ones first
    done: dict[str, dict[tuple[str, str], tuple[dict[str, Any], SimResult, float]]] = {c.name: {} for c in cases}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_unit, *u) for u in units]
        for future in futures:
            name, routing, policy, row, result, wall = future.result()
            done[name][(routing, policy)] = (row, result, wall)
            print(
                f"  {name} {routing} {policy}: {row['slo_attainment']:.2%}, {row['gpu_hours']:.2f} GPU-h ({wall:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
    everything: list[dict[str, Any]] = []
    for case in cases:
        trace = case.trace()
        setup = build_setup(case, trace, "service")
        console.print(describe(case, trace, setup))
        rows = {k: v[0] for k, v in done[case.name].items()}
        bound = rows[("gateway", "bound")]
        table = Table(title=f"{case.name}: bound {bound['gpu_hours']:.2f} GPU-h at {bound['slo_attainment']:.2%}")
        columns = ["policy", "routing", "SLO met", "TTFT p99 ms", "GPU-h", "vs bound", "vs peak", "scale events"]
        if case.warmup_s:
            columns += ["whole: SLO met", "whole: GPU-h"]
        for col in (*columns, "wall s"):
            table.add_column(col)
        for routing in ROUTINGS:
            peak = rows[(routing, "peak")]
            for policy in (*POLICIES, "oracle", "peak"):
                row = rows[(routing, policy)]
                row["gpu_hours_vs_peak"] = round(row["gpu_hours"] / peak["gpu_hours"], 3)
                row["gpu_hours_vs_bound"] = round(row["gpu_hours"] / bound["gpu_hours"], 3)
                row["case"] = case.name
                everything.append(row)
                table.add_row(
                    policy,
                    routing,
                    f"{row['slo_attainment']:.2%}",
                    f"{row['ttft_p99_ms']:.0f}" if row["ttft_p99_ms"] is not None else "-",
                    f"{row['gpu_hours']:.2f}",
                    f"{row['gpu_hours_vs_bound']:.2f}",
                    f"{row['gpu_hours_vs_peak']:.2f}",
                    str(row["scale_events"]),
                    *((f"{row['slo_attainment_whole']:.2%}", f"{row['gpu_hours_whole']:.2f}") if case.warmup_s else ()),
                    f"{done[case.name][(routing, policy)][2]:.0f}",
                )
        bound["case"] = case.name
        everything.append(bound)
        console.print(table)
        for routing in ROUTINGS:
            kinds = rows[(routing, "kvscale")].get("decision_kinds", {})
            console.print(f"  kvscale decisions behind a {routing}: " + ", ".join(f"{k} {n}" for k, n in kinds.items()))
        for routing in ROUTINGS:
            for name in ("kvscale", "oracle"):
                goals = verdict(rows, routing, name, case.aim_vs_peak)
                console.print(
                    f"  {name} behind a {routing}: "
                    + "; ".join(f"{'met' if ok else 'MISSED'} {goal}" for goal, ok in goals)
                )
        if args.png_dir is not None:
            args.png_dir.mkdir(parents=True, exist_ok=True)
            draw(
                case,
                {k: v[1] for k, v in done[case.name].items()},
                case.slo,
                args.png_dir / f"autoscaling-{case.name}.png",
                describe(case, trace, setup).split(";")[0],
            )
    console.print(f"suite wall time {time.perf_counter() - started:.0f}s with {args.jobs} processes")
    if args.json is not None:
        args.json.write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
