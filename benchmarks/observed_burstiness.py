"""The burstiness the operator reads from Prometheus against the one `plan --trace` fits, on
the bundled traces and the seeded load generators, and the plans each gives.

The operator counts the requests arriving per KVSCALE_BURST_WINDOW (30 s) at scrape
resolution and reads, every KVSCALE_WORKLOAD_WINDOW (10 min), the index of dispersion (mean
squared change between neighbouring windows over twice the mean count), the share of the
arrivals in windows far above the two minutes before them and those windows' size-biased
excess (kvscale.metrics.promql.burst_queries). This replays the same arithmetic on a trace's
arrival times (kvscale.autoscaling.observation: dispersion_of_counts, bursts_of_counts: the
PromQL's Python twins) and prints, per load, the median over the 10-minute reads beside
Burstiness.from_arrivals over the whole trace (5 s windows against their minute, what
`plan --trace` uses), then the plan for the trace's fitted workload with either burstiness.

Run: .venv/bin/python benchmarks/observed_burstiness.py [--model llama-3.1-8b] [--gpu L4,A10G,L40S,H100-SXM]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvscale.autoscaling.observation import ObservedWorkload, bursts_of_counts, dispersion_of_counts
from kvscale.planner.search import PlanRequest, plan
from kvscale.sim.fit import fit_trace
from kvscale.sim.generators import generate, parse_load
from kvscale.sim.trace import TraceRequest, read_trace
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.workload import Burstiness, Slo, Workload

TRACES = Path(__file__).resolve().parent / "data" / "traces"
BURST_S, WINDOW_S, MEAN_SPAN_S = 30.0, 600.0, 120.0  # the operator's defaults
LOADS = (
    "azure-llm-conv-2023.csv",
    "mooncake-synthetic.jsonl",
    "poisson:rate=5,duration=1h",
    "batches:base=1,every=2m,size=200,spread=3s,duration=1h",
    "batches:base=4,every=1m,size=60,spread=3s,duration=1h",
    "bursty:duration=1h",
    "diurnal:low=1,high=10,period=30m,duration=1h",
)


def arrivals(load: str) -> list[TraceRequest]:
    if (TRACES / load).exists():
        return read_trace(TRACES / load)
    return generate(parse_load(load), seed=0)


def operator_reads(times: list[float]) -> list[Burstiness]:
    """What each 10-minute workload read would say (reads with at least 30 requests)."""
    start = times[0]
    n = int((times[-1] - start) // BURST_S) + 1
    counts = [0.0] * n
    for t in times:
        counts[int((t - start) // BURST_S)] += 1
    per_read = int(WINDOW_S // BURST_S)
    span = max(4, round(MEAN_SPAN_S / BURST_S))
    out = []
    for end in range(per_read, n + 1, per_read):
        window = counts[end - per_read : end]
        d = dispersion_of_counts(window)
        if d is None or sum(window) < 30:
            continue
        # The trailing mean looks back before the read's window, as the PromQL's does.
        lead = max(0, end - per_read - span + 1)
        found = bursts_of_counts(counts[lead:end], span, first=end - per_read - lead)
        share, size = found if found is not None else (None, None)
        w = ObservedWorkload(
            time_s=0.0, window_s=WINDOW_S, requests_per_s=1.0, arrival_dispersion=d, burst_window_s=BURST_S,
            arrivals_in_bursts=share, burst_requests=size,
        )  # fmt: skip
        if w.burstiness is not None:
            out.append(w.burstiness)
    return out


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="L4,A10G,L40S,H100-SXM")
    args = parser.parse_args()
    catalog = default_catalog()
    slo = Slo(1.0, 0.05, 99.0)
    console = Console(width=200)
    fits = Table(title="Burstiness: the operator's 10-minute reads (30 s windows) vs plan --trace's fit (5 s windows)")
    for col in (
        "load",
        "reads",
        "D (op, median)",
        "share (op)",
        "burst (op)",
        "D (fit, 5s)",
        "share (fit)",
        "burst (fit)",
    ):
        fits.add_column(col, justify="right" if col != "load" else "left")
    plans = Table(title=f"Plans for the fitted workload ({args.model}, p99 TTFT 1s / TPOT 50ms)")
    for col in ("load", "burstiness", "GPU x TP", "replicas", "batch", "budget", "limited by"):
        plans.add_column(col, justify="right" if col not in ("load", "burstiness", "limited by") else "left")
    for load in LOADS:
        trace = arrivals(load)
        times = sorted(r.arrival_s for r in trace)
        reads = operator_reads(times)
        fitted = fit_trace(trace)
        fit = fitted.workload.arrivals
        op = Burstiness(
            median([b.index_of_dispersion for b in reads]) if reads else 1.0,
            BURST_S,
            median([b.burst_share for b in reads]) if reads else 1.0,
            median([b.burst_requests for b in reads]) if reads else 0.0,
        )
        name = load.split(",duration")[0]
        fits.add_row(
            name, str(len(reads)), f"{op.index_of_dispersion:.1f}", f"{op.burst_share:.2f}", f"{op.burst_requests:.0f}",
            f"{fit.index_of_dispersion:.1f}", f"{fit.burst_share:.2f}", f"{fit.burst_requests:.0f}",
        )  # fmt: skip
        for label, burst in (("fit (5 s)", fit), ("operator (30 s)", op), ("Poisson", None)):
            workload: Workload = replace(fitted.workload, burstiness=burst)
            request = PlanRequest(catalog.model(args.model), workload, slo, gpus=tuple(args.gpu.split(",")))
            chosen = plan(catalog, request).chosen
            if chosen is None:
                plans.add_row(name, label, "none fits", "", "", "", "")
                continue
            p = chosen.prediction
            plans.add_row(
                name, label, f"{chosen.gpu} x {chosen.tensor_parallel}", str(p.replicas), str(p.max_batch),
                str(chosen.max_num_batched_tokens), p.limited_by,
            )  # fmt: skip
    console.print(fits)
    console.print(plans)


if __name__ == "__main__":
    main()
