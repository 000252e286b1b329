"""Every policy on the Azure conversation trace at two load scales.

Prints the comparison table per scale, the wall time of each policy's simulated hour, and
whether kvscale met the goal: >= 99% SLO attainment, GPU-hours within 1.2x of the oracle,
and below every baseline that also reaches 99%.
Run: .venv/bin/python benchmarks/simulate.py [--png-dir DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.cli.simulate_plot import draw_timeline, timeline_title
from kvscale.sim.compare import POLICY_NAMES, make_policies, run_oracle
from kvscale.sim.report import summary
from kvscale.sim.run import SimResult, SimSetup, Source, simulate
from kvscale.sim.trace import rate_scale, read_trace
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo

TRACE = Path(__file__).resolve().parent / "data" / "traces" / "azure-llm-conv-2023.csv"
MODEL, GPU, MAX_BATCH = "llama-3.1-8b", "L40S", 256
SLO = Slo(ttft_s=1.0, tpot_s=0.05, percentile=99.0)
SCALES = (1.0, 4.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--png-dir", type=Path, default=None)
    args = parser.parse_args()
    console = Console(width=170)
    catalog = default_catalog()
    cfg = ServingConfig.build(catalog, catalog.model(MODEL), catalog.gpu(GPU), "bf16", 1)
    base = read_trace(TRACE)
    console.print(
        f"{MODEL} on 1 x {GPU}, max batch {MAX_BATCH}, cold start {cfg.cold_start_s:.0f}s; "
        f"SLO p{SLO.percentile:g} TTFT <= {SLO.ttft_s * 1e3:g} ms, TPOT <= {SLO.tpot_s * 1e3:g} ms; trace {TRACE.name}"
    )
    for scale in SCALES:
        trace = rate_scale(base, scale, seed=0)
        setup = SimSetup(cfg, SLO, MAX_BATCH, cfg.cold_start_s, initial_replicas=max(1, round(2 * scale)))
        capacity = SizingCapacity(cfg, SLO, MAX_BATCH)
        results: list[SimResult] = []
        walls: dict[str, float] = {}
        for policy in make_policies(POLICY_NAMES, setup, capacity, trace, 0.10, None, 100):
            start = time.perf_counter()
            results.append(simulate(setup, Source(trace), policy))
            walls[policy.name] = time.perf_counter() - start
        start = time.perf_counter()
        oracle = run_oracle(setup, trace, capacity)
        walls["oracle"] = time.perf_counter() - start
        results.append(oracle)
        rows = [summary(r, SLO, oracle.gpu_hours) for r in results]
        table = Table(title=f"rate scale {scale:g}: {len(trace)} requests over {trace[-1].arrival_s / 60:.0f} min")
        for col in (
            "policy",
            "SLO met",
            "TTFT p50 / p95 ms",
            "TPOT p50 / p95 ms",
            "GPU-h",
            "vs oracle",
            "cost $",
            "scale events",
            "wall s",
        ):
            table.add_column(col)
        for row in rows:
            table.add_row(
                row["policy"],
                f"{row['slo_attainment']:.2%}",
                f"{row['ttft_p50_ms']:.0f} / {row['ttft_p95_ms']:.0f}",
                f"{row['tpot_p50_ms']:.1f} / {row['tpot_p95_ms']:.1f}",
                f"{row['gpu_hours']:.2f}",
                f"{row['gpu_hours_vs_oracle']:.2f}",
                f"{row['cost_usd']:.2f}",
                str(row["scale_events"]),
                f"{walls[row['policy']]:.1f}",
            )
        console.print(table)
        ours = next(r for r in rows if r["policy"] == "kvscale")
        rivals = [r for r in rows if r["policy"] not in ("kvscale", "oracle") and r["slo_attainment"] >= 0.99]
        goals = {
            ">= 99% SLO attainment": ours["slo_attainment"] >= 0.99,
            "GPU-hours within 1.2x of the oracle": ours["gpu_hours_vs_oracle"] <= 1.2,
            "fewer GPU-hours than every baseline at >= 99%": all(ours["gpu_hours"] < r["gpu_hours"] for r in rivals),
        }
        for goal, met in goals.items():
            console.print(f"  {'met' if met else 'MISSED'}: {goal}")
        if args.png_dir is not None:
            args.png_dir.mkdir(parents=True, exist_ok=True)
            draw_timeline(
                results,
                SLO,
                args.png_dir / f"simulate-x{scale:g}.png",
                timeline_title(f"{MODEL} on {GPU}", SLO, f"Azure conversation trace x{scale:g}", setup.routing),
            )


if __name__ == "__main__":
    main()
