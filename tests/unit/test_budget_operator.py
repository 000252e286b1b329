"""The operator's budget step on a tick: without a budget nothing changes; under one the
scale-up is capped by the grant and by GPUs free now, the condition and one Event say why."""

from __future__ import annotations

from dataclasses import replace

from kvscale.api.budget import parse_budget_spec
from kvscale.operator.budget import CONDITION, BudgetBook, Entry, budget_status, govern
from kvscale.operator.reconcile import Resource
from kvscale.operator.scaling import ScalerMemory, tick
from kvscale.operator.status import get_condition
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
    book.set_budget("b", parse_budget_spec({"limits": {gpu: (start.current + 1) * start.plan.tensor_parallel}}))
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
    book.entries["ns/low"] = Entry("b", low, "ns", "low", held_by_low, gpu, NOW.timestamp())
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
    spec = {"limits": {gpu: 100 * tp}, "namespaceLimits": {RES.namespace: {gpu: ns_limit}}}
    book.set_budget("b", parse_budget_spec(spec))
    _tick_under_load(book)  # records chat's want
    # A lower priority in the same namespace still holds two replicas' GPUs (it shrinks at its own
    # tick); one in another namespace holds more, which the namespace's limit does not count.
    mine = book.entries["ns/chat"]
    low = replace(mine.demand, name="ns/low", priority=-1, min_replicas=0)
    book.entries["ns/low"] = Entry("b", low, "ns", "low", 2 * tp, gpu, NOW.timestamp())
    far = replace(mine.demand, name="other/far", priority=-1, min_replicas=0, namespace="other")
    book.entries["other/far"] = Entry("b", far, "other", "far", 10 * tp, gpu, NOW.timestamp())
    _, governed, _ = _tick_under_load(book)
    assert governed.result.scale_to is None  # the namespace's limit is full now
    c = get_condition(governed.result.status, CONDITION)
    assert c is not None and "once other services release their GPUs" in c.message
    # The neighbour released its GPUs: chat takes up to the namespace's limit, no further.
    book.entries["ns/low"] = Entry("b", low, "ns", "low", 0, gpu, NOW.timestamp())
    _, governed, _ = _tick_under_load(book)
    assert governed.result.scale_to == start.current + 2


def test_a_new_service_starts_with_what_the_budget_has_free_and_is_counted_at_once() -> None:
    from kvscale.api.intent import parse_intent
    from kvscale.operator.budget import cap_deploy
    from kvscale.operator.reconcile import DeploymentView
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
    # Without a budget, in recommend mode or pinned: unchanged.
    assert cap_deploy(BudgetBook(), other, {}, intent, created, None, NOW) == created
    pinned = {**body, "scaling": {"replicas": 4, "maxReplicas": 10}}
    assert cap_deploy(book, other, {}, parse_intent(pinned), deployed(pinned, other), None, NOW) == deployed(
        pinned, other
    )
