"""Issue 37 item 4: the simulated fleet steps only replicas with work (an idle replica is parked
and its clock caught up when it is next needed), keeps its list of serving replicas between
changes, and the endpoint picker reads a replica's room only when its load is the lowest left.
None of it may change a result: each run here is compared, request by request and figure by
figure, with the fleet as it was, which advanced every replica at every event and read every
replica's room for every request."""

import math
import random

import pytest

from kvscale.sim.engine import KV_WATERMARK, Replica, SimRequest, StepTimes
from kvscale.sim.fleet import Fleet, FleetSpec
from kvscale.sim.policies import SchedulePolicy, StaticPolicy
from kvscale.sim.run import SimResult, SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo

CAT = default_catalog()
CFG = ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu("L40S"), "bf16", 1)
SLO = Slo(1.0, 0.05, 99.0)


class EveryReplica(Fleet):
    """The fleet before issue 37 item 4: every replica advanced at every event, the picker
    reading every serving replica's room."""

    def serving(self, now_s: float) -> list[Replica]:
        return [r for r in self.replicas if r.stopped_s is None and r.ready_s <= now_s and not r.draining]

    def _serving_now(self, now_s: float) -> list[Replica]:
        return self.serving(now_s)

    def _advance_replicas(self, now_s: float, finished: list[SimRequest], stop_after_finish: bool = False) -> None:
        for replica in self.replicas:
            if replica.stopped_s is not None or replica.ready_s > now_s:
                continue
            until = min(now_s, replica.drain_deadline_s)
            if replica.clock < until:
                if replica.running or replica.waiting:
                    replica.advance_to(until, finished, stop_after_finish)
                else:
                    replica.clock = until
            if replica.draining and replica.idle:
                replica.stopped_s = max(replica.clock, until)
            elif replica.draining and replica.clock >= replica.drain_deadline_s:
                self._cut(replica, replica.drain_deadline_s)

    def _gateway_send(self, now_s: float) -> None:
        rooms = {r.id: self._room(r) for r in self.serving(now_s)}
        by_id = {r.id: r for r in self.serving(now_s)}
        while self.unrouted and rooms:
            request = self.unrouted[0]
            need = request.input_tokens + request.generated + 1
            fits = [i for i, (slots, kv) in rooms.items() if slots > 0 and kv >= need]
            if not fits:
                idle = [i for i in rooms if by_id[i].idle]
                if not idle:
                    return
                fits = idle[:1]
            chosen = min(fits, key=lambda i: (by_id[i].load, -rooms[i][1], i))
            by_id[chosen].enqueue(self.unrouted.popleft())
            slots, kv = rooms[chosen]
            rooms[chosen] = (slots - 1, kv - need)


def _trace(seed: int, n: int, rate: float, prompt_max: int) -> list[TraceRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(TraceRequest(t, rng.randint(100, prompt_max), rng.randint(5, 400)))
    return out


def _figures(result: SimResult) -> tuple[object, ...]:
    per_request = [
        (r.replica, r.first_token_s, r.finish_s, r.scheduled_s, r.preemptions, r.lost) for r in result.requests
    ]
    return (
        per_request,
        result.gpu_hours,
        result.scale_events,
        result.preemptions,
        result.duration_s,
        sorted(result.token_gaps.items()),
        result.replica_spans,
        [(p.time_s, p.desired, p.ready, p.ttft_p_s, p.tpot_p_s, p.arrival_rate_per_s) for p in result.timeline],
    )


def _both(
    monkeypatch: pytest.MonkeyPatch,
    setup: SimSetup,
    trace: list[TraceRequest] | None,
    policy: object,
    closed: tuple[int, int, int, float] | None = None,
) -> None:
    fast = simulate(setup, Source(trace, closed), policy)  # type: ignore[arg-type]
    with monkeypatch.context() as m:
        m.setattr("kvscale.sim.run.Fleet", EveryReplica)
        slow = simulate(setup, Source(trace, closed), policy)  # type: ignore[arg-type]
    assert _figures(fast) == _figures(slow)


@pytest.mark.parametrize("routing", ["service", "round-robin", "gateway"])
def test_a_scaled_fleet_gives_what_stepping_every_replica_gives(monkeypatch: pytest.MonkeyPatch, routing: str) -> None:
    # Scale-ups with cold starts, scale-downs that drain (the drain bound cuts some), a fleet
    # mostly idle then saturated: replicas park, wake on a request, and are woken by scales.
    trace = _trace(3, 1200, 6.0, 6000)
    schedule = [(0.0, 6), (30.0, 2), (60.0, 12), (90.0, 3), (120.0, 9), (150.0, 1), (170.0, 5)]
    setup = SimSetup(CFG, SLO, 16, 20.0, 6, routing=routing, cold_start_jitter=0.3, seed=5)
    _both(monkeypatch, setup, trace, SchedulePolicy(schedule))


@pytest.mark.parametrize("routing", ["service", "gateway"])
def test_a_static_fleet_of_many_mostly_idle_replicas_gives_the_same(
    monkeypatch: pytest.MonkeyPatch, routing: str
) -> None:
    # plan --trace's check: fixed warm fleets far larger than the load needs, and prompts
    # larger than a replica's free cache (served alone by an idle replica behind the gateway).
    trace = _trace(11, 800, 4.0, 20000)
    big = math.floor(CFG.memory.kv_capacity_tokens * (1 - KV_WATERMARK)) + 10
    trace[100] = TraceRequest(trace[100].arrival_s, big, 20)
    setup = SimSetup(CFG, SLO, 8, 0.0, 60, routing=routing)
    _both(monkeypatch, setup, trace, StaticPolicy(60))


@pytest.mark.parametrize("routing", ["service", "gateway"])
def test_a_closed_loop_gives_the_same(monkeypatch: pytest.MonkeyPatch, routing: str) -> None:
    # A closed loop stops a replica at the step a request finishes in (its clock short of the
    # event): such a replica is not parked until an advance reaches the event.
    setup = SimSetup(CFG, SLO, 8, 0.0, 12, routing=routing)
    _both(monkeypatch, setup, None, StaticPolicy(12), closed=(20, 1500, 120, 120.0))


def test_a_replica_stopped_from_outside_leaves_the_serving_list() -> None:
    # The stand-in stops a replica by setting stopped_s itself (its pod went away): the kept
    # serving list must not route to it, nor the stepping wake it.
    fleet = Fleet(FleetSpec(8, CFG.memory.kv_capacity_tokens, 8192, 1, cold_start_s=30.0), StepTimes(CFG))
    fleet.start(3, 0.0, warm=True)
    fleet.advance_to(1.0, [])
    assert [r.id for r in fleet.serving(1.0)] == [0, 1, 2]
    fleet.replicas[1].stopped_s = 1.0
    assert [r.id for r in fleet.serving(1.5)] == [0, 2]
    for i in range(50):
        fleet.route(SimRequest(i, 1.5, 100, 10), 1.5)
    fleet.advance_to(5.0, [])
    assert not fleet.replicas[1].waiting and fleet.replicas[1].stopped_s == 1.0
    assert fleet.replicas[0].clock >= 5.0 and fleet.replicas[2].clock >= 5.0
