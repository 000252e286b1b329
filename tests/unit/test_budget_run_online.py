"""A fleet replay (kvscale simulate --fleet) runs the operator's online capacity search as
`kvscale simulate` does: each service's kvscale policy searches its own past window every
capacity interval, on the GPU type it runs on, and acts on the confirmed capacity where it is
above the model's (kvscale.control.capacity.raises); a move to another GPU type drops what was
confirmed on the old one."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

import kvscale.sim.budget_run as budget_run
from kvscale.autoscaling.budget import Budget
from kvscale.autoscaling.capacity import ConfirmedCapacity, SizingCapacity
from kvscale.autoscaling.policy import Capacity
from kvscale.autoscaling.tick import BudgetView, TickDecision, TickInput, tick_all
from kvscale.cli.simulate_fleet import fleet_services
from kvscale.sim.online import OnlineSearch
from kvscale.sim.online_refresh import INTERVAL_S, OnlineRefresh
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog

CAT = default_catalog()

# low (3,000-token prompts at 2 req/s) starts on L40S, where the replay carries more than the
# model says; top's load surges at 400 s and takes the L40S, so low moves to H100.
FLEET = """\
budget: {L40S: 4, H100-SXM: 4}
routing: gateway
services:
  - name: top
    model: llama-3.1-8b
    priority: 10
    gpus: [L40S]
    slo: {ttft: 2s, tpot: 60ms}
    load: poisson:rate=8,duration=11m,input=1000,output=100
  - name: low
    model: llama-3.1-8b
    gpus: [L40S, H100-SXM]
    slo: {ttft: 2s, tpot: 60ms}
    load: poisson:rate=2,duration=11m,input=3000,output=200
"""


def poisson(rate: float, start_s: float, end_s: float, prompt: int, output: int, seed: int) -> list[TraceRequest]:
    rng, t = random.Random(seed), start_s
    out: list[TraceRequest] = []
    while True:
        t += rng.expovariate(rate)
        if t >= end_s:
            return out
        out.append(TraceRequest(t, max(1, round(prompt * rng.uniform(0.5, 1.5))), output))


def fleet(tmp_path: Path) -> tuple[Budget, list[budget_run.FleetService]]:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    budget, services, _ = fleet_services(path, CAT)
    top, low = services
    surge = poisson(0.2, 0.0, 400.0, 1000, 100, 1) + poisson(10.0, 400.0, 660.0, 1000, 100, 2)
    return budget, [replace(top, trace=surge), low]


Searched = tuple[Sequence[TraceRequest], str, float, OnlineSearch]  # the trace searched, GPU type, time, outcome
Ticked = tuple[str, float, Capacity, str]  # service, time, the capacity it acts on, the GPU type it runs on


def spy(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Searched], list[Ticked]]:
    searched: list[Searched] = []
    ticked: list[Ticked] = []
    search = OnlineRefresh.search

    def spied_search(self: OnlineRefresh, now_s: float) -> object:
        out = search(self, now_s)
        searched.append((self.trace, self.setup.cfg.gpu.name, now_s, self.searches[-1][1]))
        return out

    def spied_tick_all(inputs: Sequence[TickInput], view: BudgetView | None = None) -> list[TickDecision]:
        for i in inputs:
            assert i.seat is not None
            ticked.append((i.seat.name, i.obs.time_s, i.capacity, i.seat.options[i.seat.active].gpu_type))
        return tick_all(inputs, view)

    monkeypatch.setattr(OnlineRefresh, "search", spied_search)
    monkeypatch.setattr(budget_run, "tick_all", spied_tick_all)
    return searched, ticked


def gpu_of(capacity: Capacity) -> str:
    model = capacity.model if isinstance(capacity, ConfirmedCapacity) else capacity
    assert isinstance(model, SizingCapacity)
    return model.cfg.gpu.name


def test_each_service_searches_its_own_window_every_interval_and_acts_on_what_raises_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget, services = fleet(tmp_path)
    low = services[1]
    searched, ticked = spy(monkeypatch)
    result = budget_run.simulate_fleet(budget, services)
    by_name = {r.service.name: r for r in result.services}
    assert by_name["low"].moves == 1  # the scenario: low moved from L40S to H100

    # Each service its own refresh over its own arrivals, every interval (300 s, 600 s).
    assert all(any(trace is s.trace for s in services) for trace, _, _, _ in searched)
    for svc in services:
        times = [t for trace, _, t, _ in searched if trace is svc.trace]
        assert times == [INTERVAL_S, 2 * INTERVAL_S], svc.name
    low_searches = [(gpu, t, found) for trace, gpu, t, found in searched if trace is low.trace]
    # Each on the GPU type the service ran on then: L40S before the move, H100 after.
    assert [gpu for gpu, _, _ in low_searches] == ["L40S", "H100-SXM"]
    _, _, first = low_searches[0]
    assert first.confirmed_rate_per_s is not None and first.confirmed_rate_per_s > first.analytic_rate_per_s

    low_ticks = [(t, cap, gpu) for name, t, cap, gpu in ticked if name == "low"]
    before = [cap for t, cap, _ in low_ticks if t < INTERVAL_S]
    assert before and all(isinstance(c, SizingCapacity) and gpu_of(c) == "L40S" for c in before)
    # From the first search until the move, it acts on the confirmed figure, above the model's.
    confirmed = [(t, cap) for t, cap, gpu in low_ticks if t >= INTERVAL_S and gpu == "L40S"]
    assert confirmed
    for _, cap in confirmed:
        assert isinstance(cap, ConfirmedCapacity)
        assert cap.confirmed_rate_per_s == pytest.approx(first.confirmed_rate_per_s)
        inp = sum(r.input_tokens for r in low.trace) / len(low.trace)
        out = sum(r.output_tokens for r in low.trace) / len(low.trace)
        assert cap.rate_per_replica(inp, out, 2.0) > cap.model.rate_per_replica(inp, out, 2.0)
    # After the move, until the next search: the H100's model (the L40S's confirmation dropped).
    moved = [cap for t, cap, gpu in low_ticks if gpu == "H100-SXM" and t < 2 * INTERVAL_S]
    assert moved and all(isinstance(c, SizingCapacity) and gpu_of(c) == "H100-SXM" for c in moved)
    # After the H100's search: what it says, by the operator's rule.
    _, _, second = low_searches[1]
    after = [cap for t, cap, _ in low_ticks if t >= 2 * INTERVAL_S]
    assert after and all(gpu_of(c) == "H100-SXM" for c in after)
    raised = second.confirmed_rate_per_s is not None and second.confirmed_rate_per_s > second.analytic_rate_per_s
    assert all(isinstance(c, ConfirmedCapacity) == raised for c in after)


def test_without_online_search_the_fleet_acts_on_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    budget, services = fleet(tmp_path)
    searched, ticked = spy(monkeypatch)
    budget_run.simulate_fleet(budget, services, online=False)
    assert not searched
    assert ticked and all(isinstance(cap, SizingCapacity) for _, _, cap, _ in ticked)
