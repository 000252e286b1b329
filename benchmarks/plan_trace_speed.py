"""How long `kvscale plan --trace` takes as a whole process (issue 17: `kvscale plan` under 1 s
on the full catalog), and where the time goes. Prints two tables:

- the command as a process, `--runs` times: wall and CPU (user + system of the child);
- its stages in a fresh process each run, as `plan` runs them: start-up and imports, the
  trace's fit, the plan, the fp8 line beside it, the simulated check (with its sizing search, issue 26).

Run: .venv/bin/python benchmarks/plan_trace_speed.py [--runs 7] [--model ... --ttft ...]
The shared machine's load swings wall time: the load average is printed with the tables,
and the minimum is the steadier figure. Python compiles kvscale's modules on every start
when PYTHONDONTWRITEBYTECODE is set (this project's sessions set it): the table says which.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "benchmarks" / "data" / "traces" / "mooncake-synthetic.jsonl"

# One run of the stages, in a fresh interpreter: what `kvscale plan --trace` does, timed.
STAGES = r"""
import json, sys, time
start = time.perf_counter()
from dataclasses import replace
from pathlib import Path
from kvscale.cli import load_commands
load_commands(("planning",))
from kvscale.cli.common import load, slo as make_slo
from kvscale.sim.check import check_and_size, sample
from kvscale.sim.fit import fit_trace
from kvscale.sim.trace import read_trace
from kvscale.planner.search import PlanRequest, cheapest, plan
model, ttft, tpot, percentile, trace = sys.argv[1:6]
cat = load(None)
arch = cat.model(model)
t = {"imports": time.perf_counter() - start}
mark = time.perf_counter()
requests = read_trace(Path(trace))
fit = fit_trace(requests)
w = fit.workload
w = replace(w, max_context_tokens=min(w.inputs.max + w.outputs.max, arch.max_context_tokens))
t["fit"], mark = time.perf_counter() - mark, time.perf_counter()
slo = make_slo(ttft, tpot, float(percentile))
request = PlanRequest(model=arch, workload=w, slo=slo)
result = plan(cat, request)
t["plan"], mark = time.perf_counter() - mark, time.perf_counter()
chosen = result.chosen
if chosen is not None and chosen.precision in ("bf16", "fp16"):
    cheapest(cat, replace(request, gpus=(chosen.gpu,), precisions=("fp8",)))
t["fp8 line"], mark = time.perf_counter() - mark, time.perf_counter()
if chosen is not None:
    check_and_size(result, sample(requests, w.requests_per_s))
t["check (search)"] = time.perf_counter() - mark
print(json.dumps(t))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--ttft", default="10s")
    parser.add_argument("--tpot", default="80ms")
    parser.add_argument("--percentile", default="99")
    parser.add_argument("--trace", type=Path, default=TRACE)
    args = parser.parse_args()
    kvscale = Path(sys.executable).with_name("kvscale")
    command = [str(kvscale), "plan", "--model", args.model, "--ttft", args.ttft, "--tpot", args.tpot]
    command += ["--percentile", args.percentile, "--trace", str(args.trace)]
    load_before = os.getloadavg()[0]
    walls, cpus = [], []
    stages: dict[str, list[float]] = {}
    for _ in range(args.runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        stage_args = [args.model, args.ttft, args.tpot, args.percentile, str(args.trace)]
        done = subprocess.run(
            [sys.executable, "-c", STAGES, *stage_args], check=True, capture_output=True, text=True, cwd=ROOT
        )
        for name, seconds in json.loads(done.stdout).items():
            stages.setdefault(name, []).append(seconds)
    load_after = os.getloadavg()[0]
    bytecode = "not cached (PYTHONDONTWRITEBYTECODE)" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "cached"
    console = Console(width=140)
    table = Table(title=f"`{' '.join(['kvscale', *command[1:]])}` as a whole process (target: under 1 s)")
    for col in ("runs", "wall min s", "wall median s", "CPU min s", "CPU median s", "load avg", "bytecode"):
        table.add_column(col)
    table.add_row(
        str(len(walls)),
        f"{min(walls):.2f}",
        f"{statistics.median(walls):.2f}",
        f"{min(cpus):.2f}",
        f"{statistics.median(cpus):.2f}",
        f"{load_before:.1f} -> {load_after:.1f}",
        bytecode,
    )
    console.print(table)
    parts = Table(title="its stages, wall time in a fresh process (imports: interpreter start excluded)")
    for col in ("stage", "min ms", "median ms"):
        parts.add_column(col)
    for name, values in stages.items():
        parts.add_row(name, f"{min(values) * 1e3:.0f}", f"{statistics.median(values) * 1e3:.0f}")
    console.print(parts)


if __name__ == "__main__":
    main()
