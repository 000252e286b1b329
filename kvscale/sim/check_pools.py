"""`plan --trace`'s check of a disaggregated plan: the trace's busiest stretch (the same sample
kvscale.sim.check replays for an aggregated plan) through both pools at fixed worker counts
(kvscale.sim.disaggregated_fleet with the plan's workers fixed, the plan's routing), judged by the same
criterion: the share of requests meeting TTFT and TPOT reaches the SLO percentile.

Where the planned pools miss it, the misses are laid on a pool (a TPOT miss, or a TTFT miss
spent mostly after the prompt's prefill: the decode pool; a TTFT miss spent mostly waiting for
or in prefill: the prefill pool) and that pool is searched first, as kvscale.sim.check searches
an aggregated fleet (search_replicas: down when it meets, up to MAX_UP x its planned workers,
or a limit, when it misses), then the other pool with the first one's count, and once more
while the counts change. Where the planned pools meet it, the pool whose workers cost more is
searched down first. Each replay is a fraction of a second on a CI machine for a few workers;
its cost grows with the workers, so a pool planned at more than twice FAR times the fewest
workers the sample's rate needs (their no-queueing capacity: the planner's pools behind a plain
Service can be hundreds of prefill workers) starts at FAR times that fewest instead, as the
aggregated check does, and the planned pools are replayed only if the search reaches them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from kvscale.planner.disaggregated import DisaggregatedPlan
from kvscale.sim.check import FAR, MAX_UP, Routing, search_replicas
from kvscale.sim.disaggregated_fleet import (
    DisaggregatedResult,
    DisaggregatedSetup,
    StaticPools,
    setup_from_disaggregated,
    simulate_disaggregated,
)
from kvscale.sim.report import attainment
from kvscale.sim.run import Source
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.disaggregation import DecodeWorker, PrefillWorker
from kvscale.sizing.workload import Slo

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")
ROUNDS = 2  # both pools searched in turn, at most this many times (the counts settle in one or two)


@dataclass(frozen=True)
class PoolsReplay:
    """One replay of fixed pools: what it met and where its misses were."""

    prefill: int
    decode: int
    attainment: float
    ttft_p_s: float  # the SLO percentile of TTFT over the finished requests (nan: none finished)
    tpot_p_s: float
    gpu_hours: float
    prefill_misses: int  # misses laid on the prefill pool (the wait for or in prefill)
    decode_misses: int  # TPOT misses, and TTFT misses spent mostly after the prefill


@dataclass(frozen=True)
class PoolsCheck:
    """The pools' replay at the planned workers and at the counts the search settled on
    (`prefill`, `decode`: the fewest it found meeting the percentile, or the closest pools)."""

    analytic_prefill: int  # the plan's workers
    analytic_decode: int
    analytic: PoolsReplay | None  # at the plan's workers; None: not replayed (far above the fewest)
    checked: PoolsReplay  # at the counts reported
    target: float  # the SLO percentile as a share
    met: bool
    requests: int
    span_s: float
    routing: Routing
    tried: tuple[tuple[int, int, float], ...]  # (prefill, decode, attainment) of every replay, in order
    why: str = ""

    @property
    def prefill(self) -> int:
        return self.checked.prefill

    @property
    def decode(self) -> int:
        return self.checked.decode

    @property
    def rate_per_s(self) -> float:
        return self.requests / self.span_s if self.span_s > 0 else 0.0


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def judge(result: DisaggregatedResult, slo: Slo, prefill: int, decode: int) -> PoolsReplay:
    """A replay's figures, its misses laid on the pool they were spent in."""
    q = slo.percentile / 100.0
    done = [r for r in result.requests if r.done]
    on_prefill = on_decode = 0
    for r in result.requests:
        if r.done and r.ttft_s <= slo.ttft_s and r.tpot_s <= slo.tpot_s:
            continue
        prefilled = result.prefill_done_s[r.id] if r.id < len(result.prefill_done_s) else math.nan
        if math.isnan(prefilled):  # never left the prefill pool
            on_prefill += 1
        elif r.done and r.ttft_s <= slo.ttft_s:  # TTFT met, TPOT missed: the decode steps
            on_decode += 1
        else:
            at_prefill = prefilled - r.arrival_s
            after = (r.first_token_s if r.done else math.inf) - prefilled
            if at_prefill >= after:
                on_prefill += 1
            else:
                on_decode += 1
    return PoolsReplay(
        prefill=prefill,
        decode=decode,
        attainment=attainment(result, slo),
        ttft_p_s=_quantile([r.ttft_s for r in done], q),
        tpot_p_s=_quantile([r.tpot_s for r in done if r.output_tokens > 1], q),
        gpu_hours=result.gpu_hours,
        prefill_misses=on_prefill,
        decode_misses=on_decode,
    )


def pools_setup(plan: DisaggregatedPlan, routing: Routing, seed: int = 0) -> DisaggregatedSetup:
    """The plan's pools as `simulate --disaggregation` sets them up
    (kvscale.sim.disaggregated_fleet.setup_from_disaggregated) behind `routing`, the plan's, as
    the aggregated check replays behind the plan's routing."""
    return setup_from_disaggregated(plan, seed=seed, routing=routing)


def replay_pools(setup: DisaggregatedSetup, replay: list[TraceRequest], prefill: int, decode: int) -> PoolsReplay:
    """`replay` through `prefill` + `decode` warm workers, fixed."""
    fixed = replace(
        setup,
        prefill=replace(setup.prefill, initial_replicas=prefill),
        decode=replace(setup.decode, initial_replicas=decode),
    )
    result = simulate_disaggregated(fixed, Source(replay), StaticPools(prefill, decode))
    return judge(result, setup.prefill.slo, prefill, decode)


def _bound(plan: DisaggregatedPlan, role: Role, other_workers: int) -> int:
    """The most workers of `role` the search tries: MAX_UP x the planned workers, within the
    request's --max-replicas (per pool, as the planner counts it) and the GPUs of its type
    the other pool leaves."""
    request = plan.request
    pool, other = (plan.prefill, plan.decode) if role == "prefill" else (plan.decode, plan.prefill)
    most = MAX_UP * pool.workers
    if request.max_replicas is not None:
        most = min(most, request.max_replicas)
    if request.gpu_limits is not None:
        free = request.gpu_limits.get(pool.cfg.gpu.name, 0)
        if other.cfg.gpu.name == pool.cfg.gpu.name:
            free -= other_workers * other.cfg.gpus
        most = min(most, free // pool.cfg.gpus)
    return max(1, most)


def _fewest(plan: DisaggregatedPlan, role: Role, rate_per_s: float, routing: Routing) -> int:
    """The fewest workers of `role` that carry `rate_per_s` at their no-queueing capacity."""
    request = plan.request
    if role == "prefill":
        capacity = PrefillWorker(plan.prefill.cfg, request.workload, routing == "gateway").capacity_rate_per_s()
    else:
        capacity = DecodeWorker(plan.decode.cfg, request.workload, request.step_target_s).capacity_rate_per_s()
    return max(1, math.ceil(rate_per_s / capacity)) if capacity > 0 else 1


def check_pools(
    plan: DisaggregatedPlan, replay: list[TraceRequest], routing: Routing = "service", seed: int = 0
) -> PoolsCheck:
    """The plan's pools replayed on `replay` (kvscale.sim.check.sample of the trace) at the
    planned workers, and searched (module docstring) for the fewest that meet the SLO
    percentile when they miss it, or when fewer would do."""
    slo = plan.request.slo
    target = slo.percentile / 100.0
    setup = pools_setup(plan, routing, seed)
    runs: dict[tuple[int, int], PoolsReplay] = {}
    order: list[tuple[int, int]] = []

    def run(p: int, d: int) -> PoolsReplay:
        if (p, d) not in runs:
            runs[p, d] = replay_pools(setup, replay, p, d)
            order.append((p, d))
        return runs[p, d]

    noise = math.sqrt(target * (1.0 - target) / max(1, len(replay))) if replay else 0.0
    planned = (plan.prefill.workers, plan.decode.workers)
    span = replay[-1].arrival_s - replay[0].arrival_s if replay else 0.0
    start = list(planned)
    if span > 0:
        for i, role in enumerate(ROLES):
            far = FAR * _fewest(plan, role, len(replay) / span, routing)
            if planned[i] > 2 * far:  # within 2x of it, the planned count is the better first guess
                start[i] = far
    first = run(start[0], start[1])
    if first.attainment < target:
        roles: list[Role] = (
            ["prefill", "decode"] if first.prefill_misses >= first.decode_misses else ["decode", "prefill"]
        )
    else:  # met: the pool whose workers cost more is searched down first
        pricier = plan.prefill.cost_usd_per_hour >= plan.decode.cost_usd_per_hour
        roles = ["prefill", "decode"] if pricier else ["decode", "prefill"]
    counts = {"prefill": start[0], "decode": start[1]}
    for _round in range(ROUNDS):
        changed = False
        for role in roles:
            other: Role = "decode" if role == "prefill" else "prefill"

            def at(n: int, role: Role = role) -> float:
                p, d = (n, counts["decode"]) if role == "prefill" else (counts["prefill"], n)
                return run(p, d).attainment

            line = {
                (p if role == "prefill" else d): r.attainment
                for (p, d), r in runs.items()
                if (d if role == "prefill" else p) == counts[other]
            }
            most = _bound(plan, role, counts[other])
            n, _ = search_replicas(
                at, counts[role], target, line, most=most, start=min(counts[role], most), noise=noise
            )
            if n != counts[role]:
                counts[role], changed = n, True
        if not changed:
            break
    final = run(counts["prefill"], counts["decode"])
    check = PoolsCheck(
        analytic_prefill=planned[0],
        analytic_decode=planned[1],
        analytic=runs.get(planned),
        checked=final,
        target=target,
        met=final.attainment >= target,
        requests=len(replay),
        span_s=span,
        routing=routing,
        tried=tuple((p, d, runs[p, d].attainment) for p, d in order),
    )
    return replace(check, why=why(check, plan))


def _pct(share: float) -> str:
    return f"{share:.0%}" if share * 100 == round(share * 100) else f"{share:.1%}"


def _misses(r: PoolsReplay) -> str:
    total = r.prefill_misses + r.decode_misses
    if total == 0:
        return "no misses"
    return f"{total} misses, {r.prefill_misses} at prefill (TTFT waits) and {r.decode_misses} at decode (TPOT, slots)"


def why(check: PoolsCheck, plan: DisaggregatedPlan) -> str:
    """What the replay found, in a sentence: the planned pools meet the percentile (and
    whether fewer do), need more, or no pools tried meet it."""
    a, c = check.analytic, check.checked
    pct = _pct(check.target)
    planned = f"{check.analytic_prefill} prefill + {check.analytic_decode} decode"
    counts = f"{c.prefill} prefill + {c.decode} decode"
    p0, d0, reached = check.tried[0]
    if a is not None:
        from_planned = f"the planned {planned} reach {a.attainment:.2%} (target {pct}; {_misses(a)})"
    else:
        from_planned = (
            f"the planned {planned} were not replayed (over {FAR}x the fewest the load needs): from {p0} + {d0} "
            f"({reached:.2%}, target {pct})"
        )
    if not check.met:
        best_p, best_d, best = max(check.tried, key=lambda t: (t[2], -t[0] - t[1]))
        return (
            f"no pools up to {max(t[0] for t in check.tried)} prefill and {max(t[1] for t in check.tried)} decode "
            f"workers meet the target in the simulator: {from_planned}; the best, {best_p} + {best_d}, reaches "
            f"{best:.2%}, the closest pools {counts} {c.attainment:.2%}"
        )
    if a is not None and (c.prefill, c.decode) == (a.prefill, a.decode):
        return f"the simulator confirms the planned {planned}: {a.attainment:.2%} meet the target {pct}"
    more = c.prefill > check.analytic_prefill or c.decode > check.analytic_decode
    head = "the simulator needs more" if more else "the simulator confirms fewer"
    return f"{head}: {from_planned}; {counts} reach {c.attainment:.2%}"


def _ms(s: float) -> float | None:
    return None if math.isnan(s) else round(s * 1e3, 3)


def check_pools_to_dict(check: PoolsCheck) -> dict[str, object]:
    """`plan --json`'s `check` under a disaggregated plan: the aggregated check's keys
    (kvscale.planner.serialize.check_to_dict) with each pool's workers for its replicas, and
    the replay's figures at the SLO percentile."""
    a, c = check.analytic, check.checked
    return {
        "requests": check.requests,
        "rate_per_s": round(check.rate_per_s, 4),
        "routing": check.routing,
        "target": check.target,
        "analytic_workers": {"prefill": check.analytic_prefill, "decode": check.analytic_decode},
        # null: not replayed (over FAR x the fewest the load needs, the search started below)
        "analytic_attainment": round(a.attainment, 5) if a is not None else None,
        "workers": {"prefill": c.prefill, "decode": c.decode},
        "attainment": round(c.attainment, 5),
        "met": check.met,
        "ttft_p_ms": _ms(c.ttft_p_s),
        "tpot_p_ms": _ms(c.tpot_p_s),
        "gpu_hours": round(c.gpu_hours, 4),
        "analytic_ttft_p_ms": _ms(a.ttft_p_s) if a is not None else None,
        "analytic_tpot_p_ms": _ms(a.tpot_p_s) if a is not None else None,
        "misses": {"prefill": c.prefill_misses, "decode": c.decode_misses},
        "analytic_misses": {"prefill": a.prefill_misses, "decode": a.decode_misses} if a is not None else None,
        "tried": [{"prefill": p, "decode": d, "attainment": round(x, 5)} for p, d, x in check.tried],
        "why": check.why,
    }
