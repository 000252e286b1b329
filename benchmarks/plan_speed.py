"""How long a plan takes: full catalog in-process (target < 20 ms median) and the whole
`kvscale plan` process (target < 1 s). Prints a table.
Run: .venv/bin/python benchmarks/plan_speed.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvscale.planner.search import PlanRequest, plan
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.workload import Slo, Workload

CASES = [
    ("llama-3.1-8b", Workload(512, 256, 10.0), Slo(0.5, 0.05)),
    ("llama-3.1-70b", Workload(1024, 256, 20.0), Slo(1.0, 0.08)),
    ("mixtral-8x7b", Workload(2048, 512, 5.0), Slo(2.0, 0.1)),
]
PRECISIONS = ("bf16", "fp16", "fp8", "int8", "int4")


def main() -> None:
    catalog = default_catalog()
    gpus = len(catalog.gpus)
    table = Table(
        title=f"plan() over the full catalog: {gpus} GPUs x TP 1/2/4/8 x 5 precisions = {gpus * 4 * 5} candidates"
    )
    for col in ("model", "runs", "median ms", "p90 ms", "max ms", "CPU median ms", "feasible"):
        table.add_column(col)
    for name, workload, slo in CASES:
        request = PlanRequest(model=catalog.model(name), workload=workload, slo=slo, precisions=PRECISIONS)
        plan(catalog, request)  # warm caches of the catalog, not of the plan
        times, cpu = [], []
        for _ in range(30):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = plan(catalog, request)
            times.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.process_time() - start_cpu) * 1e3)  # steadier than wall time on a shared machine
        times.sort()
        table.add_row(
            name,
            str(len(times)),
            f"{statistics.median(times):.1f}",
            f"{times[int(0.9 * len(times)) - 1]:.1f}",
            f"{times[-1]:.1f}",
            f"{statistics.median(cpu):.1f}",
            str(len(result.alternatives) + 1 if result.chosen else 0),
        )
    console = Console(width=140)
    console.print(table)

    kvscale = Path(sys.executable).with_name("kvscale")
    command = [
        str(kvscale),
        "plan",
        "--model",
        "llama-3.1-8b",
        "--ttft",
        "500ms",
        "--tpot",
        "50ms",
        "--rps",
        "10",
        "--input",
        "512",
        "--output",
        "256",
        "--precision",
        ",".join(PRECISIONS),
        "--json",
    ]
    walls = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        walls.append(time.perf_counter() - start)
    process = Table(title="`kvscale plan --json` as a whole process (full catalog, 5 precisions)")
    for col in ("runs", "median s", "max s"):
        process.add_column(col)
    process.add_row(str(len(walls)), f"{statistics.median(walls):.2f}", f"{max(walls):.2f}")
    console.print(process)


if __name__ == "__main__":
    main()
