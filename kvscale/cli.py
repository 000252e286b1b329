"""The `kvscale` command line: catalog, plan, predict, roofline."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from kvscale.sizing.batching import predict_batch, throughput_latency_curve
from kvscale.sizing.catalog import Catalog, CatalogError, ModelArch, load_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.engine_args import vllm_args
from kvscale.sizing.planner import DEFAULT_HEADROOM, TENSOR_PARALLEL_DEGREES, Plan, PlanRequest, plan
from kvscale.sizing.roofline import ideal_batch, ops_per_byte
from kvscale.sizing.serialize import candidate_to_dict, plan_to_dict, prediction_to_dict
from kvscale.sizing.units import GIB, UnitError, parse_duration_s
from kvscale.sizing.workload import Slo, Workload

app = typer.Typer(
    help="kvscale: size and autoscale LLM serving from first principles.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Wide enough for the plan and policy tables when output goes to a pipe or a file.
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 1

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON instead of a table.")]
CatalogOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--catalog", help="YAML file laid over the built-in catalog (extra GPUs, models, prices). Repeatable."
    ),
]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="Catalog name, alias (e.g. a Hugging Face id) or a YAML file with a custom architecture."
    ),
]


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _catalog(paths: list[Path] | None) -> Catalog:
    try:
        return load_catalog(*(paths or []))
    except CatalogError as exc:
        fail(str(exc))


def _model(catalog: Catalog, name: str) -> ModelArch:
    path = Path(name)
    if name.endswith((".yaml", ".yml")):
        if not path.is_file():
            fail(f"--model: file {name} does not exist")
        try:
            fields: Any = yaml.safe_load(path.read_text())
            if not isinstance(fields, dict):
                fail(f"--model {name}: expected a mapping of architecture fields (layers, hidden_size, heads, ...)")
            model_name = str(fields.pop("name", path.stem))
            return ModelArch.from_architecture(model_name, **fields)
        except (yaml.YAMLError, ValidationError, ValueError, TypeError) as exc:
            fail(f"--model {name}: invalid architecture: {exc}")
    try:
        return catalog.model(name)
    except CatalogError as exc:
        fail(f"--model: {exc}")


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


def _duration(value: str, option: str) -> float:
    try:
        return parse_duration_s(value, field=option)
    except UnitError as exc:
        fail(str(exc))


def _positive(value: int, option: str) -> int:
    if value < 1:
        fail(f"{option} must be a positive whole number, got {value}")
    return value


def _slo(ttft: str, tpot: str, percentile: float) -> Slo:
    if not 50 <= percentile < 100:
        fail(f"--percentile must be in [50, 100), got {percentile:g}")
    return Slo(_duration(ttft, "--ttft"), _duration(tpot, "--tpot"), percentile)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


@app.command()
def gpus(catalog: CatalogOpt = None, as_json: JsonOpt = False) -> None:
    """The GPU catalog: memory, bandwidth, peak FLOPS, link, price, efficiency factors."""
    cat = _catalog(catalog)
    rows = [g.model_dump() for g in cat.gpus.values()]
    if as_json:
        _print_json(rows)
        return
    table = Table(title="GPU catalog (dense peaks; efficiencies apart)")
    for col in (
        "GPU",
        "mem GiB",
        "HBM GB/s",
        "16-bit TFLOPS",
        "8-bit TFLOPS",
        "link",
        "$/GPU-h",
        "matmul eff",
        "bw eff",
        "node label",
    ):
        table.add_column(col)
    for g in cat.gpus.values():
        eight = g.flops_fp8_per_s or g.ops_int8_per_s
        suffix = "" if g.flops_fp8_per_s else " (int8)"
        table.add_row(
            g.name,
            f"{g.memory_gib:g}",
            f"{g.hbm_bandwidth_bytes_per_s / 1e9:.0f}",
            f"{g.flops_16bit_per_s / 1e12:.0f}",
            f"{(eight or 0) / 1e12:.0f}{suffix}",
            g.link,
            f"{g.price_usd_per_gpu_hour:.2f}",
            f"{g.matmul_efficiency:.2f}",
            f"{g.bandwidth_efficiency:.2f}",
            g.node_labels[0],
        )
    console.print(table)


@app.command()
def models(catalog: CatalogOpt = None, as_json: JsonOpt = False) -> None:
    """The model catalog: architecture, parameters, KV bytes per token."""
    cat = _catalog(catalog)
    if as_json:
        _print_json([m.model_dump() for m in cat.models.values()])
        return
    table = Table(title="Model catalog")
    for col in (
        "model",
        "layers",
        "hidden",
        "heads",
        "kv heads",
        "head dim",
        "FFN",
        "vocab",
        "params",
        "KV KiB/token (16-bit)",
    ):
        table.add_column(col)
    for m in cat.models.values():
        kv = 2 * m.layers * m.kv_heads * m.head_dim * 2 / 1024
        ffn = f"{m.intermediate_size} x{m.experts}, top-{m.active_experts}" if m.is_moe else str(m.intermediate_size)
        params = f"{m.params / 1e9:.2f}B" + (f" ({m.params_per_token / 1e9:.1f}B active)" if m.is_moe else "")
        table.add_row(
            m.name,
            str(m.layers),
            str(m.hidden_size),
            str(m.heads),
            str(m.kv_heads),
            str(m.head_dim),
            ffn,
            str(m.vocab_size),
            params,
            f"{kv:.0f}",
        )
    console.print(table)


def _tp_values(tp: int | None) -> tuple[int, ...]:
    if tp is None:
        return TENSOR_PARALLEL_DEGREES
    if tp not in TENSOR_PARALLEL_DEGREES:
        fail(f"--tp must be one of {', '.join(map(str, TENSOR_PARALLEL_DEGREES))}, got {tp}")
    return (tp,)


def _check_names(cat: Catalog, gpus: tuple[str, ...], precisions: tuple[str, ...], kv: str) -> tuple[str, ...]:
    try:
        resolved = tuple(cat.gpu(g).name for g in gpus)
        for p in precisions:
            cat.precision(p)
        cat.kv_precision(kv)
    except CatalogError as exc:
        fail(str(exc))
    return resolved


@app.command("plan")
def plan_cmd(
    model: ModelOpt,
    ttft: Annotated[str, typer.Option(help="Time-to-first-token target at the percentile, e.g. 500ms.")],
    tpot: Annotated[str, typer.Option(help="Time-per-output-token target at the percentile, e.g. 50ms.")],
    rps: Annotated[float, typer.Option(help="Expected requests per second.")],
    input_tokens: Annotated[int, typer.Option("--input", help="Typical prompt tokens.")],
    output_tokens: Annotated[int, typer.Option("--output", help="Typical generated tokens.")],
    percentile: Annotated[float, typer.Option(help="SLO percentile, in [50, 100).")] = 95.0,
    max_context: Annotated[
        int | None, typer.Option("--max-context", help="Longest context the engine must accept (--max-model-len).")
    ] = None,
    gpu: Annotated[str | None, typer.Option(help="Allowed GPU types, comma-separated (default: all).")] = None,
    tp: Annotated[int | None, typer.Option(help="Pin the tensor-parallel degree (1, 2, 4, 8).")] = None,
    precision: Annotated[
        str, typer.Option(help="Allowed weight precisions, comma-separated: bf16, fp16, fp8, int8, int4.")
    ] = "bf16",
    kv_cache_precision: Annotated[str, typer.Option("--kv-cache-precision", help="auto, fp16 or fp8.")] = "auto",
    objective: Annotated[str, typer.Option(help="cost (cheapest meeting the SLO) or latency (fastest).")] = "cost",
    headroom: Annotated[float, typer.Option(help="Spare capacity kept per replica, as a fraction.")] = DEFAULT_HEADROOM,
    max_replicas: Annotated[
        int | None, typer.Option("--max-replicas", help="Reject plans needing more replicas.")
    ] = None,
    show: Annotated[int, typer.Option(help="Alternatives to list in the table.")] = 8,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The cheapest (or fastest) GPU x TP x precision x batch limit that meets the SLO."""
    cat = _catalog(catalog)
    arch = _model(cat, model)
    if objective not in ("cost", "latency"):
        fail(f"--objective must be cost or latency, got {objective!r}")
    if not 0 <= headroom < 10:
        fail(f"--headroom is a fraction of capacity in [0, 10), got {headroom}")
    if rps < 0:
        fail(f"--rps cannot be negative, got {rps}")
    precisions = _split(precision)
    if not precisions:
        fail("--precision: give at least one of bf16, fp16, fp8, int8, int4")
    gpus = _check_names(cat, _split(gpu), precisions, kv_cache_precision)
    try:
        workload = Workload(_positive(input_tokens, "--input"), _positive(output_tokens, "--output"), rps, max_context)
        slo = _slo(ttft, tpot, percentile)
    except ValueError as exc:
        fail(str(exc))
    request = PlanRequest(
        model=arch,
        workload=workload,
        slo=slo,
        gpus=gpus,
        tensor_parallel=_tp_values(tp),
        precisions=precisions,
        kv_cache_precision=kv_cache_precision,
        objective=objective,  # type: ignore[arg-type]
        headroom=headroom,
        max_replicas=max_replicas,
    )
    result = plan(cat, request)
    args = _engine_args(cat, result)
    if as_json:
        _print_json(plan_to_dict(result, args))
    else:
        _render_plan(result, args, show)
    if not result.feasible:
        raise typer.Exit(EXIT_INFEASIBLE)


def _engine_args(cat: Catalog, result: Plan) -> list[str] | None:
    c = result.chosen
    if c is None or c.prediction is None:
        return None
    r = result.request
    cfg = ServingConfig.build(cat, r.model, cat.gpu(c.gpu), c.precision, c.tensor_parallel, c.kv_cache_precision)
    return vllm_args(cfg, c.prediction.max_batch, r.workload.engine_max_context_tokens)


def _render_plan(result: Plan, args: list[str] | None, show: int) -> None:
    r = result.request
    console.print(
        f"[bold]{r.model.name}[/]: {r.workload.requests_per_s:g} req/s, {r.workload.input_tokens} in / "
        f"{r.workload.output_tokens} out; p{r.slo.percentile:g} TTFT <= {r.slo.ttft_s * 1e3:g} ms, "
        f"TPOT <= {r.slo.tpot_s * 1e3:g} ms; objective {r.objective}"
    )
    c = result.chosen
    if c is not None and c.prediction is not None:
        p = c.prediction
        console.print(
            f"\n[bold green]Plan:[/] {p.replicas} x {c.tensor_parallel} {c.gpu} ({c.precision}), max batch {p.max_batch}, "
            f"${p.cost_usd_per_hour:.2f}/h"
        )
        console.print(
            f"  predicted p{r.slo.percentile:g} TTFT {p.ttft_p_s * 1e3:.0f} ms, TPOT {p.tpot_p_s * 1e3:.1f} ms at this load; "
            f"{p.rate_per_replica_max:.2f} req/s per replica max; limited by {p.limited_by}; MBU {p.mbu:.0%}, MFU {p.mfu:.0%}"
        )
        console.print(f"  why: {c.reason}")
        if args:
            console.print(f"  engine: vllm serve {r.model.hf_id} {' '.join(args)}", highlight=False)
    else:
        console.print("\n[bold red]No candidate meets the SLO.[/] Closest:")
        for line in result.suggestions:
            console.print(f"  - {line}")
    if result.alternatives:
        table = Table(title="Alternatives (ranked)")
        for col in ("candidate", "replicas", "batch", "TTFT ms", "TPOT ms", "$/h", "why it lost"):
            table.add_column(col)
        for alt in result.alternatives[:show]:
            d = candidate_to_dict(alt)
            table.add_row(
                alt.label,
                str(d.get("replicas", "")),
                str(d.get("max_batch", "")),
                _fmt(d.get("ttft_ms")),
                _fmt(d.get("tpot_ms")),
                _fmt(d.get("cost_usd_per_hour"), 2),
                alt.reason,
            )
        if len(result.alternatives) > show:
            table.caption = f"{len(result.alternatives) - show} more; --json lists all"
        console.print(table)
    if result.rejected:
        table = Table(title="Rejected")
        table.add_column("candidate")
        table.add_column("reason")
        for rej in result.rejected:
            table.add_row(rej.label, rej.reason)
        console.print(table)


def _fmt(value: Any, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _config(cat: Catalog, model: str, gpu: str, tp: int, precision: str, kv: str) -> ServingConfig:
    arch = _model(cat, model)
    _check_names(cat, (gpu,), (precision,), kv)
    _tp_values(tp)
    cfg = ServingConfig.build(cat, arch, cat.gpu(gpu), precision, tp, kv)
    reason = cfg.unsupported_reason()
    if reason:
        fail(reason)
    return cfg


@app.command()
def predict(
    model: ModelOpt,
    gpu: Annotated[str, typer.Option(help="GPU type.")],
    batch: Annotated[int, typer.Option(help="Requests in the static batch.")],
    input_tokens: Annotated[int, typer.Option("--input", help="Prompt tokens per request.")],
    output_tokens: Annotated[int, typer.Option("--output", help="Generated tokens per request.")],
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 1,
    precision: Annotated[str, typer.Option(help="Weight precision.")] = "bf16",
    kv_cache_precision: Annotated[str, typer.Option("--kv-cache-precision")] = "auto",
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One static batch: prefilled together, then decoded together."""
    cat = _catalog(catalog)
    cfg = _config(cat, model, gpu, tp, precision, kv_cache_precision)
    _positive(batch, "--batch")
    prediction = predict_batch(cfg, batch, _positive(input_tokens, "--input"), _positive(output_tokens, "--output"))
    data = prediction_to_dict(prediction, cfg.memory.weights_bytes)
    if as_json:
        _print_json(data)
    else:
        table = Table(
            title=f"{cfg.model.name} on {tp} x {cfg.gpu.name} ({precision}), batch {batch}, {input_tokens} in / {output_tokens} out"
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


@app.command()
def roofline(
    model: ModelOpt,
    gpu: Annotated[str, typer.Option(help="GPU type.")],
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 1,
    precision: Annotated[str, typer.Option(help="Weight precision.")] = "bf16",
    input_tokens: Annotated[int, typer.Option("--input")] = 512,
    output_tokens: Annotated[int, typer.Option("--output")] = 256,
    png: Annotated[
        Path | None, typer.Option(help="Write the throughput-latency curve and roofline to this PNG.")
    ] = None,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Throughput against latency over batch sizes, and where each sits on the roofline."""
    cat = _catalog(catalog)
    cfg = _config(cat, model, gpu, tp, precision, "auto")
    curve = throughput_latency_curve(cfg, _positive(input_tokens, "--input"), _positive(output_tokens, "--output"))
    if not curve[0].fits:
        fail(
            f"{cfg.model.name} does not fit on {tp} x {cfg.gpu.name} at {precision}; raise --tp or lower --precision",
            EXIT_INFEASIBLE,
        )
    data = {
        "model": cfg.model.name,
        "gpu": cfg.gpu.name,
        "tensor_parallel": tp,
        "precision": precision,
        "ops_per_byte": round(ops_per_byte(cfg), 2),
        "ideal_batch": round(ideal_batch(cfg), 1),
        "points": [prediction_to_dict(p, cfg.memory.weights_bytes) for p in curve],
    }
    if png is not None:
        from kvscale.sizing_plots import draw_roofline

        draw_roofline(cfg, curve, png)
    if as_json:
        _print_json(data)
        return
    console.print(
        f"{cfg.gpu.name} {precision}: ops:byte {data['ops_per_byte']}, B* = {data['ideal_batch']} "
        "(decode is bandwidth-bound below B*, compute-bound above)"
    )
    table = Table(title=f"{cfg.model.name} on {tp} x {cfg.gpu.name}, {input_tokens} in / {output_tokens} out")
    for col in ("batch", "TTFT ms", "TPOT ms", "tokens/s", "limited by", "MBU", "MFU"):
        table.add_column(col)
    for p in data["points"]:  # type: ignore[attr-defined]
        table.add_row(
            str(p["batch"]),
            _fmt(p["ttft_ms"]),
            _fmt(p["tpot_ms"], 2),
            _fmt(p["throughput_tokens_per_s"], 0),
            p["limited_by"],
            f"{p['mbu']:.0%}",
            f"{p['mfu']:.0%}",
        )
    console.print(table)
    if png is not None:
        console.print(f"wrote {png}")


@app.command()
def simulate(
    model: ModelOpt,
    ttft: Annotated[str, typer.Option(help="Time-to-first-token target, e.g. 1s.")],
    tpot: Annotated[str, typer.Option(help="Time-per-output-token target, e.g. 50ms.")],
    trace: Annotated[Path | None, typer.Option(help="Azure CSV or Mooncake JSONL trace to replay (open loop).")] = None,
    concurrency: Annotated[
        int | None, typer.Option(help="Closed loop: this many users, each sending again on completion.")
    ] = None,
    input_tokens: Annotated[int | None, typer.Option("--input", help="Closed loop: prompt tokens per request.")] = None,
    output_tokens: Annotated[
        int | None, typer.Option("--output", help="Closed loop: generated tokens per request.")
    ] = None,
    duration: Annotated[str | None, typer.Option(help="Closed loop: how long users keep sending, e.g. 10m.")] = None,
    percentile: Annotated[float, typer.Option(help="SLO percentile.")] = 95.0,
    policy: Annotated[str, typer.Option(help="kvscale, static, hpa, keda, saturation, oracle, or all.")] = "all",
    replicas: Annotated[
        int | None, typer.Option(help="Replicas of the static policy (default: peak provisioning).")
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
    precision: Annotated[str, typer.Option(help="Allowed weight precisions.")] = "bf16",
    headroom: Annotated[float, typer.Option(help="Spare capacity per replica, as a fraction.")] = DEFAULT_HEADROOM,
    seed: Annotated[int, typer.Option(help="Seed for --rate-scale sampling.")] = 0,
    png: Annotated[Path | None, typer.Option(help="Draw load, replicas and latency against time here.")] = None,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay a trace (or a closed loop) through a simulated fleet under each autoscaling policy."""
    from kvscale.sim.compare import POLICY_NAMES
    from kvscale.sim.session import Load, SimulationError, setup_from_plan
    from kvscale.sim.trace import TraceError, duration_s, read_trace
    from kvscale.sim.trace import rate_scale as scale_rate
    from kvscale.sim.trace import time_scale as scale_time

    cat = _catalog(catalog)
    arch = _model(cat, model)
    names = POLICY_NAMES if policy == "all" else _split(policy)
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        fail(f"--policy: unknown {', '.join(unknown) or 'empty'}; choose from {', '.join(POLICY_NAMES)} or all")
    closed_args = (concurrency, input_tokens, output_tokens, duration)
    if (trace is None) == all(a is None for a in closed_args):
        fail("give either --trace FILE, or --concurrency N --input N --output N --duration D for a closed loop")
    if trace is not None:
        try:
            requests = scale_time(scale_rate(read_trace(trace), rate_scale, seed), time_scale)
        except TraceError as exc:
            fail(str(exc))
        load = Load(trace=requests)
        span = max(duration_s(requests), 1.0)
        workload = Workload(
            max(1, round(sum(r.input_tokens for r in requests) / len(requests))),
            max(1, round(sum(r.output_tokens for r in requests) / len(requests))),
            len(requests) / span,
        )
    else:
        if any(a is None for a in closed_args):
            fail("a closed loop needs all of --concurrency, --input, --output and --duration")
        assert (
            concurrency is not None and input_tokens is not None and output_tokens is not None and duration is not None
        )
        users = _positive(concurrency, "--concurrency")
        seconds = _duration(duration, "--duration")
        load = Load(closed=(users, _positive(input_tokens, "--input"), _positive(output_tokens, "--output"), seconds))
        workload = Workload(input_tokens, output_tokens, 0.0)
    slo = _slo(ttft, tpot, percentile)
    gpus = _check_names(cat, _split(gpu), _split(precision), "auto")
    request = PlanRequest(
        model=arch,
        workload=workload,
        slo=slo,
        gpus=gpus,
        tensor_parallel=_tp_values(tp),
        precisions=_split(precision),
        headroom=headroom,
    )
    cold_start_s = _duration(cold_start, "--cold-start") if cold_start else None
    try:
        setup = setup_from_plan(cat, plan(cat, request), cold_start_s, replicas)
        results, rows = _run_with_progress(setup, load, names, headroom, replicas, max_replicas, show=not as_json)
    except SimulationError as exc:
        fail(str(exc), EXIT_INFEASIBLE)
    if png is not None:
        from kvscale.sim.plots import draw_timeline

        draw_timeline(results, slo, png, f"{arch.name} on {setup.cfg.tensor_parallel} x {setup.cfg.gpu.name}")
    if as_json:
        _print_json(rows)
        return
    console.print(
        f"{arch.name} on {setup.cfg.tensor_parallel} x {setup.cfg.gpu.name} ({setup.cfg.precision.name}), "
        f"max batch {setup.max_batch}, cold start {setup.cold_start_s:.0f}s; SLO p{percentile:g} TTFT <= "
        f"{slo.ttft_s * 1e3:g} ms, TPOT <= {slo.tpot_s * 1e3:g} ms"
    )
    table = Table(title="Policies on the same arrivals")
    for col in (
        "policy",
        "requests",
        "SLO met",
        "TTFT p50/p95 ms",
        "TPOT p50/p95 ms",
        "GPU-h",
        "vs oracle",
        "cost $",
        "scale events",
    ):
        table.add_column(col)
    for row in rows:
        table.add_row(
            row["policy"],
            str(row["requests"]),
            f"{row['slo_attainment']:.2%}",
            f"{_fmt(row['ttft_p50_ms'], 0)} / {_fmt(row['ttft_p95_ms'], 0)}",
            f"{_fmt(row['tpot_p50_ms'])} / {_fmt(row['tpot_p95_ms'])}",
            f"{row['gpu_hours']:.2f}",
            _fmt(row.get("gpu_hours_vs_oracle"), 2),
            f"{row['cost_usd']:.2f}",
            str(row["scale_events"]),
        )
    console.print(table)
    if png is not None:
        console.print(f"wrote {png}")


def _run_with_progress(
    setup: Any, load: Any, names: tuple[str, ...], headroom: float, replicas: int | None, max_replicas: int, show: bool
) -> tuple[list[Any], list[dict[str, Any]]]:
    from rich.progress import Progress

    from kvscale.sim.session import run_policies
    from kvscale.sim.trace import duration_s

    total = duration_s(load.trace) if load.trace is not None else load.closed[3]
    if not show or not err.is_terminal:
        return run_policies(setup, load, names, headroom, replicas, max_replicas)
    with Progress(console=err, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def tick(name: str, now_s: float) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(f"simulating {name}", total=total)
            bar.update(tasks[name], completed=min(now_s, total))

        return run_policies(setup, load, names, headroom, replicas, max_replicas, tick)


sim_app = typer.Typer(help="Simulator tools.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")


@sim_app.command("serve")
def sim_serve(
    name: Annotated[str, typer.Option(help="InferenceService to play the engine for.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    port: Annotated[int, typer.Option(help="Port of the /metrics endpoint (on 127.0.0.1).")] = 9400,
    load: Annotated[
        str, typer.Option(help="constant:R, ramp:R0:R1:SECONDS, steps:R0@T0,R1@T1,... or trace:FILE")
    ] = "constant:1",
    cold_start: Annotated[str, typer.Option("--cold-start", help="Time before a new pod serves.")] = "30s",
    seed: Annotated[int, typer.Option(help="Seed of the arrival process.")] = 0,
    duration: Annotated[str | None, typer.Option(help="Stop after this long (default: run until killed).")] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Serve vLLM-named metrics for every Running pod of an InferenceService, from the simulator."""
    from kvscale.sim.load_profile import ProfileError, parse_profile

    try:
        parse_profile(load, 1, 1)
    except ProfileError as exc:
        fail(str(exc))
    from kvscale.standin.kubernetes_loop import serve

    serve(
        _catalog(catalog),
        namespace,
        name,
        port,
        load,
        _duration(cold_start, "--cold-start"),
        seed,
        _duration(duration, "--duration") if duration else None,
    )


@app.command()
def crd() -> None:
    """The InferenceService CustomResourceDefinition, generated from kvscale/api."""
    from kvscale.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())


@app.command()
def operator(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Watch only these namespaces (repeatable); default all."),
    ] = None,
    liveness: Annotated[
        str | None, typer.Option(help="Serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz.")
    ] = None,
) -> None:
    """Run the operator against the cluster of the current kubeconfig (or in-cluster config)."""
    from kvscale.operator.settings import SettingsError

    try:
        from kvscale.operator.run import run_operator

        run_operator(tuple(namespace or ()), liveness)
    except SettingsError as exc:
        fail(str(exc))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
