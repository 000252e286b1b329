"""Every published figure the model addresses, within its stated tolerance."""

import pytest

from benchmarks.calibrate import NOT_FITTED, config
from benchmarks.data.published import FIGURES, bounds_hold
from benchmarks.reference import static_rows
from kvscale.sizing.batching import predict_batch
from kvscale.sizing.catalog import default_catalog


@pytest.mark.parametrize("figure", FIGURES, ids=[f.what for f in FIGURES])
def test_figure_within_tolerance(figure) -> None:  # type: ignore[no-untyped-def]
    predicted = figure.predicted()
    assert abs(predicted - figure.published) <= figure.tolerance * figure.published + 1e-12, (
        f"{figure.what}: predicted {predicted:.4g} vs published {figure.published:g} ({figure.source})"
    )


@pytest.mark.parametrize("claim", list(bounds_hold()))
def test_published_bound_holds(claim: str) -> None:
    assert bounds_hold()[claim], claim


def test_model_error_median_within_target() -> None:
    errors = sorted(abs(f.error()) for f in FIGURES if f.basis == "model")
    assert errors[len(errors) // 2] <= 0.15


def test_every_configuration_the_tensorrt_llm_table_ran_fits_that_engine_profile() -> None:
    # A row that ran is a configuration that fits: the tensorrt-llm profile (KV cache from
    # the memory left free after loading) must hold each batch's whole context.
    catalog = default_catalog()
    rows = static_rows()
    assert len(rows) == 2137
    refused = [r for r in rows if not predict_batch(config(catalog, r), r.batch, r.input_tokens, r.output_tokens).fits]
    assert refused == []


def test_calibrated_static_table_error_stays_within_the_reported_figures() -> None:
    # benchmarks/RESULTS.md reports the fit; this keeps the catalog from drifting away from it.
    catalog = default_catalog()
    errors = []
    for r in static_rows():
        if r.model in NOT_FITTED:
            continue
        p = predict_batch(config(catalog, r), r.batch, r.input_tokens, r.output_tokens)
        assert p.tpot_s is not None and p.ttft_s is not None
        errors.append((abs(p.ttft_s / r.ttft_s - 1), abs(p.tpot_s / r.tpot_s - 1)))
    ttft = sorted(e[0] for e in errors)
    tpot = sorted(e[1] for e in errors)
    assert ttft[len(ttft) // 2] <= 0.12 and tpot[len(tpot) // 2] <= 0.08
    assert tpot[int(0.9 * len(tpot))] <= 0.25
