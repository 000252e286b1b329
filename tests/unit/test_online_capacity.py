"""The operator's online capacity (issue 35, part 1): arrivals synthesized from the observed
workload (kvscale.sim.online.synthesize), the simulated sizing search on the current plan
(search_capacity), status.capacity (kvscale.control.capacity.measure) with its fallback to the
model's figure, and the capacity the scale tick acts on (acted_on, control.autoscale)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time

import pytest

from kvscale.api.intent import Intent, parse_intent, serving_config
from kvscale.api.models import InferenceServiceStatus, PlanStatus, status_dict
from kvscale.autoscaling.capacity import ConfirmedCapacity, SizingCapacity
from kvscale.autoscaling.observation import LengthHistogram, Observation, ObservedWorkload, dispersion_of_counts
from kvscale.cli.status import status_lines
from kvscale.control.autoscale import Governor, Readings, autoscale
from kvscale.control.budget import BudgetBook
from kvscale.control.capacity import Confirmed, acted_on, measure, raises, with_capacity
from kvscale.control.memory import ServiceMemory
from kvscale.control.reconcile import DeploymentView
from kvscale.control.scaling import Fleet, ScalerMemory, capacity, configuration_key, fleet
from kvscale.metrics.arrivals import arrival_counts_query, counts_of
from kvscale.metrics.engines import ENGINES
from kvscale.sim.check import service_attainment
from kvscale.sim.engine import StepTimes
from kvscale.sim.online import (
    MAX_REPLAY_REQUESTS,
    MAX_SYNTHESIZED,
    MIN_REQUESTS,
    WINDOW_NOISE_SDS,
    faster,
    search_capacity,
    synthesize,
)
from kvscale.sim.run import SimSetup
from kvscale.sizing.config import ServingConfig
from tests.unit.test_reconcile import CAT, NOW, RES, SETTINGS, SPEC, deployed

PROMPTS = LengthHistogram((128.0, 256.0, 512.0, 1024.0, 2048.0, math.inf), (100.0, 300.0, 400.0, 150.0, 45.0, 5.0))
OUTPUTS = LengthHistogram((32.0, 64.0, 128.0, 256.0, math.inf), (100.0, 300.0, 400.0, 190.0, 10.0))


def window(rate: float | None = 4.0, window_s: float = 600.0, **kw: object) -> ObservedWorkload:
    fields: dict[str, object] = {
        "requests_per_s": rate,
        "input_tokens_mean": 420.0,
        "output_tokens_mean": 100.0,
        "prompt_lengths": PROMPTS,
        "output_lengths": OUTPUTS,
    }
    fields.update(kw)
    return ObservedWorkload(0.0, window_s, **fields)  # type: ignore[arg-type]


# -- synthesis from the observed window -----------------------------------------------------


def test_synthesis_keeps_the_rate_the_window_and_the_observed_means() -> None:
    replay = synthesize(window(rate=1.0), 8192, seed=3)
    assert len(replay) == 600  # 1 req/s over the 10-minute window
    span = replay[-1].arrival_s - replay[0].arrival_s
    assert 590 / span == pytest.approx(1.0, rel=0.05)
    assert statistics.mean(r.input_tokens for r in replay) == pytest.approx(420.0, rel=0.02)
    assert statistics.mean(r.output_tokens for r in replay) == pytest.approx(100.0, rel=0.02)
    # the histogram's shape: about 1% of prompts past its 2,048-token bucket, none past 2 x 2,048 x scale
    longest = max(r.input_tokens for r in replay)
    assert 1024 < longest < 2 * 2048 * 1.1


def test_a_busy_window_is_thinned_over_its_whole_span() -> None:
    """Behind a Service each replica serves a random thinning of the traffic: a replay thinned
    to the cap over the whole window sizes a replica as the full one does, over minutes."""
    replay = synthesize(window(rate=50.0), 8192)
    assert len(replay) == MAX_REPLAY_REQUESTS
    assert replay[-1].arrival_s - replay[0].arrival_s == pytest.approx(600.0, rel=0.02)
    # a window too busy to synthesize whole: MAX_SYNTHESIZED x the cap at its rate, thinned
    busy = synthesize(window(rate=1000.0), 8192)
    assert len(busy) == MAX_REPLAY_REQUESTS
    span = MAX_SYNTHESIZED * MAX_REPLAY_REQUESTS / 1000.0
    assert busy[-1].arrival_s - busy[0].arrival_s == pytest.approx(span, rel=0.02)


def test_observed_bursts_are_synthesized_and_poisson_stays_poisson() -> None:
    def dispersion(w: ObservedWorkload) -> float:
        replay = synthesize(w, 8192, seed=1)
        counts = [0.0] * (int(replay[-1].arrival_s // 5.0) + 1)
        for r in replay:
            counts[int(r.arrival_s // 5.0)] += 1
        d = dispersion_of_counts(counts)
        assert d is not None
        return d

    poisson = dispersion(window(rate=2.0))
    bursty = dispersion(
        window(rate=2.0, arrival_dispersion=8.0, burst_window_s=5.0, arrivals_in_bursts=0.4, burst_requests=25.0)
    )
    assert 0.6 < poisson < 1.5
    assert bursty > 4 * poisson


def test_synthesis_without_a_rate_or_lengths_is_empty_and_without_histograms_takes_the_means() -> None:
    assert synthesize(window(rate=None), 8192) == []
    assert synthesize(window(rate=0.0), 8192) == []
    assert synthesize(window(input_tokens_mean=None, prompt_lengths=None), 8192) == []
    flat = synthesize(window(prompt_lengths=None, output_lengths=None), 8192)
    assert {(r.input_tokens, r.output_tokens) for r in flat} == {(420, 100)}
    # a request never asks for more than the context holds
    assert all(r.input_tokens + r.output_tokens <= 1024 for r in synthesize(window(), 1024))


def test_counts_at_scrape_resolution_are_followed_window_by_window() -> None:
    counts = [0.0, 10.0, 0.0, 40.0, 5.5]  # requests per 5 s, oldest first; the leading quiet step dropped
    replay = synthesize(window(), 8192, seed=2, counts=counts, counts_step_s=5.0)
    assert len(replay) in (55, 56)  # 55.5 rounded at random
    per_step = [0] * 4  # the replay starts at the first step that holds a request
    for r in replay:
        per_step[int(r.arrival_s // 5.0)] += 1
    assert per_step[:3] == [10, 0, 40] and per_step[3] in (5, 6)
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(replay))
    # more than the cap: the latest requests
    busy = synthesize(window(), 8192, counts=[1000.0, 1000.0], counts_step_s=10.0, max_requests=1500)
    assert len(busy) == 1500  # thinned over both steps alike
    assert busy[0].arrival_s < 0.2 and busy[-1].arrival_s > 19.8
    assert 650 < sum(r.arrival_s < 10.0 for r in busy) < 850
    # counts that hold no request: the rate and burstiness instead
    assert len(synthesize(window(rate=1.0), 8192, counts=[0.0, 0.0], counts_step_s=5.0)) == 600


def test_a_range_answer_becomes_counts_per_step() -> None:
    body = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": {}, "values": [[100.0, "3"], [110.0, "NaN"], [115.0, "7"]]}],
        },
    }
    assert counts_of(body, 100.0, 5.0, 4) == [3.0, 0.0, 0.0, 7.0]  # 105 unsampled, 110 not a number
    assert counts_of({"data": {"resultType": "vector", "result": []}}, 100.0, 5.0, 4) is None
    assert counts_of({"data": {"resultType": "matrix", "result": []}}, 100.0, 5.0, 4) is None
    query = arrival_counts_query(ENGINES["vllm"], "ns", "chat", 5.0)
    assert query.startswith("sum(") and "offset 5s" in query and 'pod=~"chat-' in query


# -- the search on the current plan ----------------------------------------------------------


Planned = tuple[Intent, PlanStatus, SizingCapacity, ServingConfig]


@pytest.fixture(scope="module")
def planned() -> Planned:
    intent = parse_intent(SPEC)
    plan = deployed().status.plan
    assert plan is not None
    model, _ = capacity(ScalerMemory(), intent, plan, CAT)
    return intent, plan, model, serving_config(intent, plan, CAT)


def test_the_search_confirms_the_fewest_warm_replicas_and_their_rate(planned: Planned) -> None:
    intent, plan, model, cfg = planned
    assert isinstance(model, SizingCapacity)
    replay = synthesize(window(rate=12.0, window_s=120.0), plan.max_context_tokens)  # 1,440: not thinned
    found = search_capacity(cfg, intent.slo, plan.max_batch, model, replay, 12.0 * 120)
    assert found.replicas is not None and found.confirmed_rate_per_s is not None
    assert found.requests == len(replay) == 1440
    # by hand: that many replicas meet the percentile on the replay, one fewer does not
    # (a window meets the percentile within WINDOW_NOISE_SDS standard deviations of its sample)
    setup = SimSetup(cfg, intent.slo, plan.max_batch, 0.0, found.replicas)
    p = intent.slo.percentile / 100
    target = p - WINDOW_NOISE_SDS * math.sqrt(p * (1 - p) / len(replay))
    steps = StepTimes(cfg)
    assert service_attainment(setup, replay, found.replicas, steps) >= target
    assert found.replicas > 1
    assert service_attainment(setup, replay, found.replicas - 1, steps) < target
    # the rate per replica: at least the replayed rate over them, at most what one fewer would carry
    per = found.replay_rate_per_s
    assert per / found.replicas <= found.confirmed_rate_per_s <= per / (found.replicas - 1)
    speedup = found.confirmed_rate_per_s * found.replicas / per
    assert service_attainment(setup, faster(replay, speedup), found.replicas, steps) >= target
    assert f"{found.replicas} warm replica(s)" in found.reason


def test_a_quiet_fleet_is_confirmed_at_what_one_replica_carries_not_at_its_load(
    planned: Planned,
) -> None:
    """One replica meets the SLO on a quiet window: the replay played faster finds how much it
    carries, so the figure does not fall with the load (it converges on the replica's capacity)."""
    intent, plan, model, cfg = planned
    figures = {}
    for rate in (2.0, 12.0, 30.0):
        span = min(600.0, MAX_REPLAY_REQUESTS / rate)  # not thinned: the fleet the load needs
        replay = synthesize(window(rate=rate, window_s=span), plan.max_context_tokens)
        found = search_capacity(cfg, intent.slo, plan.max_batch, model, replay, rate * span)
        assert found.confirmed_rate_per_s is not None
        figures[rate] = found.confirmed_rate_per_s
    assert figures[2.0] > 2 * 2.0  # not the load itself
    assert max(figures.values()) / min(figures.values()) < 1.3, figures
    # by hand on one replica: it meets the SLO at the confirmed rate, and misses a tenth above it
    replay = synthesize(window(rate=2.0), plan.max_context_tokens)
    setup = SimSetup(cfg, intent.slo, plan.max_batch, 0.0, 1)
    steps, target = StepTimes(cfg), intent.slo.percentile / 100
    rate = len(replay) / (replay[-1].arrival_s - replay[0].arrival_s)
    assert service_attainment(setup, faster(replay, figures[2.0] / rate), 1, steps) >= target
    assert service_attainment(setup, faster(replay, 1.1 * figures[2.0] / rate), 1, steps) < target


def test_too_few_requests_run_no_search(planned: Planned) -> None:
    intent, plan, model, cfg = planned
    replay = synthesize(window(rate=0.2), plan.max_context_tokens)
    found = search_capacity(cfg, intent.slo, plan.max_batch, model, replay, 0.2 * 600)
    assert MIN_REQUESTS > 0.2 * 600
    assert found.replicas is None and found.confirmed_rate_per_s is None
    assert "fewer than the 200" in found.reason


def test_one_search_costs_well_under_a_second_of_cpu(planned: Planned) -> None:
    """The CPU budget: at the replay cap a search takes 0.07-0.17 s of CPU behind a Service on
    the test machine, 0.19-0.31 s behind a gateway (benchmarks/online_capacity.py), so 300
    services searching every 5 minutes take at most a third of the one search thread's core."""
    intent, plan, model, cfg = planned
    replay = synthesize(window(rate=30.0, window_s=50.0), plan.max_context_tokens)  # 1,500 at 30/s: 4 replicas
    started = time.thread_time()
    found = search_capacity(cfg, intent.slo, plan.max_batch, model, replay, 30.0 * 50)
    spent = time.thread_time() - started
    assert found.requests == MAX_REPLAY_REQUESTS and found.replicas is not None
    assert spent < 1.0, f"one search took {spent:.2f} s of CPU"


# -- status.capacity and the fallback to the model's figure ---------------------------------


def test_status_capacity_is_simulated_once_enough_requests_were_replayed(planned: Planned) -> None:
    intent, plan, *_ = planned
    done = measure(intent, plan, window(rate=12.0), None, None, CAT, MIN_REQUESTS, NOW)
    s = done.status
    assert done.confirmed is not None and done.search is not None
    assert s.requests == MAX_REPLAY_REQUESTS and s.measured_at == "2026-11-23T12:00:00Z"
    assert s.simulated == pytest.approx(done.confirmed.rate_per_s, abs=1e-4)
    assert s.analytic == pytest.approx(done.search.analytic_rate_per_s, abs=1e-4)
    # acted on where it raises the model's figure for that traffic, the model's otherwise
    acts = done.confirmed.rate_per_s > done.search.analytic_rate_per_s
    assert raises(done.confirmed) is acts
    assert s.source == ("simulated" if acts else "analytic")
    assert s.simulated is not None
    assert s.requests_per_second_per_replica == pytest.approx(max(s.simulated, s.analytic), abs=1e-4)
    wire = status_dict(with_capacity(InferenceServiceStatus(), s))["capacity"]
    assert set(wire) >= {"requestsPerSecondPerReplica", "analytic", "simulated", "source", "measuredAt", "requests"}


def test_the_model_stands_before_traffic_and_without_metrics(planned: Planned) -> None:
    intent, plan, *_ = planned
    none = measure(intent, plan, None, "no data for rate", None, CAT, MIN_REQUESTS, NOW)
    assert none.status.source == "analytic" and none.confirmed is None and none.search is None
    assert none.status.requests_per_second_per_replica == none.status.analytic > 0
    assert "no data for rate" in none.status.message
    quiet = measure(intent, plan, window(rate=0.1), None, None, CAT, MIN_REQUESTS, NOW)
    assert quiet.status.source == "analytic" and quiet.confirmed is None
    assert "fewer than the 200" in quiet.status.message


def test_counted_arrivals_decide_whether_there_were_enough_requests(planned: Planned) -> None:
    intent, plan, *_ = planned
    few = measure(
        intent, plan, window(rate=12.0), None, None, CAT, MIN_REQUESTS, NOW, counts=[50.0] * 3, counts_step_s=5.0
    )
    assert few.status.source == "analytic" and "150 request(s) observed" in few.status.message
    enough = measure(
        intent, plan, window(rate=0.1), None, None, CAT, MIN_REQUESTS, NOW, counts=[60.0] * 10, counts_step_s=5.0
    )
    assert enough.status.simulated is not None and enough.status.requests == 600


def test_a_figure_confirmed_before_stays_through_a_quiet_window_but_not_a_new_plan(
    planned: Planned,
) -> None:
    intent, plan, *_ = planned
    first = measure(intent, plan, window(rate=12.0), None, None, CAT, MIN_REQUESTS, NOW)
    assert first.confirmed is not None
    quiet = measure(intent, plan, window(rate=0.1), None, first.confirmed, CAT, MIN_REQUESTS, NOW)
    assert quiet.confirmed == first.confirmed and quiet.status.simulated == first.status.simulated
    assert quiet.status.source == first.status.source
    assert quiet.status.measured_at == first.status.measured_at and "stays" in quiet.status.message
    other = dataclasses.replace(first.confirmed, key=("another plan",))
    moved = measure(intent, plan, None, "no data", other, CAT, MIN_REQUESTS, NOW)
    assert moved.confirmed is None and moved.status.source == "analytic"


# -- what the scale tick acts on ------------------------------------------------------------


def test_the_tick_acts_on_the_confirmed_capacity_of_its_configuration(planned: Planned) -> None:
    intent, plan, model, _ = planned
    assert isinstance(model, SizingCapacity)
    key = configuration_key(intent, plan)
    analytic = model.rate_per_replica(420.0, 100.0, 12.0)
    confirmed = Confirmed(key, 3 * analytic, 420.0, 100.0, 12.0, 1500, "2026-11-23T12:00:00Z")
    acting = acted_on(model, confirmed, intent, plan)
    assert isinstance(acting, ConfirmedCapacity)
    assert acting.rate_per_replica(420.0, 100.0, 12.0) == pytest.approx(3 * analytic)
    assert acted_on(model, dataclasses.replace(confirmed, key=("old",)), intent, plan) is model
    assert acted_on(model, None, intent, plan) is model
    # set against the model's figure for the traffic it was confirmed on: acted on above it only
    above = dataclasses.replace(confirmed, rate_per_s=2.0, analytic_rate_per_s=1.5)
    below = dataclasses.replace(confirmed, rate_per_s=1.0, analytic_rate_per_s=1.5)
    assert raises(above) and not raises(below)
    assert isinstance(acted_on(model, above, intent, plan), ConfirmedCapacity)
    assert acted_on(model, below, intent, plan) is model
    # the ratio to that figure carries over: 2.0 / 1.5 of the model's at the service's traffic
    acting_above = acted_on(model, above, intent, plan)
    assert acting_above.rate_per_replica(420.0, 100.0, 12.0) == pytest.approx(analytic * 2.0 / 1.5)

    # Through the operator's adapter: three times the capacity, fewer replicas wanted
    status = deployed().status
    start = fleet(intent, status, DeploymentView(6, 6, plan.gpu_type))
    assert isinstance(start, Fleet)
    obs = Observation(
        time_s=NOW.timestamp(),
        ready_replicas=6,
        starting_replicas=0,
        arrival_rate_per_s=12.0,
        input_tokens_mean=420.0,
        output_tokens_mean=100.0,
        running=6.0,
        waiting=0.0,
    )
    read = Readings(obs, None, None, (), ())
    governor = Governor(BudgetBook(), {}, 45.0)

    def wanted(memory: ServiceMemory) -> float | None:
        done = autoscale(intent, RES, status, start, read, memory, governor, CAT, SETTINGS, NOW)
        assert done.memory.capacity == memory.capacity  # the tick keeps what the search confirmed
        return done.tick.decision.capacity_per_replica

    model_figure, confirmed_figure = wanted(ServiceMemory()), wanted(ServiceMemory(capacity=confirmed))
    assert model_figure is not None and confirmed_figure is not None
    assert confirmed_figure == pytest.approx(3 * model_figure, rel=0.05)


def test_kvscale_status_shows_the_capacity_and_where_it_comes_from() -> None:
    obj = {
        "metadata": {"name": "chat", "namespace": "ns"},
        "spec": {},
        "status": {
            "capacity": {
                "requestsPerSecondPerReplica": 14.1,
                "analytic": 15.36,
                "source": "simulated",
                "measuredAt": "2026-11-29T07:38:13Z",
                "requests": 741,
                "message": "1 warm replica(s) meet p95",
            }
        },
    }
    (line,) = [line for line in status_lines(obj, []) if line.startswith("Capacity:")]
    assert "14.1 req/s per replica (simulated on 741 observed requests at 2026-11-29T07:38:13Z" in line
    assert "the model's 15.36" in line
    assert not any(line.startswith("Capacity:") for line in status_lines({**obj, "status": {}}, []))


def test_the_capacity_timer_runs_at_its_interval_and_off_turns_it_off() -> None:
    from tests.unit.test_calibration_tick import _timers

    assert _timers({})["capacity"] == 300.0
    assert _timers({"KVSCALE_CAPACITY_INTERVAL": "20s"})["capacity"] == 20.0
    assert "capacity" not in _timers({"KVSCALE_CAPACITY_INTERVAL": "off"})
