"""`kvscale simulate`: a trace (or a closed loop) through a simulated fleet under each policy."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kvscale.cli.common import (
    EXIT_INFEASIBLE,
    ITL_HELP,
    CatalogOpt,
    EngineCommandOpt,
    EngineOpt,
    EngineVersionOpt,
    JsonOpt,
    OptionalModelOpt,
    check_names,
    command_config_or_fail,
    command_model,
    console,
    engine_selection,
    err,
    fail,
    fmt,
    image_path,
    number,
    parse_command,
    positive,
    positive_number,
    print_json,
    split,
    tokens,
    tp_values,
    write_picture,
)
from kvscale.cli.common import (
    duration as parse_duration,
)
from kvscale.cli.common import (
    load as load_catalog,
)
from kvscale.cli.common import (
    model as resolve_model,
)
from kvscale.cli.common import (
    slo as make_slo,
)
from kvscale.cli.root import app
from kvscale.cli.simulate_pools import DISAGGREGATION_SIM_HELP, GPU_LIMIT_HELP, parse_gpu_limits
from kvscale.planner.search import DEFAULT_HEADROOM, PlanRequest, plan
from kvscale.sizing.checkpoints import default_precision
from kvscale.sizing.workload import Workload

# Bounds that keep one run to minutes on a laptop; the messages say how to get under them.
MAX_REPLICAS = 10_000
MAX_USERS = 100_000
MAX_RATE_SCALE = 1_000.0
MAX_TIME_SCALE = 1_000_000.0
MIN_TIME_SCALE = 1e-3
# Plain progress lines on a stderr that is not a terminal, this often (wall-clock seconds).
PROGRESS_EVERY_S = 10.0


@app.command()
def simulate(
    model: OptionalModelOpt = None,
    ttft: Annotated[str | None, typer.Option(help="Time-to-first-token target, e.g. 1s.")] = None,
    tpot: Annotated[str | None, typer.Option(help="Time-per-output-token target, e.g. 50ms.")] = None,
    fleet: Annotated[
        Path | None,
        typer.Option(
            "--fleet",
            help="Several services under one GPU budget (YAML: budget, services with model, priority, gpus, slo, "
            "load or trace); see kvscale/cli/simulate_fleet.py.",
        ),
    ] = None,
    trace: Annotated[Path | None, typer.Option(help="Azure CSV or Mooncake JSONL trace to replay (open loop).")] = None,
    load: Annotated[
        str | None,
        typer.Option(
            "--load",
            help="Open-loop load, as `kvscale sim serve --load`: generated, KIND:key=value,...: poisson, bursty, "
            "diurnal, step, flash, batches "
            "(batch submissions) or drift (the mean prompt moving at a constant rate), "
            "e.g. bursty:base=0.5,peak=90,on=1m,off=4m,input=2000,output=100,lengths=heavy,duration=30m or "
            "batches:base=1,every=2m,size=200,spread=3s,output=20,output_lengths=heavy; or a profile, constant:R, "
            "ramp:R0:R1:SECONDS, steps:R0@T0,R1@T1,... or trace:FILE, optionally with ;lengths:IN/OUT@T,... "
            "(--duration, --input and --output set the load's defaults: 30m, 512, 256).",
        ),
    ] = None,
    routing: Annotated[
        str,
        typer.Option(
            help="How requests reach replicas: service (random, stays on its replica), round-robin, "
            "or gateway (held at the gateway until a replica has room)."
        ),
    ] = "service",
    concurrency: Annotated[
        int | None, typer.Option(help="Closed loop: this many users, each sending again on completion.")
    ] = None,
    input_tokens: Annotated[int | None, typer.Option("--input", help="Closed loop: prompt tokens per request.")] = None,
    output_tokens: Annotated[
        int | None, typer.Option("--output", help="Closed loop: generated tokens per request.")
    ] = None,
    duration: Annotated[str | None, typer.Option(help="Closed loop: how long users keep sending, e.g. 10m.")] = None,
    percentile: Annotated[float, typer.Option(help="SLO percentile.")] = 95.0,
    itl: Annotated[str | None, typer.Option(help=ITL_HELP)] = None,
    policy: Annotated[
        str,
        typer.Option(
            help="kvscale, static (a fixed fleet: --replicas, by default the busiest minute over modelled "
            "capacity), hpa, keda, saturation, trailing (1.3 x the largest of the last ten minutes' per-minute "
            "bound counts, read causally), oracle, bound (per-minute fewest warm replicas that "
            "meet the SLO), peak (cheapest fixed fleet that meets it, found by simulation), or all."
        ),
    ] = "all",
    replicas: Annotated[
        int | None,
        typer.Option(
            help="Replicas of the static policy, and every policy's starting fleet (default: the static policy "
            "runs the busiest minute's rate, plus --headroom, over one replica's modelled capacity, and the "
            "others start from the plan's replicas, at most --max-replicas; not the `peak` yardstick, which "
            "simulates fleet sizes for the smallest that meets the SLO)."
        ),
    ] = None,
    max_replicas: Annotated[int, typer.Option("--max-replicas", help="Upper bound for every autoscaler.")] = 100,
    cold_start: Annotated[
        str | None, typer.Option("--cold-start", help="Replica start time (default: from the model size).")
    ] = None,
    rate_scale: Annotated[
        float, typer.Option("--rate-scale", help="X times the requests, same duration and shape.")
    ] = 1.0,
    time_scale: Annotated[float, typer.Option("--time-scale", help="Play the trace X times faster.")] = 1.0,
    gpu: Annotated[str | None, typer.Option(help="Allowed GPU types for the plan, comma-separated.")] = None,
    tp: Annotated[int | None, typer.Option(help="Pin the tensor-parallel degree.")] = None,
    precision: Annotated[
        str | None, typer.Option(help="Allowed weight precisions (default: the checkpoint's own, else bf16).")
    ] = None,
    headroom: Annotated[float, typer.Option(help="Spare capacity per replica, as a fraction.")] = DEFAULT_HEADROOM,
    seed: Annotated[int, typer.Option(help="Seed for --rate-scale sampling, --load arrivals and routing.")] = 0,
    png: Annotated[
        Path | None, typer.Option(help="Draw load, replicas and latency against time here (.png, .svg or .pdf).")
    ] = None,
    disaggregation: Annotated[str, typer.Option(help=DISAGGREGATION_SIM_HELP)] = "off",
    gpu_limit: Annotated[str | None, typer.Option("--gpu-limit", help=GPU_LIMIT_HELP)] = None,
    engine: EngineOpt = None,
    engine_command: EngineCommandOpt = None,
    engine_version: EngineVersionOpt = None,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay a trace (or a closed loop) through a simulated fleet under each autoscaling policy.

    With --engine-command the fleet runs that command (one GPU type, --gpu) instead of a plan:
    "what does the command I run today give me"; --replicas sets the static fleet (default 1)."""
    from kvscale.cli.simulate_pools import PoolsArgs, replay_pools
    from kvscale.sim.compare import OPT_IN_NAMES, POLICY_NAMES
    from kvscale.sim.disaggregated_session import POOLS_POLICY_NAMES
    from kvscale.sim.fit import fit_trace
    from kvscale.sim.fleet import RoutingError, check_routing
    from kvscale.sim.generators import LoadError
    from kvscale.sim.load_profile import DEFAULT_DURATION_S, load_requests
    from kvscale.sim.session import Load, SimulationError, setup_from_plan
    from kvscale.sim.trace import MAX_SPAN_S, TraceError, duration_s, read_trace
    from kvscale.sim.trace import rate_scale as scale_rate
    from kvscale.sim.trace import time_scale as scale_time

    # Every option is checked before the trace is read or anything runs.
    image_path(png)
    cat = load_catalog(catalog)
    if fleet is not None:
        from kvscale.cli.simulate_fleet import run_fleet

        if (
            model is not None
            or trace is not None
            or load is not None
            or concurrency is not None
            or engine_command
            or engine is not None
            or engine_version is not None
        ):
            fail(
                "--fleet FILE names each service's model and load: leave out --model, --trace, --load, "
                "--concurrency, --engine-command, --engine, --engine-version"
            )
        if gpu_limit is not None or disaggregation != "off":
            fail(
                "--fleet FILE has its budget and each service's disaggregation: leave out --gpu-limit and "
                "--disaggregation (set budget: and a service's disaggregation: in the file)"
            )
        run_fleet(fleet, cat, as_json, png)
        return
    command = (
        parse_command(engine_command, gpu, tp, precision, engine_version, cat, engine)
        if engine_command is not None
        else None
    )
    # Without a command, --engine/--engine-version pick the profile the plan is sized with.
    engine_name = engine_selection(cat, engine, engine_version)[0] if command is None else None
    if (model is None and command is None) or ttft is None or tpot is None:
        fail(
            "give --model (a catalog name, config.json or architecture file) or --engine-command, with --ttft and "
            "--tpot (or --fleet FILE for several services under one budget)"
        )
    arch = resolve_model(cat, model) if model is not None else command_model(cat, command)
    names = POLICY_NAMES if policy == "all" else split(policy)
    unknown = [n for n in names if n not in (*POLICY_NAMES, *OPT_IN_NAMES, *POOLS_POLICY_NAMES)]
    if unknown or not names:
        fail(
            f"--policy: unknown {', '.join(unknown) or 'empty'}; choose from "
            f"{', '.join(dict.fromkeys((*POLICY_NAMES, *OPT_IN_NAMES, *POOLS_POLICY_NAMES)))} or all"
        )
    if disaggregation not in ("auto", "on", "off"):
        fail(f"--disaggregation must be auto, on or off, got {disaggregation!r}")
    if disaggregation == "on" and command is not None:
        fail("--engine-command runs that command's aggregated replicas: leave out --disaggregation on")
    if gpu_limit is not None and (disaggregation == "off" or command is not None):
        fail(
            "--gpu-limit replays prefill and decode pools under a budget: give --disaggregation on or auto "
            "(for aggregated services under a budget, --fleet FILE)"
        )
    limits = parse_gpu_limits(cat, gpu_limit) if gpu_limit is not None else None
    if replicas is not None:
        positive(replicas, "--replicas", MAX_REPLICAS)
    positive(max_replicas, "--max-replicas", MAX_REPLICAS)
    number(headroom, "--headroom", low=0, high=10, what="spare capacity as a fraction, e.g. 0.2")
    positive_number(rate_scale, "--rate-scale", high=MAX_RATE_SCALE, what="times the requests; 0.5 keeps half")
    if not MIN_TIME_SCALE <= time_scale <= MAX_TIME_SCALE:  # also refuses NaN
        fail(
            f"--time-scale must be in [{MIN_TIME_SCALE:g}, {MAX_TIME_SCALE:g}] (times faster; 2 halves the span), "
            f"got {time_scale:g}"
        )
    slo = make_slo(ttft, tpot, percentile)
    max_itl_s = parse_duration(itl, "--itl") if itl is not None else None
    precisions = split(default_precision(precision, arch))
    if not precisions:
        fail("--precision: give at least one of bf16, fp16, fp8, int8, int4, mxfp4, nvfp4")
    gpus = check_names(cat, split(gpu), precisions, "auto")
    tps = tp_values(tp)
    cold_start_s = parse_duration(cold_start, "--cold-start") if cold_start is not None else None
    try:
        check_routing(routing)
    except RoutingError as exc:
        fail(str(exc))
    closed_args = (concurrency, input_tokens, output_tokens, duration)
    # With --load, --input/--output/--duration are the load's defaults (its text wins).
    closed = concurrency is not None or (load is None and not all(a is None for a in closed_args))
    if sum((trace is not None, load is not None, closed)) != 1 or (trace is not None and any(closed_args)):
        fail(
            "give one of --trace FILE, --load KIND:key=value,... (or constant:R, ramp:R0:R1:SECONDS, steps:R@T,...; "
            "--input/--output/--duration set its defaults), or --concurrency N --input N --output N "
            "--duration D for a closed loop"
        )
    if trace is not None or load is not None:
        try:
            if load is not None:
                seconds = parse_duration(duration, "--duration") if duration is not None else DEFAULT_DURATION_S
                prompt = tokens(input_tokens, "--input") if input_tokens is not None else 512
                output = tokens(output_tokens, "--output") if output_tokens is not None else 256
                base = load_requests(load, prompt, output, seed, seconds)
                requests = scale_time(scale_rate(base, rate_scale, seed), time_scale)
            else:
                assert trace is not None
                requests = scale_time(scale_rate(read_trace(trace), rate_scale, seed), time_scale)
        except (TraceError, LoadError) as exc:
            fail(str(exc))
        arrivals = Load(trace=requests)
        span = max(duration_s(requests), 1.0)
        # The plan sees the load's length mix and burstiness, at its mean rate.
        workload = fit_trace(requests).workload.at_rate(len(requests) / span)
    else:
        if concurrency is None or input_tokens is None or output_tokens is None or duration is None:
            fail("a closed loop needs all of --concurrency, --input, --output and --duration")
        users = positive(concurrency, "--concurrency", MAX_USERS)
        seconds = parse_duration(duration, "--duration")
        if seconds > MAX_SPAN_S:
            fail(f"--duration must be at most {MAX_SPAN_S / 86400:g} days, got {duration}")
        arrivals = Load(closed=(users, tokens(input_tokens, "--input"), tokens(output_tokens, "--output"), seconds))
        workload = Workload(input_tokens, output_tokens, 0.0)
    request = PlanRequest(
        model=arch,
        workload=workload,
        slo=slo,
        gpus=gpus,
        tensor_parallel=tps,
        precisions=precisions,
        headroom=headroom,
        # The plan the operator makes behind that router (an InferencePool plans least-loaded):
        # its replicas are the fleet every policy starts from, its batch limit the one deployed.
        least_loaded=routing == "gateway",
        max_itl_s=max_itl_s,
        engine=engine_name or "vllm",
    )
    try:
        if command is not None:
            setup = replace(
                command_setup(cat, command, gpus[0], arch, slo, cold_start_s, replicas), routing=routing, seed=seed
            )
        else:
            aggregated = plan(cat, request) if disaggregation != "on" else None
            # Two pools when the layout chosen is disaggregated (kvscale.cli.simulate_pools).
            replayed = replay_pools(
                cat,
                request,
                aggregated,
                disaggregation,
                arrivals.trace,
                policy,
                names,
                PoolsArgs(
                    headroom, max_replicas, cold_start_s, seed, percentile, as_json, png, load or str(trace), limits
                ),
            )
            if replayed:
                return
            assert aggregated is not None
            setup = replace(setup_from_plan(cat, aggregated, cold_start_s, replicas), routing=routing, seed=seed)
        results, rows = _run_with_progress(setup, arrivals, names, headroom, replicas, max_replicas, workload)
    except SimulationError as exc:
        fail(str(exc), EXIT_INFEASIBLE)
    if load is not None:
        load_text = load
    elif trace is not None:
        scales = "".join(
            f", {name} {value:g}x" for name, value in (("rate", rate_scale), ("time", time_scale)) if value != 1.0
        )
        load_text = f"trace {trace.name}{scales}"
    else:
        load_text = f"{concurrency} closed-loop users, {input_tokens} in / {output_tokens} out"
    head = f"{arch.name} on {setup.cfg.gpus} x {setup.cfg.gpu.name} ({setup.cfg.precision.name})"
    at_slo = _slo_percentile_keys(results, rows, percentile)
    for row in rows:  # the catalog profile every policy's step times came from
        row["engine_profile"] = setup.cfg.engine.profile
    if as_json:
        print_json(rows)
    else:
        said = engine is not None or engine_version is not None
        _render(setup, rows, slo, percentile, said, at_slo)
    if png is not None:
        from kvscale.cli.simulate_plot import draw_timeline, timeline_title

        title = timeline_title(head, slo, load_text, routing)
        write_picture(png, lambda: draw_timeline(results, slo, png, title))
        if not as_json:
            console.print(f"wrote {png}")


def _slo_percentile_keys(results: list[Any], rows: list[dict[str, Any]], percentile: float) -> tuple[str, str]:
    """Each row's TTFT and TPOT at the SLO's percentile (`ttft_p99_ms`, ...), beside its p50/p95:
    a p99 target is read against the p99. Returns the two keys."""

    def quantile(values: list[float], q: float) -> float:  # nearest rank, as the rows' p50/p95
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    name = f"p{percentile:g}".replace(".", "_")
    keys = (f"ttft_{name}_ms", f"tpot_{name}_ms")
    for result, row in zip(results, rows, strict=True):
        done = [r for r in result.requests if r.done]
        ttft = [r.ttft_s * 1e3 for r in done]
        tpot = [r.tpot_s * 1e3 for r in done if r.output_tokens > 1]
        row.setdefault(keys[0], round(quantile(ttft, percentile / 100), 2) if ttft else None)
        row.setdefault(keys[1], round(quantile(tpot, percentile / 100), 3) if tpot else None)
    return keys


def _render(
    setup: Any,
    rows: list[dict[str, Any]],
    slo: Any,
    percentile: float,
    engine_said: bool = False,
    at_slo: tuple[str, str] = ("ttft_p95_ms", "tpot_p95_ms"),
) -> None:
    """`engine_said`: --engine or --engine-version chose the profile, so the header names it;
    `at_slo`: the rows' TTFT and TPOT keys at the SLO's percentile (the table's second figure)."""
    profile = f", engine profile {setup.cfg.engine.profile}" if engine_said else ""
    console.print(
        f"{setup.cfg.model.name} on {setup.cfg.gpus} x {setup.cfg.gpu.name} ({setup.cfg.precision.name}){profile}, "
        f"max batch {setup.max_batch}, chunk budget {setup.cfg.max_num_batched_tokens}, cold start {setup.cold_start_s:.0f}s, routing {setup.routing}; "
        f"SLO p{percentile:g} TTFT <= "
        f"{slo.ttft_s * 1e3:g} ms, TPOT <= {slo.tpot_s * 1e3:g} ms"
    )
    table = Table(title="Policies on the same arrivals")
    for col in (
        "policy",
        "requests",
        "SLO met",
        f"TTFT p50/p{percentile:g} ms",
        f"TPOT p50/p{percentile:g} ms",
        "ITL p99 ms",
        "GPU-h",
        "vs bound",
        "vs peak",
        "cost $",
        "scale events",
    ):
        table.add_column(col)
    for row in rows:
        table.add_row(
            row["policy"],
            str(row["requests"]),
            f"{row['slo_attainment']:.2%}",
            f"{fmt(row['ttft_p50_ms'], 0)} / {fmt(row[at_slo[0]], 0)}",
            f"{fmt(row['tpot_p50_ms'])} / {fmt(row[at_slo[1]])}",
            fmt(row.get("itl_p99_ms")),
            f"{row['gpu_hours']:.2f}",
            fmt(row.get("gpu_hours_vs_bound"), 2),
            fmt(row.get("gpu_hours_vs_peak"), 2),
            f"{row['cost_usd']:.2f}",
            str(row["scale_events"]),
        )
    console.print(table)


def _run_with_progress(
    setup: Any,
    load: Any,
    names: tuple[str, ...],
    headroom: float,
    replicas: int | None,
    max_replicas: int,
    shape: Any = None,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Runs the policies with progress on stderr (a bar on a terminal, a line every
    PROGRESS_EVERY_S otherwise), whatever --json says: stdout stays machine-readable."""
    from rich.progress import Progress

    from kvscale.sim.session import run_policies
    from kvscale.sim.trace import duration_s

    total = max(duration_s(load.trace) if load.trace is not None else load.closed[3], 1e-9)
    if not err.is_terminal:
        started = time.monotonic()
        last = [started]

        def line(name: str, now_s: float) -> None:
            wall = time.monotonic()
            if wall - last[0] >= PROGRESS_EVERY_S:
                last[0] = wall
                err.print(
                    f"simulating {name}: {min(now_s / total, 1.0):.0%} of {total / 3600:.2f} h simulated "
                    f"after {wall - started:.0f}s",
                    highlight=False,
                )

        return run_policies(setup, load, names, headroom, replicas, max_replicas, line, shape)
    with Progress(console=err, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def tick(name: str, now_s: float) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(f"simulating {name}", total=total)
            bar.update(tasks[name], completed=min(now_s, total))

        return run_policies(setup, load, names, headroom, replicas, max_replicas, tick, shape)


def command_setup(
    cat: Any, command: Any, gpu: str, arch: Any, slo: Any, cold_start_s: float | None, replicas: int | None
) -> Any:
    """A fleet that runs an engine command as given, instead of a plan."""
    from kvscale.sim.run import SimSetup

    cc = command_config_or_fail(cat, command, gpu, arch)
    if not cc.config.memory.fits:
        fail(
            f"--engine-command: {arch.name} does not fit on {cc.config.gpus} x {cc.config.gpu.name} at "
            f"{cc.config.precision.name}",
            EXIT_INFEASIBLE,
        )
    for note in cc.notes:
        err.print(f"note: {note}", markup=False)
    cold = cold_start_s if cold_start_s is not None else cc.config.cold_start_s
    return SimSetup(cfg=cc.config, slo=slo, max_batch=cc.max_batch, cold_start_s=cold, initial_replicas=replicas or 1)
