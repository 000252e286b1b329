"""The observed burstiness: the estimator the operator's PromQL computes (checked here on
counts whose dispersion is known), its noise, the drift it drives (burstier at the same mean
rate is a drift; an estimate within its noise is not; an unread one never is), the re-plan
for it and its place in status."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscale.autoscaling.observation import (
    MIN_BURST_WINDOWS,
    ObservedWorkload,
    bursts_of_counts,
    dispersion_noise,
    dispersion_of_counts,
)
from kvscale.control.status import planned_workload, planned_workload_status
from kvscale.control.workload import as_workload, check_drift
from kvscale.metrics.client import Missing, MissingKind
from kvscale.metrics.engines import ENGINES
from kvscale.metrics.observe import assemble_workload
from kvscale.metrics.promql import workload_queries
from kvscale.sim.load_profile import ProfileError, parse_profile
from kvscale.sizing.workload import Burstiness, LengthDistribution, Workload
from tests.unit.test_reconcile import NOW, deployed
from tests.unit.test_replan import PLANNED, at, observed, tick

RNG_SEED = 7


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw by counting exponential gaps (stdlib only)."""
    n, t = 0, rng.expovariate(1.0)
    while t < mean:
        n, t = n + 1, t + rng.expovariate(1.0)
    return n


def _counts(rng: random.Random, windows: int, mean: float, batch: int = 1) -> list[float]:
    """Arrivals per window: Poisson batches of `batch` requests, `mean` requests per window."""
    return [float(batch * _poisson(rng, mean / batch)) for _ in range(windows)]


@pytest.mark.parametrize(("batch", "mean"), [(1, 8.0), (1, 2.0), (8, 8.0), (16, 8.0)])
def test_the_estimator_reads_the_batch_size_and_its_noise_is_as_stated(batch: int, mean: float) -> None:
    rng = random.Random(RNG_SEED)
    n = 20
    estimates = [dispersion_of_counts(_counts(rng, n, mean, batch)) for _ in range(1500)]
    values = [e for e in estimates if e is not None]
    assert len(values) >= 1450
    # Compound Poisson with batches of k has index of dispersion k.
    assert statistics.fmean(values) == pytest.approx(batch, rel=0.08)
    assert statistics.pstdev(values) / batch == pytest.approx(dispersion_noise(n), rel=0.15)


def test_a_ramp_is_not_burstiness() -> None:
    # The rate doubles over the window: counts of a variance/mean estimate read it as bursts,
    # the first differences do not.
    ramp = [60.0 + 3.0 * i for i in range(20)]
    naive = statistics.variance(ramp) / statistics.fmean(ramp)
    assert naive > 3.0
    d = dispersion_of_counts(ramp)
    assert d is not None and d < 0.1


@given(st.lists(st.integers(0, 500), min_size=2, max_size=60), st.integers(1, 20))
def test_estimator_properties(counts: list[int], k: int) -> None:
    d = dispersion_of_counts([float(c) for c in counts])
    if sum(counts) == 0:
        assert d is None
        return
    assert d is not None and d >= 0
    assert dispersion_of_counts([float(c) for c in reversed(counts)]) == pytest.approx(d)
    # Batches of k of the same stream: k times the dispersion.
    assert dispersion_of_counts([float(k * c) for c in counts]) == pytest.approx(k * d)


def test_noise_shrinks_with_windows() -> None:
    assert dispersion_noise(2) == math.inf and dispersion_noise(1) == math.inf
    assert dispersion_noise(21) == pytest.approx(math.sqrt(3 / 20))
    assert dispersion_noise(100) < dispersion_noise(20)


def bursty(d: float | None, window_s: float = 600.0, burst_s: float = 30.0, **kw: float) -> ObservedWorkload:
    return dataclasses.replace(observed(512, window_s=window_s, **kw), arrival_dispersion=d, burst_window_s=burst_s)


def test_the_observed_burstiness_needs_enough_windows_and_a_reading() -> None:
    assert bursty(4.0).burstiness == Burstiness(4.0, 30.0)
    assert bursty(0.0).burstiness == Burstiness(0.05, 30.0)  # floored as from_arrivals floors it
    for unread in (bursty(None), bursty(math.nan), bursty(-1.0), dataclasses.replace(bursty(4.0), burst_window_s=None)):
        assert unread.burstiness is None
    few = bursty(4.0, burst_s=600.0 / (MIN_BURST_WINDOWS - 1))
    assert few.burstiness is None


def test_burstier_arrivals_at_the_same_rate_are_a_drift() -> None:
    check = check_drift(PLANNED, bursty(6.0), None, NOW, 1.5, 600)
    assert check.since == NOW and check.drift == "burstiness (index of dispersion over 30s) 6.0 vs 1.0 planned (6x)"
    assert check_drift(PLANNED, bursty(6.0), NOW, at(10), 1.5, 600).replan
    # Within its noise (20 windows: a standard error of 0.4x) a Poisson stream reads up to ~2.
    assert check_drift(PLANNED, bursty(2.0), None, NOW, 1.5, 600).drift is None
    # More windows, less noise: the same reading is a drift.
    assert check_drift(PLANNED, bursty(2.0, window_s=3600.0), None, NOW, 1.5, 600).drift is not None
    # Hysteresis: once drifting, it holds down to sqrt(factor) and half the noise margin.
    assert check_drift(PLANNED, bursty(1.9), NOW, at(5), 1.5, 600).since == NOW
    assert check_drift(PLANNED, bursty(1.3), NOW, at(5), 1.5, 600).since is None
    # Unread: no drift, whatever the plan assumed.
    planned_bursty = Workload.of(
        LengthDistribution.constant(512), LengthDistribution.constant(128), 4.0, burstiness=Burstiness(8.0, 30.0)
    )
    assert check_drift(planned_bursty, bursty(None), None, NOW, 1.5, 600).drift is None
    # Calmer than planned is a drift too (the fleet is sized for bursts that no longer come).
    calm = check_drift(planned_bursty, bursty(1.0), None, NOW, 1.5, 600)
    assert calm.drift is not None and "1.0 vs 8.0 planned" in calm.drift


def test_the_planned_burstiness_is_compared_at_the_observed_window() -> None:
    # Planned over 5 s windows; observed over 2 s: the excess shrinks in proportion.
    planned = Workload.of(
        LengthDistribution.constant(512), LengthDistribution.constant(128), 4.0, burstiness=Burstiness(11.0, 5.0)
    )
    check = check_drift(planned, bursty(5.0, burst_s=2.0), None, NOW, 1.5, 600)
    assert check.drift is None  # 1 + 10 x 2/5 = 5


def test_the_replan_takes_the_observed_burstiness_or_keeps_the_planned_one() -> None:
    w = as_workload(bursty(6.0), PLANNED)
    assert w is not None and w.burstiness == Burstiness(6.0, 30.0) and w.requests_per_s == 4.0
    kept = as_workload(bursty(None), PLANNED, Burstiness(3.0, 5.0))
    assert kept is not None and kept.burstiness == Burstiness(3.0, 5.0)
    assert (w2 := as_workload(bursty(None), PLANNED)) is not None and w2.burstiness is None


def test_the_planned_burstiness_survives_status() -> None:
    w = Workload.of(
        LengthDistribution((256, 1024), (0.5, 0.5)),
        LengthDistribution.constant(64),
        3.0,
        burstiness=Burstiness(12.34567, 2.0),
    )
    recorded = planned_workload_status(w, "observed")
    assert recorded.burstiness is not None and recorded.burstiness.index_of_dispersion == 12.3
    back = planned_workload(recorded, None)
    assert back is not None and back.burstiness == Burstiness(12.3, 2.0)
    assert planned_workload_status(PLANNED, "spec").burstiness is None


def test_status_shows_the_burstiness_and_a_bursty_drift_replans() -> None:
    start = deployed().status
    first = tick(start, bursty(6.2), 0)
    shown = first.status.observed_workload
    assert shown is not None and shown.burstiness is not None
    assert (shown.burstiness.index_of_dispersion, shown.burstiness.window_seconds) == (6.2, 30.0)
    assert "burstiness" in (shown.drift or "")
    replanned = tick(first.status, bursty(6.2), 10)
    [event] = replanned.events
    assert event.reason == "Replanned" and "burstiness (index of dispersion over 30s) 6.2 vs 1.0" in event.message
    plan = replanned.status.plan
    assert plan is not None and plan.workload is not None and plan.workload.burstiness is not None
    assert plan.workload.burstiness.index_of_dispersion == 6.2
    # Planned for it now: the same reading is no drift; no second re-plan.
    calm = tick(replanned.status, bursty(6.2), 11)
    assert calm.events == () and calm.status.observed_workload is not None
    assert calm.status.observed_workload.drift is None


def test_a_missing_burstiness_never_replans() -> None:
    start = deployed().status
    for minutes in (0, 10, 20):
        result = tick(start, bursty(None), minutes)
        assert result.events == () and result.apply == ()
        assert result.status.observed_workload is not None and result.status.observed_workload.burstiness is None
        start = result.status


def test_the_dispersion_query_is_asked_only_with_enough_windows() -> None:
    vllm = ENGINES["vllm"]
    assert "arrival_dispersion" not in workload_queries(vllm, "ns", "svc", "10m", "1m")
    assert "arrival_dispersion" not in workload_queries(vllm, "ns", "svc", "15s", "1m", "30s")
    q = workload_queries(vllm, "ns", "svc", "10m", "1m", "30s")["arrival_dispersion"]
    # Arrivals per pod: completions plus the growth of the requests in flight, exact differences.
    for name in ("vllm:request_success_total", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert f'{{__name__="{name}",namespace="ns"' in q and "offset 30s" in q
    assert "[60000ms:30s]" in q and "[10m:30s]" in q and "rate(" not in q
    burst_keys = workload_queries(vllm, "ns", "svc", "10m", "1m", "30s")
    assert "[10m:30s]" in burst_keys["arrivals_in_bursts"] and "[120000ms:30s]" in burst_keys["arrivals_in_bursts"]
    assert burst_keys["burst_requests"].startswith("sum_over_time(")


def test_a_failed_dispersion_read_leaves_the_rest_of_the_workload() -> None:
    values: dict[str, float | Missing] = {
        "rate": 4.0,
        "input_tokens": 512.0,
        "output_tokens": 128.0,
        "arrival_dispersion": Missing(MissingKind.TIMEOUT, "slow"),
    }
    workload, why = assemble_workload(values, {}, 5.0, "10m", "1m", "30s")
    assert workload is not None and why is None and workload.burstiness is None and workload.requests_per_s == 4.0
    assert "arrival_dispersion" in values  # the caller's answers are left as they were
    values["arrival_dispersion"] = 7.5
    workload, _ = assemble_workload(values, {}, 5.0, "10m", "1m", "30s")
    assert workload is not None and workload.burstiness == Burstiness(7.5, 30.0)


def test_the_standin_sends_batches_at_the_same_mean_rate() -> None:
    arrivals = parse_profile("constant:4;bursts:12@600", 256, 64, seed=3)
    got = arrivals.until(1200.0)
    before = [r.arrival_s for r in got if r.arrival_s < 600]
    after = [r.arrival_s for r in got if r.arrival_s >= 600]
    assert len(before) / 600 == pytest.approx(4, rel=0.1) and len(after) / 600 == pytest.approx(4, rel=0.25)
    calm, batched = Burstiness.from_arrivals(before, 5.0), Burstiness.from_arrivals(after, 5.0)
    assert calm.index_of_dispersion < 1.5 and batched.index_of_dispersion > 6
    both = parse_profile("constant:4;lengths:1024/32@10;bursts:3@0", 256, 64, seed=3).until(20.0)
    assert {(r.input_tokens, r.output_tokens) for r in both if r.arrival_s >= 10} == {(1024, 32)}
    assert all(sum(1 for o in both if o.arrival_s == r.arrival_s) % 3 == 0 for r in both)
    for bad in ("constant:1;bursts:0@0", "constant:1;bursts:x", "constant:1;bursts:2@-1", "constant:1;bursts:20000@0"):
        with pytest.raises(ProfileError, match="bursts"):
            parse_profile(bad, 1, 1)


def test_the_autoscaler_sizes_for_the_burstiness_planned_for() -> None:
    from kvscale.api.intent import parse_intent
    from kvscale.control.scaling import ScalerMemory, capacity
    from tests.unit.test_reconcile import CAT, SPEC

    intent = parse_intent(SPEC)
    start = deployed().status
    replanned = tick(tick(start, bursty(6.2), 0).status, bursty(6.2), 10).status
    assert start.plan is not None and replanned.plan is not None
    poisson, memory = capacity(ScalerMemory(), intent, start.plan, CAT)
    assert poisson.shape is not None and poisson.shape.burstiness is None
    shaped, kept = capacity(memory, intent, replanned.plan, CAT)
    assert shaped.shape is not None and shaped.shape.burstiness == Burstiness(6.2, 30.0)
    # Bursts of ~6 requests: a replica carries less within the TTFT tail than under Poisson.
    assert shaped.rate_per_replica(512, 128) < poisson.rate_per_replica(512, 128)
    if replanned.plan.gpu_type == start.plan.gpu_type and replanned.plan.max_batch == start.plan.max_batch:
        assert kept.state is memory.state  # the same configuration: the policy's state stays
    assert capacity(kept, intent, replanned.plan, CAT)[0] is shaped  # cached while the plan stays


def test_the_burst_share_follows_the_fitting_rule() -> None:
    # Batch submissions over a base load: 20% of the arrivals in windows far above their mean,
    # bursts of about 150 requests.
    share = dataclasses.replace(bursty(20.0), arrivals_in_bursts=0.2, burst_requests=150.0)
    assert share.burstiness == Burstiness(20.0, 30.0, 0.2, 150.0)
    # No window far above its neighbours (no answer), near Poisson, or unreadable parts: every
    # request is in a burst of D, as Burstiness.from_arrivals says it.
    assert dataclasses.replace(bursty(20.0), arrivals_in_bursts=None).burstiness == Burstiness(20.0, 30.0)
    assert dataclasses.replace(bursty(20.0), arrivals_in_bursts=0.2).burstiness == Burstiness(20.0, 30.0)
    near = dataclasses.replace(bursty(1.2), arrivals_in_bursts=0.3, burst_requests=5.0)
    assert near.burstiness == Burstiness(1.2, 30.0)
    bad = dataclasses.replace(bursty(20.0), arrivals_in_bursts=math.nan, burst_requests=150.0)
    assert bad.burstiness == Burstiness(20.0, 30.0)
    over = dataclasses.replace(bursty(20.0), arrivals_in_bursts=1.3, burst_requests=0.5)
    assert over.burstiness == Burstiness(20.0, 30.0, 1.0, 1.0)
    # A trace's fit says the same kind of thing for batch submissions over a base load.
    rng = random.Random(RNG_SEED)
    times: list[float] = []
    t = 0.0
    while t < 1800:
        t += rng.expovariate(3.0)
        times.append(t)
    for start in range(60, 1800, 120):
        times += [start + rng.random() * 2 for _ in range(150)]
    times.sort()
    fit = Burstiness.from_arrivals(times, 5.0)
    assert 0.1 < fit.burst_share < 0.6 and fit.index_of_dispersion > 10 and 100 < fit.burst_requests < 200


def test_status_shows_the_burst_share_and_keeps_it_in_the_plan() -> None:
    w = dataclasses.replace(bursty(20.0), arrivals_in_bursts=0.2, burst_requests=150.0)
    first = tick(deployed().status, w, 0)
    shown = first.status.observed_workload
    assert shown is not None and shown.burstiness is not None
    assert (shown.burstiness.burst_share, shown.burstiness.burst_requests) == (0.2, 150.0)
    replanned = tick(first.status, w, 10).status
    assert replanned.plan is not None and replanned.plan.workload is not None
    recorded = replanned.plan.workload.burstiness
    assert recorded is not None
    assert (recorded.index_of_dispersion, recorded.burst_share, recorded.burst_requests) == (20.0, 0.2, 150.0)
    back = planned_workload(replanned.plan.workload, None)
    assert back is not None and back.burstiness == Burstiness(20.0, 30.0, 0.2, 150.0)
    every = planned_workload_status(Workload(512, 128, 4.0, burstiness=Burstiness(3.0)), "spec").burstiness
    assert every is not None and every.burst_share is None and every.burst_requests is None  # unset: the defaults


def test_the_burst_windows_as_the_promql_reads_them() -> None:
    # A flat 10 per window with one batch of 90 on top: one far window, share 100/290, excess 90 - its mean.
    counts = [10.0] * 20
    counts[12] = 100.0
    found = bursts_of_counts(counts, 4)
    assert found is not None
    share, size = found
    local = (10 * 3 + 100) / 4
    assert share == pytest.approx(100 / 290) and size == pytest.approx(100 - local)
    # Windows before `first` feed the means only; a flat or Poisson stream holds no burst.
    assert bursts_of_counts(counts, 4, first=13) is None
    assert bursts_of_counts([10.0] * 20, 4) is None
    assert bursts_of_counts(_counts(random.Random(RNG_SEED), 200, 20.0), 4) is None


@given(st.floats(0.05, 500.0), st.sampled_from([2.0, 5.0, 30.0]), st.floats(1.1, 4.0), st.booleans())
def test_drift_properties(planned_d: float, burst_s: float, factor: float, drifting: bool) -> None:
    planned = Workload.of(
        LengthDistribution.constant(512),
        LengthDistribution.constant(128),
        4.0,
        burstiness=Burstiness(planned_d, burst_s),
    )
    since = NOW if drifting else None
    # What the plan was made for is no drift; an unread burstiness is none either.
    assert check_drift(planned, bursty(planned_d, burst_s=burst_s), since, NOW, factor, 600).drift is None
    assert check_drift(planned, bursty(None, burst_s=burst_s), since, NOW, factor, 600).drift is None


def test_batches_that_grew_at_the_same_dispersion_are_a_drift() -> None:
    # Planned for batches of 60 among 20% of arrivals; an hour at 4 req/s now brings batches of
    # 180 as often in share (16 of them: an error of ~0.35x) at the same dispersion.
    planned = Workload.of(
        LengthDistribution.constant(512),
        LengthDistribution.constant(128),
        4.0,
        burstiness=Burstiness(20.0, 30.0, 0.2, 60.0),
    )
    grown = dataclasses.replace(bursty(20.0, window_s=3600.0), arrivals_in_bursts=0.2, burst_requests=180.0)
    check = check_drift(planned, grown, None, NOW, 1.5, 600)
    assert check.drift == "burst size 180 requests vs 60 planned (3x)"
    same = dataclasses.replace(grown, burst_requests=70.0)
    assert check_drift(planned, same, None, NOW, 1.5, 600).drift is None
    # Over ten minutes the same reading comes from ~3 bursts: within its noise, no drift.
    short = dataclasses.replace(grown, window_s=600.0)
    assert check_drift(planned, short, None, NOW, 1.5, 600).drift is None
