"""Services under one GPU budget against each of them alone (issue 29's aim).

For each fleet file (the `kvscale simulate --fleet` format) it runs the fleet as
`simulate --fleet` does, then each service alone under the same budget, and prints per
service: SLO attainment together and alone, the GPUs it held at most alone (its peak need),
and whether the aim holds: a service whose priority class fits the budget (the peak needs of
every service of its priority or higher, alone, plus the floors the budget keeps for the lower
priorities, sum to at most the budget) meets its SLO as it would alone, within 0.5 point,
whatever the lower priorities do. The floors count because the allocator places every
service's minReplicas before any want, and never takes a service behind a plain Service to
zero (issue 29, "Floors hold"): those GPUs are not the higher priorities' to have.

Run: PYTHONPATH=. .venv/bin/python benchmarks/budget_contention.py [FILE ...] [--json OUT]
(default: deploy/budget/contention.yaml, diurnal_vs_batch.yaml, equal_priority.yaml).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvscale.autoscaling.budget import Budget
from kvscale.cli.simulate_fleet import fleet_services
from kvscale.sim.budget_run import FleetResult, FleetService, PoolsResult, ServiceResult, simulate_fleet
from kvscale.sim.report import attainment
from kvscale.sim.run import SimResult
from kvscale.sizing.catalog import default_catalog

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = [
    ROOT / "deploy/budget" / n for n in ("contention.yaml", "diurnal_vs_batch.yaml", "equal_priority.yaml")
]
AIM_POINTS = 0.5  # percentage points of attainment a service may lose to the others


@dataclass(frozen=True)
class Row:
    scenario: str
    service: str
    priority: int
    together: float  # SLO attainment, 0..1
    alone: float
    peak_need_gpus: int  # the most GPUs it held alone
    class_need_gpus: int  # peak needs of every service of its priority or higher
    floors_below_gpus: int  # GPUs the floors of lower priorities hold on the types it accepts
    budget_gpus: float  # the budget's GPUs on the types it accepts
    held_ticks: int
    ticks: int

    @property
    def aim_applies(self) -> bool:
        return self.class_need_gpus + self.floors_below_gpus <= self.budget_gpus

    @property
    def aim_met(self) -> bool:
        return self.together >= self.alone - AIM_POINTS / 100


def _attainment(r: ServiceResult) -> float:
    svc = r.service
    return attainment(SimResult(svc.name, r.requests, r.gpu_hours, r.cost_usd, 0, 0, 0.0), svc.options[0].setup.slo)


def _budget_gpus(budget: Budget, svc: FleetService) -> float:
    types = {o.gpu_type for o in svc.options}
    return sum(budget.limits.get(t, math.inf) for t in types)


def _floors_below(svc: FleetService, services: list[FleetService]) -> int:
    """GPUs the floors of lower priorities hold on the GPU types `svc` accepts (each on its
    cheapest option, the one the allocator places it on first)."""
    types = {o.gpu_type for o in svc.options}
    return sum(
        s.min_replicas * s.options[0].gpus_per_replica
        for s in services
        if s.priority < svc.priority and s.options[0].gpu_type in types
    )


def _aggregated(r: ServiceResult | PoolsResult) -> ServiceResult:
    assert isinstance(r, ServiceResult), "the contention fleets run aggregated services"
    return r


def run_file(path: Path) -> list[Row]:
    budget, services, _ = fleet_services(path, default_catalog())
    together: FleetResult = simulate_fleet(budget, services)
    alone: dict[str, ServiceResult] = {s.name: _aggregated(simulate_fleet(budget, [s]).services[0]) for s in services}
    peak = {n: max((p.gpus for p in r.timeline), default=0) for n, r in alone.items()}
    rows = []
    for result in together.services:
        r = _aggregated(result)
        svc = r.service
        rows.append(
            Row(
                path.stem,
                svc.name,
                svc.priority,
                _attainment(r),
                _attainment(alone[svc.name]),
                peak[svc.name],
                sum(peak[s.name] for s in services if s.priority >= svc.priority),
                _floors_below(svc, services),
                _budget_gpus(budget, svc),
                r.held_ticks,
                len(r.timeline),
            )
        )
    return rows


def render(rows: list[Row], console: Console) -> None:
    table = Table(
        title="Attainment under one budget vs alone (aim: within 0.5 point where the class and the floors below fit)"
    )
    for col in (
        "scenario",
        "service",
        "prio",
        "together",
        "alone",
        "peak need",
        "class need",
        "floors below",
        "budget",
        "held",
        "aim",
    ):
        table.add_column(col)
    for r in rows:
        aim = ("met" if r.aim_met else "MISSED") if r.aim_applies else "n/a"
        table.add_row(
            r.scenario,
            r.service,
            str(r.priority),
            f"{r.together:.2%}",
            f"{r.alone:.2%}",
            str(r.peak_need_gpus),
            str(r.class_need_gpus),
            str(r.floors_below_gpus),
            f"{r.budget_gpus:g}",
            f"{r.held_ticks}/{r.ticks}",
            aim,
        )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, default=DEFAULT_FILES)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    console = Console(width=150)
    rows: list[Row] = []
    for path in args.files:
        started = time.monotonic()
        rows.extend(run_file(path))
        console.print(f"{path.name}: {time.monotonic() - started:.0f}s")
    render(rows, console)
    if args.json:
        out: list[dict[str, Any]] = [{**r.__dict__, "aim_applies": r.aim_applies, "aim_met": r.aim_met} for r in rows]
        args.json.write_text(json.dumps(out, indent=2))
    missed = [r for r in rows if r.aim_applies and not r.aim_met]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
