"""Routing in the simulated fleet: a plain Service pins a request to its replica; the
gateway holds requests and hands them to replicas with room."""

import random

import pytest

from kvscale.sim.engine import SimRequest, StepTimes
from kvscale.sim.fleet import Fleet, FleetSpec, RoutingError, check_routing
from kvscale.sim.policies import StaticPolicy
from kvscale.sim.report import summary
from kvscale.sim.run import SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo

CAT = default_catalog()
CFG = ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu("L40S"), "bf16", 1)
SLO = Slo(1.0, 0.05, 99.0)


def spec(routing: str, max_batch: int = 8) -> FleetSpec:
    return FleetSpec(max_batch, CFG.memory.kv_capacity_tokens, 8192, 1, cold_start_s=30.0, routing=routing)


def test_unknown_routing_is_refused_with_the_choices() -> None:
    with pytest.raises(RoutingError, match="service, round-robin, gateway"):
        check_routing("random")


def test_service_keeps_a_queued_request_on_its_replica_when_a_new_one_starts() -> None:
    fleet = Fleet(spec("service"), StepTimes(CFG))
    fleet.start(1, 0.0, warm=True)
    finished: list[SimRequest] = []
    requests = [SimRequest(i, 0.0, 2000, 200) for i in range(40)]  # 5x the batch limit
    for r in requests:
        fleet.route(r, 0.0)
    fleet.start(1, 0.0, warm=True)  # a second replica, ready at once, after the queue formed
    fleet.advance_to(0.5, finished)
    assert all(r.replica == 0 for r in requests)
    assert len(fleet.replicas[1].waiting) == 0 and not fleet.replicas[1].running


def test_gateway_hands_the_backlog_to_a_replica_that_becomes_ready() -> None:
    fleet = Fleet(spec("gateway"), StepTimes(CFG))
    fleet.start(1, 0.0, warm=True)
    finished: list[SimRequest] = []
    requests = [SimRequest(i, 0.0, 2000, 200) for i in range(40)]
    for r in requests:
        fleet.route(r, 0.0)
    assert len(fleet.unrouted) == 40 - 8  # the gateway sent only what the replica could admit
    fleet.start(1, 0.0, warm=True)
    fleet.advance_to(0.5, finished)
    assert sum(1 for r in requests if r.replica == 1) >= 8  # the new replica took from the backlog
    held = [r for r in requests if r.replica == -1]
    assert held == list(fleet.unrouted)  # the rest still waits at the gateway, in arrival order


def test_service_spreads_requests_at_random_and_round_robin_in_turn() -> None:
    for routing in ("service", "round-robin"):
        fleet = Fleet(spec(routing, max_batch=256), StepTimes(CFG))
        fleet.start(4, 0.0, warm=True)
        for i in range(400):
            fleet.route(SimRequest(i, 0.0, 10, 10), 0.0)
        loads = [r.load for r in fleet.replicas]
        assert sum(loads) == 400
        if routing == "round-robin":
            assert loads == [100, 100, 100, 100]
        else:
            assert min(loads) > 60 and loads != [100, 100, 100, 100]


def test_routing_is_seeded_and_the_gateway_beats_a_service_under_overload() -> None:
    rng = random.Random(7)
    t, trace = 0.0, []
    for _ in range(1500):
        t += rng.expovariate(25.0)
        trace.append(TraceRequest(t, rng.randint(200, 3000), rng.randint(20, 300)))
    results = {}
    for routing in ("service", "gateway"):
        setup = SimSetup(CFG, SLO, 128, cold_start_s=60.0, initial_replicas=3, routing=routing, seed=3)
        first = summary(simulate(setup, Source(trace), StaticPolicy(3)), SLO)
        again = summary(simulate(setup, Source(trace), StaticPolicy(3)), SLO)
        assert first == again
        results[routing] = first
    assert results["gateway"]["ttft_p95_ms"] <= results["service"]["ttft_p95_ms"]
