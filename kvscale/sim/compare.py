"""Builds every policy for one setup and runs them on the same arrivals; the oracle is the
cheapest clairvoyant schedule (from the whole trace and the cold start) that meets the SLO."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.autoscaling.policy import PolicyConfig
from kvscale.sim.policies import (
    HpaRunningPolicy,
    KedaWaitingPolicy,
    KvscalePolicy,
    SaturationPolicy,
    SchedulePolicy,
    SimPolicy,
    StaticPolicy,
)
from kvscale.sim.report import attainment
from kvscale.sim.run import SimResult, SimSetup, Source, bucket_rates, simulate
from kvscale.sim.trace import TraceRequest

POLICY_NAMES = ("kvscale", "static", "hpa", "keda", "saturation", "oracle")
ORACLE_BUCKET_S = 30.0
ORACLE_HEADROOMS = (0.0, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
ATTAINMENT_GOAL = 0.99


def _lengths(trace: list[TraceRequest]) -> tuple[float, float]:
    return (sum(r.input_tokens for r in trace) / len(trace), sum(r.output_tokens for r in trace) / len(trace))


def peak_replicas(trace: list[TraceRequest], capacity: SizingCapacity, headroom: float, bucket_s: float = 60.0) -> int:
    """What a cautious team provisions statically: the busiest minute over one replica's capacity."""
    per_replica = capacity.rate_per_replica(*_lengths(trace))
    peak = max(bucket_rates(trace, bucket_s) or [0.0])
    return max(1, math.ceil(peak * (1 + headroom) / per_replica)) if per_replica > 0 else 1


def oracle_schedule(
    trace: list[TraceRequest],
    capacity: SizingCapacity,
    cold_start_s: float,
    headroom: float,
    bucket_s: float = ORACLE_BUCKET_S,
) -> list[tuple[float, int]]:
    """Replicas needed in each bucket, asked for one cold start ahead, released when no
    bucket in the next cold start still needs them."""
    per_replica = capacity.rate_per_replica(*_lengths(trace))
    rates = bucket_rates(trace, bucket_s)
    needed = [max(1, math.ceil(r * (1 + headroom) / per_replica)) if per_replica > 0 else 1 for r in rates]
    lead = math.ceil(cold_start_s / bucket_s) + 1
    return [(i * bucket_s, max(needed[i : i + lead + 1])) for i in range(len(needed))]


def make_policies(
    names: tuple[str, ...],
    setup: SimSetup,
    capacity: SizingCapacity,
    trace: list[TraceRequest] | None,
    headroom: float,
    replicas: int | None,
    max_replicas: int,
) -> list[SimPolicy]:
    inp, out = _lengths(trace) if trace else (512.0, 256.0)
    per_replica = capacity.rate_per_replica(inp, out)
    static_n = replicas or (peak_replicas(trace, capacity, headroom) if trace else setup.initial_replicas)
    # A replica at its planned rate holds rate x (TTFT + output x TPOT) requests: HPA's natural target.
    target_running = max(1.0, per_replica * out * setup.slo.tpot_s * 0.8)
    config = PolicyConfig(
        ttft_target_s=setup.slo.ttft_s,
        tpot_target_s=setup.slo.tpot_s,
        default_input_tokens=inp,
        default_output_tokens=out,
        max_replicas=max_replicas,
        headroom=headroom,
        cold_start_s=setup.cold_start_s,
        tick_s=setup.tick_s,
    )
    built: dict[str, Callable[[], SimPolicy]] = {
        "kvscale": lambda: KvscalePolicy(capacity, config),
        "static": lambda: StaticPolicy(static_n),
        "hpa": lambda: HpaRunningPolicy(target_running, max_replicas=max_replicas),
        "keda": lambda: KedaWaitingPolicy(max_replicas=max_replicas),
        "saturation": lambda: SaturationPolicy(setup.max_batch, max_replicas=max_replicas),
    }
    return [built[n]() for n in names if n != "oracle"]


def run_oracle(setup: SimSetup, trace: list[TraceRequest], capacity: SizingCapacity) -> SimResult:
    """The least GPU-hours among clairvoyant schedules that reach the attainment goal."""
    best: SimResult | None = None
    for headroom in ORACLE_HEADROOMS:
        schedule = oracle_schedule(trace, capacity, setup.cold_start_s, headroom)
        result = simulate(replace(setup, initial_replicas=schedule[0][1]), Source(trace), SchedulePolicy(schedule))
        if best is None or _better(result, best, setup):
            best = result
        if attainment(result, setup.slo) >= ATTAINMENT_GOAL:
            break
    assert best is not None
    return best


def _better(candidate: SimResult, incumbent: SimResult, setup: SimSetup) -> bool:
    a, b = attainment(candidate, setup.slo), attainment(incumbent, setup.slo)
    if (a >= ATTAINMENT_GOAL) != (b >= ATTAINMENT_GOAL):
        return a >= ATTAINMENT_GOAL
    return candidate.gpu_hours < incumbent.gpu_hours if a >= ATTAINMENT_GOAL else a > b
