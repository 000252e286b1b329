"""`kvscale plan`, `kvscale predict` and `kvscale roofline`: the sizing model's answers."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kvscale.cli.common import (
    EXIT_INFEASIBLE,
    ITL_HELP,
    MAX_TOKENS,
    CatalogOpt,
    EngineCommandOpt,
    EngineOpt,
    EngineVersionOpt,
    JsonOpt,
    ModelOpt,
    OptionalModelOpt,
    check_names,
    command_config_or_fail,
    command_model,
    console,
    duration,
    engine_selection,
    fail,
    fmt,
    gpu_nodes,
    image_path,
    load,
    number,
    parse_command,
    positive,
    print_json,
    sized_to_nodes,
    split,
    tokens,
    tp_values,
    write_picture,
)
from kvscale.cli.common import (
    model as resolve_model,
)
from kvscale.cli.common import (
    slo as make_slo,
)
from kvscale.cli.plan_layouts import DISAGGREGATION_HELP, infeasible, layout_lines, layouts, with_layouts
from kvscale.cli.root import app
from kvscale.engines.args import ENGINE_TYPES, PlannedLaunch, engine_command, plan_launch, requested_source
from kvscale.planner.routing_advice import GatewayAdvice, gateway_advice
from kvscale.planner.search import (
    DEFAULT_HEADROOM,
    TENSOR_PARALLEL_DEGREES,
    Feasible,
    Plan,
    PlanRequest,
    SimulatedSizing,
    cheapest,
    plan,
)
from kvscale.planner.serialize import candidate_to_dict, check_to_dict, plan_to_dict, prediction_to_dict
from kvscale.sizing.batching import predict_batch, throughput_latency_curve
from kvscale.sizing.catalog import Catalog, EngineProfile, ModelArch
from kvscale.sizing.checkpoints import CheckpointError, default_precision, resolve_checkpoint, substitution
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.context_limit import ContextLimitError, check_requested_context
from kvscale.sizing.engine_profiles import profile_on
from kvscale.sizing.roofline import ideal_batch, ops_per_byte
from kvscale.sizing.units import GIB
from kvscale.sizing.workload import Slo, Workload

# A request rate above this is a typo: it would need more GPUs than any cloud region holds.
MAX_RPS = 1_000_000.0
# The most replicas a plan may name: a fleet larger than this is not what anyone deploys.
MAX_REPLICAS = 100_000


@app.command("plan")
def plan_cmd(
    model: ModelOpt,
    ttft: Annotated[str, typer.Option(help="Time-to-first-token target at the percentile, e.g. 500ms.")],
    tpot: Annotated[str, typer.Option(help="Time-per-output-token target at the percentile, e.g. 50ms.")],
    rps: Annotated[
        float | None, typer.Option(help="Expected requests per second (with --trace: overrides the fitted rate).")
    ] = None,
    input_tokens: Annotated[int | None, typer.Option("--input", help="Typical prompt tokens.")] = None,
    output_tokens: Annotated[int | None, typer.Option("--output", help="Typical generated tokens.")] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Azure CSV or Mooncake JSONL trace: plan for its fitted lengths, busy-minute rate and "
            "burstiness, then replay its busiest stretch on the plan (instead of --input/--output)."
        ),
    ] = None,
    percentile: Annotated[float, typer.Option(help="SLO percentile, in [50, 100).")] = 95.0,
    itl: Annotated[str | None, typer.Option(help=ITL_HELP)] = None,
    max_context: Annotated[
        int | None, typer.Option("--max-context", help="Longest context the engine must accept (--max-model-len).")
    ] = None,
    gpu: Annotated[str | None, typer.Option(help="Allowed GPU types, comma-separated (default: all).")] = None,
    free_gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            help="The cluster's free GPUs, TYPE=COUNT or TYPE=NODESxGPUS,... (e.g. H100-SXM=16,L4=8x1: eight "
            "one-GPU L4 nodes), as `kvscale manifests --gpus`: plan only on those types, within those counts, no "
            "tensor-parallel group beyond a node.",
        ),
    ] = None,
    tp: Annotated[int | None, typer.Option(help="Pin the tensor-parallel degree (1, 2, 4, 8).")] = None,
    precision: Annotated[
        str | None,
        typer.Option(
            help="Allowed weight precisions, comma-separated: bf16, fp16, fp8, int8, int4, mxfp4, nvfp4 "
            "(default: the checkpoint's own, else bf16)."
        ),
    ] = None,
    kv_cache_precision: Annotated[str, typer.Option("--kv-cache-precision", help="auto, fp16 or fp8.")] = "auto",
    objective: Annotated[str, typer.Option(help="cost (cheapest meeting the SLO) or latency (fastest).")] = "cost",
    headroom: Annotated[float, typer.Option(help="Spare capacity kept per replica, as a fraction.")] = DEFAULT_HEADROOM,
    max_replicas: Annotated[
        int | None, typer.Option("--max-replicas", help="Reject plans needing more replicas.")
    ] = None,
    show: Annotated[int, typer.Option(help="Alternatives to list in the table.")] = 8,
    engine: EngineOpt = None,
    engine_version: EngineVersionOpt = None,
    source: Annotated[
        str | None, typer.Option(help="Checkpoint the engine loads (hf://org/name); int4/int8 need a quantized one.")
    ] = None,
    dp_attention: Annotated[
        bool,
        typer.Option(
            "--dp-attention",
            help="MoE models on vLLM: also plan replicas of 2, 4 or 8 data-parallel attention ranks "
            "(--data-parallel-size N --enable-expert-parallel: each GPU its own attention and KV cache, the "
            "experts over all; spec.hardware.dataParallelAttention in the operator).",
        ),
    ] = False,
    routing: Annotated[
        str,
        typer.Option(
            help="How requests reach the replicas: service (a plain Service, at random) or gateway (a "
            "least-loaded endpoint picker, spec.routing.inferencePool in the operator): a new prompt joins a "
            "busy replica only when none is idle, which long prompts need far fewer replicas for."
        ),
    ] = "service",
    disaggregation: Annotated[str, typer.Option(help=DISAGGREGATION_HELP)] = "auto",
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The cheapest (or fastest) GPU x TP x precision x batch limit that meets the SLO."""
    cat = load(catalog)
    arch = resolve_model(cat, model)
    engine_name, profile = engine_selection(cat, engine, engine_version)
    if objective not in ("cost", "latency"):
        fail(f"--objective must be cost or latency, got {objective!r}")
    if routing not in ("service", "gateway"):
        fail(f"--routing must be service or gateway, got {routing!r}")
    if disaggregation not in ("auto", "on", "off"):
        fail(f"--disaggregation must be auto, on or off, got {disaggregation!r}")
    number(headroom, "--headroom", low=0, high=10, what="spare capacity as a fraction, e.g. 0.2")
    if trace is None and (rps is None or input_tokens is None or output_tokens is None):
        fail("give --rps, --input and --output, or --trace FILE to fit them from a trace")
    if trace is not None and (input_tokens is not None or output_tokens is not None):
        fail("--trace fits the lengths from the trace: leave out --input/--output (or drop --trace)")
    if rps is not None:
        number(rps, "--rps", low=0, high=MAX_RPS, what="requests per second", high_inclusive=True)
    fitted = _fit(trace) if trace is not None else None
    if max_replicas is not None:
        positive(max_replicas, "--max-replicas", MAX_REPLICAS)
    if show < 0:
        fail(f"--show must be zero or more, got {show}")
    precisions = split(default_precision(precision, arch))
    if not precisions:
        fail("--precision: give at least one of bf16, fp16, fp8, int8, int4, mxfp4, nvfp4")
    nodes = gpu_nodes(cat, free_gpus) if free_gpus is not None else None
    limits = {name: n.count for name, n in nodes.items()} if nodes is not None else None
    if nodes is not None:  # TYPE=NODESxGPUS: no tensor-parallel group beyond the largest node
        cat = sized_to_nodes(cat, nodes)
    if limits is not None and gpu:
        fail("--gpu and --gpus both name GPU types: use --gpus TYPE=COUNT alone (it also limits the types)")
    gpus = check_names(cat, tuple(limits) if limits else split(gpu), precisions, kv_cache_precision)
    context = tokens(max_context, "--max-context") if max_context is not None else None
    context_said = None  # why the context limit is what it is, when --max-context did not set it
    try:
        longest = (
            # a trace's longest requests beyond the model's limit are not planned for (the
            # engine answers them 400); the typical one must fit
            fitted.workload.input_tokens + fitted.workload.output_tokens
            if fitted is not None
            else tokens(input_tokens or 0, "--input") + tokens(output_tokens or 0, "--output")
        )
        if fitted is not None and context is None:
            traced = fitted.workload.inputs.max + fitted.workload.outputs.max
            context = min(traced, arch.max_context_tokens)
            context_said = _trace_context_reason(arch, traced)
        check_requested_context(arch, context, "--max-context", longest, "--input + --output")
    except ContextLimitError as exc:
        fail(str(exc))
    served = served_id(model)
    precisions = _with_checkpoints(cat, arch, precisions, served, source)
    try:
        if fitted is not None:
            base = fitted.workload if rps is None else fitted.workload.at_rate(rps)
            workload = replace(base, max_context_tokens=context)
        else:
            assert rps is not None and input_tokens is not None and output_tokens is not None
            workload = Workload(tokens(input_tokens, "--input"), tokens(output_tokens, "--output"), rps, context)
        slo = make_slo(ttft, tpot, percentile)
    except ValueError as exc:
        fail(str(exc))
    max_itl_s = duration(itl, "--itl") if itl is not None else None
    request = PlanRequest(
        model=arch,
        workload=workload,
        slo=slo,
        gpus=gpus,
        tensor_parallel=tp_values(tp),
        precisions=precisions,
        kv_cache_precision=kv_cache_precision,
        objective=objective,  # type: ignore[arg-type]
        headroom=headroom,
        max_replicas=max_replicas,
        gpu_limits=limits,
        engine=engine_name,
        data_parallel_attention=dp_attention,
        least_loaded=routing == "gateway",
        max_itl_s=max_itl_s,
    )
    result = plan(cat, request)
    # Both routers by the analytic model alike (the simulated check sizes only the chosen one).
    gateway = gateway_advice(cat, result)
    replay, replays = None, None
    if fitted is not None:
        from kvscale.sim.check import Replays, sample

        replay, replays = sample(fitted.trace, workload.requests_per_s), Replays()
    analytic, result = result, _checked(result, replay, routing, replays=replays)
    if result.chosen is not None and analytic.chosen is not None and result.chosen.config != analytic.chosen.config:
        # The check chose another candidate: the gateway advice is for it (its analytic figures).
        twin = next((a for a in analytic.alternatives if a.config == result.chosen.config), None)
        gateway = gateway_advice(cat, replace(analytic, chosen=twin)) if twin is not None else None
    unpinned = _unpinned(cat, result, replay, routing, replays) if not result.feasible else None
    if unpinned is not None:
        result = replace(result, suggestions=(*result.suggestions, unpinned[0]))
    fp8 = _fp8_beside(cat, request, result, served, source)
    # A custom architecture or a config.json file names no checkpoint: the engine line needs
    # --source (without it the engine would be told to load the file's name).
    needs_source = names_no_checkpoint(model) and source is None
    # Sized with any profile; deployed only by an engine the operator runs.
    not_deployed = None if profile.name in ENGINE_TYPES else not_deployable(profile)
    launch = None if needs_source or not_deployed else _launch(result, served, source)
    if launch is not None and context_said is not None:
        launch = replace(launch, context=replace(launch.context, reason=context_said))
    check = result.chosen.check if result.chosen is not None else None
    # The layout beside the aggregated plan (prefill/decode pools: kvscale.planner.disaggregated)
    found = layouts(cat, result, disaggregation, checked=check is not None, replay=replay, routing=routing)
    command, args = engine_command(launch.launch) if launch else ([], None)
    if as_json:
        out = plan_to_dict(result, args)
        if fp8 is not None and out["chosen"] is not None:
            out["chosen"]["fp8_beside"] = fp8
        if gateway is not None and out["chosen"] is not None:
            out["chosen"]["gateway_beside"] = {
                "replicas": gateway.gateway_replicas,
                "gpus": gateway.gateway_gpus,
                "cost_usd_per_hour": round(gateway.gateway_usd_per_hour, 2),
                "saving": round(gateway.saving, 3),
            }
        out["engine_profile"] = (result.chosen.config.engine if result.chosen is not None else profile).profile
        if out["chosen"] is not None:
            out["chosen"]["engine_profile"] = out["engine_profile"]
        if (needs_source or not_deployed) and out["chosen"] is not None:
            out["chosen"].update(
                engine=profile.name, engine_args=None, engine_args_missing=not_deployed or NEEDS_SOURCE
            )
        if launch and out["chosen"] is not None:
            out["chosen"].update(
                engine=profile.name,
                max_context_tokens=launch.context.max_model_len_tokens,
                max_context_reason=launch.context.reason,
                checkpoint=launch.checkpoint.source,
                checkpoint_note=substitution(launch.checkpoint),
                cold_start_s=round(launch.cold_start.total_s, 1),
            )
        if unpinned is not None:
            out["unpinned"] = unpinned[1]
        if fitted is not None:
            out["workload"]["fitted"] = fitted.fit.describe()
        if check is not None:
            out["check"] = check_to_dict(check)
        print_json(with_layouts(out, found, served, source, result.feasible))
    else:
        if fitted is not None:
            console.print("[bold]Workload fitted from the trace[/]")
            for line in fitted.fit.describe():
                console.print(f"  {line}")
        checked = describe_check(check, slo) if check is not None else []
        if found.mode == "disaggregated":
            for line in layout_lines(found):
                console.print(line, highlight=False, soft_wrap=True)
        # Why there is no engine command: said under the request's line (not after the tables).
        no_engine = not_deployed or (
            f"{NEEDS_SOURCE} (sized with the {profile.profile} profile)" if needs_source else None
        )
        _render_plan(result, [*command, *args] if args else None, show, launch, fp8, gateway, checked, no_engine)
        if found.mode != "disaggregated":
            for line in layout_lines(found):
                console.print(line, highlight=False, soft_wrap=True)
    if infeasible(found, result.feasible):
        raise typer.Exit(EXIT_INFEASIBLE)


def _checked(result: Plan, replay: list[Any] | None, routing: str, advise: bool = True, replays: Any = None) -> Plan:
    """The plan sized and ranked by the simulated check on `replay` (None: no trace, as planned);
    `advise`: with what would make an infeasible check feasible; `replays`: the replays of an
    earlier check of this command (kvscale.sim.check.Replays), read rather than run again."""
    if replay is None or result.chosen is None:
        return result
    from kvscale.sim.check import check_and_size

    # The analytic count proposes; the simulator's replay of the trace's busiest stretch
    # (the same routing) sizes the plan, below or above that count.
    return check_and_size(result, replay, routing, advise, replays)  # type: ignore[arg-type]


def _unpinned(
    cat: Catalog, result: Plan, replay: list[Any] | None, routing: str, replays: Any = None
) -> tuple[str, dict[str, Any]] | None:
    """An infeasible plan under a pinned tensor-parallel degree: the plan without the pin (the
    same GPU types, checked the same way), as a suggestion line and its JSON, when it meets
    the SLO; None when nothing is pinned or it does not."""
    r = result.request
    if len(r.tensor_parallel) != 1:
        return None
    free = _checked(
        plan(cat, replace(r, tensor_parallel=TENSOR_PARALLEL_DEGREES)), replay, routing, advise=False, replays=replays
    )
    c = free.chosen
    if c is None or not free.feasible:
        return None
    p = c.prediction
    how = "in the simulated check" if c.check is not None else "by the analytic model"
    line = (
        f"without the pin ({r.knobs.to(r.knobs.tensor_parallel, str(r.tensor_parallel[0]))}): {p.replicas} x "
        f"{_shape(c)} ({c.precision}) meets the SLO {how} at ${p.cost_usd_per_hour:.2f}/h"
    )
    data = {
        "gpu": c.gpu,
        "tensor_parallel": c.tensor_parallel,
        "pipeline_parallel": c.pipeline_parallel,
        "precision": c.precision,
        "replicas": p.replicas,
        "cost_usd_per_hour": round(p.cost_usd_per_hour, 4),
        "checked": c.check is not None,
    }
    return line, data


def describe_check(check: SimulatedSizing, slo: Slo) -> list[str]:
    """The simulated check in the plan's words: what was replayed, both counts, and why they differ."""
    head = (
        f"simulated check: {check.requests} requests ({check.span_s / 60:.1f} min at {check.rate_per_s:.2f} req/s, "
        f"the trace's busiest stretch scaled to the planned rate, behind a {check.routing}): "
        + (
            f"{check.analytic_replicas} replica(s) (the analytic count) {check.analytic_attainment:.2%} meet "
            if check.analytic_attainment is not None
            else f"{check.replicas} replica(s) {check.attainment:.2%} meet "
        )
        + f"p{slo.percentile:g} TTFT/TPOT (target {check.target:.0%})"
    )
    if check.replicas == check.analytic_replicas and check.met:
        return [head]
    if check.met:
        return [
            head,
            f"replicas: {check.replicas} (simulated) instead of {check.analytic_replicas} (analytic): {check.why}",
        ]
    return [head, f"closest fleet: {check.replicas} replica(s): {check.why}"]


def not_deployable(profile: EngineProfile) -> str:
    """Why a plan sized with an engine the operator does not run has no engine command."""
    return (
        f"no engine command: the plan is sized with the {profile.profile} profile, but kvscale deploys only "
        f"{', '.join(ENGINE_TYPES)}; run {profile.name} yourself with these figures, or plan with --engine "
        f"{ENGINE_TYPES[0]} for a command the operator deploys"
    )


NEEDS_SOURCE = (
    "no engine command: a custom architecture or config.json file names no checkpoint; add --source hf://org/name "
    "(what the engine loads) to get the engine arguments, context limit and cold start"
)


def names_no_checkpoint(model: str) -> bool:
    """A model given as a file (a custom architecture YAML or a Hugging Face config.json): it
    says the shapes, not what the engine loads (a checkpoint directory holding a config.json does)."""
    return model.endswith((".yaml", ".yml", ".json"))


@dataclass(frozen=True)
class _Fitted:
    trace: list[Any]
    fit: Any  # kvscale.sim.fit.FittedWorkload

    @property
    def workload(self) -> Workload:
        w: Workload = self.fit.workload
        return w


def _trace_context_reason(arch: ModelArch, traced_tokens: int) -> str:
    """Why a trace-fitted plan serves what it serves without --max-context: the trace's longest
    request (prompt + output), or the model's limit when the trace goes past it."""
    if traced_tokens < arch.max_context_tokens:
        return (
            f"the trace's longest request, not {arch.name}'s limit {arch.max_context_tokens}: longer ones get "
            "HTTP 400; set --max-context to serve them"
        )
    return (
        f"{arch.name}'s context limit; the trace's longest request ({traced_tokens} tokens) is longer and "
        "would get HTTP 400"
    )


def people_rate(rate: float) -> str:
    """A request rate for people: 6.77, 10, 0.0333 (JSON keeps the exact value)."""
    if rate >= 1:
        return f"{rate:.2f}".rstrip("0").rstrip(".")
    return f"{rate:.3g}"


def _fit(path: Path) -> _Fitted:
    from kvscale.sim.fit import fit_trace
    from kvscale.sim.trace import TraceError, read_trace

    try:
        requests = read_trace(path)
    except TraceError as exc:
        fail(str(exc))
    if not requests:
        fail(f"--trace {path}: no requests to fit a workload from")
    return _Fitted(requests, fit_trace(requests))


def served_id(model: str) -> str | None:
    """The id the user typed, kept as what the engine loads (as the operator keeps
    spec.model.name): `-m meta-llama/Llama-3.1-8B-Instruct` serves the Instruct checkpoint, not
    the catalog's default one. None for a catalog name or an architecture file."""
    return None if model.endswith((".yaml", ".yml", ".json")) or "/" not in model else model


def _fp8_beside(
    cat: Catalog, request: PlanRequest, result: Plan, served: str | None, source: str | None
) -> dict[str, Any] | None:
    """What fp8 would cost when only 16-bit was asked for: the cheapest fp8 plan over every GPU
    type the plan may use (as --precision bf16,fp8 would let it compete), not only the chosen
    type (fp8 on another type can be the cheaper one); shown, never chosen. Only when one of
    those types has fp8 tensor cores (H100-class, Ada)."""
    chosen = result.chosen
    if chosen is None or chosen.precision not in ("bf16", "fp16") or len(request.precisions) != 1:
        return None
    allowed = request.gpus or tuple(cat.gpus)
    if source is not None or all(cat.gpu(g).flops_fp8_per_s is None for g in allowed):
        return None
    try:
        checkpoint = resolve_checkpoint(request.model, cat.precision("fp8"), requested_source(served, None, "fp8"))
    except CheckpointError:
        return None
    fp8 = replace(request, precisions=("fp8",))
    planned = chosen.prediction.cost_usd_per_hour
    if request.objective == "cost":  # only its chosen plan is shown: the rest is not ranked
        sized = cheapest(cat, fp8)
        if sized is None:
            return None
        config, replicas, cost = sized.config, sized.replicas, sized.cost_usd_per_hour
    else:
        other = plan(cat, fp8).chosen
        if other is None:
            return None
        config, replicas, cost = other.config, other.prediction.replicas, other.prediction.cost_usd_per_hour
    return {
        "gpu": config.gpu.name,
        "tensor_parallel": config.tensor_parallel,
        "replicas": replicas,
        "cost_usd_per_hour": round(cost, 4),
        "saving": round(1 - cost / planned, 3) if planned > 0 else 0.0,
        "checkpoint": checkpoint.source + (" quantized online" if checkpoint.online_fp8 else ""),
    }


def _fp8_versus(fp8: dict[str, Any], chosen: Feasible) -> str:
    """The fp8 plan against the chosen one: how much cheaper, and the chosen plan's GPU type
    when the fp8 plan's is another (the cheapest fp8 plan is over every allowed type)."""
    saving = fp8["saving"]
    said = f"{saving:.0%} cheaper" if saving >= 0.005 else (f"{-saving:.0%} dearer" if saving <= -0.005 else "")
    if fp8["gpu"] == chosen.gpu:
        return f", {said}" if said else ""
    return f", {said or 'the same cost'} than the {chosen.precision} plan on {chosen.gpu}"


def _with_checkpoints(
    cat: Catalog, arch: ModelArch, precisions: tuple[str, ...], served: str | None, source: str | None
) -> tuple[str, ...]:
    """The precisions a checkpoint exists for; exit 2 naming --source when none has one."""
    usable, errors = [], []
    for p in precisions:
        try:
            resolve_checkpoint(arch, cat.precision(p), requested_source(served, source, p), "--source")
        except CheckpointError as exc:
            errors.append(str(exc))
        else:
            usable.append(p)
    if not usable:
        fail("; ".join(errors))
    return tuple(usable)


def _launch(result: Plan, served: str | None, source: str | None) -> PlannedLaunch | None:
    """The chosen plan as the engine runs it: checkpoint, longest request served, command line."""
    c = result.chosen
    if c is None:
        return None
    r = result.request
    return plan_launch(
        c.config,
        requested_source(served, source, c.precision),
        r.workload.max_context_tokens,
        r.workload.context_tokens,
        c.prediction.max_batch,
        c.prediction.kv_cache_tokens,
        8000,
        cached=False,
        context_field="--max-context",
        source_field="--source",
    )


def _render_plan(
    result: Plan,
    args: list[str] | None,
    show: int,
    launch: PlannedLaunch | None,
    fp8: dict[str, Any] | None = None,
    gateway: GatewayAdvice | None = None,
    checked: list[str] | None = None,
    no_engine: str | None = None,
) -> None:
    """The plan as a table; `checked`: the simulated check's lines (printed under the plan);
    `no_engine`: why there is no engine command (said under the request's line)."""
    checked = checked or []
    r = result.request
    console.print(
        f"[bold]{r.model.name}[/]: {people_rate(r.workload.requests_per_s)} req/s, {r.workload.input_tokens} in / "
        f"{r.workload.output_tokens} out; p{r.slo.percentile:g} TTFT <= {r.slo.ttft_s * 1e3:g} ms, "
        f"TPOT <= {r.slo.tpot_s * 1e3:g} ms"
        + (f", p99 ITL <= {r.max_itl_s * 1e3:g} ms" if r.max_itl_s is not None else "")
        + f"; objective {r.objective}"
        + ("; behind a least-loaded gateway" if r.least_loaded else "")
        # a profile other than the default one is named: the figures are that engine's
        + (f"; engine profile {result.chosen.config.engine.profile}" if r.engine != "vllm" and result.chosen else "")
    )
    if no_engine is not None and result.chosen is not None:  # up front: not a surprise after the tables
        console.print(f"engine: {no_engine}", highlight=False, soft_wrap=True)
    c = result.chosen
    if c is not None:
        p = c.prediction
        head = "[bold green]Plan:[/]" if result.feasible else "[bold red]Closest fleet (infeasible):[/]"
        counted = (
            f" (simulated; the analytic model asked for {c.check.analytic_replicas})"
            if c.check is not None and c.check.replicas != c.check.analytic_replicas
            else ""
        )
        console.print(
            f"\n{head} {p.replicas} x {_shape(c)} ({c.precision}){counted}, max batch {p.max_batch}, "
            f"chunk budget {c.max_num_batched_tokens} tokens{' per rank' if c.data_parallel > 1 else ''}, "
            f"${p.cost_usd_per_hour:.2f}/h"
        )
        # Two sets of figures, each saying its rate: the requested load spread over the replicas
        # (what the SLO is met at), and the most one replica carries (what binds, MBU/MFU there).
        # The analytic figures are at the analytic count's share (a simulated check may size another).
        modelled = c.check.analytic_replicas if c.check is not None else p.replicas
        share = f"{people_rate(r.workload.requests_per_s / modelled)} req/s per replica"
        console.print(
            f"  predicted at this load ({share}"
            + (f" over the analytic {modelled}" if modelled != p.replicas else "")
            + "): "
            f"p{r.slo.percentile:g} TTFT {p.ttft_p_s * 1e3:.0f} ms, TPOT {p.tpot_p_s * 1e3:.1f} ms, "
            f"p99 ITL {p.itl_p99_s * 1e3:.0f} ms (longest step {p.itl_max_s * 1e3:.0f} ms); "
            f"at most {p.rate_per_replica_max:.2f} req/s per replica, limited by {p.limited_by} "
            f"(MBU {p.mbu:.0%}, MFU {p.mfu:.0%} there)"
        )
        if p.limited_why:
            console.print(f"  binds at {p.rate_per_replica_max:.2f} req/s per replica (the max): {p.limited_why}")
        console.print(f"  why: {c.reason}")
        if launch is not None:
            console.print(
                f"  serves requests up to {launch.context.max_model_len_tokens} tokens ({launch.context.reason}); "
                f"cold start {launch.cold_start.total_s:.0f}s with the download",
                highlight=False,
                soft_wrap=True,
            )
            note = substitution(launch.checkpoint)
            if note is not None:
                console.print(f"  checkpoint: {note}", highlight=False, soft_wrap=True)
        if args:
            # One line however wide the terminal: it is copied and pasted as a command.
            console.print(f"  engine: {' '.join(args)}", highlight=False, soft_wrap=True)
        if fp8 is not None:
            console.print(
                f"  fp8 beside it: {fp8['replicas']} x {fp8['tensor_parallel']} {fp8['gpu']} at "
                f"${fp8['cost_usd_per_hour']:.2f}/h{_fp8_versus(fp8, c)} ({fp8['checkpoint']}); not chosen: "
                "fp8 weights change the model's numerics; plan with --precision bf16,fp8 to let it compete",
                highlight=False,
                soft_wrap=True,
            )
        if gateway is not None:
            message = gateway.message("plan with --routing gateway and deploy behind an InferencePool")
            console.print(f"  gateway beside it: {message}", highlight=False, soft_wrap=True)
        for line in checked:
            console.print(f"  {line}", highlight=False, soft_wrap=True)
        if not result.feasible:
            console.print(
                "[bold red]Infeasible:[/] no fleet meets the SLO in the simulated check. It would be met with:"
            )
            for line in result.suggestions:
                console.print(f"  - {line}", highlight=False, soft_wrap=True)
    else:
        console.print("\n[bold red]No candidate meets the SLO.[/] Closest:")
        for line in result.suggestions:
            console.print(f"  - {line}")
    if result.alternatives:
        table = Table(title="Alternatives (ranked)")
        for col in ("candidate", "replicas", "batch", "TTFT ms", "TPOT ms", "ITL p99 ms", "$/h", "why it lost"):
            table.add_column(col)
        for alt in result.alternatives[:show]:
            d = candidate_to_dict(alt)
            table.add_row(
                alt.label,
                str(d.get("replicas", "")),
                str(d.get("max_batch", "")),
                fmt(d.get("ttft_ms")),
                fmt(d.get("tpot_ms")),
                fmt(d.get("itl_p99_ms")),
                fmt(d.get("cost_usd_per_hour"), 2),
                alt.reason,
            )
        if len(result.alternatives) > show:
            table.caption = f"{len(result.alternatives) - show} more; --json lists all"
        console.print(table)
    if result.rejected:
        table = Table(title="Rejected")
        table.add_column("candidate")
        table.add_column("reason")
        for label, reason in folded_rejections(result):
            table.add_row(label, reason)
        console.print(table)


def folded_rejections(result: Plan) -> list[tuple[str, str]]:
    """The rejected table's rows: candidates of one GPU type and precision refused for the same
    reason share a row (`T4 x1,2,4,8 bf16: T4 has no bfloat16 support`)."""
    groups: dict[tuple[str, int, str, str], list[Any]] = {}
    for rej in result.rejected:
        groups.setdefault((rej.gpu, rej.pipeline_parallel, rej.precision, rej.reason), []).append(rej)
    rows = []
    for (gpu, pp, precision, reason), members in groups.items():
        if len(members) == 1:
            rows.append((members[0].label, reason))
            continue
        # "2ep": tensor parallel 2 with expert parallelism (MoE), beside plain 2
        tps = ",".join(
            f"{m.data_parallel}dp" if m.data_parallel > 1 else f"{m.tensor_parallel}{'ep' if m.expert_parallel else ''}"
            for m in members
        )
        rows.append((f"{gpu} x{tps}{f'x{pp}pp' if pp > 1 else ''} {precision}", reason))
    return rows


def _shape(c: Feasible) -> str:
    """One replica's GPUs: "8 H100-SXM", "8 H100-SXM expert-parallel", or "16 H100-SXM
    over 2 nodes (TP 8 x PP 2)"."""
    if c.data_parallel > 1:
        return f"{c.config.gpus} {c.gpu} data-parallel attention (DP {c.data_parallel}, experts over all)"
    ep = ", expert parallel" if c.expert_parallel else ""
    if c.nodes > 1:
        return f"{c.config.gpus} {c.gpu} over {c.nodes} nodes (TP {c.tensor_parallel} x PP {c.pipeline_parallel}{ep})"
    return f"{c.tensor_parallel} {c.gpu}" + (" expert-parallel" if ep else "")


def _config(
    cat: Catalog, model: str, gpu: str, tp: int, precision: str | None, kv: str, engine: str = "vllm"
) -> ServingConfig:
    """`engine`: an engine (its profile follows the image the GPU type runs, as the planner's)
    or a release key."""
    arch = resolve_model(cat, model)
    precision = default_precision(precision, arch)
    (gpu,) = check_names(cat, (gpu,), (precision,), kv)
    tp_values(tp)
    spec = cat.gpu(gpu)
    cfg = ServingConfig.build(cat, arch, spec, precision, tp, kv, profile_on(cat, engine, spec).profile)
    reason = cfg.unsupported_reason()
    if reason:
        fail(reason)
    return cfg


@app.command()
def predict(
    gpu: Annotated[str, typer.Option(help="GPU type.")],
    batch: Annotated[int, typer.Option(help="Requests in the static batch.")],
    input_tokens: Annotated[int, typer.Option("--input", help="Prompt tokens per request.")],
    output_tokens: Annotated[int, typer.Option("--output", help="Generated tokens per request.")],
    model: OptionalModelOpt = None,
    tp: Annotated[int | None, typer.Option(help="Tensor-parallel degree (default 1).")] = None,
    precision: Annotated[
        str | None, typer.Option(help="Weight precision (default: the checkpoint's own, else bf16).")
    ] = None,
    kv_cache_precision: Annotated[str, typer.Option("--kv-cache-precision")] = "auto",
    engine: EngineOpt = None,
    engine_command: EngineCommandOpt = None,
    engine_version: EngineVersionOpt = None,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One static batch: prefilled together, then decoded together (with --engine-command: on
    the parallelism, precision, chunk budget and memory share that command sets on --gpu)."""
    cat = load(catalog)
    if engine_command is not None:
        command = parse_command(engine_command, gpu, tp, precision, engine_version, cat, engine)
        arch = resolve_model(cat, model) if model is not None else command_model(cat, command)
        cfg = command_config_or_fail(cat, command, gpu, arch).config
        tp = cfg.tensor_parallel
    elif model is None:
        fail("give --model (a catalog name, config.json or architecture file) or --engine-command")
    else:
        tp = 1 if tp is None else tp
        engine_name, _ = engine_selection(cat, engine, engine_version)
        cfg = _config(cat, model, gpu, tp, precision, kv_cache_precision, engine_name)
    positive(batch, "--batch", MAX_TOKENS)
    prediction = predict_batch(cfg, batch, tokens(input_tokens, "--input"), tokens(output_tokens, "--output"))
    data = prediction_to_dict(prediction, cfg.memory.weights_bytes, cfg.max_num_batched_tokens)
    data["engine_profile"] = cfg.engine.profile  # the catalog profile the step times came from
    if as_json:
        print_json(data)
    else:
        table = Table(
            title=f"{cfg.model.name} on {tp} x {cfg.gpu.name} ({cfg.precision.name}), batch {batch}, {input_tokens} in / {output_tokens} out"
        )
        table.add_column("quantity")
        table.add_column("value")
        for key, value in data.items():
            table.add_row(key, str(value))
        console.print(table)
    if not cfg.memory.fits:
        fail(
            f"{cfg.model.name} does not fit on {tp} x {cfg.gpu.name}: {cfg.memory.weights_bytes / GIB:.1f} GiB of weights per GPU "
            f"+ {cfg.memory.reserve_bytes / GIB:.1f} GiB reserve > {cfg.memory.usable_bytes / GIB:.1f} GiB usable; "
            "raise --tp or lower --precision",
            EXIT_INFEASIBLE,
        )


# The decode step's largest term (StepTime.limited_by) in the roofline table's words.
REGIME_WORDS = {
    "bandwidth": "bandwidth-bound",
    "compute": "compute-bound",
    "communication": "communication-bound",
    "overhead": "overhead-bound (the engine's per-step and per-sequence costs)",
}


def regimes(points: list[dict[str, Any]]) -> str:
    """Which term binds the decode step over the table's batches, each run of batches once
    ("bandwidth-bound at batch 1-64, compute-bound at 128, ..."): the header says what the rows
    say, attention, GEMM efficiency and the engine's costs included (B* counts the weights only)."""
    runs: list[tuple[str, int, int]] = []
    for p in points:
        if runs and runs[-1][0] == p["limited_by"]:
            runs[-1] = (runs[-1][0], runs[-1][1], p["batch"])
        else:
            runs.append((p["limited_by"], p["batch"], p["batch"]))
    return ", ".join(
        f"{REGIME_WORDS.get(term, term)} at batch {first}" + (f"-{last}" if last != first else "")
        for term, first, last in runs
    )


@app.command()
def roofline(
    model: ModelOpt,
    gpu: Annotated[str, typer.Option(help="GPU type.")],
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 1,
    precision: Annotated[
        str | None, typer.Option(help="Weight precision (default: the checkpoint's own, else bf16).")
    ] = None,
    input_tokens: Annotated[int, typer.Option("--input")] = 512,
    output_tokens: Annotated[int, typer.Option("--output")] = 256,
    png: Annotated[
        Path | None, typer.Option(help="Write the throughput-latency curve and roofline to this PNG (or .svg, .pdf).")
    ] = None,
    ttft: Annotated[
        str | None, typer.Option(help="TTFT target, e.g. 500ms: the picture marks batches whose prefill exceeds it.")
    ] = None,
    tpot: Annotated[str | None, typer.Option(help="TPOT target, e.g. 50ms: drawn on the picture.")] = None,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Throughput against latency over batch sizes, and where each sits on the roofline."""
    image_path(png)
    ttft_s = duration(ttft, "--ttft") if ttft is not None else None
    tpot_s = duration(tpot, "--tpot") if tpot is not None else None
    cat = load(catalog)
    cfg = _config(cat, model, gpu, tp, precision, "auto")
    curve = throughput_latency_curve(cfg, tokens(input_tokens, "--input"), tokens(output_tokens, "--output"))
    if not curve[0].fits:
        fail(
            f"{cfg.model.name} does not fit on {tp} x {cfg.gpu.name} at {cfg.precision.name}; raise --tp or lower --precision",
            EXIT_INFEASIBLE,
        )
    points = [prediction_to_dict(p, cfg.memory.weights_bytes) for p in curve]
    data: dict[str, Any] = {
        "model": cfg.model.name,
        "gpu": cfg.gpu.name,
        "tensor_parallel": tp,
        "precision": cfg.precision.name,
        "ops_per_byte": round(ops_per_byte(cfg), 2),
        "ideal_batch": round(ideal_batch(cfg), 1),
        "points": points,
    }
    if as_json:
        print_json(data)
    else:
        console.print(
            f"{cfg.gpu.name} {cfg.precision.name}: ops:byte {data['ops_per_byte']}, B* = {data['ideal_batch']} "
            "(the weights' roofline alone: above B* their matmuls outlast reading them)"
        )
        console.print(
            f"decode steps by batch, as 'limited by' below (attention, GEMM efficiency and the engine's costs "
            f"counted): {regimes(points)}"
        )
        table = Table(title=f"{cfg.model.name} on {tp} x {cfg.gpu.name}, {input_tokens} in / {output_tokens} out")
        for col in ("batch", "TTFT ms", "TPOT ms", "tokens/s", "limited by", "MBU", "MFU"):
            table.add_column(col)
        for p in points:
            table.add_row(
                str(p["batch"]),
                fmt(p["ttft_ms"]),
                fmt(p["tpot_ms"], 2),
                fmt(p["throughput_tokens_per_s"], 0),
                p["limited_by"],
                # the decode step's, as B* and "limited by" are (the JSON's mbu/mfu: the binding phase's)
                f"{p['decode_mbu']:.0%}",
                f"{p['decode_mfu']:.0%}",
            )
        console.print(table)
    if png is not None:
        from kvscale.cli.roofline_plot import draw_roofline

        write_picture(png, lambda: draw_roofline(cfg, curve, png, ttft_s, tpot_s))
        if not as_json:
            console.print(f"wrote {png}")
