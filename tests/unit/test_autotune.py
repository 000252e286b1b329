"""Holding tuned on the service's own history (issue 35, part 2): the choice among replayed
candidates, the causal trailing floor, and the simulator's tuner replaying only the past."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

import kvscale.sim.autotune as sim_autotune
from kvscale.autoscaling.autotune import (
    TRAILING_MARGIN,
    HoldingSettings,
    Trial,
    before_history,
    candidates,
    choose,
    tune,
)
from kvscale.autoscaling.policy import PolicyConfig, PolicyState, decide
from kvscale.sim.autotune import TunedKvscalePolicy
from kvscale.sim.run import SimResult, SimSetup, Source
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo
from tests.unit.test_policy import CONFIG, FixedCapacity, obs

A = HoldingSettings("a", 0.95, 1200.0, 0.1)
B = HoldingSettings("b", 0.9, 600.0, 0.05)
C = HoldingSettings("c", 1.0, 1800.0, 0.25)


def test_the_cheapest_setting_that_met_the_goal_with_its_margin_is_chosen() -> None:
    trials = [Trial(A, 0.996, 3.0), Trial(B, 0.994, 2.0), Trial(C, 0.999, 4.0)]
    choice = choose(trials, goal=0.99, margin=0.005)
    # B is cheapest but misses 99.5%: A is the cheapest that met it
    assert choice.settings is A
    assert "2/3 settings meeting 99.50%" in choice.reason
    assert choose(trials, goal=0.99, margin=0.0).settings is B  # no margin: B met 99%


def test_when_none_met_the_goal_the_closest_is_chosen() -> None:
    trials = [Trial(A, 0.95, 3.0), Trial(B, 0.97, 5.0), Trial(C, 0.97, 4.0)]
    choice = choose(trials, goal=0.99)
    assert choice.settings is C  # the highest attainment, the cheaper of the two
    assert "none of 3 settings met 99.20% on the replayed past: the closest" in choice.reason
    with pytest.raises(ValueError):
        choose([], goal=0.99)


def test_tune_replays_each_candidate_applied_to_the_config() -> None:
    seen: list[PolicyConfig] = []

    def replay(config: PolicyConfig) -> tuple[float, float]:
        seen.append(config)
        # More headroom costs more and meets more; no headroom misses.
        return (0.99 + min(config.headroom, 0.009), 1.0 + config.headroom + config.trailing_margin)

    choice = tune(CONFIG, replay, goal=0.99)
    tried = candidates(CONFIG)
    assert [(c.burst_quantile, c.burst_hold_s, c.headroom, c.trailing_margin) for c in seen] == [
        (s.burst_quantile, s.burst_hold_s, s.headroom, s.trailing_margin) for s in tried
    ]
    assert len({(c.burst_quantile, c.burst_hold_s, c.headroom, c.trailing_margin) for c in seen}) == len(tried)
    # "lean" (half the headroom, 0.05 >= the margin) is the cheapest meeting 99.5%; "thin" (none) misses
    assert choice.settings.name == "lean"
    assert [t.settings.name for t in choice.trials] == [s.name for s in tried]


def test_the_trailing_floor_holds_the_largest_recent_per_minute_rate_times_its_margin() -> None:
    floored = before_history(CONFIG).apply(CONFIG)
    assert floored.trailing_margin == TRAILING_MARGIN and CONFIG.trailing_margin == 0.0
    history = [obs(15.0, 10.0, 8), *(obs(15.0 * i, 2.0, 8) for i in range(2, 8))]

    def last(config: PolicyConfig, observations: list) -> tuple[int, str]:  # type: ignore[type-arg]
        state = PolicyState()
        for o in observations:
            decision, state = decide(o, state, FixedCapacity(), config)
        return decision.replicas, decision.reason

    plain, _ = last(replace(CONFIG, scale_down_stabilization_s=15.0), history)
    held, why = last(replace(floored, scale_down_stabilization_s=15.0), history)
    assert plain < held
    assert held == math.ceil(TRAILING_MARGIN * 10.0 * (1 + CONFIG.headroom) / 2.0 - 1e-9)  # 8
    assert "trailing floor 1.3 x the largest per-minute rate of the last 600s" in why
    # Past the lookback the peak no longer counts
    later = [*history, *(obs(15.0 * i, 2.0, 8) for i in range(8, 60))]
    assert last(replace(floored, scale_down_stabilization_s=15.0), later)[0] == plain
    with pytest.raises(ValueError):
        replace(CONFIG, trailing_margin=-1.0)


def _setup() -> SimSetup:
    cat = default_catalog()
    cfg = ServingConfig.build(cat, cat.model("llama-3.1-8b"), cat.gpu("H100-SXM"), "bf16", 1)
    return SimSetup(cfg, Slo(2.0, 0.06, 99.0), max_batch=64, cold_start_s=120.0, initial_replicas=2)


def test_the_simulators_tuner_replays_only_arrivals_before_each_retune(monkeypatch: pytest.MonkeyPatch) -> None:
    # (re-tune time, requests, last arrival in the replay, replicas it starts warm with)
    replayed: list[tuple[float, int, float, int]] = []

    def fake_simulate(setup: SimSetup, source: Source, policy: object, **_: object) -> SimResult:
        times = sorted(t for t, _, _ in source._heap)
        replayed.append((now[0], len(times), times[-1], setup.initial_replicas))
        spend = 1.0 + policy.config.headroom  # type: ignore[attr-defined]
        return SimResult("x", [], spend, 0.0, 0, 0, 0.0, replica_spans=[(0.0, spend * 3600.0)])

    monkeypatch.setattr(sim_autotune, "simulate", fake_simulate)
    trace = [TraceRequest(float(t), 500, 50) for t in range(0, 4000)]  # one a second
    policy = TunedKvscalePolicy(FixedCapacity(), CONFIG, setup=_setup(), trace=trace)
    assert policy.choice is not None and policy.choice.settings.name == "trailing"  # before history
    assert policy.config.trailing_margin == TRAILING_MARGIN
    now = [0.0]
    ran = [(0.0, 2)]
    for i in range(1, 200):
        now[0] = 15.0 * i
        ran.append((now[0], policy.decide(obs(now[0], 1.0 + (i % 40 == 0) * 20.0, 3)).replicas))
    assert [t for t, _ in policy.choices] == [900.0, 1800.0, 2700.0]  # every 15 min
    assert len({n for _, n in ran}) > 1
    for when, count, last_arrival, warm in replayed:
        start = max(0.0, when - sim_autotune.REPLAY_S)
        assert last_arrival + start < when  # nothing from the re-tune point on
        assert warm == [n for t, n in ran if t <= start][-1]  # warm at the count the policy ran then
        assert count == sum(1 for r in trace if start <= r.arrival_s < when)
    # Every trial meets the goal (no requests, attainment 1): the cheapest, no headroom, runs
    assert policy.choice.settings.name == "thin" and policy.config.headroom == 0.0
    assert "[holding thin" in policy.decide(obs(15.0 * 200, 1.0, 3)).reason


def test_simulate_runs_the_tuner_only_when_named_and_only_on_a_trace() -> None:
    from typer.testing import CliRunner

    from kvscale.cli import app
    from kvscale.sim.compare import OPT_IN_NAMES, POLICY_NAMES

    assert "kvscale-tuned" in OPT_IN_NAMES and "kvscale-tuned" not in POLICY_NAMES  # `all` leaves it out
    base = ["simulate", "-m", "llama-3.1-8b", "--gpu", "H100-SXM", "--ttft", "2s", "--tpot", "60ms"]
    closed = CliRunner().invoke(
        app,
        [
            *base,
            "--concurrency",
            "4",
            "--input",
            "500",
            "--output",
            "50",
            "--duration",
            "60s",
            "--policy",
            "kvscale-tuned",
        ],
    )
    assert closed.exit_code != 0 and "kvscale-tuned needs a trace" in closed.output
    unknown = CliRunner().invoke(
        app, [*base, "--concurrency", "4", "--input", "500", "--output", "50", "--policy", "tuned"]
    )
    assert unknown.exit_code == 2 and "kvscale-tuned" in unknown.output
