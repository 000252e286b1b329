"""The operator's online capacity search run inside a replay (kvscale.sim.online_refresh): the
window it reads is the past only, counted as the engines' metrics count it, and kvscale's
simulated policy acts on what it confirms, as the deployed one does."""

from __future__ import annotations

import math
import random

import pytest

from kvscale.autoscaling.capacity import ConfirmedCapacity, SizingCapacity
from kvscale.engines.buckets import vllm_token_buckets
from kvscale.sim.compare import make_policies
from kvscale.sim.fit import fit_trace
from kvscale.sim.generators import generate, parse_load
from kvscale.sim.online import search_capacity
from kvscale.sim.online_refresh import INTERVAL_S, OnlineRefresh, observed_window
from kvscale.sim.policies import KvscalePolicy
from kvscale.sim.run import SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo

CAT = default_catalog()


def poisson(rate: float, start_s: float, end_s: float, prompt: int, output: int, seed: int) -> list[TraceRequest]:
    rng, t = random.Random(seed), start_s
    out: list[TraceRequest] = []
    while True:
        t += rng.expovariate(rate)
        if t >= end_s:
            return out
        out.append(TraceRequest(t, max(1, round(prompt * rng.uniform(0.5, 1.5))), output))


def setup_8b() -> SimSetup:
    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu("H100-SXM"))
    return SimSetup(cfg, Slo(ttft_s=1.0, tpot_s=0.05), max_batch=64, cold_start_s=60.0, initial_replicas=2)


def test_the_window_is_the_past_as_the_engines_count_it() -> None:
    trace = poisson(4.0, 0.0, 1200.0, 600, 100, seed=1)
    times = [r.arrival_s for r in trace]
    workload, counts = observed_window(trace, times, 900.0, 600.0, 30.0, 8192)
    past = [r for r in trace if 300.0 <= r.arrival_s < 900.0]
    assert sum(counts) == len(past) and len(counts) == 20
    assert workload.requests_per_s == pytest.approx(len(past) / 600.0)
    assert workload.input_tokens_mean == pytest.approx(sum(r.input_tokens for r in past) / len(past))
    assert workload.prompt_lengths is not None and workload.prompt_lengths.total == len(past)
    # vLLM's 1-2-5 buckets, the last open
    assert workload.prompt_lengths.upper_bounds[:-1] == vllm_token_buckets(8192)
    assert math.isinf(workload.prompt_lengths.upper_bounds[-1])
    # a request arriving after `now` changes nothing: the search never sees the future
    later = [*trace, TraceRequest(950.0, 100_000, 10)]
    again, again_counts = observed_window(later, [r.arrival_s for r in later], 900.0, 600.0, 30.0, 8192)
    assert again == workload and again_counts == counts


def test_the_simulated_policy_acts_on_the_capacity_its_search_confirms() -> None:
    setup = setup_8b()
    trace = poisson(6.0, 0.0, 1500.0, 800, 120, seed=2)
    model = SizingCapacity(setup.cfg, setup.slo, setup.max_batch, None)
    (policy,) = make_policies(("kvscale",), setup, model, trace, 0.1, None, 16)
    assert isinstance(policy, KvscalePolicy) and isinstance(policy.refresh, OnlineRefresh)
    assert policy.capacity is model  # the model's figure before the first search
    simulate(setup, Source(trace), policy)
    searches = policy.refresh.searches
    assert [round(t) for t, _ in searches][:4] == [300, 600, 900, 1200]  # every interval
    assert all(found.requests >= 200 for _, found in searches)
    confirmed = [found.confirmed_rate_per_s for _, found in searches if found.confirmed_rate_per_s]
    assert confirmed, [found.reason for _, found in searches]
    # what it acts on after the last search: the latest confirmed figure where it raised the
    # model's for that traffic, the model's where it did not; a search confirming nothing keeps it
    expected = None
    for _, found in searches:
        if found.confirmed_rate_per_s is not None:
            expected = found if found.confirmed_rate_per_s > found.analytic_rate_per_s else None
    if expected is None:
        assert policy.capacity is model
    else:
        assert isinstance(policy.capacity, ConfirmedCapacity)
        assert policy.capacity.confirmed_rate_per_s == pytest.approx(expected.confirmed_rate_per_s)
        assert policy.capacity.analytic_rate_per_s == pytest.approx(expected.analytic_rate_per_s)


def test_without_online_search_or_trace_the_capacity_stays_as_given() -> None:
    setup = setup_8b()
    trace = poisson(6.0, 0.0, 700.0, 800, 120, seed=3)
    model = SizingCapacity(setup.cfg, setup.slo, setup.max_batch, None)
    (off,) = make_policies(("kvscale",), setup, model, trace, 0.1, None, 16, online=False)
    assert isinstance(off, KvscalePolicy) and off.refresh is None
    simulate(setup, Source(trace), off)
    assert off.capacity is model


def test_too_few_requests_keep_the_capacity_acted_on() -> None:
    setup = setup_8b()
    trace = poisson(0.2, 0.0, 700.0, 800, 120, seed=4)  # ~120 requests per 10-minute window
    model = SizingCapacity(setup.cfg, setup.slo, setup.max_batch, None)
    refresh = OnlineRefresh(setup, model, trace)
    assert not refresh.due(INTERVAL_S - 1.0) and refresh.due(INTERVAL_S)
    assert refresh.search(INTERVAL_S) is None
    (_, found) = refresh.searches[0]
    assert found.confirmed_rate_per_s is None and "fewer than the 200" in found.reason
    assert not refresh.due(INTERVAL_S + 1.0)  # the next one is an interval later


def test_a_quiet_window_does_not_lend_its_ratio_to_the_bursts_the_plan_expects() -> None:
    """The confirmed figure is set against the model on the replay's own traffic: a Poisson
    window says how far the model is off for Poisson traffic, not that a replica carries bursts
    at the quiet window's rate (against the plan's bursty shape it read as 3-5x)."""
    setup = setup_8b()
    spikes = generate(parse_load("batches:base=2,every=2m,size=150,spread=3s,input=800,output=100,duration=30m"), 5)
    bursty = fit_trace(spikes).workload
    model = SizingCapacity(setup.cfg, setup.slo, setup.max_batch, bursty)
    quiet = poisson(4.0, 0.0, 600.0, 800, 100, seed=6)
    found = search_capacity(setup.cfg, setup.slo, setup.max_batch, model, quiet, len(quiet))
    assert found.confirmed_rate_per_s is not None, found.reason
    own = SizingCapacity(
        setup.cfg, setup.slo, setup.max_batch, fit_trace(quiet).workload.at_rate(found.replay_rate_per_s)
    )
    assert found.analytic_rate_per_s == pytest.approx(
        own.rate_per_replica(found.input_tokens, found.output_tokens, found.replay_rate_per_s)
    )
    confirmed = ConfirmedCapacity(
        model,
        found.confirmed_rate_per_s,
        found.input_tokens,
        found.output_tokens,
        found.replay_rate_per_s,
        found.analytic_rate_per_s,
    )
    at_plan = (bursty.input_tokens, bursty.output_tokens, bursty.requests_per_s)
    ratio = found.confirmed_rate_per_s / found.analytic_rate_per_s
    assert confirmed.rate_per_replica(*at_plan) == pytest.approx(ratio * model.rate_per_replica(*at_plan))
    # against the bursty shape's own figure at the quiet traffic, the ratio would have been larger
    naive = ConfirmedCapacity(
        model, found.confirmed_rate_per_s, found.input_tokens, found.output_tokens, found.replay_rate_per_s
    )
    assert naive.rate_per_replica(*at_plan) > 1.5 * confirmed.rate_per_replica(*at_plan)
