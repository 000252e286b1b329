"""Holding tuned on the service's own history (issue 35, part 2): kvscale as deployed against
kvscale with its burst settings re-chosen causally every 15 simulated minutes by replaying
the arrivals before that point (kvscale.sim.autotune), beside `peak` and the causal
`trailing` baseline, behind a Service and a gateway, on benchmarks/autoscaling.py's cases.

Run: .venv/bin/python benchmarks/autotune.py --cases NAME,... [--jobs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from autoscaling import CASES, ROUTINGS, run_unit

NAMES = ("kvscale", "kvscale-tuned", "trailing", "peak")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", required=True, help="comma-separated case names of benchmarks/autoscaling.py")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    wanted = args.cases.split(",")
    cases = [c for c in CASES if c.name in wanted]
    if len(cases) != len(wanted):
        parser.error(f"--cases: choose from {', '.join(c.name for c in CASES)}")
    started = time.perf_counter()
    units = [(c, r, n) for c in cases for r in ROUTINGS for n in NAMES]
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for case, routing, name, row, _, wall in pool.map(run_unit, *zip(*units, strict=True)):
            rows[(case, routing, name)] = row
            print(
                f"  {case} {routing} {name}: {row['slo_attainment']:.2%}, {row['gpu_hours']:.2f} GPU-h ({wall:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
    print(
        "| case | routing | kvscale SLO | kvscale GPU-h (x peak) | tuned SLO | tuned GPU-h (x peak) | trailing SLO | trailing x peak | peak GPU-h |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        for routing in ROUTINGS:
            peak = rows[(case.name, routing, "peak")]
            cells = []
            for name in ("kvscale", "kvscale-tuned", "trailing"):
                row = rows[(case.name, routing, name)]
                vs = row["gpu_hours"] / peak["gpu_hours"]
                cells.append(f"{row['slo_attainment']:.2%}")
                cells.append(f"{row['gpu_hours']:.2f} ({vs:.2f}x)" if name != "trailing" else f"{vs:.2f}x")
            print(f"| {case.name} | {routing} | " + " | ".join(cells) + f" | {peak['gpu_hours']:.2f} |")
    print(f"wall {time.perf_counter() - started:.0f}s with {args.jobs} processes", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(
            json.dumps([{"case": k[0], "routing": k[1], "policy": k[2], **v} for k, v in rows.items()])
        )


if __name__ == "__main__":
    main()
