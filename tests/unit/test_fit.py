"""Fitting a workload (lengths, rate profile, burstiness) from a trace."""

import random

import pytest

from kvscale.sim.fit import fit_trace
from kvscale.sim.trace import TraceRequest


def poisson(rate: float, span_s: float, seed: int, inp: int = 1000, out: int = 100) -> list[TraceRequest]:
    rng = random.Random(seed)
    t, trace = 0.0, []
    while t < span_s:
        t += rng.expovariate(rate)
        trace.append(TraceRequest(t, max(1, int(rng.expovariate(1 / inp))), max(1, int(rng.expovariate(1 / out)))))
    return trace


def test_poisson_trace_fits_poisson_and_its_means() -> None:
    fit = fit_trace(poisson(4.0, 1800, 1))
    w = fit.workload
    assert 0.8 < w.arrivals.index_of_dispersion < 1.25
    assert w.inputs.mean == pytest.approx(1000, rel=0.06) and w.outputs.mean == pytest.approx(100, rel=0.06)
    assert w.inputs.quantile(0.99) > 3 * w.inputs.quantile(0.5)  # the exponential tail kept
    assert fit.mean_rate_per_s == pytest.approx(4.0, rel=0.05)
    assert w.requests_per_s >= fit.mean_rate_per_s  # sized for a busy minute
    assert any("prefix-cache" in line for line in fit.describe())


def test_batch_submissions_fit_a_high_dispersion() -> None:
    rng = random.Random(2)
    trace = poisson(1.0, 1800, 3)
    for _ in range(20):  # 20 batches of 100 requests within 2 s
        start = rng.uniform(0, 1790)
        trace += [TraceRequest(start + rng.uniform(0, 2), 500, 13) for _ in range(100)]
    trace.sort(key=lambda r: r.arrival_s)
    fit = fit_trace(trace)
    assert fit.workload.arrivals.index_of_dispersion > 20
    assert fit.minute_rate_cv > 0.5


def test_empty_trace_is_refused() -> None:
    with pytest.raises(ValueError, match="no requests"):
        fit_trace([])
