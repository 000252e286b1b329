"""One `kvscale simulate` invocation: plan from the load, then every requested policy on
the same arrivals, with GPU-hours relative to the oracle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.sim.compare import make_policies, run_oracle
from kvscale.sim.report import summary
from kvscale.sim.run import SimResult, SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.planner import Plan


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
) -> tuple[list[SimResult], list[dict[str, Any]]]:
    capacity = SizingCapacity(setup.cfg, setup.slo, setup.max_batch)
    if "oracle" in names and load.trace is None:
        raise SimulationError(
            "the oracle needs a trace (it knows every arrival in advance); use --trace or leave oracle out"
        )
    results: list[SimResult] = []
    for policy in make_policies(names, setup, capacity, load.trace, headroom, replicas, max_replicas):
        tick = (lambda t, name=policy.name: progress(name, t)) if progress else None
        results.append(simulate(setup, load.source(), policy, tick))
    oracle_hours = None
    if "oracle" in names and load.trace is not None:
        oracle = run_oracle(setup, load.trace, capacity)
        oracle_hours = oracle.gpu_hours
        results.append(oracle)
    order = {name: i for i, name in enumerate(names)}
    results.sort(key=lambda r: order.get(r.policy, len(order)))
    return results, [summary(r, setup.slo, oracle_hours) for r in results]
