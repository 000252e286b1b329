"""Every published figure the model addresses, within its stated tolerance."""

import pytest

from benchmarks.data.published import FIGURES, bounds_hold


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
