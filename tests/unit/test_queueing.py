"""Queueing formulas against textbook values."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscale.sizing.queueing import (
    erlang_b_blocking,
    erlang_c,
    md1_wait_percentile_s,
    mmc_wait_percentile_s,
    replicas_for_rate,
)


def _erlang_b_reference(c: int, a: float) -> float:
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def test_erlang_c_textbook_values() -> None:
    # M/M/1: P(wait) = rho
    assert erlang_c(1, 0.7) == pytest.approx(0.7)
    # c = 2, a = 1: C = 1/3
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(10, 10.0) == 1.0
    assert erlang_c(10, 0.0) == 0.0


@given(st.integers(min_value=1, max_value=1500), st.floats(min_value=0.01, max_value=0.999))
def test_warm_started_erlang_b_matches_full_recursion(servers: int, utilization: float) -> None:
    a = servers * utilization
    assert erlang_b_blocking(servers, a) == pytest.approx(_erlang_b_reference(servers, a), rel=1e-8, abs=1e-12)


def test_mm1_wait_percentile_by_hand() -> None:
    # M/M/1 with lambda 0.8, mean service 1: P(W > t) = 0.8 exp(-0.2 t)
    expected = math.log(0.8 / 0.05) / 0.2
    assert mmc_wait_percentile_s(1, 0.8, 1.0, 95) == pytest.approx(expected)
    assert mmc_wait_percentile_s(1, 0.01, 1.0, 95) == 0.0
    assert mmc_wait_percentile_s(1, 1.0, 1.0, 95) == math.inf


def test_md1_wait_percentile() -> None:
    assert md1_wait_percentile_s(0.5, 1.0, 95) == pytest.approx(math.log(0.5 / 0.05) / (2 * 0.5))
    assert md1_wait_percentile_s(0.01, 1.0, 95) == 0.0
    assert md1_wait_percentile_s(2.0, 1.0, 95) == math.inf


def test_replicas_with_headroom() -> None:
    assert replicas_for_rate(10.0, 5.0, 0.0) == 2
    assert replicas_for_rate(10.0, 5.0, 0.1) == 3
    assert replicas_for_rate(0.0, 5.0, 0.1) == 1
    with pytest.raises(ValueError):
        replicas_for_rate(1.0, 0.0, 0.1)
