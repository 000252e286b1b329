"""One `kvscale simulate` invocation: plan from the load, then every requested policy on
the same arrivals, with GPU-hours relative to the oracle."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvscale.autoscaling.capacity import ConfirmedCapacity, SizingCapacity
from kvscale.planner.search import Plan
from kvscale.sim.check import sample, search_replicas, service_attainment
from kvscale.sim.compare import (
    KVSCALE_NAMES,
    NEEDS_TRACE,
    REFERENCE_NAMES,
    make_policies,
    run_bound,
    run_oracle,
    run_peak,
)
from kvscale.sim.engine import StepTimes
from kvscale.sim.policies import StaticPolicy
from kvscale.sim.report import attainment, summary
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


def starting_fleet(setup: SimSetup, max_replicas: int) -> SimSetup:
    """The fleet the policies start from, within their bound: the plan's replicas, at most
    `max_replicas`. The operator never runs a plan above spec.scaling.maxReplicas (it plans
    within it, and scales a running plan down to a lowered one at once: kvscale.control.
    reconcile._within_bounds). A simulated fleet started above it stays there under every
    policy that holds while the SLO is missed: on Mooncake x2 behind a Service (70B, TP4, p99
    TTFT 10 s) the analytic plan asks for 1,752 replicas, no fleet within maxReplicas 64
    meets p99, and kvscale's policy and `saturation` held all 1,752 for the whole run (27x the
    best fixed fleet within the bound)."""
    return replace(setup, initial_replicas=max(1, min(setup.initial_replicas, max_replicas)))


def confirmed_capacity(
    setup: SimSetup,
    trace: list[TraceRequest],
    capacity: SizingCapacity,
    shape: Workload | None = None,
    most: int | None = None,
) -> ConfirmedCapacity | None:
    """The capacity kvscale's policy acts on offline: the simulated sizing search on the
    traffic itself, as `plan --trace` sizes a plan (the trace's busiest stretch replayed at
    the load's rate on fleets of warm replicas behind the setup's routing, searched from the
    analytic count for the fewest that meet the SLO percentile), the replayed rate over that
    fleet per replica, with the sizing model's shape around it. None when no fleet up to
    `most` meets the SLO there (the analytic figure stays)."""
    if not trace:
        return None
    span = max(trace[-1].arrival_s - trace[0].arrival_s, 1.0)
    rate = shape.requests_per_s if shape is not None and shape.requests_per_s > 0 else len(trace) / span
    lengths: tuple[float, float] = (
        (shape.input_tokens, shape.output_tokens)
        if shape is not None
        else (sum(r.input_tokens for r in trace) / len(trace), sum(r.output_tokens for r in trace) / len(trace))
    )
    replay = sample(trace, rate)
    if len(replay) < 2:
        return None
    replay_rate = len(replay) / max(replay[-1].arrival_s - replay[0].arrival_s, 1e-9)
    modelled = capacity.rate_per_replica(*lengths, fleet_rate_per_s=replay_rate)
    analytic = max(1, math.ceil(replay_rate / modelled)) if modelled > 0 else setup.initial_replicas
    if most is not None:
        analytic = min(analytic, most)
    steps = StepTimes(setup.cfg)
    warm = replace(setup, cold_start_s=0.0)

    def attain(n: int) -> float:
        if setup.routing == "service":
            return service_attainment(warm, replay, n, steps)
        result = simulate(replace(warm, initial_replicas=n), Source(replay), StaticPolicy(n), steps=steps)
        return attainment(result, setup.slo)

    noise = math.sqrt(0.99 * 0.01 / len(replay))
    replicas, met = search_replicas(attain, analytic, setup.slo.percentile / 100.0, most=most, noise=noise)
    if not met:
        return None
    return ConfirmedCapacity(capacity, replay_rate / replicas, *lengths, fleet_rate_per_s=replay_rate)


def policy_capacity(confirmed: ConfirmedCapacity | None) -> ConfirmedCapacity | None:
    """The confirmed capacity kvscale's policy acts on: only a figure above the model's (None:
    the model's). The policy's SLO feedback lowers the capacity it acts on while the observed
    SLO is missed (an optimistic model is corrected online), but no signal raises it (a
    pessimistic one is not). Below the model's, the replay's busiest stretch asks more of a
    fleet than the traffic does over time: on the Azure conversation trace (8B, L40S, p99 1 s
    / 50 ms) it confirms 0.61 req/s per replica where the cheapest fixed fleet carries the
    whole trace at 0.92, and the policy acting on it spent 2.7x that fleet's GPU-hours (1.2x
    on the model's figure)."""
    if confirmed is None or not confirmed.confirmed_rate_per_s > confirmed.analytic_rate_per_s:
        return None
    return confirmed


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
    for) is what the capacity model of kvscale and the oracle assumes. With a trace,
    kvscale's policy acts on the capacity the simulated sizing search confirms on it
    (`confirmed_capacity`), as the plan does, where that is above the model's
    (`policy_capacity`); the oracle and the baselines keep the model's. Without `replicas`
    every policy starts from the plan's replicas within `max_replicas` (`starting_fleet`)."""
    if replicas is None:  # the plan's replicas, within the bound (an explicit --replicas is the fleet asked for)
        setup = starting_fleet(setup, max_replicas)
    capacity = SizingCapacity(setup.cfg, setup.slo, setup.max_batch, shape, least_loaded=setup.routing == "gateway")
    confirmed = (
        confirmed_capacity(setup, load.trace, capacity, shape, max_replicas)
        if load.trace is not None and any(n in KVSCALE_NAMES for n in names)
        else None
    )
    references = [n for n in names if n in REFERENCE_NAMES]
    traced = [n for n in names if n in NEEDS_TRACE]
    if traced and load.trace is None:
        raise SimulationError(
            f"{' and '.join(traced)} {'needs' if len(traced) == 1 else 'need'} a trace (every arrival "
            "known in advance); use --trace or --load, or leave them out"
        )
    results: list[SimResult] = []
    acted_on = policy_capacity(confirmed)
    for policy in make_policies(names, setup, capacity, load.trace, headroom, replicas, max_replicas, acted_on):
        tick = (lambda t, name=policy.name: progress(name, t)) if progress else None
        results.append(simulate(setup, load.source(), policy, tick))
    hours: dict[str, float] = {}
    if load.trace is not None:
        # peak first: the oracle weighs its fleet among its schedules (run_oracle), run once.
        peak = run_peak(setup, load.trace, max_replicas) if "peak" in references else None
        runners = {
            "oracle": lambda trace: run_oracle(setup, trace, capacity, max_replicas, peak),
            "bound": lambda trace: run_bound(setup, trace, max_replicas),
            "peak": lambda trace: peak if peak is not None else run_peak(setup, trace, max_replicas),
        }
        for name in references:
            result = runners[name](load.trace)
            hours[name] = result.gpu_hours
            results.append(result)
    order = {name: i for i, name in enumerate(names)}
    results.sort(key=lambda r: order.get(r.policy, len(order)))
    return results, [summary(r, setup.slo, hours.get("oracle"), hours) for r in results]
