"""Drain-aware scale-down and preemption with a bound (issues 27 and 29), in the simulator and
in the pure rule the operator uses: a draining replica takes no new request, its in-flight
requests finish within the bound or are cut and counted, the least-loaded replicas go first,
a budget's preemption frees GPUs within its grace while the lower priority stays saturated,
and a fleet run ends at the loads' end plus its drain."""

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscale.api.budget import parse_budget_spec
from kvscale.api.models import Condition, InferenceServiceStatus
from kvscale.autoscaling.budget import Budget
from kvscale.autoscaling.drain import (
    DEFAULT_PREEMPTION_GRACE_S,
    DELETION_COST_MAX,
    deletion_costs,
    drain_order,
    victims,
)
from kvscale.cli import app
from kvscale.control.budget import BudgetBook
from kvscale.control.drain import preempted, preemption_grace_s, scale_down_marks
from kvscale.control.inventory import EnginePod
from kvscale.control.resources import PRE_STOP_SLEEP_S, TERMINATION_GRACE_PERIOD_S
from kvscale.metrics.engines import ENGINES
from kvscale.metrics.promql import in_flight_by_pod
from kvscale.planner.search import PlanRequest, plan
from kvscale.sim.budget_run import FleetService, ServiceOption, simulate_fleet
from kvscale.sim.engine import SimRequest, StepTimes
from kvscale.sim.fleet import DRAIN_BOUND_S, Fleet
from kvscale.sim.run import SimSetup
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.workload import Slo, Workload

CAT = default_catalog()
SLO = Slo(1.0, 0.06, 95)


def option(gpu: str, rate: float, routing: str = "service", output: int = 60) -> ServiceOption:
    p = plan(
        CAT, PlanRequest(model=CAT.model("llama-3.1-8b"), workload=Workload(400, output, rate), slo=SLO, gpus=(gpu,))
    )
    assert p.chosen is not None
    c = p.chosen
    setup = SimSetup(c.config, SLO, c.prediction.max_batch, 60.0, c.prediction.replicas, routing=routing)
    return ServiceOption(setup, c.prediction.rate_per_replica_max)


def fleet_of(replicas: int, routing: str = "service", bound_s: float = DRAIN_BOUND_S) -> Fleet:
    setup = option("L40S", 5.0, routing).setup
    from dataclasses import replace

    fleet = Fleet(replace(setup.fleet_spec(), drain_bound_s=bound_s), StepTimes(setup.cfg))
    fleet.start(replicas, 0.0, warm=True)
    return fleet


def poisson(rate: float, duration_s: float, seed: int, start_s: float = 0.0, out: int = 60) -> list[TraceRequest]:
    rng, t = random.Random(seed), start_s
    trace: list[TraceRequest] = []
    while True:
        t += rng.expovariate(rate)
        if t >= start_s + duration_s:
            return trace
        trace.append(TraceRequest(t, 400, out))


# -- the operator's rule: pod-deletion-cost -------------------------------------------------


def test_the_least_loaded_replicas_drain_first_and_their_deletion_cost_is_lowest() -> None:
    in_flight = {"a": 7.0, "b": 0.0, "c": 3.0, "d": 3.0, "e": math.nan}
    assert drain_order(in_flight) == ["b", "c", "d", "a", "e"]  # ties by name; unknown load last
    assert victims(in_flight, keep=3) == ["b", "c"]
    assert victims(in_flight, keep=9) == [] and victims(in_flight, keep=0) == drain_order(in_flight)
    costs = deletion_costs(in_flight)
    assert costs == {"a": 7, "b": 0, "c": 3, "d": 3, "e": DELETION_COST_MAX}
    # The ReplicaSet controller deletes the lowest cost first: the same pods as victims().
    assert sorted(costs, key=lambda n: (costs[n], n))[:2] == victims(in_flight, keep=3)
    assert deletion_costs({"x": 2.2, "y": 1e12}) == {"x": 3, "y": DELETION_COST_MAX}  # an int32


def test_the_simulators_drain_bound_is_the_engine_pods_pre_stop() -> None:
    # In-flight requests have the preStop to finish (vLLM stops at once on SIGTERM), and the
    # engine the rest of the grace period to exit.
    assert DRAIN_BOUND_S == PRE_STOP_SLEEP_S < TERMINATION_GRACE_PERIOD_S


# -- the simulator's fleet ----------------------------------------------------------------


def test_no_request_reaches_a_draining_replica_and_the_least_loaded_drains() -> None:
    fleet = fleet_of(3, bound_s=3600.0)
    loads = {0: 6, 1: 1, 2: 4}
    n = 0
    for replica in fleet.replicas:
        for _ in range(loads[replica.id]):
            replica.enqueue(SimRequest(n, 0.0, 400, 2000))
            n += 1
    assert fleet.scale_to(2, 0.0) == 1
    (draining,) = [r for r in fleet.replicas if r.draining]
    assert draining.id == 1  # the least loaded
    later = [SimRequest(n + i, 0.1 + i * 0.01, 400, 60) for i in range(300)]
    for request in later:
        fleet.route(request, request.arrival_s)
    assert all(r.replica in (0, 2) for r in later)
    assert not any(r.replica == draining.id for r in later)


def test_requests_left_at_the_drain_bound_are_cut_and_counted() -> None:
    fleet = fleet_of(2, bound_s=5.0)
    long = [SimRequest(i, 0.0, 400, 20_000) for i in range(3)]  # far longer than 5 s of decode
    for request in long:
        fleet.replicas[0].enqueue(request)
    fleet.replicas[1].enqueue(SimRequest(9, 0.0, 400, 20_000))
    fleet.scale_to(1, 0.0)
    victim = next(r for r in fleet.replicas if r.draining)
    finished: list[SimRequest] = []
    fleet.advance_to(4.0, finished)
    assert victim.stopped_s is None and not fleet.lost  # still within its bound
    fleet.advance_to(30.0, finished)
    assert victim.stopped_s == pytest.approx(5.0)  # stopped at the bound, not when its queue ends
    lost = fleet.take_lost()
    assert [r.id for r in lost] == [9] and all(r.lost == "cut" and not r.done for r in lost)
    assert fleet.take_lost() == []  # counted once
    # GPU-hours include the drain: the victim's 5 s and the other's 30 s.
    assert fleet.gpu_hours() == pytest.approx((5.0 + 30.0) * fleet.spec.gpus_per_replica / 3600, rel=1e-3)


def test_behind_the_gateway_a_drained_replicas_queue_goes_back_to_the_others() -> None:
    fleet = fleet_of(2, routing="gateway", bound_s=5.0)
    queued = [SimRequest(i, 0.0, 400, 60) for i in range(4)]
    for request in queued:
        fleet.replicas[0].enqueue(request)
    fleet.replicas[1].enqueue(SimRequest(9, 0.0, 400, 60))
    fleet.replicas[1].enqueue(SimRequest(10, 0.0, 400, 60))
    fleet.scale_to(1, 0.0)  # replica 1 is the least loaded
    assert fleet.replicas[1].draining and [r.id for r in fleet.unrouted] == [9, 10]  # back at the gateway
    finished: list[SimRequest] = []
    fleet.advance_to(60.0, finished)
    assert {r.id for r in finished} == {0, 1, 2, 3, 9, 10} and not fleet.lost
    assert {r.id: r.replica for r in finished}[9] == 0 == {r.id: r.replica for r in finished}[10]


# -- a fleet under one budget ---------------------------------------------------------------


def test_a_fleet_run_ends_within_its_drain_and_counts_every_request_it_lost() -> None:
    # Far more than two replicas carry: a backlog that would take an hour to drain.
    svc = FleetService("flood", (option("L40S", 10.0),), poisson(80.0, 120, 1), max_replicas=2)
    result = simulate_fleet(Budget("b", {"L40S": 2}), [svc], drain_limit_s=60.0)
    last = max(r.arrival_s for r in svc.trace)
    assert result.duration_s <= last + 60.0
    flood = result.services[0]
    lost = flood.lost("cut") + flood.lost("rejected")
    assert lost > 0
    assert all(r.done or r.lost for r in flood.requests)  # served, cut or rejected: none silent
    assert sum(1 for r in flood.requests if r.done) + lost == len(flood.requests)


def test_preemption_frees_the_gpus_within_the_grace_while_the_low_priority_stays_saturated() -> None:
    grace_s, tick_s = 20.0, 15.0
    # batch saturates the budget from the start and stays saturated; chat arrives at 300 s.
    batch = FleetService("batch", (option("L40S", 10.0),), poisson(60.0, 900, 2, out=1000), priority=1)
    chat = FleetService("chat", (option("L40S", 10.0),), poisson(20.0, 400, 3, start_s=300.0), priority=100)
    # 5 L40S: chat's peak need alone (4 under the vllm-0.11 profile) and batch's floor of one
    result = simulate_fleet(Budget("b", {"L40S": 5}), [chat, batch], preemption_grace_s=grace_s)
    by = {r.service.name: r for r in result.services}
    assert by["batch"].preemptions > 0
    # Each of chat's waits for GPUs lasts at most the grace plus a tick or two (the allocation
    # and the start land on ticks), never until batch's queue drains (it never does): from each
    # tick where chat holds less than it wants, the time until it holds that want (or all the
    # budget leaves it beside batch's floor of one).
    timeline = by["chat"].timeline
    held = [sum(n for _, n in p.held) for p in timeline]
    waits = []
    for i, p in enumerate(timeline):
        if held[i] < p.wanted:
            target = min(p.wanted, 5 - 1)
            j = next((j for j in range(i, len(timeline)) if held[j] >= target), len(timeline))
            waits.append((j - i) * tick_s)
    assert waits and max(waits) <= grace_s + 2 * tick_s
    assert 0 < by["chat"].grant_wait_s <= by["batch"].preemptions * (grace_s + 2 * tick_s)
    assert by["batch"].lost("cut") > 0  # its preempted in-flight requests, counted
    for _, used in result.usage:
        assert used.get("L40S", 0) <= 5


# -- the operator's pure part ---------------------------------------------------------------


def _pod(name: str, deleting: bool = False) -> EnginePod:
    return EnginePod(name, "A100-80GB", "node-0", "Running", None, deleting)


def test_only_a_deployment_scale_down_marks_every_live_pod_by_its_load() -> None:
    pods = [_pod("p-a"), _pod("p-b"), _pod("p-c"), _pod("p-gone", deleting=True)]
    loads = {"p-a": 4.0, "p-b": 0.0, "p-gone": 9.0}  # p-c unreported
    assert scale_down_marks(2, "Deployment", 3, pods, loads) == {"p-a": 4, "p-b": 0, "p-c": DELETION_COST_MAX}
    assert scale_down_marks(3, "Deployment", 3, pods, loads) == {}  # not a scale-down
    assert scale_down_marks(4, "Deployment", 3, pods, loads) == {}
    assert scale_down_marks(None, "Deployment", 3, pods, loads) == {}
    assert scale_down_marks(1, "LeaderWorkerSet", 3, pods, loads) == {}  # groups go by index


def test_pods_the_budget_took_drain_within_its_grace() -> None:
    held = InferenceServiceStatus(conditions=[Condition(type="HeldByBudget", status="True", reason="Held")])
    free = InferenceServiceStatus(conditions=[Condition(type="HeldByBudget", status="False", reason="Within")])
    pods = [_pod("p-a"), _pod("p-b", deleting=True)]
    assert preempted(held, pods) == ("p-b",)
    assert preempted(free, pods) == () and preempted(InferenceServiceStatus(), pods) == ()
    book = BudgetBook()
    assert preemption_grace_s(book, "ns", {}) is None
    book.set_budget("b", parse_budget_spec({"limits": {"A100-80GB": 4}}))
    assert preemption_grace_s(book, "ns", {}) == DEFAULT_PREEMPTION_GRACE_S == 15
    book.set_budget("b", parse_budget_spec({"limits": {"A100-80GB": 4}, "preemptionGraceSeconds": 5}))
    assert preemption_grace_s(book, "ns", {}) == 5


def test_the_in_flight_query_reads_running_and_waiting_by_pod_of_one_service() -> None:
    q = in_flight_by_pod(ENGINES["vllm"], "team-a", "chat")
    assert q.startswith("sum by (pod) (")
    for name in ("vllm:num_requests_running", "vllm_num_requests_waiting"):
        assert name in q
    assert 'namespace="team-a"' in q and "chat" in q


# -- the report -------------------------------------------------------------------------------


def test_simulate_fleet_reports_what_each_service_lost_and_what_it_would_meet_alone(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        """
budget: {L40S: 4}
routing: gateway
preemption_grace: 10s
drain: 1m
services:
  - name: chat
    model: llama-3.1-8b
    priority: 100
    slo: {ttft: 1s, tpot: 60ms}
    load: steps:2@0,10@150,0@300
  - name: batch
    model: llama-3.1-8b
    priority: 1
    slo: {ttft: 1s, tpot: 60ms}
    load: poisson:rate=60,duration=5m,input=400,output=400
"""
    )
    result = CliRunner().invoke(app, ["simulate", "--fleet", str(fleet), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["preemption_grace_s"] == 10 and data["drain_s"] == 60
    assert data["duration_s"] <= 300 + 60
    rows = {r["name"]: r for r in data["services"]}
    for r in rows.values():
        assert {"alone_slo_attainment", "rejected", "cut", "preemptions", "grant_wait_s"} <= set(r)
    # batch, saturated, loses requests the report counts; chat, the top priority, takes its GPUs.
    assert rows["batch"]["rejected"] + rows["batch"]["cut"] > 0
    assert rows["batch"]["preemptions"] > 0
    # Alone (no budget) batch scales to its load; under the budget it keeps its floor.
    assert rows["batch"]["alone_slo_attainment"] > 0.99 > rows["batch"]["slo_attainment"]
    assert rows["chat"]["alone_slo_attainment"] >= rows["chat"]["slo_attainment"]
    assert rows["chat"]["grant_wait_s"] > 0
    human = CliRunner().invoke(app, ["simulate", "--fleet", str(fleet)])
    assert human.exit_code == 0, human.output
    assert "preemption grace 10s" in " ".join(human.output.split())


def test_a_single_service_run_reports_the_requests_its_scale_downs_cut() -> None:
    from kvscale.sim.policies import StaticPolicy
    from kvscale.sim.report import summary
    from kvscale.sim.run import Source, simulate

    setup = option("L40S", 5.0).setup
    # Two replicas, then one: the policy drops a replica holding requests far longer than the bound.
    trace = [TraceRequest(0.1 * i, 400, 20_000) for i in range(8)]
    result = simulate(replace(setup, initial_replicas=2), Source(trace), StaticPolicy(1))
    row = summary(result, SLO)
    assert row["cut_by_scale_down"] == sum(1 for r in result.requests if r.lost == "cut") > 0
    assert all(r.done or r.lost == "cut" for r in result.requests)
