"""Scale to zero on a tick: refused behind a plain Service (condition, one replica kept);
behind an InferencePool or the KEDA HTTP add-on's interceptor the last replica goes after the
idle window and comes back when the gateway's queue holds requests; unknown figures never
release it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kvscale.api.intent import parse_intent
from kvscale.autoscaling.observation import Observation
from kvscale.control.reconcile import DeploymentView
from kvscale.control.scale_zero import (
    CONDITION,
    KEDA_PENDING_METRIC,
    QUEUE_METRIC,
    gateway_queue,
    queue_promql,
    queue_queries,
    scale_zero,
)
from kvscale.control.scaling import Fleet, ScalerMemory, Tick, fleet, tick
from kvscale.control.status import get_condition
from tests.unit.test_reconcile import CAT, NOW, RES, SETTINGS, deployed, spec

ZERO = spec(scaling={"minReplicas": 0, "idleWindow": "2m"})
POOLED = spec(scaling={"minReplicas": 0, "idleWindow": "2m"}, routing={"inferencePool": {}})
KEDA = spec(scaling={"minReplicas": 0, "idleWindow": "2m"}, routing={"kedaHttp": {}})


def run(
    body: dict[str, Any],
    current: int,
    rate: float | None,
    queue: float | None,
    memo: dict[str, Any],
    at: dt.datetime = NOW,
) -> Tick:
    first = deployed(body)
    intent = parse_intent(body)
    gpu = first.status.plan.gpu_type if first.status.plan else None
    start = fleet(intent, first.status, DeploymentView(current, current, gpu))
    assert isinstance(start, Fleet) and start.current == current
    obs = Observation(
        time_s=at.timestamp(),
        ready_replicas=current,
        starting_replicas=0,
        arrival_rate_per_s=rate,
        running=0.0 if rate is not None else None,
        waiting=0.0 if rate is not None else None,
        ttft_p_s=None,
        tpot_p_s=None,
    )
    done = tick(intent, RES, first.status, start, obs, None, ScalerMemory(), CAT, SETTINGS, at)
    return scale_zero(intent, RES, first.status, start, obs, queue, done, memo, 95.0, at)


def test_the_queue_query_reads_the_pickers_gauge_in_the_services_namespace() -> None:
    # inference_pool is the bare pool name (the picker's --pool-name): one name in two
    # namespaces is one label value, so the picker pod's namespace tells them apart (issue 28).
    assert queue_promql("t2", "chat") == (
        'sum(inference_extension_flow_control_queue_size{namespace="t2",inference_pool="chat"})'
    )
    assert QUEUE_METRIC == "inference_extension_flow_control_queue_size"
    assert queue_queries(parse_intent(POOLED), RES) == (queue_promql(RES.namespace, RES.name),)
    # Label values are escaped: a quote cannot end the matcher and widen the query.
    assert queue_promql('a"b', "c\\d") == (
        'sum(inference_extension_flow_control_queue_size{namespace="a\\"b",inference_pool="c\\\\d"})'
    )


def test_refused_behind_a_plain_service_with_one_replica_kept() -> None:
    done = run(ZERO, 1, 0.0, None, {})
    c = get_condition(done.result.status, CONDITION)
    assert c is not None and (c.status, c.reason) == ("False", "NoQueueSignal")
    assert "spec.routing.inferencePool" in c.message and "spec.routing.kedaHttp" in c.message
    assert done.result.scale_to is None and done.decision.replicas >= 1


def test_idle_window_releases_the_last_replica_behind_a_pool() -> None:
    memo: dict[str, Any] = {}
    first = run(POOLED, 1, 0.0, 0.0, memo)
    assert first.result.scale_to is None  # idle for 0 s
    c = get_condition(first.result.status, CONDITION)
    assert c is not None and c.status == "True" and "about 95s" in c.message and "after 120s" in c.message
    later = run(POOLED, 1, 0.0, 0.0, memo, NOW + dt.timedelta(minutes=3))
    assert later.result.scale_to == 0 and later.result.status.replicas == 0
    assert any(e.reason == "Scaled" and "releasing every replica" in e.message for e in later.result.events)


def test_unknown_traffic_or_queue_never_releases() -> None:
    memo: dict[str, Any] = {}
    run(POOLED, 1, None, 0.0, memo)
    assert run(POOLED, 1, None, 0.0, memo, NOW + dt.timedelta(minutes=10)).result.scale_to is None
    memo = {}
    run(POOLED, 1, 0.0, None, memo)
    assert run(POOLED, 1, 0.0, None, memo, NOW + dt.timedelta(minutes=10)).result.scale_to is None


def test_requests_waiting_at_the_gateway_bring_it_back() -> None:
    memo: dict[str, Any] = {"last_active_s": (NOW - dt.timedelta(hours=1)).timestamp()}
    assert run(POOLED, 0, None, 0.0, memo).result.scale_to is None  # at zero, nothing waits: stays
    back = run(POOLED, 0, None, 3.0, memo)
    assert back.result.scale_to == 1 and back.decision.replicas == 1
    assert any("3 requests wait for a replica" in e.message for e in back.result.events)
    c = get_condition(back.result.status, CONDITION)
    assert c is not None and "at zero" in c.message and "gateway queue 3" in c.message


def test_the_keda_http_add_ons_pending_count_is_read_per_http_scaled_object() -> None:
    # github.com/kedacore/http-add-on v0.8.0 interceptor/metrics/prommetrics.go: the gauge
    # interceptor_pending_request_count, attribute host = the HTTPScaledObject's namespace/name.
    assert KEDA_PENDING_METRIC == "interceptor_pending_request_count"
    assert queue_queries(parse_intent(KEDA), RES) == (
        f'sum(interceptor_pending_request_count{{host="{RES.namespace}/{RES.name}"}})',
    )
    named = spec(scaling={"minReplicas": 0}, routing={"kedaHttp": {"httpScaledObject": "front"}})
    both = spec(scaling={"minReplicas": 0}, routing={"kedaHttp": {"httpScaledObject": "front"}, "inferencePool": {}})
    assert queue_queries(parse_intent(named), RES) == (
        f'sum(interceptor_pending_request_count{{host="{RES.namespace}/front"}})',
    )
    assert len(queue_queries(parse_intent(both), RES)) == 2
    assert queue_queries(parse_intent(ZERO), RES) == ()
    # Both read: their sum; one unread: unknown (never releases).
    assert gateway_queue([0.0, 2.0]) == 2.0
    assert gateway_queue([0.0, None]) is None and gateway_queue([]) is None


def test_behind_the_keda_interceptor_it_releases_and_comes_back() -> None:
    memo: dict[str, Any] = {}
    first = run(KEDA, 1, 0.0, 0.0, memo)
    c = get_condition(first.result.status, CONDITION)
    assert c is not None and (c.status, c.reason) == ("True", "Enabled") and "about 95s" in c.message
    later = run(KEDA, 1, 0.0, 0.0, memo, NOW + dt.timedelta(minutes=3))
    assert later.result.scale_to == 0
    back = run(KEDA, 0, None, 2.0, memo, NOW + dt.timedelta(minutes=4))
    assert back.result.scale_to == 1
    assert any("2 requests wait for a replica" in e.message for e in back.result.events)


def test_a_wake_is_sized_by_the_queue_and_the_arrival_rate() -> None:
    # Issue 29: 50 requests waiting at the gateway woke the service to one replica. A wake
    # starts what the policy's backlog term asks: the arrival rate plus the queue drained
    # within the cold start and the TTFT target, over what one replica carries.
    from kvscale.autoscaling.idle import wake_replicas

    assert wake_replicas(50, None, 1.0, 10.0, 20) == 5  # 50 / 10 s = 5 req/s over 1 req/s each
    assert wake_replicas(50, 2.0, 1.0, 10.0, 20) == 7  # and 2 req/s arriving
    assert wake_replicas(50, 2.0, 1.0, 10.0, 6) == 6  # within maxReplicas
    assert wake_replicas(1, None, 1.0, 10.0, 20) == 1  # at least one, never zero
    assert wake_replicas(50, None, 0.0, 10.0, 20) == 1  # capacity unknown: one
    body = spec(scaling={"minReplicas": 0, "maxReplicas": 20, "idleWindow": "2m"}, routing={"inferencePool": {}})
    plan = deployed(body).status.plan
    assert plan is not None
    drain_s = 95.0 + parse_intent(body).slo.ttft_s  # run() hands a 95 s cold start
    queue = 3.5 * plan.rate_per_replica * drain_s  # 3.5 replicas' worth: 4
    memo: dict[str, Any] = {"last_active_s": (NOW - dt.timedelta(hours=1)).timestamp()}
    back = run(body, 0, None, queue, memo)
    assert back.result.scale_to == 4 and back.decision.replicas == 4
    assert any(
        f"{queue:.0f} requests wait for a replica: scaling back from zero to 4" in e.message for e in back.result.events
    )


def test_while_the_woken_replicas_start_the_queue_keeps_the_wake_sized() -> None:
    # One replica started (none ready yet: the policy sees no engine queue) with the queue
    # still at the gateway: it grows to what the queue needs rather than sitting at one.
    body = spec(scaling={"minReplicas": 0, "maxReplicas": 20, "idleWindow": "2m"}, routing={"inferencePool": {}})
    first = deployed(body)
    intent = parse_intent(body)
    plan = first.status.plan
    assert plan is not None
    start = fleet(intent, first.status, DeploymentView(1, 0, plan.gpu_type))
    assert isinstance(start, Fleet)
    obs = Observation(time_s=NOW.timestamp(), ready_replicas=0, starting_replicas=1)
    done = tick(intent, RES, first.status, start, obs, None, ScalerMemory(), CAT, SETTINGS, NOW)
    queue = 2.5 * plan.rate_per_replica * (95.0 + intent.slo.ttft_s)
    out = scale_zero(intent, RES, first.status, start, obs, queue, done, {}, 95.0, NOW)
    assert out.result.scale_to == 3
    # Once a replica is ready the policy sizes it from the engines' own queues.
    ready = Fleet(1, 1, plan)
    done = tick(intent, RES, first.status, ready, obs, None, ScalerMemory(), CAT, SETTINGS, NOW)
    out = scale_zero(intent, RES, first.status, ready, obs, queue, done, {}, 95.0, NOW)
    assert out.decision.replicas == done.decision.replicas
