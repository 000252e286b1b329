"""`kvscale bench`: open-loop load on a live OpenAI-compatible endpoint, the measured TTFT,
TPOT and inter-token gaps, and (with SLO options) the plan's predictions beside them."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.table import Table

from kvscale.cli.common import (
    EXIT_INFEASIBLE,
    ITL_HELP,
    CatalogOpt,
    JsonOpt,
    check_names,
    console,
    duration,
    fail,
    fmt,
    http_url,
    load,
    number,
    positive,
    print_json,
    split,
    tokens,
    tp_values,
)
from kvscale.cli.common import model as resolve_model
from kvscale.cli.common import slo as make_slo
from kvscale.cli.progress import StderrProgress
from kvscale.cli.root import app
from kvscale.sim.bench import Arrival, Measured, poisson_arrivals, summarize, trace_arrivals

MAX_RPS = 10_000.0  # one client process: beyond this the client, not the server, is measured
MAX_REQUESTS = 1_000_000


def _endpoint(url: str) -> str:
    """The base URL, checked by the parser calibrate's --prometheus shares (common.http_url:
    http(s) with a host and a valid port, exit 2 naming --endpoint), less a trailing /v1."""
    return http_url(url, "--endpoint", "http://127.0.0.1:8000").rstrip("/").removesuffix("/v1")


def _has_text(data: str) -> bool:
    try:
        event = json.loads(data)
    except ValueError:
        return False
    choices = event.get("choices") if isinstance(event, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    return bool(choices[0].get("text"))


async def _one(
    client: httpx.AsyncClient, url: str, model: str, arrival: Arrival, ignore_eos: bool, timeout_s: float
) -> Measured:
    body: dict[str, Any] = {
        "model": model,
        # about one token per word in the common tokenizers (" hello" is one token)
        "prompt": " ".join(["hello"] * arrival.input_tokens),
        "max_tokens": arrival.output_tokens,
        "stream": True,
        "temperature": 0.0,
    }
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's and SGLang's extension: generate all max_tokens
    out = Measured()
    sent = time.perf_counter()

    async def stream() -> None:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:200]
                out.error = f"HTTP {response.status_code}: {' '.join(text.split())}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter() - sent
                # a chunk with text is a token (vLLM streams one chunk per decode step);
                # one without (a usage chunk) is not
                if _has_text(data):
                    out.token_times_s.append(now)

    try:
        await asyncio.wait_for(stream(), timeout_s)
    except TimeoutError:
        out.error = f"timed out after {timeout_s:g}s"
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    return out


async def _run(
    url: str,
    model: str,
    arrivals: list[Arrival],
    ignore_eos: bool,
    timeout_s: float,
    progress: Callable[[int, int], None] | None = None,
) -> list[Measured]:
    """Each request at its arrival time whatever the others are doing (open loop), each
    bounded by `timeout_s`: the run ends by the last arrival plus the timeout. `progress`
    is told (requests sent, requests ended) at each send and each end."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    counts = [0, 0]  # sent, ended

    def ended(_: object) -> None:
        counts[1] += 1
        if progress is not None:
            progress(counts[0], counts[1])

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits, trust_env=False) as client:
        start = time.perf_counter()
        tasks = []
        for a in arrivals:
            delay = a.at_s - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)  # the schedule's pacing, not a wait on a condition
            task = asyncio.create_task(_one(client, url, model, a, ignore_eos, timeout_s))
            task.add_done_callback(ended)
            tasks.append(task)
            counts[0] += 1
            if progress is not None:
                progress(counts[0], counts[1])
        return list(await asyncio.gather(*tasks))


def _sent(url: str, model: str, arrivals: list[Arrival], ignore_eos: bool, timeout_s: float) -> list[Measured]:
    """The run with progress on stderr (kvscale.cli.progress: a bar on a terminal, a line every
    10 s otherwise, whatever --json says): requests sent and ended of the schedule's."""
    n = len(arrivals)
    with StderrProgress() as shown:

        def said(sent: int, done: int) -> None:
            shown.update("bench: requests ended", done, n, f"bench: {sent} of {n} requests sent, {done} ended")

        return asyncio.run(_run(url, model, arrivals, ignore_eos, timeout_s, said))


@app.command()
def bench(
    endpoint: Annotated[
        str, typer.Option(help="Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000.")
    ],
    model: Annotated[str, typer.Option("--model", "-m", help="Model name the server serves (and the plan's model).")],
    rps: Annotated[float | None, typer.Option(help="Poisson arrival rate, requests per second.")] = None,
    input_tokens: Annotated[int | None, typer.Option("--input", help="Prompt tokens per request.")] = None,
    output_tokens: Annotated[int | None, typer.Option("--output", help="Generated tokens per request.")] = None,
    trace: Annotated[
        Path | None, typer.Option(help="Azure CSV or Mooncake JSONL trace: send at its timestamps with its lengths.")
    ] = None,
    run_for: Annotated[str, typer.Option("--duration", help="How long to send requests (a trace: cut there).")] = "30s",
    seed: Annotated[int, typer.Option(help="Seed of the Poisson arrivals.")] = 0,
    request_timeout: Annotated[str, typer.Option("--timeout", help="Limit on each request.")] = "60s",
    ignore_eos: Annotated[
        bool, typer.Option("--ignore-eos/--no-ignore-eos", help="Ask for all --output tokens (vLLM, SGLang).")
    ] = True,
    ttft: Annotated[str | None, typer.Option(help="TTFT target at the percentile, e.g. 500ms (with --tpot).")] = None,
    tpot: Annotated[str | None, typer.Option(help="TPOT target at the percentile, e.g. 50ms (with --ttft).")] = None,
    percentile: Annotated[float, typer.Option(help="SLO percentile, in [50, 100).")] = 95.0,
    itl: Annotated[str | None, typer.Option(help=ITL_HELP)] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            help="GPU types the plan may use, comma-separated (default: all); with --tp, the endpoint's one GPU type."
        ),
    ] = None,
    tp: Annotated[
        int | None,
        typer.Option(
            help="The endpoint's tensor-parallel degree (with --gpu TYPE): predict for its configuration "
            "(--gpu, --tp, --precision, --replicas) instead of a fresh plan's."
        ),
    ] = None,
    replicas: Annotated[int | None, typer.Option(help="Replicas behind the endpoint, with --tp (default 1).")] = None,
    precision: Annotated[
        str | None,
        typer.Option(help="Weight precision the endpoint serves (default: the checkpoint's own, else bf16)."),
    ] = None,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Confirm a plan on the live endpoint: open-loop requests, measured TTFT/TPOT/ITL
    percentiles, and with --ttft/--tpot the predictions beside them: for the endpoint's own
    configuration when --gpu TYPE --tp N (--replicas, --precision) describe it, else for a fresh
    plan's (which may be another GPU count than the endpoint's; the output says which)."""
    base = _endpoint(endpoint)
    run_s = duration(run_for, "--duration")
    timeout_s = duration(request_timeout, "--timeout")
    if trace is None and (rps is None or input_tokens is None or output_tokens is None):
        fail("give --rps, --input and --output, or --trace FILE to send a trace's requests")
    if trace is not None and (rps is not None or input_tokens is not None or output_tokens is not None):
        fail("--trace sets the times and lengths: leave out --rps/--input/--output (or drop --trace)")
    if (ttft is None) != (tpot is None):
        fail("give --ttft and --tpot together (the SLO the plan is checked against), or neither")
    endpoint_config = _endpoint_config(tp, replicas, gpu, ttft is not None)
    if precision is not None and ttft is None:
        fail("--precision describes the configuration predicted for: give --ttft and --tpot with it")
    if trace is not None:
        from kvscale.cli.planning import _fit

        fitted = _fit(trace)
        arrivals = trace_arrivals(fitted.trace, run_s)
        workload = fitted.workload
    else:
        assert rps is not None and input_tokens is not None and output_tokens is not None
        from kvscale.sizing.workload import Workload

        number(rps, "--rps", low=0, high=MAX_RPS, what="requests per second", high_inclusive=True)
        if rps == 0:
            fail("--rps must be above 0")
        workload = Workload(tokens(input_tokens, "--input"), tokens(output_tokens, "--output"), rps, None)
        arrivals = poisson_arrivals(rps, run_s, input_tokens, output_tokens, seed)
    if len(arrivals) > MAX_REQUESTS:
        fail(f"--duration {run_for}: {len(arrivals):,} requests; at most {MAX_REQUESTS:,} in one run")
    slo_s = make_slo(ttft, tpot, percentile) if ttft is not None and tpot is not None else None
    max_itl_s = duration(itl, "--itl") if itl is not None else None
    predicted = (
        _predicted(load(catalog), model, workload, slo_s, max_itl_s, gpu, precision, endpoint_config)
        if slo_s is not None
        else None
    )
    results = _sent(base + "/v1/completions", model, arrivals, ignore_eos, timeout_s)
    if results and all(r.error is not None and not r.error.startswith(("HTTP", "timed")) for r in results):
        fail(f"--endpoint {endpoint}: cannot reach the server ({results[0].error})", EXIT_INFEASIBLE)
    out = summarize(
        results,
        slo_s.ttft_s if slo_s else None,
        slo_s.tpot_s if slo_s else None,
        slo_s.percentile if slo_s else None,
    )
    out["first_errors"] = sorted({r.error for r in results if r.error})[:5]
    if slo_s is not None:
        out["slo"] = {
            "percentile": slo_s.percentile,
            "ttft_ms": slo_s.ttft_s * 1e3,
            "tpot_ms": slo_s.tpot_s * 1e3,
            "itl_ms": None if max_itl_s is None else max_itl_s * 1e3,
        }
        out["plan"] = predicted
    if as_json:
        print_json(out)
    else:
        _render(out, endpoint, len(arrivals))


MAX_ENDPOINT_REPLICAS = 10_000


def _endpoint_config(tp: int | None, replicas: int | None, gpu: str | None, with_slo: bool) -> tuple[int, int] | None:
    """--tp and --replicas, checked: the endpoint's (tensor-parallel degree, replicas), or None
    when the endpoint is not described (the predictions are then a fresh plan's)."""
    if tp is None:
        if replicas is not None:
            fail("--replicas describes the endpoint: give its --gpu TYPE and --tp N with it")
        return None
    (degree,) = tp_values(tp)
    if replicas is not None:
        positive(replicas, "--replicas", MAX_ENDPOINT_REPLICAS)
    if not with_slo:
        fail(f"--tp {tp}: the endpoint's configuration is what the predictions are for; give --ttft and --tpot too")
    if gpu is None or len(split(gpu)) != 1:
        fail(f"--tp {tp}: name the endpoint's one GPU type with --gpu TYPE (e.g. --gpu L4 --tp {tp})")
    return degree, replicas or 1


def _predicted(
    cat: Any,
    model: str,
    workload: Any,
    slo: Any,
    max_itl_s: float | None,
    gpu: str | None,
    precision: str | None = None,
    endpoint: tuple[int, int] | None = None,
) -> dict[str, Any] | None:
    """The predictions beside the measurement. `endpoint` (tensor-parallel degree, replicas):
    for that configuration on the one --gpu type, at the load spread over those replicas (the
    batch limit and chunk budget the planner picks for it); None: the plan `kvscale plan` makes
    for this model, workload and SLO. None when no candidate meets the SLO."""
    from kvscale.cli.planning import _with_checkpoints, served_id
    from kvscale.planner.search import TENSOR_PARALLEL_DEGREES, PlanRequest, plan
    from kvscale.sizing.checkpoints import default_precision

    arch = resolve_model(cat, model)
    precisions = split(default_precision(precision, arch))
    if endpoint is not None and len(precisions) != 1:
        fail(f"--precision {precision}: the endpoint serves one precision; give one (e.g. --precision {precisions[0]})")
    precisions = _with_checkpoints(cat, arch, precisions, served_id(model), None)
    gpus = check_names(cat, split(gpu), precisions, "auto")
    degrees = (endpoint[0],) if endpoint is not None else TENSOR_PARALLEL_DEGREES
    request = PlanRequest(arch, workload, slo, gpus=gpus, precisions=precisions, max_itl_s=max_itl_s)
    result = plan(cat, replace(request, tensor_parallel=degrees))
    c = result.chosen
    if c is None:
        if endpoint is not None:
            why = result.rejected[0].reason if result.rejected else "no candidate"
            fail(
                f"--gpu {gpus[0]} --tp {endpoint[0]} ({precisions[0]}): no prediction for this configuration at "
                f"this SLO: {why}",
                EXIT_INFEASIBLE,
            )
        return None
    p = c.prediction
    out = {
        "for": "fresh plan" if endpoint is None else "endpoint",
        "gpu": c.gpu,
        "tensor_parallel": c.tensor_parallel,
        "precision": c.precision,
        "replicas": p.replicas,
        "max_batch": p.max_batch,
        "max_rps_per_replica": round(p.rate_per_replica_max, 3),
        "requests_per_s": round(workload.requests_per_s, 4),
        "ttft_ms": round(p.ttft_p_s * 1e3, 3),
        "tpot_ms": round(p.tpot_p_s * 1e3, 3),
        "itl_p99_ms": round(p.itl_p99_s * 1e3, 3),
    }
    if endpoint is None:
        return out
    # The endpoint's replicas, not the plan's count: the load spread over them.
    from kvscale.sizing.load import ReplicaModel

    replicas = endpoint[1]
    replica = ReplicaModel(c.config, workload)
    point = replica.at_rate(workload.requests_per_s / replicas, p.max_batch, slo.percentile)
    figures = (point.ttft_p_s, point.tpot_p_s, replica.itl_percentile_s(point))
    out.update(replicas=replicas, planned_replicas=p.replicas)
    for key, value in zip(("ttft_ms", "tpot_ms", "itl_p99_ms"), figures, strict=True):
        out[key] = round(value * 1e3, 3) if math.isfinite(value) else None
    return out


def _described(plan: dict[str, Any]) -> str:
    """Which configuration the predictions are for, e.g. `endpoint: 1 x TP1 L4 bf16`."""
    return f"{plan['for']}: {plan['replicas']} x TP{plan['tensor_parallel']} {plan['gpu']} {plan['precision']}"


def _render(out: dict[str, Any], endpoint: str, sent: int) -> None:
    console.print(f"[bold]{endpoint}[/]: {out['requests']} requests, {out['errors']} errors")
    plan = out.get("plan")
    slo = out.get("slo")
    pct = f"p{slo['percentile']:g}" if slo else None
    table = Table(title="Measured" + (" against the prediction" if plan else ""))
    table.add_column("quantity")
    table.add_column("measured ms")
    if slo:
        table.add_column(f"predicted ms ({_described(plan)})" if plan else "predicted")
        table.add_column("target ms")
    rows: list[tuple[str, Any, Any, Any]] = [
        ("TTFT p50", out["ttft_p50_ms"], None, None),
        ("TTFT p95", out["ttft_p95_ms"], None, None),
        ("TTFT p99", out["ttft_p99_ms"], None, None),
        ("TPOT p50", out["tpot_p50_ms"], None, None),
        ("TPOT p99", out["tpot_p99_ms"], None, None),
        ("ITL p99", out["itl_p99_ms"], plan and plan["itl_p99_ms"], slo and slo["itl_ms"]),
    ]
    if slo:  # the SLO's percentile beside the fixed ones, with the plan's prediction and the target
        tpot_row = (f"TPOT {pct} (SLO)", out["tpot_at_slo_percentile_ms"], plan and plan["tpot_ms"], slo["tpot_ms"])
        rows.insert(5, tpot_row)
        ttft_row = (f"TTFT {pct} (SLO)", out["ttft_at_slo_percentile_ms"], plan and plan["ttft_ms"], slo["ttft_ms"])
        rows.insert(3, ttft_row)
    predicted_rows = {"ITL p99", f"TTFT {pct} (SLO)", f"TPOT {pct} (SLO)"}
    for name, measured, pred, target in rows:
        # a predicted figure that is None: the load is beyond the replicas (the queue grows)
        said = "unbounded" if plan and pred is None and name in predicted_rows else fmt(pred)
        table.add_row(name, fmt(measured), *((said, fmt(target)) if slo else ()))
    console.print(table)
    if out["slo_attainment"] is not None:
        console.print(f"SLO attainment: {out['slo_attainment']:.1%} of {sent} requests met both targets")
    if slo and plan is None:
        console.print("No plan meets this SLO for this model and load: nothing to compare against.")
    if plan and plan["for"] == "fresh plan":
        console.print(
            f"The predictions are a fresh plan's ({plan['replicas']} x TP{plan['tensor_parallel']} {plan['gpu']} "
            f"{plan['precision']}), not necessarily the endpoint's configuration: give its --gpu TYPE --tp N "
            "(--replicas N, --precision P) to predict for it.",
            highlight=False,
        )
    elif plan and plan["replicas"] * plan["max_rps_per_replica"] < plan["requests_per_s"] * 0.999:
        console.print(
            f"The load is beyond what {plan['replicas']} replica(s) carry within the SLO (at most "
            f"{plan['max_rps_per_replica']:g} req/s each; the plan for it has {plan['planned_replicas']}).",
            highlight=False,
        )
    for e in out["first_errors"]:
        console.print(f"  error: {e}", highlight=False)
