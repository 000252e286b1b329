"""The stand-in hands each request to its engine at the request's own arrival time, as a real
engine sees it, not at the serve loop's next tick: a lone request waits for nothing, and its
prefill time (vLLM's scheduled to first token) is one step carrying its prompt. Calibration
reads the prefill time; requests bunched per tick would make it several prompts' worth."""

from __future__ import annotations

import statistics

from kvscale.sim.engine import SimRequest, StepTimes
from kvscale.sim.fleet import FleetSpec
from kvscale.sim.load_profile import parse_profile
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.roofline import step
from kvscale.standin.fleet import PodFleet, PodStats

TICK_S = 0.5  # the serve loop's tick in simulated time (0.1 s wall at 5x)


def test_requests_reach_the_engine_at_their_arrival_not_at_the_tick() -> None:
    cat = default_catalog()
    cfg = ServingConfig.build(cat, cat.model("llama-3.1-8b"), cat.gpu("H100-SXM"))
    clock = {"t": 0.0}
    fleet = PodFleet(
        FleetSpec(256, cfg.memory.kv_capacity_tokens, cfg.max_num_batched_tokens, 1, 0.0),
        StepTimes(cfg),
        parse_profile("constant:2", 512, 16, seed=5),
        clock=lambda: clock["t"],
    )
    fleet.sync_pods(["p"])
    done: list[SimRequest] = []
    original = PodStats.record

    def record(self: PodStats, r: SimRequest) -> None:
        done.append(r)
        original(self, r)

    PodStats.record = record  # type: ignore[method-assign]
    try:
        while clock["t"] < 300:
            clock["t"] += TICK_S
            fleet.tick()
    finally:
        PodStats.record = original  # type: ignore[method-assign]
    assert len(done) > 400
    one_prompt = step(cfg, 0.0, 0.0, 512.0, 256.0).seconds
    # A request at 2 req/s mostly finds the engine idle (16 tokens take ~0.15 s): it is
    # scheduled on arrival, and its prefill is one step of its own prompt.
    assert all(r.scheduled_s >= r.arrival_s for r in done)  # never before it arrived
    assert statistics.median(r.scheduled_s - r.arrival_s for r in done) < 0.01
    assert statistics.median(r.prefill_s for r in done) < 1.5 * one_prompt
    assert statistics.fmean(r.ttft_s for r in done) < 0.2 * TICK_S


def test_sim_serve_speed_runs_the_engines_clock_faster() -> None:
    import time

    from typer.testing import CliRunner

    from kvscale.cli import app
    from kvscale.standin.serve import pod_fleet
    from tests.unit.test_standin import CAT, PLAN, SPEC

    obj = {"spec": SPEC, "status": {"plan": PLAN}}
    before = time.monotonic()
    fleet, _ = pod_fleet(CAT, obj, "constant:1", 0.0, 0, speed=10.0)
    after = time.monotonic()
    while time.monotonic() - after < 0.05:  # some wall time passes (polled)
        pass
    t0 = time.monotonic()
    now = fleet.now()
    t1 = time.monotonic()
    assert 10.0 * (t0 - after) <= now <= 10.0 * (t1 - before)
    for bad in ("0", "-1", "nan", "1000"):
        result = CliRunner().invoke(app, ["sim", "serve", "--name", "x", "--speed", bad])
        assert result.exit_code == 2 and "--speed" in result.output, result.output
