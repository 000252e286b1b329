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
) -> tuple[DisaggregatedSetup, list[Any]]:
    """Runs the pools policies and prints their rows (JSON or a table); returns the setup and
    the results (for a picture)."""
    from kvscale.cli.common import print_json
    from kvscale.cli.simulate import _slo_percentile_keys
    from kvscale.sim.disaggregated_session import run_pools_policies

    setup, results, rows = run_pools_policies(pools, trace, names, headroom, max_replicas, cold_start_s, seed, shape)
    at_slo = _slo_percentile_keys(results, rows, percentile)
    for row in rows:
        row["engine_profile"] = setup.decode.cfg.engine.profile
        row["layout"] = {"disaggregation": found.disaggregation, "reason": found.reason}
        row["predicted"] = {
            f"ttft_p{percentile:g}_ms".replace(".", "_"): round(pools.ttft_p_s * 1e3, 2),
            f"tpot_p{percentile:g}_ms".replace(".", "_"): round(pools.tpot_p_s * 1e3, 3),
        }
    if as_json:
        print_json(rows)
    else:
        render_pools(setup, pools, found.reason, rows, percentile, at_slo)
    return setup, results


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
        if disaggregation == "on":
            fail("--disaggregation on replays open-loop arrivals: give --trace or --load")
        return False
    found, pools = choose_layout(cat, request, aggregated, disaggregation)
    if found is None or pools is None:
        if disaggregation == "on":
            fail(f"no disaggregated plan: {found.reason if found is not None else ''}", EXIT_INFEASIBLE)
        if "ratematch" in names:
            fail("--policy ratematch sizes prefill and decode pools: it runs only on a disaggregated layout")
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
    )
    if args.png is not None:
        from kvscale.cli.simulate_plot import draw_timeline, timeline_title

        png = args.png
        title = timeline_title(f"{request.model.name} disaggregated", request.slo, args.load_text, "gateway")
        write_picture(png, lambda: draw_timeline(results, request.slo, png, title))
        if not args.as_json:
            console.print(f"wrote {png}")
    return True
