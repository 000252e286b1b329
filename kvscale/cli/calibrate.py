"""`kvscale calibrate`: the engine profile's step-time fields fitted to what vLLM exports into a
Prometheus the user already scrapes it into, written as a catalog overlay for `plan --catalog`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvscale.cli.common import EXIT_INFEASIBLE, CatalogOpt, duration, fail, load
from kvscale.cli.root import app

if TYPE_CHECKING:
    from kvscale.sizing.config import ServingConfig


@app.command("calibrate")
def calibrate(
    prometheus: Annotated[str, typer.Option("--prometheus", help="Prometheus base URL, e.g. http://prometheus:9090.")],
    gpu: Annotated[str, typer.Option(help="GPU type the engines run on (vLLM's metrics do not say).")],
    model_name: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="Catalog model the engines serve (default: their model_name label, if it is one)."
        ),
    ] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree of each engine.")] = 1,
    precision: Annotated[str | None, typer.Option(help="Weight precision (default: the checkpoint's own).")] = None,
    engine: Annotated[str, typer.Option(help="Catalog engine profile to fit (vllm).")] = "vllm",
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Only series with this namespace label.")
    ] = None,
    selector: Annotated[
        str | None,
        typer.Option(help='More PromQL label matchers of the engines\' series, e.g. pod=~"llama-.*",job="vllm".'),
    ] = None,
    since: Annotated[str, typer.Option(help="How far back to read.")] = "1h",
    window: Annotated[str, typer.Option(help="Length of each window the fit sees (one point per engine).")] = "1m",
    out: Annotated[Path | None, typer.Option("--out", help="Write the catalog overlay here.")] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Fit the engine profile's GEMM share, per-sequence and per-step costs from the engines'
    own metrics; print each with its uncertainty and samples; write an overlay for `plan --catalog`."""
    import yaml

    from kvscale.calibration.fit import NotEnoughData, compare, fit, with_fields
    from kvscale.cli.common import check_names, http_url, tp_values
    from kvscale.cli.common import model as resolve_model
    from kvscale.metrics.calibration import SelectorError, matchers, read_windows
    from kvscale.metrics.client import PrometheusError
    from kvscale.metrics.engines import ENGINES
    from kvscale.sizing.checkpoints import default_precision
    from kvscale.sizing.config import ServingConfig

    prometheus = http_url(prometheus, "--prometheus", "http://prometheus:9090")
    if engine not in ENGINES or not ENGINES[engine].prefill_time_histogram:
        fail(f"--engine {engine}: calibration reads vLLM's metrics; use --engine vllm")
    since_s, window_s = duration(since, "--since"), duration(window, "--window")
    if window_s < 10 or window_s * 5 > since_s:
        fail(f"--window {window}: at least 10s, and --since ({since}) at least five windows long")
    tp_values(tp)
    try:
        where = matchers(namespace, selector)
    except SelectorError as exc:
        fail(str(exc))
    cat = load(catalog)
    (gpu,) = check_names(cat, (gpu,), (), "auto")  # the catalog name from here on (noted once if an alias)
    end_s = time.time()
    # The model first: without --model, the engines' model_name label names it.
    names = ENGINES[engine]
    try:
        reading = read_windows(prometheus, names, where, end_s - since_s, end_s, window_s)
    except PrometheusError as exc:
        fail(str(exc), EXIT_INFEASIBLE)
    if model_name is None:
        if len(reading.models) != 1:
            seen = ", ".join(sorted(reading.models)) or "none"
            fail(f"--model: give the model the engines serve (model_name labels found: {seen})")
        model_name = next(iter(reading.models))
    arch = resolve_model(cat, model_name)
    chosen = default_precision(precision, arch)
    check_names(cat, (gpu,), (chosen,), "auto")
    cfg = ServingConfig.build(cat, arch, cat.gpu(gpu), chosen, tp, "auto", engine)
    reason = cfg.unsupported_reason()
    if reason:
        fail(reason)
    found = reading.windows(float(cfg.memory.kv_capacity_tokens))
    try:
        result = fit(
            cfg,
            found,
            {
                "gap": names.itl_histogram[0],
                "prefill": names.prefill_time_histogram[0],
                "batch": names.running_gauge[0],
            },
        )
    except NotEnoughData as exc:
        fail(f"{exc} (read {len(found)} window(s) of {window} from {reading.engines} engine(s))", EXIT_INFEASIBLE)
    typer.echo(
        f"Calibrated {result.key} from {reading.engines} engine(s): {result.decode_windows} decode and "
        f"{result.prefill_windows} prefill windows of {window} over the last {since}"
    )
    for f in result.fields:
        bound = " (at its limit)" if f.at_bound else ""
        if f.at_prior_with:
            bound = f" (near the catalog's: the windows do not tell it apart from {f.at_prior_with})"
        typer.echo(
            f"  {f.name:<26} {f.value:.4g} ± {f.stderr:.2g}{bound}  (catalog {f.prior:.4g}; "
            f"{f.samples} samples in {f.windows} windows of {f.data})"
        )
    calibrated = with_fields(cfg, result.updates())
    kv = "vllm:cache_config_info" if reading.kv_from_engine else "the catalog's estimate"
    typer.echo(
        f"  step times against the windows: rms error {result.rms_error:.1%} calibrated, "
        f"{result.prior_rms_error:.1%} with the catalog's profile (KV cache size: {kv})"
    )
    for who, profile in (("calibrated", calibrated), ("catalog", cfg)):
        against = compare(profile, found)
        if against is not None:
            typer.echo(f"  {who}: {against.describe()}")
    typer.echo(
        f"  decode step at batch 1 / 32: {calibrated_ms(calibrated, 1)} / {calibrated_ms(calibrated, 32)} "
        f"(catalog {calibrated_ms(cfg, 1)} / {calibrated_ms(cfg, 32)})"
    )
    if out is not None:
        try:
            out.write_text(
                f"# kvscale calibrate --prometheus {prometheus}: for plans of {result.key}\n"
                + yaml.safe_dump(result.overlay(), sort_keys=False, allow_unicode=True)
            )
        except OSError as exc:
            fail(f"--out {out}: {exc}")
        typer.echo(f"Wrote {out}: use it with `kvscale plan --catalog {out}`")


def calibrated_ms(cfg: ServingConfig, batch: int) -> str:
    """A decode step over 1,024 tokens of context, in milliseconds."""
    from kvscale.sizing.roofline import decode_step

    return f"{decode_step(cfg, batch, 1024.0).seconds * 1e3:.2f} ms"
