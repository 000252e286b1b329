"""Seeded load generators: shapes, determinism, lengths, and clear errors."""

import re
import statistics

import pytest

from kvscale.sim.generators import KINDS, LoadError, generate, parse_load
from kvscale.sim.run import bucket_rates


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_is_seeded_and_deterministic(kind: str) -> None:
    spec = parse_load(f"{kind}:duration=10m")
    a, b, c = generate(spec, seed=1), generate(spec, seed=1), generate(spec, seed=2)
    assert a == b and a != c
    assert all(0 <= r.arrival_s < 600 for r in a)
    assert [r.arrival_s for r in a] == sorted(r.arrival_s for r in a)


def test_step_rates_before_and_after() -> None:
    trace = generate(parse_load("step:before=2,after=20,at=5m,duration=10m"), seed=0)
    rates = bucket_rates(trace, 60.0)
    assert statistics.fmean(rates[:5]) == pytest.approx(2, rel=0.2)
    assert statistics.fmean(rates[5:]) == pytest.approx(20, rel=0.1)


def test_bursty_alternates_between_base_and_peak() -> None:
    trace = generate(parse_load("bursty:base=0.5,peak=60,on=60s,off=3m,rise=10s,duration=1h"), seed=4)
    rates = bucket_rates(trace, 10.0)
    assert max(rates) > 45  # inside bursts
    assert sum(1 for r in rates if r < 2) > len(rates) / 2  # mostly idle
    # bursty: the busiest minute is far above the mean
    minute = bucket_rates(trace, 60.0)
    assert max(minute) > 3 * statistics.fmean(minute)


def test_diurnal_and_flash_shapes() -> None:
    diurnal = bucket_rates(generate(parse_load("diurnal:low=1,high=11,period=20m,duration=20m"), seed=0), 120.0)
    assert diurnal[0] < 3 and diurnal[4] > 9 and diurnal[-1] < 3
    flash = bucket_rates(generate(parse_load("flash:base=1,peak=41,at=2m,rise=30s,decay=2m,duration=12m"), 0), 60.0)
    assert flash[0] < 2 and max(flash[2:4]) > 25 and flash[-1] < 3


def test_lengths_fixed_spread_and_heavy() -> None:
    fixed = generate(parse_load("poisson:rate=20,input=300,output=40,lengths=fixed,duration=5m"), seed=0)
    assert {r.input_tokens for r in fixed} == {300} and {r.output_tokens for r in fixed} == {40}
    heavy = generate(parse_load("poisson:rate=50,input=1000,output=100,lengths=heavy,duration=10m"), seed=0)
    spread = generate(parse_load("poisson:rate=50,input=1000,output=100,lengths=spread,duration=10m"), seed=0)
    for trace in (heavy, spread):
        assert statistics.fmean(r.input_tokens for r in trace) == pytest.approx(1000, rel=0.15)

    # the heavy tail: a larger share of the tokens sits in the top 1% of requests
    def top_share(values: list[int]) -> float:
        ordered = sorted(values)
        return sum(ordered[-len(ordered) // 100 :]) / sum(ordered)

    assert top_share([r.input_tokens for r in heavy]) > 2 * top_share([r.input_tokens for r in spread])
    assert max(r.input_tokens for r in heavy) <= 32768


@pytest.mark.parametrize(
    "text,words",
    [
        ("sine:rate=2", "unknown kind 'sine'"),
        ("bursty:peak=lots", "peak='lots' is not a number"),
        ("bursty:spike=3", "bursty has no key 'spike'"),
        ("bursty:base=9,peak=3", "base (9) must not exceed peak (3)"),
        ("step:at=soon", "at: cannot read 'soon'"),
        ("poisson:rate=0", "no request would arrive"),
        ("poisson:lengths=long", "choose one of fixed, spread, heavy"),
        ("poisson:rate", "is not key=value"),
        ("poisson:input=0", "at least 1 token"),
    ],
)
def test_bad_loads_name_the_key_and_the_fix(text: str, words: str) -> None:
    with pytest.raises(LoadError) as info:
        parse_load(text)
    assert words in str(info.value)


def test_batch_submissions_are_bursts_over_a_base_load() -> None:
    from kvscale.sim.fit import fit_trace

    spec = parse_load("batches:base=1,every=2m,size=100,spread=2s,duration=30m")
    trace = generate(spec, seed=3)
    fit = fit_trace(trace)
    assert fit.workload.arrivals.index_of_dispersion > 20  # Poisson is 1
    assert len(trace) > 1800 + 100 * 10  # the base load plus ~15 batches of 100
    assert [r.arrival_s for r in trace] == sorted(r.arrival_s for r in trace)
    assert generate(spec, seed=3) == trace


def test_length_drift_moves_the_mean_prompt_at_a_constant_rate() -> None:
    from kvscale.sim.fit import fit_trace

    trace = generate(parse_load("drift:rate=6,swing=3,input=2000,lengths=fixed,duration=30m"), seed=1)
    fit = fit_trace(trace)
    assert fit.prompt_mean_swing > 2.0
    assert fit.minute_rate_cv < 0.2
    assert all(2000 / 3**0.5 - 1 <= r.input_tokens <= 2000 * 3**0.5 + 1 for r in trace)


def test_short_heavy_tailed_outputs() -> None:
    trace = generate(parse_load("poisson:rate=20,output=20,output_lengths=heavy,lengths=fixed,duration=10m"), seed=2)
    outputs = sorted(r.output_tokens for r in trace)
    assert outputs[len(outputs) // 2] < 20 < outputs[int(0.99 * len(outputs))] / 5  # median short, tail long
    assert {r.input_tokens for r in trace} == {512}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("batches:size=0", "size=0 must be at least 1"),
        ("drift:swing=0.5", "must be at least 1"),
        ("poisson:output_lengths=wide", "output_lengths='wide'"),
    ],
)
def test_new_kinds_refuse_bad_values(text: str, message: str) -> None:
    with pytest.raises(LoadError, match=re.escape(message)):
        parse_load(text)


def _index_of_dispersion(trace: list, window_s: float) -> float:  # type: ignore[type-arg]
    """Variance over mean of the arrivals counted per window (1: Poisson)."""
    counts = [0] * (int(trace[-1].arrival_s // window_s) + 1)
    for r in trace:
        counts[int(r.arrival_s // window_s)] += 1
    return statistics.pvariance(counts) / statistics.fmean(counts)


@pytest.mark.parametrize(
    ("load", "low", "high"),
    [
        # Issue 27's production shape: hundreds of requests within seconds over a base load, an
        # index of dispersion ~25 over 5 s windows, short outputs, at three scales.
        ("batches:base=10,every=2m,size=200,spread=3s,output=30,duration=1h", 15, 35),
        ("batches:base=20,every=90s,size=300,spread=4s,output=20,duration=1h", 15, 45),
        ("batches:base=20,every=3m,size=400,spread=5s,output=40,duration=1h", 15, 40),
    ],
)
def test_batch_submissions_have_the_issues_dispersion(load: str, low: float, high: float) -> None:
    trace = generate(parse_load(load), seed=1)
    assert low < _index_of_dispersion(trace, 5.0) < high
    assert statistics.median(r.output_tokens for r in trace) < 50  # short outputs


def test_spikes_are_shorter_than_a_cold_start_at_random_intervals() -> None:
    trace = generate(parse_load("spikes:base=1,peak=40,every=3m,length=40s,duration=2h"), seed=2)
    per_10s = bucket_rates(trace, 10.0)
    hot = [i for i, r in enumerate(per_10s) if r > 20]
    runs, gaps, start = [], [], hot[0]
    for a, b in zip(hot, [*hot[1:], None], strict=True):  # consecutive hot windows form one burst
        if b != a + 1:
            runs.append(a - start + 1)
            if b is not None:
                gaps.append(b - a)
                start = b
    assert len(runs) > 15  # about 2 h / (3 m + 40 s) bursts
    # Each ~40 s (four 10 s windows, five when it straddles one); two bursts a few seconds apart
    # (an exponential gap can be that short) merge into one run now and then.
    assert statistics.median(runs) in (4, 5) and sum(r <= 5 for r in runs) >= 0.85 * len(runs)
    assert statistics.pstdev(gaps) > 0.5 * statistics.fmean(gaps)  # random (exponential) gaps, not a clock
    assert _index_of_dispersion(trace, 5.0) > 20
