"""`kvscale simulate --disaggregation auto|on|off`: when the layout chosen is disaggregated, the
replay runs a prefill pool and a decode pool (kvscale.sim.disaggregated_fleet) under kvscale's
policy (both pools through the one tick), the plan's fixed pools (`static`) and Dynamo's
average-rate matching (`ratematch`); the report shows each pool's replicas and GPU-hours and
the total. Helpers of `simulate`, no command of their own."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from kvscale.cli.common import EXIT_INFEASIBLE, console, fail, fmt, write_picture
from kvscale.planner.disaggregated import DisaggregatedPlan, Disaggregation, LayoutPlan, plan_layouts
from kvscale.planner.search import Plan, PlanRequest
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.units import format_duration

if TYPE_CHECKING:  # the simulator is imported when a replay runs
    from kvscale.sim.disaggregated_fleet import DisaggregatedSetup

DISAGGREGATION_SIM_HELP = (
    "Prefill/decode disaggregation: off (aggregated replicas, what the operator deploys today; the default), auto "
    "(two pools when `plan --disaggregation auto` would choose them) or on (only prefill and decode pools). Pools "
    "run behind the gateway under kvscale, static (the plan's pools) and ratematch (Dynamo's planner: both pools "
    "from the last interval's average rates); --replicas and --routing apply to aggregated replicas only."
)


GPU_LIMIT_HELP = (
    "With --disaggregation: replay the pools under a GPU budget, TYPE=N,... GPUs per type both pools may hold at "
    "once (a fleet file's budget: {TYPE: N}), e.g. --gpu-limit H100-SXM=8. kvscale's pools share it as the "
    "operator's GPUBudget splits it (the split that serves the most, split_pools), ratematch clamps "
    "proportionally; the pools start within it."
)


def parse_gpu_limits(cat: Catalog, text: str) -> dict[str, int]:
    """--gpu-limit TYPE=N,...: GPUs per catalog type (N >= 0, as a fleet file's budget)."""
    from kvscale.cli.common import split
    from kvscale.sizing.catalog import CatalogError

    limits: dict[str, int] = {}
    for item in split(text):
        kind, sep, value = item.partition("=")
        if not sep or not kind.strip() or not value.strip().isdigit():
            fail(f"--gpu-limit {item!r}: write TYPE=N (N GPUs, N >= 0), e.g. --gpu-limit H100-SXM=8")
        try:
            name = cat.gpu(kind.strip()).name
        except CatalogError as exc:
            fail(f"--gpu-limit: {exc}")
        if name in limits:
            fail(f"--gpu-limit names {name} twice")
        limits[name] = int(value.strip())
    if not limits:
        fail("--gpu-limit: give at least one TYPE=N, e.g. --gpu-limit H100-SXM=8")
    return limits


def within_limits(plan: DisaggregatedPlan, limits: dict[str, int]) -> tuple[DisaggregatedPlan, str]:
    """The plan's pools started within `limits` (the operator's rule for new pools under a
    GPUBudget, kvscale.control.pool_budget.cap_pools): the plan's workers where they fit, else on
    one GPU type the split that serves the most (split_pools, at the plan's rates per worker);
    exits when not one worker of each fits. Returns the plan to start from and what changed."""
    from kvscale.autoscaling.pool_capacity import split_pools

    p, d = plan.prefill, plan.decode
    gp, gd = p.cfg.gpu.name, d.cfg.gpu.name
    if gp == gd:
        if gp not in limits:
            return plan, ""
        limit = limits[gp]
        if limit < p.cfg.gpus + d.cfg.gpus:
            fail(
                f"--gpu-limit {gp}={limit}: not one prefill worker ({p.cfg.gpus} GPUs) and one decode worker "
                f"({d.cfg.gpus} GPUs) fit",
                EXIT_INFEASIBLE,
            )
        if p.gpus + d.gpus <= limit:
            return plan, ""
        counts = split_pools(
            limit, (p.workers, d.workers), (p.rate_per_worker_max, d.rate_per_worker_max), (p.cfg.gpus, d.cfg.gpus)
        )
    else:
        fitted = []
        for pool in (p, d):
            cap = limits.get(pool.cfg.gpu.name)
            if cap is not None and cap < pool.cfg.gpus:
                fail(f"--gpu-limit {pool.cfg.gpu.name}={cap}: not one {pool.role} worker ({pool.cfg.gpus} GPUs) fits")
            fitted.append(pool.workers if cap is None else min(pool.workers, cap // pool.cfg.gpus))
        counts = (fitted[0], fitted[1])
    if counts == (p.workers, d.workers):
        return plan, ""
    said = (
        f"the GPU limit starts the pools at prefill {counts[0]} and decode {counts[1]} workers "
        f"(the plan: {p.workers} and {d.workers})"
    )
    return replace(plan, prefill=replace(p, workers=counts[0]), decode=replace(d, workers=counts[1])), said


def choose_layout(
    cat: Catalog, request: PlanRequest, aggregated: Plan | None, disaggregation: str
) -> tuple[LayoutPlan | None, DisaggregatedPlan | None]:
    """The layout for the replay: (the layouts searched, the disaggregated plan when it is the
    one chosen). `off` searches nothing. The pools are planned least-loaded, the routing they
    replay behind (an endpoint picker that knows the roles: llm-d's P/D deployments need one);
    the aggregated plan beside them is the one made for --routing."""
    if disaggregation == "off":
        return None, None
    mode: Disaggregation = "on" if disaggregation == "on" else "auto"
    behind_picker = replace(request, least_loaded=True)
    found = plan_layouts(cat, behind_picker, mode, aggregated=None if mode == "on" else aggregated)
    return found, found.disaggregated if found.mode == "disaggregated" else None


def pools_names(policy: str, names: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """The pools policies to run, and the named ones that do not run on pools."""
    from kvscale.sim.disaggregated_session import POOLS_POLICY_NAMES

    if policy == "all":
        return POOLS_POLICY_NAMES, []
    return tuple(n for n in names if n in POOLS_POLICY_NAMES), [n for n in names if n not in POOLS_POLICY_NAMES]


def render_pools(
    setup: DisaggregatedSetup,
    plan: DisaggregatedPlan,
    reason: str,
    rows: list[dict[str, Any]],
    percentile: float,
    at_slo: tuple[str, str],
) -> None:
    ps, ds = setup.prefill, setup.decode
    slo = ps.slo
    console.print(
        f"{ps.cfg.model.name} disaggregated: {ps.initial_replicas} prefill x {ps.cfg.gpus} x {ps.cfg.gpu.name} "
        f"({ps.cfg.precision.name}, chunk budget {ps.cfg.max_num_batched_tokens}) + {ds.initial_replicas} decode x "
        f"{ds.cfg.gpus} x {ds.cfg.gpu.name} (max batch {ds.max_batch}); KV transfer over {setup.path.name} "
        f"{format_duration(plan.kv_transfer_s)} at the mean prompt; cold start {ps.cold_start_s:.0f}s / "
        f"{ds.cold_start_s:.0f}s, routing gateway (least-loaded prefill, then decode); SLO p{percentile:g} "
        f"TTFT <= {slo.ttft_s * 1e3:g} ms, TPOT <= {slo.tpot_s * 1e3:g} ms",
        highlight=False,
    )
    console.print(
        f"plan predicts TTFT p{percentile:g} {plan.ttft_p_s * 1e3:.0f} ms, TPOT {plan.tpot_p_s * 1e3:.1f} ms",
        highlight=False,
    )
    if reason:
        console.print(f"Layout: {reason}", highlight=False, markup=False)
    table = Table(title="Policies on the same arrivals (prefill + decode pools)")
    for col in (
        "policy",
        "requests",
        "SLO met",
        f"TTFT p50/p{percentile:g} ms",
        f"TPOT p50/p{percentile:g} ms",
        "prefill max",
        "prefill GPU-h",
        "decode max",
        "decode GPU-h",
        "GPU-h",
        "cost $",
        "scale events",
    ):
        table.add_column(col)
    for row in rows:
        p, d = row["prefill"], row["decode"]
        table.add_row(
            row["policy"],
            str(row["requests"]),
            f"{row['slo_attainment']:.2%}",
            f"{fmt(row['ttft_p50_ms'], 0)} / {fmt(row[at_slo[0]], 0)}",
            f"{fmt(row['tpot_p50_ms'])} / {fmt(row[at_slo[1]])}",
            str(p["replicas_max"]),
            f"{p['gpu_hours']:.2f}",
            str(d["replicas_max"]),
            f"{d['gpu_hours']:.2f}",
            f"{row['gpu_hours']:.2f}",
            f"{row['cost_usd']:.2f}",
            str(row["scale_events"]),
        )
    console.print(table)


def run_pools_cli(
    found: LayoutPlan,
    pools: DisaggregatedPlan,
    trace: list[Any],
    names: tuple[str, ...],
    headroom: float,
    max_replicas: int,
    cold_start_s: float | None,
    seed: int,
    shape: Any,
    percentile: float,
    as_json: bool,
    gpu_limits: dict[str, int] | None = None,
) -> tuple[DisaggregatedSetup, list[Any]]:
    """Runs the pools policies and prints their rows (JSON or a table); returns the setup and
    the results (for a picture). `gpu_limits`: the budget both pools share (--gpu-limit)."""
    from kvscale.cli.common import print_json
    from kvscale.cli.simulate import _slo_percentile_keys
    from kvscale.sim.disaggregated_session import run_pools_policies

    started, capped = within_limits(pools, gpu_limits) if gpu_limits is not None else (pools, "")
    setup, results, rows = run_pools_policies(
        started, trace, names, headroom, max_replicas, cold_start_s, seed, shape, gpu_limits=gpu_limits
    )
    at_slo = _slo_percentile_keys(results, rows, percentile)
    for row, result in zip(rows, results, strict=True):
        row["engine_profile"] = setup.decode.cfg.engine.profile
        row["layout"] = {"disaggregation": found.disaggregation, "reason": found.reason}
        if gpu_limits is not None:
            row["gpu_limits"] = dict(gpu_limits)
            row["max_gpus_used"] = _peak(result)
            row["start"] = {"prefill": started.prefill.workers, "decode": started.decode.workers, "why": capped}
        row["predicted"] = {
            f"ttft_p{percentile:g}_ms".replace(".", "_"): round(pools.ttft_p_s * 1e3, 2),
            f"tpot_p{percentile:g}_ms".replace(".", "_"): round(pools.tpot_p_s * 1e3, 3),
        }
    if as_json:
        print_json(rows)
    else:
        render_pools(setup, pools, found.reason, rows, percentile, at_slo)
        if gpu_limits is not None:
            limits = ", ".join(f"{g} {n}" for g, n in gpu_limits.items())
            peaks = "; ".join(
                f"{row['policy']} at most " + ", ".join(f"{g} {n}" for g, n in row["max_gpus_used"].items())
                for row in rows
            )
            console.print(f"GPU limit {limits}: {peaks}", highlight=False)
            if capped:
                console.print(capped[0].upper() + capped[1:], highlight=False)
    return setup, results


def _peak(result: Any) -> dict[str, int]:
    """GPUs per type both pools held at most, at any tick."""
    peak: dict[str, int] = {}
    for point in result.pool_timeline:
        for gpu, n in point.gpus_held.items():
            peak[gpu] = max(peak.get(gpu, 0), n)
    return peak


@dataclass(frozen=True)
class PoolsArgs:
    headroom: float
    max_replicas: int
    cold_start_s: float | None
    seed: int
    percentile: float
    as_json: bool
    png: Path | None
    load_text: str
    gpu_limits: dict[str, int] | None = None


def replay_pools(
    cat: Catalog,
    request: PlanRequest,
    aggregated: Plan | None,
    disaggregation: str,
    trace: list[Any] | None,
    policy: str,
    names: tuple[str, ...],
    args: PoolsArgs,
) -> bool:
    """Replays the two pools when the layout chosen is disaggregated (True: done, printed);
    False: the caller replays aggregated replicas. Fails when `on` finds no pools, on a closed
    loop under `on`, and on policies that do not fit the layout."""
    if trace is None:
        if disaggregation == "on" or args.gpu_limits is not None:
            fail(f"--disaggregation {disaggregation} replays open-loop arrivals: give --trace or --load")
        return False
    found, pools = choose_layout(cat, request, aggregated, disaggregation)
    if found is None or pools is None:
        if disaggregation == "on":
            fail(f"no disaggregated plan: {found.reason if found is not None else ''}", EXIT_INFEASIBLE)
        if "ratematch" in names:
            fail("--policy ratematch sizes prefill and decode pools: it runs only on a disaggregated layout")
        if args.gpu_limits is not None:
            fail(
                "--gpu-limit replays prefill and decode pools under a budget, and the layout chosen is aggregated "
                f"({found.reason if found is not None else 'disaggregation off'}); for aggregated services under a "
                "budget give --fleet FILE"
            )
        return False
    run_names, other = pools_names(policy, names)
    if other or not run_names:
        fail(f"{', '.join(other)}: not run on prefill and decode pools; choose from kvscale, static, ratematch")
    _, results = run_pools_cli(
        found,
        pools,
        trace,
        run_names,
        args.headroom,
        args.max_replicas,
        args.cold_start_s,
        args.seed,
        request.workload,
        args.percentile,
        args.as_json,
        args.gpu_limits,
    )
    if args.png is not None:
        from kvscale.cli.simulate_plot import draw_timeline, timeline_title

        png = args.png
        title = timeline_title(f"{request.model.name} disaggregated", request.slo, args.load_text, "gateway")
        write_picture(png, lambda: draw_timeline(results, request.slo, png, title))
        if not args.as_json:
            console.print(f"wrote {png}")
    return True
