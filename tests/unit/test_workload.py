"""The workload as distributions: lengths, burstiness, demand in work units."""

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscale.sizing.workload import Burstiness, LengthDistribution, Workload


def test_constant_is_the_mean_value_case() -> None:
    d = LengthDistribution.constant(512)
    assert d.mean == 512 and d.max == 512 and d.is_constant
    assert d.quantile(0.0) == d.quantile(0.99) == 512
    w = Workload(512, 128, 2.0)
    assert w.is_mean_value and w.inputs == d and w.outputs == LengthDistribution.constant(128)
    assert w.arrivals.is_poisson


def test_points_are_sorted_merged_and_normalized() -> None:
    d = LengthDistribution((300, 100, 100), (1.0, 2.0, 1.0))
    assert d.tokens == (100, 300)
    assert d.weights == pytest.approx((0.75, 0.25))
    assert d.mean == pytest.approx(150.0)  # hand: 0.75 x 100 + 0.25 x 300
    assert d.quantile(0.5) == 100 and d.quantile(0.75) == 100 and d.quantile(0.76) == 300


def test_from_samples_keeps_the_mean_and_a_tail_point() -> None:
    samples = list(range(1, 1001))  # 1..1000, mean 500.5
    d = LengthDistribution.from_samples(samples)
    assert d.mean == pytest.approx(500.5, abs=1.0)
    assert d.max >= 995  # the top 0.2% bin: 999..1000
    assert d.quantile(0.5) < d.quantile(0.99)


def test_from_histogram_places_buckets_at_midpoints() -> None:
    d = LengthDistribution.from_histogram([100, 200, math.inf], [1, 1, 2])
    # hand: (0, 100] -> 50, (100, 200] -> 150, (200, inf) -> (200 + 400) / 2 = 300
    assert d.tokens == (50, 150, 300) and d.weights == pytest.approx((0.25, 0.25, 0.5))


@pytest.mark.parametrize(
    ("tokens", "weights", "field"),
    [((), (), "at least one point"), ((10,), (1.0, 2.0), "one weight per length"), ((0,), (1.0,), "at least 1 token")],
)
def test_bad_distributions_say_what_is_wrong(tokens: tuple[int, ...], weights: tuple[float, ...], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LengthDistribution(tokens, weights)


def test_workload_of_takes_the_means_and_rejects_a_mismatch() -> None:
    inputs = LengthDistribution((1000, 3000), (0.5, 0.5))
    outputs = LengthDistribution((10, 90), (0.5, 0.5))
    w = Workload.of(inputs, outputs, 2.0, burstiness=Burstiness(25.0, 5.0), prefix_cache_hit_share=0.5)
    assert (w.input_tokens, w.output_tokens) == (2000, 50)
    assert not w.is_mean_value
    assert w.prefill_tokens_per_s == pytest.approx(2.0 * 2000 * 0.5)  # prefix hits discount prefill
    assert w.decode_tokens_per_s == pytest.approx(2.0 * 50)
    assert w.engine_max_context_tokens == 3090
    assert w.at_rate(4.0).burstiness == w.burstiness and w.at_rate(4.0).requests_per_s == 4.0
    with pytest.raises(ValueError, match=r"Workload\.of"):
        Workload(500, 50, 1.0, input_lengths=inputs)


def test_poisson_arrivals_fit_a_dispersion_near_one() -> None:
    rng = random.Random(7)
    t = 0.0
    times: list[float] = []
    while t < 3600:
        t += rng.expovariate(5.0)
        times.append(t)
    fit = Burstiness.from_arrivals(times, 5.0)
    assert 0.85 < fit.index_of_dispersion < 1.15


def test_batch_submissions_fit_a_dispersion_near_the_batch_size() -> None:
    rng = random.Random(3)
    times: list[float] = []
    for _ in range(200):  # batches of 25 within 1 s at Poisson epochs
        start = rng.uniform(0, 3600)
        times.extend(start + rng.uniform(0, 1.0) for _ in range(25))
    fit = Burstiness.from_arrivals(sorted(times), 5.0)
    assert 15 < fit.index_of_dispersion < 35  # a compound Poisson of 25s: dispersion ~25


def test_arrivals_at_percentile_hand_computed() -> None:
    b = Burstiness(25.0, 5.0)
    # mean 2/s x 5 s = 10; sd sqrt(25 x 10) = 15.81; z(0.99) = 2.326 -> 46.8
    assert b.arrivals_at_percentile(2.0, 5.0, 99.0) == pytest.approx(10 + 2.3263 * math.sqrt(250), rel=1e-3)
    # over a window shorter than the burst the excess shrinks: 1 + 24 x 1/5 = 5.8
    assert b.dispersion_at(1.0) == pytest.approx(5.8)
    assert Burstiness().arrivals_at_percentile(0.0, 5.0, 99.0) == 0.0


@given(st.lists(st.integers(1, 200_000), min_size=1, max_size=400), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_sample_fit_properties(samples: list[int], q1: float, q2: float) -> None:
    d = LengthDistribution.from_samples(samples)
    assert sum(d.weights) == pytest.approx(1.0)
    assert min(samples) <= d.mean <= max(samples)
    assert d.mean == pytest.approx(sum(samples) / len(samples), rel=0.01, abs=1.0)
    lo, hi = sorted((q1, q2))
    assert d.quantile(lo) <= d.quantile(hi)  # quantiles never decrease


@given(st.floats(0.1, 100.0), st.floats(0.01, 50.0), st.floats(0.5, 60.0))
def test_burstier_never_fewer_arrivals_at_the_tail(dispersion: float, rate: float, window: float) -> None:
    calm = Burstiness(1.0, 5.0).arrivals_at_percentile(rate, window, 99.0)
    mine = Burstiness(dispersion, 5.0).arrivals_at_percentile(rate, window, 99.0)
    assert (mine >= calm) == (dispersion >= 1.0) or math.isclose(mine, calm)
