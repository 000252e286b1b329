"""`kvscale sim serve`: the stand-in engine's metrics for an InferenceService's pods."""

from __future__ import annotations

from typing import Annotated

import typer

from kvscale.cli.common import EXIT_INFEASIBLE, CatalogOpt, duration, fail, load, positive_number
from kvscale.cli.root import sim_app


@sim_app.command("serve")
def sim_serve(
    name: Annotated[str, typer.Option(help="InferenceService to play the engine for.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    port: Annotated[int, typer.Option(help="Port of the /metrics endpoint (on 127.0.0.1).")] = 9400,
    load_profile: Annotated[
        str,
        typer.Option(
            "--load",
            help="The load, as `kvscale simulate --load`: constant:R, ramp:R0:R1:SECONDS, steps:R0@T0,R1@T1,... "
            "or trace:FILE (append ;lengths:IN/OUT@T,... to change prompt/output lengths over time, ;bursts:N@T,... "
            "to send requests N at a time at the same mean rate), or a "
            "generated KIND:key=value,... (poisson, bursty, diurnal, step, flash, batches, drift; played until its "
            "duration ends), with the service's workload lengths as defaults",
        ),
    ] = "constant:1",
    cold_start: Annotated[str, typer.Option("--cold-start", help="Time before a new pod serves.")] = "30s",
    seed: Annotated[int, typer.Option(help="Seed of the arrival process.")] = 0,
    run_for: Annotated[
        str | None, typer.Option("--duration", help="Stop after this long (default: run until killed).")
    ] = None,
    catalog: CatalogOpt = None,
    speed: Annotated[
        float,
        typer.Option(
            help="Simulated seconds per wall-clock second: the engines' clock, so ten minutes of --load play in "
            "one at 10 (the load's times and the cold start are simulated; rates read from the metrics are "
            "this many times the load's, ratios such as a mean gap are not).",
        ),
    ] = 1.0,
) -> None:
    """Serve vLLM-named metrics for every Running pod of an InferenceService, from the simulator."""
    from kvscale.sim.generators import LoadError
    from kvscale.sim.load_profile import load_arrivals

    if not 1 <= port <= 65535:
        fail(f"--port must be in [1, 65535], got {port}")
    try:
        load_arrivals(load_profile, 1, 1, seed)
    except LoadError as exc:
        fail(str(exc))
    positive_number(speed, "--speed", high=100.0, what="simulated seconds per second")
    cold_start_s = duration(cold_start, "--cold-start")
    stop_after_s = duration(run_for, "--duration") if run_for is not None else None
    cat = load(catalog)
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError as TransportError

    from kvscale.standin.serve import serve

    try:
        serve(cat, namespace, name, port, load_profile, cold_start_s, seed, stop_after_s, speed)
    except ConfigException as exc:
        fail(f"no cluster to talk to (kubeconfig or in-cluster config): {exc}")
    except ApiException as exc:
        if exc.status == 404:
            fail(
                f"--name: InferenceService {namespace}/{name} not found; list them with "
                f"`kubectl get kvis -n {namespace}` (or pass --namespace)"
            )
        if exc.status in (401, 403):
            fail(f"--name: not allowed to read InferenceService {namespace}/{name}: {exc.reason}")
        raise
    except TransportError as exc:
        fail(f"cannot reach the cluster's API server (kubeconfig or in-cluster config): {exc}", EXIT_INFEASIBLE)
    except OSError as exc:
        fail(f"--port {port}: cannot serve metrics there: {exc}")


@sim_app.command("serve-openai")
def sim_serve_openai(
    model: Annotated[str, typer.Option("--model", "-m", help="Catalog model whose timing is served.")],
    gpu: Annotated[str, typer.Option(help="GPU type of the modelled replica.")],
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 1,
    precision: Annotated[str | None, typer.Option(help="Weight precision (default: the checkpoint's own).")] = None,
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 8000,
    run_for: Annotated[
        str | None, typer.Option("--duration", help="Stop after this long (default: run until killed).")
    ] = None,
    catalog: CatalogOpt = None,
) -> None:
    """An OpenAI-compatible /v1/completions endpoint (streaming) whose token timing is the
    sizing model's prefill and decode step times: a stand-in to try `kvscale bench` on."""
    import asyncio

    from kvscale.cli.common import check_names, tp_values
    from kvscale.cli.common import model as resolve_model
    from kvscale.sizing.checkpoints import default_precision
    from kvscale.sizing.config import ServingConfig
    from kvscale.standin.openai import ModelledEngine, start

    if not 1 <= port <= 65535:
        fail(f"--port must be in [1, 65535], got {port}")
    stop_after_s = duration(run_for, "--duration") if run_for is not None else None
    cat = load(catalog)
    arch = resolve_model(cat, model)
    chosen = default_precision(precision, arch)
    check_names(cat, (gpu,), (chosen,), "auto")
    tp_values(tp)
    cfg = ServingConfig.build(cat, arch, cat.gpu(gpu), chosen, tp, "auto")
    reason = cfg.unsupported_reason()
    if reason:
        fail(reason)
    engine = ModelledEngine(cfg, model)

    async def main() -> None:
        server = await start(engine, "127.0.0.1", port)
        typer.echo(
            f"kvscale sim serve-openai: {model} on {tp} x {cfg.gpu.name} ({chosen}) at http://127.0.0.1:{port}/v1/completions",
            err=True,
        )
        async with server:
            if stop_after_s is None:
                await server.serve_forever()
            else:
                await asyncio.sleep(stop_after_s)  # the requested run time

    try:
        asyncio.run(main())
    except OSError as exc:
        fail(f"--port {port}: cannot listen there: {exc}")
