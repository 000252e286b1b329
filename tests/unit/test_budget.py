"""The GPU budget allocator: hand-built cases and properties (never above a limit, equal to
independent decisions without contention, priority order, floors first, no flapping)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscale.autoscaling.budget import Allocation, Budget, Demand, Grant, Option, allocate

H100, L40S, A100 = "H100-SXM", "L40S", "A100-80GB"


def d(
    name: str,
    *options: tuple[str, int, int] | tuple[str, int, int, float] | tuple[str, int, int, float, int, str],
    **kw: object,
) -> Demand:
    return Demand(name, tuple(Option(*o) for o in options), **kw)  # type: ignore[arg-type]


def test_without_contention_everyone_gets_its_want_on_its_first_option() -> None:
    a = allocate(
        Budget("b", {H100: 16, L40S: 8}),
        [d("chat", (H100, 1, 6), priority=10), d("rag", (H100, 2, 3), (L40S, 1, 8)), d("x", (L40S, 1, 2))],
    )
    assert [(g.name, g.gpu_type, g.replicas, g.held, g.moved) for g in a.grants] == [
        ("chat", H100, 6, False, False),
        ("rag", H100, 3, False, False),
        ("x", L40S, 2, False, False),
    ]
    assert a.used == {H100: 12, L40S: 2}
    assert a.grant("chat").reason == "wanted 6, got 6 on H100-SXM x1"


def test_the_top_priority_keeps_its_replicas_and_the_others_say_why() -> None:
    a = allocate(
        Budget("prod", {H100: 8}),
        [
            d("batch", (H100, 1, 5), priority=1, min_replicas=1),
            d("chat", (H100, 1, 6), priority=100, min_replicas=1),
            d("rag", (H100, 1, 4), priority=50, min_replicas=1),
        ],
    )
    assert [g.name for g in a.grants] == ["chat", "rag", "batch"]
    assert [g.replicas for g in a.grants] == [6, 1, 1]  # rag and batch keep their floors
    assert a.used == {H100: 8}
    rag = a.grant("rag")
    assert rag.held and rag.wanted == 4
    assert rag.reason == (
        "wanted 4, got 1 on H100-SXM x1: budget prod holds the H100-SXM limit of 8 GPUs; in priority order: "
        "chat (priority 100) 6, batch (priority 1) 1"
    )


def test_floors_come_before_any_want() -> None:
    a = allocate(
        Budget("b", {H100: 4}),
        [d("top", (H100, 1, 10), priority=9, min_replicas=1), d("low", (H100, 1, 3), priority=0, min_replicas=2)],
    )
    assert (a.grant("top").replicas, a.grant("low").replicas) == (2, 2)


def test_a_floor_the_budget_cannot_hold_gets_what_is_left_and_says_so() -> None:
    a = allocate(
        Budget("b", {H100: 3}),
        [d("top", (H100, 1, 2), priority=9, min_replicas=2), d("low", (H100, 1, 3), min_replicas=3)],
    )
    assert (a.grant("top").replicas, a.grant("low").replicas) == (2, 1)
    assert "minReplicas 3 does not fit (2 short)" in a.grant("low").reason


def test_a_lower_priority_moves_to_its_next_cheapest_plan_rather_than_starving() -> None:
    a = allocate(
        Budget("b", {H100: 8, L40S: 8}),
        [d("chat", (H100, 1, 7), priority=10, min_replicas=1), d("batch", (H100, 1, 3), (L40S, 2, 4), min_replicas=1)],
    )
    batch = a.grant("batch")
    assert (batch.gpu_type, batch.replicas, batch.moved, batch.held) == (L40S, 4, True, False)
    assert "next-cheapest feasible plan" in batch.reason
    assert a.grant("chat").replicas == 7


def test_a_lower_floor_moves_out_of_a_higher_prioritys_way() -> None:
    # batch's floor sits on the only H100s chat accepts; it moves to its L40S plan.
    a = allocate(
        Budget("b", {H100: 4, L40S: 4}),
        [d("chat", (H100, 1, 4), priority=10), d("batch", (H100, 2, 1), (L40S, 2, 1), min_replicas=1)],
    )
    assert (a.grant("chat").replicas, a.grant("batch").gpu_type, a.grant("batch").replicas) == (4, L40S, 1)


def test_types_the_budget_does_not_list_are_not_limited() -> None:
    a = allocate(Budget("b", {H100: 1}), [d("x", (A100, 4, 50))])
    assert (a.grant("x").replicas, a.used) == (50, {A100: 200})


def test_namespace_limits_hold_within_the_global_ones() -> None:
    budget = Budget("b", {H100: 10}, namespace_limits={"team-a": {H100: 3}})
    a = allocate(
        budget,
        [
            d("team-a/x", (H100, 1, 5), namespace="team-a", priority=5),
            d("team-b/y", (H100, 1, 5), namespace="team-b"),
        ],
    )
    assert (a.grant("team-a/x").replicas, a.grant("team-b/y").replicas) == (3, 5)
    assert "namespace team-a's H100-SXM limit of 3 GPUs" in a.grant("team-a/x").reason


def test_slo_gap_orders_one_priority_and_small_differences_keep_last_ticks_order() -> None:
    # One priority whose wants do not fit: each gets a fair share (2 of 5), and the SLO gap
    # decides who gets the remainder.
    budget = Budget("b", {H100: 5})
    a = allocate(budget, [d("a", (H100, 1, 4), slo_gap=0.0), d("b", (H100, 1, 4), slo_gap=0.6)])
    assert (a.grant("b").replicas, a.grant("a").replicas) == (3, 2)
    # Next tick "a" misses a little more than "b" now does: within the margin, b keeps its place.
    again = allocate(
        budget,
        [d("a", (H100, 1, 4), slo_gap=0.1, current_gpu_type=H100), d("b", (H100, 1, 4), slo_gap=0.0)],
        previous=a.by_name,
    )
    assert again.grant("b").replicas == 3


def test_equal_priorities_share_what_does_not_fit_and_neither_starves() -> None:
    # Issue 29 on the cluster: two services of priority 50, each missing its SLO while its
    # backlog drained, both wanted every GPU (6 of 7, a batch floor holding one); the one ranked
    # first took five, the other kept one and never caught up. Now each gets three.
    budget = Budget("b", {A100: 7})
    a = allocate(
        budget,
        [
            d("search", (A100, 1, 6), priority=50, min_replicas=1, slo_gap=6.2),
            d("assist", (A100, 1, 6), priority=50, min_replicas=1, slo_gap=6.1),
            d("batch", (A100, 1, 6), priority=1, min_replicas=1),
        ],
    )
    assert {g.name: g.replicas for g in a.grants} == {"search": 3, "assist": 3, "batch": 1}
    assert a.grant("assist").wanted == 6 and a.grant("assist").held
    assert "a fair share of budget b's GPUs among 2 services of priority 50" in a.grant("assist").reason
    # A want below the share is met in full, and the rest is shared among the others.
    b = allocate(
        budget,
        [
            d("x", (A100, 1, 1), priority=50),
            d("y", (A100, 1, 6), priority=50),
            d("z", (A100, 1, 6), priority=50),
        ],
    )
    assert sorted(g.replicas for g in b.grants) == [1, 3, 3]
    # The group's remainder stays in the group, never with a lower priority's want.
    c = allocate(
        Budget("b", {A100: 5}),
        [d("p", (A100, 1, 4), priority=5), d("q", (A100, 1, 4), priority=5), d("low", (A100, 1, 3))],
    )
    assert sorted((c.grant("p").replicas, c.grant("q").replicas)) == [2, 3] and c.grant("low").replicas == 0


def test_the_move_back_needs_the_margin() -> None:
    moved = d("x", (H100, 1, 4), (L40S, 1, 6), current_gpu_type=L40S)
    assert allocate(Budget("b", {H100: 4, L40S: 8}), [moved]).grant("x").gpu_type == L40S
    assert allocate(Budget("b", {H100: 5, L40S: 8}), [moved]).grant("x").gpu_type == H100


def test_a_held_service_moves_where_more_of_its_want_is_served_in_requests_per_s() -> None:
    # deploy/budget/fleet.yaml (issue 29): rag held its 4 L40S while 4 H100 sat idle. Its want
    # is capped at maxReplicas 100 on both types, so each holds 4% of it; by what a replica
    # carries, 4 H100 replicas serve 2.5x what 4 L40S replicas do.
    rag = d(
        "rag",
        (H100, 1, 100, 5.0),
        (L40S, 1, 100, 2.0),
        priority=50,
        min_replicas=1,
        current_gpu_type=L40S,
    )
    chat = d("chat", (H100, 1, 2, 15.0), priority=100, min_replicas=1, current_gpu_type=H100)
    a = allocate(Budget("fleet", {H100: 6, L40S: 4}), [chat, rag])
    assert (a.grant("rag").gpu_type, a.grant("rag").replicas) == (H100, 4)
    assert a.grant("chat").replicas == 2


def test_a_move_needs_a_replicas_worth_more_of_the_want() -> None:
    # 4 replicas of 1.2 req/s on H100 serve 4.8 req/s; the 4 on L40S serve 4.0, and a fifth
    # would serve 5.0: within a replica's worth, a move's cold start buys nothing.
    x = d("x", (H100, 1, 100, 1.2), (L40S, 1, 100, 1.0), current_gpu_type=L40S)
    assert allocate(Budget("b", {H100: 4, L40S: 4}), [x]).grant("x").gpu_type == L40S
    assert allocate(Budget("b", {H100: 5, L40S: 4}), [x]).grant("x").gpu_type == H100  # 6.0 >= 5.0


def test_without_rates_a_move_is_for_a_replicas_worth_more_of_the_share() -> None:
    # Held everywhere, rates unknown: 3 of 10 on H100 is one replica more than the 2 of 10 it
    # has on L40S (a 25% margin on the share asked 4.5 of 10 before).
    x = d("x", (H100, 1, 10), (L40S, 1, 10), current_gpu_type=L40S)
    assert allocate(Budget("b", {H100: 3, L40S: 2}), [x]).grant("x").gpu_type == H100
    assert allocate(Budget("b", {H100: 2, L40S: 2}), [x]).grant("x").gpu_type == L40S


def test_bad_input_is_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match="at least one option"):
        Demand("x", ())
    with pytest.raises(ValueError, match="H100-SXM limit must be >= 0"):
        Budget("b", {H100: -1})
    with pytest.raises(ValueError, match="unique"):
        allocate(Budget("b", {}), [d("x", (H100, 1, 1)), d("x", (H100, 1, 1))])


# -- properties ---------------------------------------------------------------------------

TYPES = (H100, L40S, A100)


@st.composite
def scenarios(draw: st.DrawFn, ahead: bool = True) -> tuple[Budget, list[Demand]]:
    limits = {t: draw(st.integers(0, 24)) for t in draw(st.lists(st.sampled_from(TYPES), min_size=1, unique=True))}
    demands = []
    for i in range(draw(st.integers(1, 7))):
        types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True))
        base = draw(st.integers(0, 12))  # the policy's count; other types need more or fewer replicas
        options = tuple(
            Option(
                t,
                draw(st.sampled_from((1, 2, 4))),
                draw(st.integers(max(1, base // 2), 2 * base)) if base else 0,
                rate,  # what a replica carries: the move rule compares requests/s when all know it
                draw(st.integers(0, 3)) if ahead else 0,  # room its forecast asks for one lead further
            )
            for t, rate in zip(types, draw(st.sampled_from(((0.0,) * 3, (1.0, 2.5, 0.7)))), strict=False)
        )
        demands.append(
            Demand(
                f"s{i}",
                options,
                priority=draw(st.integers(0, 3)),
                min_replicas=draw(st.integers(0, 2)),
                slo_gap=draw(st.floats(-1, 3)),
                current_gpu_type=draw(st.sampled_from((None, *types))),
            )
        )
    return Budget("b", limits), demands


def _used(a: Allocation) -> dict[str, int]:
    used: dict[str, int] = {}
    for g in a.grants:
        if g.gpus:
            used[g.gpu_type] = used.get(g.gpu_type, 0) + g.gpus
    return used


@settings(max_examples=150, deadline=None)  # the machine's load, not the allocator, sets the time
@given(scenarios())
def test_never_above_a_limit(case: tuple[Budget, list[Demand]]) -> None:
    budget, demands = case
    a = allocate(budget, demands)
    assert _used(a) == a.used
    for gpu, limit in budget.limits.items():
        assert a.used.get(gpu, 0) + a.reserved.get(gpu, 0) <= limit  # room ahead is within the limit too
    for g in a.grants:
        assert 0 <= g.replicas <= g.wanted


@settings(max_examples=150, deadline=None)  # the machine's load, not the allocator, sets the time
@given(scenarios())
def test_without_contention_the_allocation_is_the_independent_decisions(case: tuple[Budget, list[Demand]]) -> None:
    _, demands = case
    fresh = [Demand(x.name, x.options, x.priority, x.min_replicas, slo_gap=x.slo_gap) for x in demands]
    need: dict[str, int] = {}
    for x in fresh:
        o = x.options[0]
        # Room for its want and the room ahead its forecast asks for (held before lower wants).
        need[o.gpu_type] = need.get(o.gpu_type, 0) + (max(o.wanted, x.min_replicas) + o.ahead) * o.gpus_per_replica
    a = allocate(Budget("roomy", need), fresh)
    for x in fresh:
        g = a.grant(x.name)
        assert (g.gpu_type, g.replicas, g.held) == (
            x.options[0].gpu_type,
            max(x.options[0].wanted, x.min_replicas),
            False,
        )


# Issue 38: at 150 examples its counterexample surfaced on some runs only.
@settings(max_examples=600, deadline=None)
@given(scenarios())
def test_priority_order(case: tuple[Budget, list[Demand]]) -> None:
    """A service held on a GPU type leaves lower priorities at most their floors there (up to
    less than one of its replicas, which it cannot use)."""
    budget, demands = case
    a = allocate(budget, demands)
    for high in a.grants:
        if not high.held:
            continue
        above_floor = sum(
            (g.replicas - min(g.replicas, g.min_replicas)) * g.gpus_per_replica
            for g in a.grants
            if g.priority < high.priority and g.gpu_type == high.gpu_type
        )
        assert above_floor < high.gpus_per_replica


@settings(max_examples=150, deadline=None)  # the machine's load, not the allocator, sets the time
@given(scenarios())
def test_floors_first(case: tuple[Budget, list[Demand]]) -> None:
    """A service short of its floor means the floors alone fill what it could use."""
    budget, demands = case
    a = allocate(budget, demands)
    for g in a.grants:
        if g.replicas < g.min_replicas:
            assert "does not fit" in g.reason


@settings(max_examples=150, deadline=None)  # the machine's load, not the allocator, sets the time
@given(scenarios(ahead=False))
def test_the_same_inputs_give_the_same_allocation_next_tick(case: tuple[Budget, list[Demand]]) -> None:
    """No flapping: feeding a tick's result back (where each runs, its rank) changes nothing."""
    budget, demands = case
    first = allocate(budget, demands)
    settled = [
        Demand(x.name, x.options, x.priority, x.min_replicas, x.namespace, x.slo_gap, first.grant(x.name).gpu_type)
        for x in demands
    ]
    second = allocate(budget, settled, previous=first.by_name)
    third = allocate(
        budget,
        [
            Demand(x.name, x.options, x.priority, x.min_replicas, x.namespace, x.slo_gap, second.grant(x.name).gpu_type)
            for x in demands
        ],
        previous=second.by_name,
    )
    assert [(g.name, g.gpu_type, g.replicas) for g in third.grants] == [
        (g.name, g.gpu_type, g.replicas) for g in second.grants
    ]


def test_grant_is_typed() -> None:
    a = allocate(Budget("b", {}), [d("x", (H100, 2, 3))])
    g: Grant = a.grant("x")
    assert (g.gpus, g.held) == (6, False)


def test_idle_window_releases_the_last_replica_and_a_wait_brings_it_back() -> None:
    from kvscale.autoscaling.idle import idle_replicas

    assert idle_replicas(1, 1, 9999.0, 300.0, 0.0) == (1, None)  # a floor above zero: untouched
    assert idle_replicas(1, 0, 299.0, 300.0, 0.0) == (1, None)
    replicas, why = idle_replicas(1, 0, 300.0, 300.0, 0.0)
    assert replicas == 0 and why is not None and "idle window 300s" in why
    assert idle_replicas(0, 0, 100.0, 300.0, 0.0)[0] == 1  # the policy's 0 waits for the window
    replicas, why = idle_replicas(0, 0, 9999.0, 300.0, 3.0)
    assert replicas == 1 and why is not None and "3 requests wait" in why
    assert idle_replicas(0, 0, None, 300.0, None)[0] == 1  # unknown never releases
    assert idle_replicas(2, 0, 9999.0, 300.0, None) == (2, None)


def test_a_failed_attempt_to_make_room_leaves_the_floors_where_they_were() -> None:
    # Found by test_floors_first: s2 tried the cheaper H100 and moved s1's floor to L40S for it,
    # found too little room there and went back to L40S, where s1 now held what its floor needed.
    budget = Budget("b", {"H100-SXM": 5, "A100-80GB": 0, "L40S": 4})
    h100 = (Option("H100-SXM", 1, 0),)
    demands = [
        Demand("s0", (Option("H100-SXM", 1, 1),)),
        Demand("s1", (Option("H100-SXM", 1, 1), Option("L40S", 1, 1)), min_replicas=1),
        Demand(
            "s2",
            (Option("A100-80GB", 1, 0), Option("H100-SXM", 1, 0), Option("L40S", 2, 0)),
            priority=1,
            min_replicas=2,
            current_gpu_type="L40S",
        ),
        Demand("s3", h100),
        Demand("s4", h100),
        Demand("s5", h100),
        Demand(
            "s6",
            (Option("H100-SXM", 2, 0), Option("L40S", 2, 0), Option("A100-80GB", 1, 0)),
            min_replicas=2,
            slo_gap=1.0,
        ),
    ]
    a = allocate(budget, demands)
    assert all(g.replicas >= g.min_replicas for g in a.grants), [(g.name, g.gpu_type, g.replicas) for g in a.grants]


def test_a_limit_cut_below_the_floors_keeps_them_in_priority_order_and_names_the_one_short() -> None:
    a = allocate(
        Budget("b", {H100: 2}),
        [
            d("low", (H100, 1, 3), priority=1, min_replicas=1),
            d("top", (H100, 1, 3), priority=100, min_replicas=1),
            d("mid", (H100, 1, 3), priority=50, min_replicas=1),
        ],
    )
    assert [(g.name, g.replicas, g.floor_short, g.over_limit) for g in a.grants] == [
        ("top", 1, 0, 0),
        ("mid", 1, 0, 0),
        ("low", 0, 1, 0),  # behind a gateway it may go to zero: its requests wait there
    ]
    assert a.used == {H100: 2}
    assert "minReplicas 1 does not fit (1 short)" in a.grant("low").reason


def test_a_service_without_a_gateway_keeps_one_replica_beyond_the_limit() -> None:
    # Issue 29: a limit cut below the floors took a minReplicas 1 service behind a plain
    # Service to zero. A running one keeps one, beyond the limit, and takes nothing from the others.
    a = allocate(
        Budget("b", {H100: 1}),
        [
            d("plain", (H100, 1, 3), priority=1, min_replicas=1, gateway=False, running=True),
            d("top", (H100, 1, 3), priority=100, min_replicas=1),
        ],
    )
    assert [(g.name, g.replicas, g.floor_short, g.over_limit) for g in a.grants] == [
        ("top", 1, 0, 0),
        ("plain", 1, 0, 1),
    ]
    assert a.used == {H100: 2}  # what runs, the replica beyond the limit included
    assert "1 replica beyond the H100-SXM limit: no gateway holds its requests at zero" in a.grant("plain").reason
    # minReplicas 0 and a limit of 0: still one.
    alone = allocate(Budget("b", {H100: 0}), [d("plain", (H100, 1, 2), gateway=False, running=True)])
    assert (alone.grant("plain").replicas, alone.grant("plain").over_limit) == (1, 1)
    # Room within the limit: no replica beyond it.
    roomy = allocate(Budget("b", {H100: 4}), [d("plain", (H100, 1, 2), gateway=False)])
    assert (roomy.grant("plain").replicas, roomy.grant("plain").over_limit) == (2, 0)
    # With a gateway the same service may be cut to zero.
    gated = allocate(Budget("b", {H100: 0}), [d("gated", (H100, 1, 2))])
    assert gated.grant("gated").replicas == 0


def test_services_without_a_gateway_never_take_a_budget_beyond_its_limit_by_more_than_one_replica() -> None:
    # Issue 38: five TP8 services behind plain Services under a namespace limit of 8 H100 were
    # granted 40 (each kept "one replica beyond the limit"). One runs within the limit; the new
    # ones are refused and say what to do.
    budget = Budget("b", {H100: 64}, namespace_limits={"t": {H100: 8}})
    five = [d(f"t/s{i}", (H100, 8, 1), min_replicas=1, namespace="t", gateway=False) for i in range(5)]
    a = allocate(budget, five)
    assert a.used == {H100: 8}
    assert [(g.name, g.replicas, g.refused) for g in a.grants] == [
        ("t/s0", 1, False),
        *((f"t/s{i}", 0, True) for i in range(1, 5)),
    ]
    why = a.grant("t/s1").reason
    assert "refused: no gateway (spec.routing.inferencePool or kedaHttp) holds its requests at zero" in why
    assert "budget b has no room for one replica (8 H100-SXM) within its limit: raise the limit" in why
    # All five already running (a limit cut below them): one keeps its replica beyond the limit,
    # the others are refused: a budget runs at most one replica beyond its limit.
    running = allocate(budget, [replace(x, running=True) for x in five])
    assert sorted(g.replicas for g in running.grants) == [0, 0, 0, 1, 1] and running.used == {H100: 16}
    assert sum(g.over_limit for g in running.grants) == 1
    # A higher priority created later takes the floor within the limit: the running one keeps
    # its replica beyond it, and a third, older, lower one is refused rather than a second beyond.
    escalate = allocate(
        budget,
        [
            replace(five[0], running=True, priority=1),
            replace(five[1], running=True, priority=2),
            replace(five[2], priority=3),
        ],
    )
    assert [(g.name, g.replicas, g.over_limit, g.refused) for g in escalate.grants] == [
        ("t/s2", 1, 0, False),
        ("t/s1", 1, 1, False),
        ("t/s0", 0, 0, True),
    ]


@settings(max_examples=400, deadline=None)
@given(scenarios(), st.lists(st.booleans(), min_size=7, max_size=7), st.lists(st.booleans(), min_size=7, max_size=7))
def test_without_a_gateway_never_zero_unless_refused_and_beyond_a_limit_by_one_replica_at_most(
    case: tuple[Budget, list[Demand]], gateways: list[bool], running: list[bool]
) -> None:
    budget, demands = case
    demands = [replace(x, gateway=gw, running=run) for x, gw, run in zip(demands, gateways, running, strict=False)]
    a = allocate(budget, demands)
    for x in demands:
        g = a.grant(x.name)
        if not x.gateway:
            assert (g.replicas >= 1) != g.refused
        assert not g.refused or (not x.gateway and g.replicas == 0)
        assert g.over_limit <= 1 and (g.over_limit == 0 or (not x.gateway and x.running))
        assert g.over_limit == 0 or g.replicas == 1  # beyond the limit only the one replica
    assert sum(g.over_limit for g in a.grants) <= 1  # of one service per budget
    # Less the replicas kept beyond it, every limit holds.
    for gpu, limit in budget.limits.items():
        within = sum((g.replicas - g.over_limit) * g.gpus_per_replica for g in a.grants if g.gpu_type == gpu)
        assert within <= limit
        assert a.used.get(gpu, 0) == sum(g.gpus for g in a.grants if g.gpu_type == gpu)


def test_what_a_moved_floor_frees_goes_to_the_higher_priority_first() -> None:
    # Found by test_priority_order: s4's floor sat on A100, so s6 (priority 2) got nothing there;
    # s1 (priority 1) then moved s4 to L40S and took every A100 it freed, s6 still at 0.
    a = allocate(
        Budget("b", {L40S: 8, A100: 8}),
        [
            d("s1", (A100, 4, 2), (L40S, 2, 5), (H100, 1, 1), priority=1, min_replicas=1, current_gpu_type=L40S),
            d("s4", (L40S, 4, 1), (A100, 4, 1), min_replicas=2),
            d("s6", (A100, 1, 1), priority=2),
        ],
    )
    assert (a.grant("s6").gpu_type, a.grant("s6").replicas) == (A100, 1)
    assert (a.grant("s4").gpu_type, a.grant("s4").replicas) == (L40S, 2)
    assert a.grant("s1").replicas >= 1 and a.used.get(A100, 0) <= 8


def test_floors_that_cannot_make_room_stay_put_from_tick_to_tick() -> None:
    # s2's floor (2 replicas of 4 GPUs) fits neither type; moving s1's floor between them to
    # try made no room, and the moves it left behind swapped s1 and s2 every tick (found by
    # the property test below once options carried more fields).
    budget = Budget("b", {H100: 4, L40S: 4})
    demands = [d("s0", (H100, 1, 0)), d("s1", (H100, 1, 0), (L40S, 1, 0), min_replicas=1)]
    demands.append(d("s2", (H100, 4, 0), (L40S, 4, 0), min_replicas=2))
    first = allocate(budget, demands)
    settled = [replace(x, current_gpu_type=first.grant(x.name).gpu_type) for x in demands]
    second = allocate(budget, settled, previous=first.by_name)
    assert [(g.name, g.gpu_type, g.replicas) for g in second.grants] == [
        (g.name, g.gpu_type, g.replicas) for g in first.grants
    ]


@settings(max_examples=150, deadline=None)  # the machine's load, not the allocator, sets the time
@given(scenarios())
def test_with_room_ahead_the_allocation_settles_and_never_cycles(case: tuple[Budget, list[Demand]]) -> None:
    """Room held ahead changes where lower priorities fit, so a return to a preferred type
    may follow a tick later (one more settling tick than without it); it settles, never cycles."""
    budget, demands = case
    previous: dict[str, Grant] | None = None
    where = {x.name: x.current_gpu_type for x in demands}
    seen: list[list[tuple[str, str, int, int]]] = []
    for _ in range(5):
        a = allocate(budget, [replace(x, current_gpu_type=where[x.name]) for x in demands], previous=previous)
        now = [(g.name, g.gpu_type, g.replicas, g.ahead) for g in a.grants]
        if seen and now == seen[-1]:
            return
        assert now not in seen, f"the allocation cycles: {[*seen, now]}"
        seen.append(now)
        previous, where = a.by_name, {g.name: g.gpu_type for g in a.grants}
    raise AssertionError(f"not settled within 4 ticks: {seen}")


def test_equal_priorities_hand_out_the_remainder_one_replica_at_a_time() -> None:
    # Issue 38: 8 equal services wanting 5 each under a limit of 5 got [5, 0, 0, 0, 0, 0, 0, 0];
    # max-min fairness hands the remainder out one replica at a time, in the group's order.
    a = allocate(Budget("b", {H100: 5}), [d(f"s{i}", (H100, 1, 5)) for i in range(8)])
    assert [g.replicas for g in a.grants] == [1, 1, 1, 1, 1, 0, 0, 0]
    assert a.used == {H100: 5}
    # Beyond the equal share, still one at a time: 3 services wanting 9 under 11 get 4, 4, 3.
    b = allocate(Budget("b", {H100: 11}), [d(f"s{i}", (H100, 1, 9)) for i in range(3)])
    assert [g.replicas for g in b.grants] == [4, 4, 3]


def test_each_gpu_type_is_bounded_by_the_budget_its_option_names() -> None:
    # Issue 38: several budgets select one service, each type bounded by the tightest that limits
    # it. Options name their budget; two services on one type under different budgets do not
    # compete, and each grant says which budget bounds it.
    team = Budget("team-a100", {A100: 4})
    cap = Budget("h100-cap", {H100: 0})
    a = allocate(
        Budget("", {}),
        [
            d("bud/x", (A100, 1, 3, 0.0, 0, "team-a100"), (H100, 1, 3, 0.0, 0, "h100-cap"), namespace="bud"),
            d("bud/y", (A100, 1, 3, 0.0, 0, "team-a100"), namespace="bud"),
            d("other/z", (A100, 1, 10)),  # no budget limits its A100s
        ],
        pools={"team-a100": team, "h100-cap": cap},
    )
    assert sorted(a.grant(n).replicas for n in ("bud/x", "bud/y")) == [2, 2]
    assert a.grant("other/z").replicas == 10
    assert {a.grant(n).budget for n in ("bud/x", "bud/y")} == {"team-a100"}
    assert a.used_by_budget == {"team-a100": {A100: 4}, "": {A100: 10}}
    assert "budget team-a100's GPUs" in a.grant("bud/y").reason
    with pytest.raises(ValueError, match="names budget 'gone', which pools does not hold"):
        allocate(Budget("", {}), [d("x", (A100, 1, 1, 0.0, 0, "gone"))])


def test_a_service_at_its_whole_want_on_the_option_it_got_is_not_held() -> None:
    # Issue 38, finding 7 (test_priority_order failed on some runs only): under a fair share, a
    # service's "true want" was read from the uncapped allocation, which had it on another option
    # (2 on H100, where nothing fits); granted its whole want of 1 on A100 it counted as held,
    # "wanted 2, got 1", and a lower priority's A100 above its floor broke the priority order.
    budget = Budget("b", {A100: 12, H100: 0, L40S: 0})
    a = allocate(
        budget,
        [
            d("s0", (H100, 1, 1), (L40S, 1, 1), (A100, 1, 1)),
            d("s1", (H100, 1, 2), (L40S, 1, 1), (A100, 1, 1), priority=2),
            d("s2", (A100, 4, 3), (H100, 1, 1), priority=2, slo_gap=1.0),
        ],
    )
    s1 = a.grant("s1")
    assert (s1.gpu_type, s1.replicas, s1.wanted, s1.held) == (A100, 1, 1, False)
    s2 = a.grant("s2")
    assert (s2.gpu_type, s2.replicas, s2.wanted, s2.held) == (A100, 2, 3, True)
    assert a.grant("s0").gpus < s2.gpus_per_replica  # what a held priority leaves below it


def test_what_a_priority_s_fair_shares_leave_free_goes_to_its_held_services_before_lower_ones() -> None:
    # Found by test_priority_order at 600 examples: s1's larger cap kept it on H100 (hysteresis),
    # so its share stopped at 3 of 4 on L40S, and the two L40S left went to s3, priority 0.
    a = allocate(
        Budget("b", {H100: 6, L40S: 8, A100: 0}),
        [
            d("s0", (H100, 2, 2), (L40S, 1, 1), priority=3),
            d("s1", (H100, 1, 3), (L40S, 2, 4), (A100, 1, 1), priority=3, current_gpu_type=H100),
            d("s2", (H100, 1, 0), (L40S, 1, 0), priority=3, min_replicas=1, current_gpu_type=L40S),
            d("s3", (L40S, 1, 2)),
        ],
    )
    assert [(g.name, g.gpu_type, g.replicas, g.held) for g in a.grants] == [
        ("s0", H100, 2, False),
        ("s1", L40S, 4, False),
        ("s2", H100, 1, False),
        ("s3", L40S, 0, True),
    ]


def test_what_a_lower_priority_frees_by_moving_goes_to_a_higher_one_held_to_its_share() -> None:
    # Found by the property test at 4,000 examples: s2 (priority 2) was held to a share of 1 on
    # L40S; s3 (priority 1) then moved its floor to H100 and the two L40S it freed went to s5
    # (priority 1), above its floor, while s2 wanted them.
    a = allocate(
        Budget("b", {H100: 1, L40S: 5, A100: 0}),
        [
            d("s0", (H100, 1, 0), priority=2),
            d("s2", (L40S, 2, 2), (H100, 1, 1), priority=2),
            d("s3", (L40S, 2, 2), (H100, 1, 1), (A100, 1, 1), priority=1, min_replicas=1),
            d("s5", (L40S, 1, 3), (H100, 1, 1), priority=1, min_replicas=1),
        ],
    )
    assert (a.grant("s2").gpu_type, a.grant("s2").replicas, a.grant("s2").held) == (L40S, 2, False)
    assert (a.grant("s5").replicas, a.grant("s3").replicas) == (1, 1)  # the floors, within 5 L40S and 1 H100
