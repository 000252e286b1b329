"""The operator's budget step on a tick: without a budget nothing changes; under one the
scale-up is capped by the grant and by GPUs free now, the condition and one Event say why."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from kvscale.api.budget import parse_budget_spec
from kvscale.api.intent import read_spec
from kvscale.autoscaling.budget import Demand, Option
from kvscale.control.budget import CONDITION, BudgetBook, Entry, budget_status, govern, govern_pin
from kvscale.control.reconcile import Resource, Result
from kvscale.control.scaling import ScalerMemory, tick
from kvscale.control.status import get_condition
from tests.unit.test_reconcile import CAT, NOW, RES, SETTINGS, SPEC, _obs, _planned

TTL = 45.0


def _tick_under_load(book: BudgetBook, res: Resource = RES, before: object = None):  # type: ignore[no-untyped-def]
    intent, status, start = _planned(SPEC)
    obs = _obs(200.0, start.ready)
    done = tick(intent, res, status, start, obs, None, ScalerMemory(), CAT, SETTINGS, NOW)
    return done, govern(book, res, {"tier": "x"}, intent, status, start, obs, done, NOW, TTL), start


def test_without_a_budget_the_tick_is_unchanged() -> None:
    book = BudgetBook()
    done, governed, _ = _tick_under_load(book)
    assert governed == done
    book.set_budget("other-ns-only", parse_budget_spec({"limits": {"L4": 1}, "selector": {"namespaces": ["x"]}}))
    done, governed, _ = _tick_under_load(book)
    assert governed == done and not book.entries


def test_a_budget_caps_the_scale_up_and_says_why_once() -> None:
    book = BudgetBook()
    done, _, start = _tick_under_load(BudgetBook())
    gpu = start.plan.gpu_type
    wanted = done.decision.replicas
    assert wanted > start.current + 1
    elsewhere = {a.gpu_type: 0 for a in start.plan.alternatives if a.gpu_type != gpu}  # nowhere to move
    limits = {gpu: (start.current + 1) * start.plan.tensor_parallel, **elsewhere}
    book.set_budget("b", parse_budget_spec({"limits": limits}))
    _, governed, _ = _tick_under_load(book)
    assert governed.result.scale_to == start.current + 1
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and (c.status, c.reason) == ("True", "BudgetLimit")
    assert c.message.startswith(f"budget b: wanted {wanted}, got {start.current + 1} on {gpu}")
    assert [e.reason for e in governed.result.events].count(CONDITION) == 1
    assert governed.result.status.replicas == start.current + 1
    # The same again: no second Event.
    intent, status, start = _planned(SPEC)
    status = governed.result.status
    obs = _obs(200.0, start.ready)
    again = tick(intent, RES, status, start, obs, None, ScalerMemory(), CAT, SETTINGS, NOW)
    again = govern(book, RES, {}, intent, status, start, obs, again, NOW, TTL)
    assert CONDITION not in [e.reason for e in again.result.events]


def test_a_scale_up_waits_for_gpus_another_service_still_holds() -> None:
    book = BudgetBook()
    _, _, start = _tick_under_load(BudgetBook())
    gpu, tp = start.plan.gpu_type, start.plan.tensor_parallel
    limit = 100 * tp
    book.set_budget("b", parse_budget_spec({"limits": {gpu: limit}}))
    _tick_under_load(book)  # records chat's want
    # A lower priority still holds what chat's grant needs (it shrinks at its own tick).
    mine = book.entries["ns/chat"]
    held_by_low = limit - start.current * tp
    low = replace(mine.demand, name="ns/low", priority=-1, min_replicas=0)
    book.record(Entry("b", low, "ns", "low", held_by_low, gpu, NOW.timestamp()))
    _, governed, _ = _tick_under_load(book)
    assert governed.result.scale_to is None  # nothing free now
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and c.status == "True" and "once other services release their GPUs" in c.message
    status = budget_status(book, "b", NOW.timestamp(), TTL, 1)
    assert [s["name"] for s in status["services"]] == ["chat", "low"]
    assert status["allocated"][gpu] <= limit


def test_a_scale_up_stays_within_the_namespaces_limit_while_a_neighbour_still_holds_gpus() -> None:
    book = BudgetBook()
    _, _, start = _tick_under_load(BudgetBook())
    gpu, tp = start.plan.gpu_type, start.plan.tensor_parallel
    ns_limit = (start.current + 2) * tp
    # No room on the plan's alternative types: chat cannot move off its own.
    elsewhere = {a.gpu_type: 0 for a in start.plan.alternatives if a.gpu_type != gpu}
    spec = {"limits": {gpu: 100 * tp, **elsewhere}, "namespaceLimits": {RES.namespace: {gpu: ns_limit}}}
    book.set_budget("b", parse_budget_spec(spec))
    _tick_under_load(book)  # records chat's want
    # A lower priority in the same namespace still holds two replicas' GPUs (it shrinks at its own
    # tick); one in another namespace holds more, which the namespace's limit does not count.
    mine = book.entries["ns/chat"]
    # Both behind a gateway (minReplicas 0 lets them go to zero; without one they keep a replica).
    low = replace(mine.demand, name="ns/low", priority=-1, min_replicas=0, gateway=True)
    book.record(Entry("b", low, "ns", "low", 2 * tp, gpu, NOW.timestamp()))
    far = replace(mine.demand, name="other/far", priority=-1, min_replicas=0, namespace="other", gateway=True)
    book.record(Entry("b", far, "other", "far", 10 * tp, gpu, NOW.timestamp()))
    _, governed, _ = _tick_under_load(book)
    assert governed.result.scale_to is None  # the namespace's limit is full now
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and "once other services release their GPUs" in c.message
    # The neighbour released its GPUs: chat takes up to the namespace's limit, no further.
    book.record(Entry("b", low, "ns", "low", 0, gpu, NOW.timestamp()))
    _, governed, _ = _tick_under_load(book)
    assert governed.result.scale_to == start.current + 2


def test_a_new_service_starts_with_what_the_budget_has_free_and_is_counted_at_once() -> None:
    from kvscale.api.intent import parse_intent
    from kvscale.control.budget import cap_deploy
    from kvscale.control.reconcile import DeploymentView
    from tests.unit.test_reconcile import deployed

    body = {**SPEC, "workload": {**SPEC["workload"], "requestsPerSecond": 200}}
    created = deployed(body)
    plan = created.status.plan
    assert plan is not None and plan.replicas >= 3
    gpu, tp = plan.gpu_type, plan.tensor_parallel
    intent = parse_intent(body)
    book = BudgetBook()
    book.set_budget("b", parse_budget_spec({"limits": {gpu: (plan.replicas + 1) * tp}}))
    first = cap_deploy(book, RES, {}, intent, created, None, NOW)
    assert first == created  # room for all of it: unchanged, but counted
    assert book.entries["ns/chat"].held_gpus == plan.replicas * tp
    # A second service created next sees only one replica's GPUs free.
    other = Resource("ns", "rag", "uid-2", 1)
    second = cap_deploy(book, other, {}, intent, deployed(body, other), None, NOW)
    (workload,) = [o for o in second.apply if o["kind"] == "Deployment"]
    assert workload["spec"]["replicas"] == 1 and second.applied_deployment == workload
    assert second.status.replicas == 1 and second.status.desired_replicas == 1
    c = get_condition(second.status, CONDITION)
    assert c is not None and c.status == "True"
    assert c.message.startswith(f"budget b: wanted {plan.replicas}, starts with 1 on {gpu} x{tp}")
    assert [e.reason for e in second.events].count(CONDITION) == 1
    assert sum(e.held_gpus for e in book.entries.values()) <= (plan.replicas + 1) * tp
    # A spec change that does not grow the running Deployment changes nothing, not even the record.
    recorded = book.entries["ns/rag"]
    again = deployed(body, other)
    running = DeploymentView(plan.replicas, plan.replicas, gpu)
    assert cap_deploy(book, other, {}, intent, again, running, NOW) == again
    assert book.entries["ns/rag"] == recorded
    # Without a budget: unchanged.
    assert cap_deploy(BudgetBook(), other, {}, intent, created, None, NOW) == created
    # A pin (kubectl scale) is a want like any other: capped to what is free, and it says so.
    pinned = {**body, "scaling": {"replicas": 4, "maxReplicas": 10}}
    held = cap_deploy(book, other, {}, parse_intent(pinned), deployed(pinned, other), None, NOW)
    (workload,) = [o for o in held.apply if o["kind"] == "Deployment"]
    assert workload["spec"]["replicas"] == 1
    c = get_condition(held.status, CONDITION)
    assert c is not None and (c.status, c.reason) == ("True", "PinHeldByBudget")
    assert c.message.startswith("budget b: spec.scaling.replicas pins 4, starts with 1")


def test_a_service_whose_type_is_full_moves_to_its_next_option_and_back() -> None:
    from kvscale.control.budget import MOVED, moved, moving_to, options
    from kvscale.control.reconcile import DeploymentView, Observed, replan
    from kvscale.control.replan import BudgetMove, recorded_target
    from tests.unit.test_reconcile import POOLS, SETTINGS, deployed

    book = BudgetBook()
    _, _, start = _tick_under_load(BudgetBook())
    plan = start.plan
    gpu, tp = plan.gpu_type, plan.tensor_parallel
    # The want on every accepted type: the plan's own first, each other type once, converted by capacity.
    opts = options(plan, 10, 100)
    assert opts[0].gpu_type == gpu and opts[0].wanted == 10
    assert len({o.gpu_type for o in opts}) == len(opts) > 1
    alt = next(a for a in plan.alternatives if a.gpu_type == opts[1].gpu_type)
    assert alt.rate_per_replica is not None
    assert opts[1].wanted == math.ceil(10 * plan.rate_per_replica / alt.rate_per_replica - 1e-9)
    # The plan's type holds only its current replicas; another type has room: it moves.
    to = opts[1].gpu_type
    limits = {o.gpu_type: 0 for o in opts} | {gpu: start.current * tp, to: 100}
    book.set_budget("b", parse_budget_spec({"limits": limits}))
    _, governed, _ = _tick_under_load(book)
    assert governed.result.scale_to is None  # the current Deployment is not scaled: it moves
    grant = moving_to(book, RES, {}, plan)
    assert grant is not None and grant.gpu_type == to and grant.replicas > 0
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and "next-cheapest feasible plan" in c.message
    # The move: re-planned on the granted type at the granted replicas, marked, one Event.
    status = governed.result.status
    replanned = replan(BudgetMove(grant, "b"), read_spec(SPEC), RES, status, Observed(POOLS), CAT, SETTINGS, NOW)
    out = moved(replanned, plan, grant)
    assert out is not None and out.status.plan is not None
    assert (out.status.plan.gpu_type, out.status.plan.budget_moved_from) == (to, gpu)
    (workload,) = [o for o in out.apply if o["kind"] == "Deployment"]
    assert workload["spec"]["replicas"] == grant.replicas == out.status.replicas
    assert out.applied_deployment == workload
    assert [e.reason for e in out.events].count(MOVED) == 1 and "Planned" not in [e.reason for e in out.events]
    assert f"moved from {gpu} TP{tp} to {to}" in next(e.message for e in out.events if e.reason == MOVED)
    # A grant above the count running now: the new template rolls at that count, the grant is
    # recorded as what the rollout's end grows to (replicas and template in one write would give
    # the increase to the old ReplicaSet, on the type being left).
    first = deployed(SPEC)
    assert first.applied_deployment is not None
    running = replace(DeploymentView.of(first.applied_deployment), replicas=2, ready_replicas=2, updated_replicas=2)
    more = replace(grant, replicas=running.replicas + 3)
    seen = Observed(POOLS, running)
    bigger = moved(replan(BudgetMove(more, "b"), read_spec(SPEC), RES, status, seen, CAT, SETTINGS, NOW), plan, more)
    assert bigger is not None
    (rolled,) = [o for o in bigger.apply if o["kind"] == "Deployment"]
    assert rolled["spec"]["replicas"] == running.replicas == bigger.status.replicas
    assert recorded_target(rolled) == more.replicas == bigger.status.desired_replicas
    # Moved, its options start with the type the planner chose: it goes back when that has room.
    assert options(out.status.plan, 2, 100)[0].gpu_type == gpu
    back_grant = replace(grant, gpu_type=gpu, replicas=1)
    again = replan(BudgetMove(back_grant, "b"), read_spec(SPEC), RES, out.status, Observed(POOLS), CAT, SETTINGS, NOW)
    back = moved(again, out.status.plan, back_grant)
    assert back is not None and back.status.plan is not None
    assert (back.status.plan.gpu_type, back.status.plan.budget_moved_from) == (gpu, None)
    assert "moved back from" in next(e.message for e in back.events if e.reason == MOVED)
    # No plan on the granted type fits the cluster: nothing moves.
    nowhere = replace(grant, gpu_type="MI300X")
    stay = replan(BudgetMove(nowhere, "b"), read_spec(SPEC), RES, status, Observed(POOLS), CAT, SETTINGS, NOW)
    assert moved(stay, plan, nowhere) is None


def test_gpus_a_moved_service_still_holds_on_its_old_type_count_against_the_budget() -> None:
    book = BudgetBook()
    _, _, start = _tick_under_load(BudgetBook())
    gpu, tp = start.plan.gpu_type, start.plan.tensor_parallel
    elsewhere = {a.gpu_type: 0 for a in start.plan.alternatives if a.gpu_type != gpu}
    book.set_budget("b", parse_budget_spec({"limits": {gpu: 100 * tp, **elsewhere}}))
    _tick_under_load(book)
    mine = book.entries["ns/chat"]
    # Another service moved off this type: its pods there drain, holding all but one replica's GPUs.
    other = replace(mine.demand, name="ns/low", priority=-1, min_replicas=0)
    book.record(Entry("b", other, "ns", "low", 0, "L4", NOW.timestamp(), ((gpu, 100 * tp - tp),)))
    _, governed, _ = _tick_under_load(book)
    assert governed.result.scale_to is None
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and "once other services release their GPUs" in c.message


def test_a_service_started_with_no_replicas_reads_as_none_and_waits_for_free_gpus() -> None:
    from kvscale.api.intent import parse_intent
    from kvscale.control.budget import cap_deploy
    from kvscale.control.reconcile import DeploymentView
    from kvscale.control.scaling import fleet
    from tests.unit.test_reconcile import deployed

    created = deployed(SPEC)
    plan = created.status.plan
    assert plan is not None
    gpu, tp = plan.gpu_type, plan.tensor_parallel
    book = BudgetBook()
    elsewhere = {a.gpu_type: 0 for a in plan.alternatives if a.gpu_type != gpu}
    book.set_budget("b", parse_budget_spec({"limits": {gpu: tp, **elsewhere}}))
    book.record(Entry("b", Demand("ns/big", (Option(gpu, tp, 1),), 5), "ns", "big", tp, gpu, NOW.timestamp()))
    started = cap_deploy(book, RES, {}, parse_intent(SPEC), created, None, NOW)
    assert started.status.desired_replicas == 0
    # Running behind a plain Service, a re-plan onto a full GPU type keeps one replica: nothing
    # would hold its requests at zero (issue 29). Behind a gateway it may start with none.
    elsewhere_running = DeploymentView(1, 1, "L4")
    kept = cap_deploy(book, RES, {}, parse_intent(SPEC), created, elsewhere_running, NOW)
    (workload,) = [o for o in kept.apply if o["kind"] == "Deployment"]
    assert workload["spec"]["replicas"] == 1
    gated = {**SPEC, "routing": {"kedaHttp": {}}}
    started = cap_deploy(book, RES, {}, parse_intent(gated), deployed(gated), elsewhere_running, NOW)
    assert started.status.desired_replicas == 0
    # Its Deployment at 0 replicas is 0, not the plan's count (a scale-"down" to its floor would
    # otherwise skip the check for free GPUs).
    start = fleet(parse_intent(SPEC), started.status, DeploymentView(0, 0, gpu))
    assert start is not None and not isinstance(start, Result) and start.current == 0
    # ... also once a tick that found no free GPUs has recorded the policy's 1 as desired.
    wanting = started.status.model_copy(update={"desired_replicas": 1})
    again = fleet(parse_intent(SPEC), wanting, DeploymentView(0, 0, gpu))
    assert again is not None and not isinstance(again, Result) and again.current == 0


def test_a_tick_handed_a_status_older_than_its_own_last_write_posts_no_second_event() -> None:
    # On a loaded API server a timer may get a body from before the previous tick's status
    # write (no HeldByBudget condition yet): the Event posted then is not posted again
    # (CI found a fourth HeldByBudget Event over eight settled ticks).
    book = BudgetBook()
    _, _, start = _tick_under_load(BudgetBook())
    gpu = start.plan.gpu_type
    elsewhere = {a.gpu_type: 0 for a in start.plan.alternatives if a.gpu_type != gpu}
    book.set_budget(
        "b", parse_budget_spec({"limits": {gpu: (start.current + 1) * start.plan.tensor_parallel, **elsewhere}})
    )
    _, first, _ = _tick_under_load(book)
    _, stale, _ = _tick_under_load(book)  # the same planned status again: no condition in it
    assert [e.reason for e in first.result.events].count(CONDITION) == 1
    assert CONDITION not in [e.reason for e in stale.result.events]
    assert get_condition(stale.result.status, CONDITION) is not None  # the condition is still written


def test_overlapping_budgets_the_tightest_governs_and_the_catch_all_says_it_is_shadowed() -> None:
    """Issue 28, finding 5: a catch-all budget (first by name) used to govern, and a team's
    reservation reported allocated 0 and Ready. Now the tightest matching budget governs and the
    shadowed one says so in a condition."""
    from kvscale.operator.budget_handlers import budget_conditions

    book = BudgetBook()
    _, _, start = _tick_under_load(BudgetBook())
    gpu = start.plan.gpu_type
    book.set_budget("a-catch-all", parse_budget_spec({"limits": {gpu: 64}}))
    book.set_budget("team", parse_budget_spec({"limits": {gpu: 8}, "selector": {"matchLabels": {"tier": "x"}}}))
    assert book.governing(RES.namespace, {"tier": "x"}) == "team"
    assert book.governing(RES.namespace, {}) == "a-catch-all"
    _, governed, _ = _tick_under_load(book)
    cond = get_condition(governed.result.status, CONDITION)
    assert cond is not None and cond.message.startswith("budget team:")
    key = f"{RES.namespace}/{RES.name}"
    assert book.shadowed("a-catch-all") == [(key, gpu, "team")] and book.shadowed("team") == []
    catch_all = {c["type"]: c for c in budget_conditions(book, "a-catch-all")}
    assert catch_all["Shadowed"]["status"] == "True"
    assert f"{key} on {gpu} (by team)" in catch_all["Shadowed"]["message"]
    assert {c["type"]: c["status"] for c in budget_conditions(book, "team")}["Shadowed"] == "False"
    status = budget_status(book, "team", NOW.timestamp(), TTL, 1)
    assert [s["name"] for s in status["services"]] == [RES.name]


def test_a_budget_naming_a_gpu_type_the_catalog_lacks_is_refused_with_the_names() -> None:
    from kvscale.operator.budget_handlers import unknown_types

    spec = parse_budget_spec({"limits": {"H100": 8}})
    message = unknown_types(spec, tuple(CAT.gpus))
    assert message.startswith("spec.limits names GPU type(s) H100 ") and "H100-SXM" in message
    assert unknown_types(parse_budget_spec({"limits": {"H100-SXM": 8}}), tuple(CAT.gpus)) == ""


def test_a_limit_cut_below_the_floors_never_takes_a_service_behind_a_plain_service_to_zero() -> None:
    # Issue 29: with the limit cut below the floors, a minReplicas 1 service behind a plain
    # Service went to 0 replicas within 6 s. A higher priority holds the whole limit now.
    body = {**SPEC, "scaling": {"minReplicas": 1, "maxReplicas": 6, "priority": 1}}
    intent, status, start = _planned(body)
    assert start.current == 1
    gpu, tp = start.plan.gpu_type, start.plan.tensor_parallel
    book = BudgetBook()
    elsewhere = {a.gpu_type: 0 for a in start.plan.alternatives if a.gpu_type != gpu}
    book.set_budget("b", parse_budget_spec({"limits": {gpu: tp, **elsewhere}}))
    top = Demand("ns/top", (Option(gpu, tp, 1),), 100, 1, "ns", 0.0, gpu)
    book.record(Entry("b", top, "ns", "top", tp, gpu, NOW.timestamp()))
    obs = _obs(0.5, start.ready)
    done = tick(intent, RES, status, start, obs, None, ScalerMemory(), CAT, SETTINGS, NOW)
    governed = govern(book, RES, {}, intent, status, start, obs, done, NOW, TTL)
    assert governed.result.scale_to is None and governed.result.status.replicas != 0  # it keeps its replica
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and (c.status, c.reason) == ("True", "KeptBeyondLimit")
    assert "no gateway holds its requests at zero" in c.message
    # The budget's status says so; the top priority keeps its floor.
    out = budget_status(book, "b", NOW.timestamp(), TTL, 1)
    assert [(s["name"], s["replicas"]) for s in out["services"]] == [("top", 1), ("chat", 1)]
    (floors,) = out["conditions"]
    assert (floors["type"], floors["status"], floors["reason"]) == ("FloorsKept", "False", "KeptBeyondLimit")
    assert "ns/chat (priority 1) 1 replica beyond the" in floors["message"]
    # Behind a gateway the same cut may take it to zero, and both say which floor is not kept.
    gated = {**body, "routing": {"kedaHttp": {}}}
    intent, status, start = _planned(gated)
    done = tick(intent, RES, status, start, obs, None, ScalerMemory(), CAT, SETTINGS, NOW)
    governed = govern(book, RES, {}, intent, status, start, obs, done, NOW, TTL)
    assert governed.result.scale_to == 0
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and (c.status, c.reason) == ("True", "FloorNotKept")
    assert "minReplicas 1 does not fit (1 short)" in c.message
    (floors,) = budget_status(book, "b", NOW.timestamp(), TTL, 1)["conditions"]
    assert (floors["status"], floors["reason"]) == ("False", "FloorNotKept")
    assert "ns/chat (priority 1) minReplicas 1, 1 short" in floors["message"]


def test_a_pin_counts_against_the_budget_and_is_held_to_its_grant() -> None:
    # Issue 29: with a limit of 1 L4, `kubectl scale --replicas=2` ran 2 L4 pods and the
    # budget's status reported 0 allocated without listing the service.
    from kvscale.api.intent import parse_intent
    from kvscale.control.reconcile import DeploymentView
    from kvscale.control.scaling import fleet
    from tests.unit.test_reconcile import deployed

    body = {**SPEC, "scaling": {"replicas": 2, "maxReplicas": 4}}
    first = deployed(body)
    plan = first.status.plan
    assert plan is not None
    gpu, tp = plan.gpu_type, plan.tensor_parallel
    intent = parse_intent(body)
    seen = DeploymentView(2, 2, gpu)
    pinned = fleet(intent, first.status, seen)
    assert isinstance(pinned, Result)
    book = BudgetBook()
    book.set_budget("b", parse_budget_spec({"limits": {gpu: tp}}))
    out = govern_pin(book, RES, {}, intent, pinned, seen, NOW, TTL)
    assert out.scale_to == 1
    c = get_condition(out.status, CONDITION)
    assert c is not None and (c.status, c.reason) == ("True", "PinHeldByBudget")
    assert c.message.startswith("budget b: spec.scaling.replicas pins 2; wanted 2, got 1 on ")
    assert c.message.endswith("the pin is held to 1")
    assert [e.reason for e in out.events].count(CONDITION) == 1
    status = budget_status(book, "b", NOW.timestamp(), TTL, 1)
    assert status["allocated"] == {gpu: tp}
    assert [(s["name"], s["replicas"], s["wanted"]) for s in status["services"]] == [("chat", 1, 2)]
    # Held at 1, the next tick changes nothing and posts no second Event.
    again = govern_pin(book, RES, {}, intent, pinned, DeploymentView(1, 1, gpu), NOW, TTL)
    assert again.scale_to is None and CONDITION not in [e.reason for e in again.events]
    # The budget grows: the pin runs whole, and the condition says it is within the budget.
    book.set_budget("b", parse_budget_spec({"limits": {gpu: 4 * tp}}))
    grown = govern_pin(book, RES, {}, intent, pinned, DeploymentView(1, 1, gpu), NOW, TTL)
    assert grown.scale_to == 2
    c = get_condition(grown.status, CONDITION)
    assert c is not None and (c.status, c.reason) == ("False", "WithinBudget")
    # Without a budget: unchanged, and a HeldByBudget condition from before goes.
    assert govern_pin(BudgetBook(), RES, {}, intent, pinned, seen, NOW, TTL) == pinned
    gone = govern_pin(BudgetBook(), RES, {}, intent, replace(pinned, status=grown.status), seen, NOW, TTL)
    assert get_condition(gone.status, CONDITION) is None


def test_room_ahead_of_the_forecast_is_held_from_a_lower_priority() -> None:
    """Issue 29, room ahead of need: the policy's lead (Decision.lead_replicas) reaches the
    allocator as Option.ahead on every type, converted like the want, and a lower priority's
    grant leaves that room free."""
    from kvscale.control.budget import options

    book = BudgetBook()
    intent, status, start = _planned(SPEC)
    obs = _obs(50.0, start.ready)  # 5 replicas, within maxReplicas 10
    done = tick(intent, RES, status, start, obs, None, ScalerMemory(), CAT, SETTINGS, NOW)
    assert done.decision.lead_replicas is not None and done.decision.lead_replicas >= done.decision.replicas
    plan, wanted = start.plan, done.decision.replicas
    gpu, tp = plan.gpu_type, plan.tensor_parallel
    opts = options(plan, 10, 100, lead=13)
    assert (opts[0].wanted, opts[0].ahead, opts[0].rate_per_replica) == (10, 3, plan.rate_per_replica)
    alt = next(a for a in plan.alternatives if a.gpu_type == opts[1].gpu_type)
    assert alt.rate_per_replica is not None
    ceil = [math.ceil(n * plan.rate_per_replica / alt.rate_per_replica - 1e-9) for n in (10, 13)]
    assert (opts[1].wanted, opts[1].ahead) == (ceil[0], ceil[1] - ceil[0])
    assert options(plan, 10, 11, lead=13)[0].ahead == 1  # within maxReplicas
    # On the tick: chat (priority 0) asks 3 beyond its want; low (-1) wants everything.
    book.set_budget("b", parse_budget_spec({"limits": {gpu: (wanted + 10) * tp}}))
    low = Demand("ns/low", (Option(gpu, tp, 100),), priority=-1)
    book.record(Entry("b", low, "ns", "low", 0, gpu, NOW.timestamp()))
    ahead = replace(done, decision=replace(done.decision, lead_replicas=wanted + 3))
    govern(book, RES, {"tier": "x"}, intent, status, start, obs, ahead, NOW, TTL)
    a = book.allocation("b", NOW.timestamp(), TTL)
    held = min(3, 10 - wanted)  # the room ahead stays within chat's maxReplicas (10)
    assert held > 0
    assert (a.grant("ns/chat").replicas, a.grant("ns/chat").ahead) == (wanted, held)
    # a limit of wanted + 10 replicas, less chat's want and the room held for it
    assert a.grant("ns/low").replicas == 10 - held
    assert a.reserved == {gpu: held * tp}
    assert "chat (priority 0) " in a.grant("ns/low").reason and "ahead)" in a.grant("ns/low").reason


def test_a_scale_up_is_counted_at_once_so_a_service_created_next_does_not_take_the_same_gpus() -> None:
    """Found on the cluster (tests/cluster/test_budget_preemption.py): a service created within a
    tick of a neighbour's scale-up counted the neighbour at its replicas before the scale, and
    its Deployment started on GPUs the neighbour had just been given (6 A100s on a limit of 5)."""
    from kvscale.control.budget import free_gpus

    book = BudgetBook()
    _, _, start = _tick_under_load(BudgetBook())
    gpu, tp = start.plan.gpu_type, start.plan.tensor_parallel
    elsewhere = {a.gpu_type: 0 for a in start.plan.alternatives if a.gpu_type != gpu}
    limit = (start.current + 2) * tp
    book.set_budget("b", parse_budget_spec({"limits": {gpu: limit, **elsewhere}}))
    _, governed, _ = _tick_under_load(book)
    assert governed.result.scale_to == start.current + 2
    assert book.entries["ns/chat"].held_gpus == limit  # what its Deployment now asks for
    assert free_gpus(book.view(), "ns/rag", "ns", {}, gpu) == 0


def test_a_catch_all_budget_on_another_gpu_type_does_not_void_a_teams_budget() -> None:
    """Issue 38, finding 1: `h100-cap {H100-SXM: 2}` with no selector became the governing budget
    of every service (tightest by the sum of its limits), and a team's A100 budget limited
    nothing. Each GPU type is bounded by the tightest budget that limits it; a budget without a
    limit for a type does not govern it, nor count it."""
    book = BudgetBook()
    _, _, start = _tick_under_load(BudgetBook())
    gpu, tp = start.plan.gpu_type, start.plan.tensor_parallel
    elsewhere = {a.gpu_type: 0 for a in start.plan.alternatives if a.gpu_type != gpu}  # nowhere to move
    team = {"limits": {gpu: (start.current + 1) * tp, **elsewhere}, "selector": {"namespaces": [RES.namespace]}}
    book.set_budget("team", parse_budget_spec(team))
    book.set_budget("cap", parse_budget_spec({"limits": {"B200": 0}}))  # a type the service never runs on
    done, governed, _ = _tick_under_load(book)
    assert done.decision.replicas > start.current + 1
    assert governed.result.scale_to == start.current + 1  # the team's limit holds
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and c.message.startswith("budget team:")
    cap = budget_status(book, "cap", NOW.timestamp(), TTL, 1)
    assert (cap["allocated"], cap["services"]) == ({"B200": 0}, [])  # counts only what it limits
    mine = budget_status(book, "team", NOW.timestamp(), TTL, 1)
    assert mine["allocated"][gpu] == (start.current + 1) * tp
    assert [s["name"] for s in mine["services"]] == [RES.name]
    # A catch-all that does limit the type, more tightly, bounds it instead: per type, the tightest.
    book.set_budget("tight", parse_budget_spec({"limits": {gpu: start.current * tp}}))
    _, governed, _ = _tick_under_load(book)
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and c.message.startswith("budget tight:") and governed.result.scale_to is None
    assert budget_status(book, "team", NOW.timestamp(), TTL, 1)["allocated"][gpu] == 0


def test_a_new_service_without_a_gateway_is_refused_rather_than_run_beyond_the_limit() -> None:
    """Issue 38, finding 2: every service behind a plain Service kept "one replica beyond the
    limit", so a tenant escaped its budget by creating more. A new one whose replica the limit
    cannot hold is refused, and says what to do; the budget says so too."""
    body = {**SPEC, "scaling": {"minReplicas": 1, "maxReplicas": 6, "priority": 1}}
    intent, status, start = _planned(body)
    new = replace(start, current=0, ready=0)
    gpu, tp = start.plan.gpu_type, start.plan.tensor_parallel
    book = BudgetBook()
    elsewhere = {a.gpu_type: 0 for a in start.plan.alternatives if a.gpu_type != gpu}
    book.set_budget("b", parse_budget_spec({"limits": {gpu: tp, **elsewhere}}))
    top = Demand("ns/top", (Option(gpu, tp, 1),), 100, 1, "ns", 0.0, gpu, False, True)
    book.record(Entry("b", top, "ns", "top", tp, gpu, NOW.timestamp()))
    obs = _obs(0.5, 0)
    done = tick(intent, RES, status, new, obs, None, ScalerMemory(), CAT, SETTINGS, NOW)
    governed = govern(book, RES, {}, intent, status, new, obs, done, NOW, TTL)
    assert governed.result.scale_to is None  # it starts none
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and (c.status, c.reason) == ("True", "RefusedByBudget")
    assert "refused: no gateway (spec.routing.inferencePool or kedaHttp) holds its requests at zero" in c.message
    assert "raise the limit" in c.message
    assert CONDITION in [e.reason for e in governed.result.events]
    out = budget_status(book, "b", NOW.timestamp(), TTL, 1)
    assert out["allocated"][gpu] == tp  # the running one only
    (floors,) = out["conditions"]
    assert (floors["status"], floors["reason"]) == ("False", "RefusedByBudget") and "ns/chat" in floors["message"]


def test_a_selector_or_namespace_limit_kubernetes_could_never_match_is_refused_with_the_field() -> None:
    """Issue 38: the schema accepted the selector key `bad key!` and `namespaces: [""]`, which
    match nothing, silently."""
    import pytest
    from pydantic import ValidationError

    from kvscale.api.budget import budget_spec_error

    cases: dict[str, dict[str, Any]] = {
        "spec.selector.matchLabels key 'bad key!' is not a label key": {"selector": {"matchLabels": {"bad key!": "x"}}},
        "spec.selector.namespaces[1] '' is not a namespace name": {"selector": {"namespaces": ["ok", ""]}},
        "spec.namespaceLimits 'Team_A' is not a namespace name": {"namespaceLimits": {"Team_A": {"L4": 1}}},
        "spec.selector.matchLabels.tier value 'a b' is not a label value": {
            "selector": {"matchLabels": {"tier": "a b"}}
        },
    }
    for said, extra in cases.items():
        with pytest.raises(ValidationError) as err:
            parse_budget_spec({"limits": {"L4": 1}, **extra})
        assert said in budget_spec_error(err.value)
    ok = {"namespaces": ["team-a"], "matchLabels": {"example.com/team": "a.b_c", "tier": ""}}
    assert parse_budget_spec({"limits": {"L4": 1}, "selector": ok}).selector.namespaces == ["team-a"]


def test_the_book_has_one_owner_and_a_status_write_remembers_nothing() -> None:
    """Issue 38, design review: the kopf loop, kvscale's workers and kopf's sync handler threads
    wrote the book without a lock, a budget's status write advanced the allocator's memory, and
    members() deleted entries while others iterated them."""
    import threading

    book = BudgetBook()
    book.set_budget("b", parse_budget_spec({"limits": {"L4": 4}}))
    now = NOW.timestamp()

    def entry(i: int, seen_s: float) -> Entry:
        return Entry("b", Demand(f"ns/s{i}", (Option("L4", 1, 3),), 0, 0, "ns"), "ns", f"s{i}", 0, "L4", seen_s)

    for i in range(3):
        book.record(entry(i, now))
    status = budget_status(book, "b", now, TTL, 1)
    assert sum(s["replicas"] for s in status["services"]) == 4 and status["allocated"] == {"L4": 4}
    assert book.previous == {}  # the status is computed from a snapshot; the next tick's memory is unchanged
    view = book.view()
    book.record(entry(9, now))
    assert "ns/s9" not in view.entries  # a snapshot never changes under its reader
    # Writers recording and expiring entries while readers allocate over snapshots: no reader
    # sees a dict change size under it, and what is left is what the writers last recorded.
    failures: list[BaseException] = []

    def write(k: int) -> None:
        try:
            for j in range(200):
                book.record(entry(k, now - (TTL + 1 if j % 2 else 0)), now, TTL)
        except BaseException as exc:
            failures.append(exc)

    def read() -> None:
        try:
            for _ in range(50):
                budget_status(book, "b", now, TTL, 1)
                list(book.entries.values())
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)] + [
        threading.Thread(target=read) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert sorted(book.entries) == ["ns/s9"]  # each writer's last want was too old to count


def test_preempted_pods_drain_within_the_grace_of_the_budget_bounding_their_type() -> None:
    """Issue 38, finding 1: a catch-all budget on another GPU type must not set the grace of a
    team's preemptions either."""
    from kvscale.control.drain import preemption_grace_s

    book = BudgetBook()
    book.set_budget("cap", parse_budget_spec({"limits": {"H100-SXM": 0}, "preemptionGraceSeconds": 60}))
    team = {"limits": {"A100-80GB": 4}, "preemptionGraceSeconds": 5, "selector": {"namespaces": ["ns"]}}
    book.set_budget("team", parse_budget_spec(team))
    assert preemption_grace_s(book, "ns", {}, "A100-80GB") == 5
    assert preemption_grace_s(book, "ns", {}, "H100-SXM") == 60
    assert preemption_grace_s(book, "other", {}, "A100-80GB") is None
