"""Builds every policy for one setup and runs them on the same arrivals.

Three references beside the policies:
- the oracle: the cheapest clairvoyant schedule of our own family (replicas from the sizing
  model for each bucket of the whole trace, asked for one cold start ahead, within maxReplicas)
  that meets the SLO, or the `peak` fleet held all along where that is cheaper (a fixed fleet is
  a schedule too: on steady heavy-tailed traffic the model's per-bucket counts cost 18x `peak`,
  and a yardstick that costs more than not autoscaling measures nothing, issue 35);
- peak: the cheapest fixed fleet that meets the SLO on the whole trace (simulated, not modelled:
  the static policy's default fleet is `busiest_minute_replicas`, a different number);
- the bound: the cheapest fleet that could have met the SLO with instantaneous scaling: per
  interval, the fewest warm replicas on which that interval's requests meet the SLO, behind
  the best routing (the gateway). No policy that pays for cold starts can beat it by much.

And one causal baseline built from the bound: `trailing` (issue 27) holds 1.3 x the largest
of the last ten minutes' bound counts, each read only once its minute is over. It needs the
trace in advance to compute the counts, but decides from the past alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise

from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.autoscaling.policy import Capacity
from kvscale.autoscaling.tuning import policy_config
from kvscale.sim.autotune import TunedKvscalePolicy
from kvscale.sim.online_refresh import OnlineRefresh
from kvscale.sim.policies import (
    HpaRunningPolicy,
    KedaWaitingPolicy,
    KvscalePolicy,
    SaturationPolicy,
    SchedulePolicy,
    SimPolicy,
    StaticPolicy,
    TrailingPolicy,
)
from kvscale.sim.report import attainment
from kvscale.sim.run import SimResult, SimSetup, Source, TimelinePoint, bucket_rates, simulate
from kvscale.sim.trace import TraceRequest

POLICY_NAMES = ("kvscale", "static", "hpa", "keda", "saturation", "trailing", "oracle", "bound", "peak")
# Run only when named (not in `all`): kvscale with its holding tuned causally on the arrivals
# before each re-tune point (kvscale.sim.autotune, issue 35); off by default.
OPT_IN_NAMES = ("kvscale-tuned",)
KVSCALE_NAMES = ("kvscale", *OPT_IN_NAMES)  # act on the confirmed capacity
REFERENCE_NAMES = ("oracle", "bound", "peak")  # need the whole trace in advance
# trailing's counts are the bound's, computed from the trace; kvscale-tuned replays the past of it
NEEDS_TRACE = (*REFERENCE_NAMES, "trailing", "kvscale-tuned")
ORACLE_BUCKET_S = 30.0
ORACLE_HEADROOMS = (0.0, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
ATTAINMENT_GOAL = 0.99
BOUND_INTERVAL_S = 60.0


def _lengths(trace: list[TraceRequest]) -> tuple[float, float]:
    return (sum(r.input_tokens for r in trace) / len(trace), sum(r.output_tokens for r in trace) / len(trace))


def busiest_minute_replicas(
    trace: list[TraceRequest], capacity: SizingCapacity, headroom: float, bucket_s: float = 60.0
) -> int:
    """The static policy's fleet when --replicas is not given, what a cautious team provisions
    statically: the busiest minute's rate plus headroom over one replica's modelled capacity.
    It is not the `peak` yardstick (run_peak), which simulates fleet sizes and keeps the
    smallest that meets the SLO: a burst inside the busiest minute can make that larger, a
    modelled capacity below the simulated one smaller."""
    peak = max(bucket_rates(trace, bucket_s) or [0.0])
    per_replica = capacity.rate_per_replica(*_lengths(trace), fleet_rate_per_s=peak)
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
    overall = _lengths(trace)
    rates = bucket_rates(trace, bucket_s)
    by_bucket: dict[int, list[TraceRequest]] = {}
    for r in trace:
        by_bucket.setdefault(int(r.arrival_s // bucket_s), []).append(r)
    needed = []
    for i, rate in enumerate(rates):
        # The bucket's own lengths: a minute of long prompts needs more replicas than a minute
        # of short ones at the same request rate (few requests: the trace's means).
        bucket = by_bucket.get(i, [])
        # It knows the bucket's arrivals too: no burst larger than they are comes in it (a
        # quiet bucket is not sized for the surge the next ones bring: the lead covers those).
        per_replica = capacity.rate_per_replica(
            *(_lengths(bucket) if len(bucket) >= 10 else overall), fleet_rate_per_s=rate, burst_at_most=len(bucket)
        )
        needed.append(max(1, math.ceil(rate * (1 + headroom) / per_replica)) if per_replica > 0 else 1)
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
    confirmed: Capacity | None = None,
    online: bool = True,
) -> list[SimPolicy]:
    """`confirmed`: the capacity kvscale's policy acts on when it is not the model's (the
    one the simulated sizing search confirmed on the traffic: kvscale.sim.session), until
    the operator's online search (`online`, with a trace: kvscale.sim.online_refresh) first
    confirms one on the window just past."""
    inp, out = _lengths(trace) if trace else (512.0, 256.0)
    per_replica = capacity.rate_per_replica(inp, out)
    static_n = replicas or (busiest_minute_replicas(trace, capacity, headroom) if trace else setup.initial_replicas)
    # A replica at its planned rate holds rate x (TTFT + output x TPOT) requests: HPA's natural target.
    target_running = max(1.0, per_replica * out * setup.slo.tpot_s * 0.8)
    # The operator's constructor: the simulated policy is the deployed one, tuned alike.
    config = policy_config(
        ttft_target_s=setup.slo.ttft_s,
        tpot_target_s=setup.slo.tpot_s,
        input_tokens=inp,
        output_tokens=out,
        min_replicas=1,
        max_replicas=max_replicas,
        headroom=headroom,
        cold_start_s=setup.cold_start_s,
        interval_s=setup.tick_s,
        window_s=setup.window_s,
        least_loaded_routing=setup.routing == "gateway",
    )
    built: dict[str, Callable[[], SimPolicy]] = {
        "kvscale": lambda: KvscalePolicy(
            confirmed if confirmed is not None else capacity,
            config,
            refresh=OnlineRefresh(setup, capacity, trace) if online and trace else None,
        ),
        "kvscale-tuned": lambda: TunedKvscalePolicy(
            confirmed if confirmed is not None else capacity, config, setup=setup, trace=list(trace or [])
        ),
        "static": lambda: StaticPolicy(static_n),
        "hpa": lambda: HpaRunningPolicy(target_running, max_replicas=max_replicas),
        "keda": lambda: KedaWaitingPolicy(max_replicas=max_replicas),
        "saturation": lambda: SaturationPolicy(setup.max_batch, max_replicas=max_replicas),
        "trailing": lambda: TrailingPolicy(
            bound_counts(setup, trace or [], max_replicas), BOUND_INTERVAL_S, max_replicas=max_replicas
        ),
    }
    return [built[n]() for n in names if n not in REFERENCE_NAMES]


def run_oracle(
    setup: SimSetup,
    trace: list[TraceRequest],
    capacity: SizingCapacity,
    max_replicas: int = 1000,
    peak: SimResult | None = None,
) -> SimResult:
    """The least GPU-hours among clairvoyant schedules that reach the attainment goal (or the
    most attainment where none does): the sizing model's per-bucket schedules within
    `max_replicas`, and the `peak` fleet held all along (run_peak's, computed here unless given)."""
    best = replace(peak if peak is not None else run_peak(setup, trace, max_replicas), policy="oracle")
    for headroom in ORACLE_HEADROOMS:
        schedule = [
            (t, min(n, max_replicas)) for t, n in oracle_schedule(trace, capacity, setup.cold_start_s, headroom)
        ]
        result = simulate(replace(setup, initial_replicas=schedule[0][1]), Source(trace), SchedulePolicy(schedule))
        if _better(result, best, setup):
            best = result
        if attainment(result, setup.slo) >= ATTAINMENT_GOAL:
            break
    return best


def run_peak(
    setup: SimSetup, trace: list[TraceRequest], max_replicas: int = 1000, goal: float = ATTAINMENT_GOAL
) -> SimResult:
    """The cheapest fixed fleet that meets the SLO goal on the whole trace (what not
    autoscaling costs): n warm replicas from the start, behind the setup's routing, n the
    smallest count reaching `goal` (found by doubling, then bisection); where no count up
    to `max_replicas` does, the smallest that does as well as `max_replicas`."""
    runs: dict[int, SimResult] = {}

    def run(n: int) -> SimResult:
        if n not in runs:
            runs[n] = simulate(replace(setup, initial_replicas=n), Source(trace), StaticPolicy(n))
        return runs[n]

    wanted = goal
    lo, hi = 0, 1
    while attainment(run(hi), setup.slo) < wanted and hi < max_replicas:
        lo, hi = hi, min(max_replicas, hi * 2)
    if attainment(run(hi), setup.slo) < wanted:
        wanted = attainment(run(hi), setup.slo)
    while hi - lo > 1:  # run(hi) meets `wanted`, lo does not (or is 0)
        mid = (lo + hi) // 2
        if attainment(run(mid), setup.slo) >= wanted - 1e-12:
            hi = mid
        else:
            lo = mid
    return replace(run(hi), policy="peak")


def _better(candidate: SimResult, incumbent: SimResult, setup: SimSetup) -> bool:
    a, b = attainment(candidate, setup.slo), attainment(incumbent, setup.slo)
    if (a >= ATTAINMENT_GOAL) != (b >= ATTAINMENT_GOAL):
        return a >= ATTAINMENT_GOAL
    return candidate.gpu_hours < incumbent.gpu_hours if a >= ATTAINMENT_GOAL else a > b


def bound_counts(
    setup: SimSetup, trace: list[TraceRequest], max_replicas: int = 1000, interval_s: float = BOUND_INTERVAL_S
) -> list[int]:
    """The bound's replica count per interval (run_bound's), in order from t=0."""
    if not trace:
        raise ValueError("the bound's counts need a trace (every arrival known in advance)")
    return [p.desired for p in run_bound(setup, trace, max_replicas, interval_s).timeline]


def run_bound(
    setup: SimSetup,
    trace: list[TraceRequest],
    max_replicas: int = 1000,
    interval_s: float = BOUND_INTERVAL_S,
    goal: float = ATTAINMENT_GOAL,
) -> SimResult:
    """The fewest replicas per interval, with instantaneous scaling, meeting the SLO goal.

    Each interval's arrivals are simulated alone on n warm replicas behind the gateway
    (starting empty: work carried over from the previous interval is ignored, which only
    makes the bound lower), and n is the smallest count whose attainment reaches `goal`
    (at least 1, like every policy); where no count up to `max_replicas` does (requests the
    SLO cannot be met for at any fleet size), the smallest count that does as well as
    `max_replicas`. GPU-hours are the sum of n x interval."""
    spans: dict[int, list[TraceRequest]] = {}
    for r in trace:
        spans.setdefault(int(r.arrival_s // interval_s), []).append(r)
    intervals = (int(trace[-1].arrival_s // interval_s) + 1) if trace else 0
    base = replace(setup, routing="gateway", cold_start_s=0.0)
    requests = []
    timeline: list[TimelinePoint] = []
    counts: list[int] = []
    preemptions = 0
    guess = 1
    for i in range(intervals):
        arrivals = [
            TraceRequest(r.arrival_s - i * interval_s, r.input_tokens, r.output_tokens) for r in spans.get(i, [])
        ]
        runs: dict[int, SimResult] = {}
        wanted = [goal]  # lowered to the best any count reaches when even max_replicas misses

        def meets(
            n: int,
            arrivals: list[TraceRequest] = arrivals,
            runs: dict[int, SimResult] = runs,
            wanted: list[float] = wanted,
        ) -> bool:
            if n not in runs:
                runs[n] = simulate(replace(base, initial_replicas=n), Source(arrivals), StaticPolicy(n))
            return attainment(runs[n], setup.slo) >= wanted[0] - 1e-12

        if not arrivals:
            n = 1
        elif meets(guess):
            n = guess
            while n > 1 and meets(n - 1):
                n -= 1
        else:
            lo, hi = guess, guess
            while not meets(hi) and hi < max_replicas:
                lo, hi = hi, min(max_replicas, hi * 2)
            if not meets(hi):  # no count meets the goal: the fewest that do as well as any
                wanted[0] = attainment(runs[hi], setup.slo)
            while hi - lo > 1:  # meets(hi), not meets(lo)
                mid = (lo + hi) // 2
                if meets(mid):
                    hi = mid
                else:
                    lo = mid
            n = hi
        guess = n
        counts.append(n)
        if arrivals:
            chosen = runs[n]
            for request in chosen.requests:  # back on the trace's clock
                request.arrival_s += i * interval_s
                request.first_token_s += i * interval_s
                request.finish_s += i * interval_s
            requests.extend(chosen.requests)
            preemptions += chosen.preemptions
        timeline.append(TimelinePoint(i * interval_s, len(arrivals) / interval_s, n, n, None, None))
    gpu_hours = sum(counts) * interval_s * setup.cfg.gpus / 3600.0
    return SimResult(
        policy="bound",
        requests=requests,
        gpu_hours=gpu_hours,
        cost_usd=gpu_hours * setup.cfg.gpu.price_usd_per_gpu_hour,
        scale_events=sum(1 for a, b in pairwise(counts) if a != b),
        preemptions=preemptions,
        duration_s=intervals * interval_s,
        timeline=timeline,
        routing="gateway",
        replica_spans=[(i * interval_s, (i + 1) * interval_s) for i, n in enumerate(counts) for _ in range(n)],
    )
