"""One `kvscale simulate` invocation: plan from the load, then every requested policy on
the same arrivals, with GPU-hours relative to the oracle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.planner.search import Plan
from kvscale.sim.compare import NEEDS_TRACE, REFERENCE_NAMES, make_policies, run_bound, run_oracle, run_peak
from kvscale.sim.report import summary
from kvscale.sim.run import SimResult, SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.workload import Workload


class SimulationError(ValueError):
    """The simulation cannot run as asked; the message says why and what to change."""


@dataclass(frozen=True)
class Load:
    trace: list[TraceRequest] | None = None
    closed: tuple[int, int, int, float] | None = None  # users, input, output, duration

    def source(self) -> Source:
        return Source(self.trace) if self.trace is not None else Source(closed=self.closed)


def setup_from_plan(catalog: Catalog, plan: Plan, cold_start_s: float | None, replicas: int | None) -> SimSetup:
    chosen = plan.chosen
    if chosen is None:
        raise SimulationError(
            "no plan meets the SLO for this load, so there is nothing to simulate: " + "; ".join(plan.suggestions)
        )
    r = plan.request
    cfg = chosen.config
    return SimSetup(
        cfg=cfg,
        slo=r.slo,
        max_batch=chosen.prediction.max_batch,
        cold_start_s=cold_start_s if cold_start_s is not None else cfg.cold_start_s,
        initial_replicas=replicas or chosen.prediction.replicas,
    )


def run_policies(
    setup: SimSetup,
    load: Load,
    names: tuple[str, ...],
    headroom: float,
    replicas: int | None,
    max_replicas: int,
    progress: Callable[[str, float], None] | None = None,
    shape: Workload | None = None,
) -> tuple[list[SimResult], list[dict[str, Any]]]:
    """Every named policy on the load; `shape` (lengths and burstiness the plan was made
    for) is what the capacity model of kvscale and the oracle assumes."""
    capacity = SizingCapacity(setup.cfg, setup.slo, setup.max_batch, shape, least_loaded=setup.routing == "gateway")
    references = [n for n in names if n in REFERENCE_NAMES]
    traced = [n for n in names if n in NEEDS_TRACE]
    if traced and load.trace is None:
        raise SimulationError(
            f"{' and '.join(traced)} {'needs' if len(traced) == 1 else 'need'} a trace (every arrival "
            "known in advance); use --trace or --load, or leave them out"
        )
    results: list[SimResult] = []
    for policy in make_policies(names, setup, capacity, load.trace, headroom, replicas, max_replicas):
        tick = (lambda t, name=policy.name: progress(name, t)) if progress else None
        results.append(simulate(setup, load.source(), policy, tick))
    hours: dict[str, float] = {}
    if load.trace is not None:
        runners = {
            "oracle": lambda trace: run_oracle(setup, trace, capacity),
            "bound": lambda trace: run_bound(setup, trace, max_replicas),
            "peak": lambda trace: run_peak(setup, trace, max_replicas),
        }
        for name in references:
            result = runners[name](load.trace)
            hours[name] = result.gpu_hours
            results.append(result)
    order = {name: i for i, name in enumerate(names)}
    results.sort(key=lambda r: order.get(r.policy, len(order)))
    return results, [summary(r, setup.slo, hours.get("oracle"), hours) for r in results]
