"""Prometheus answers of every shape end as numbers or as a Missing with a reason, counted
when they are errors; the async observation holds its deadline. Answers come from
httpx.MockTransport (no sockets); tests/cluster/test_reliability.py does the same over a
real local HTTP server."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscale.autoscaling.observation import DecisionKind, Observation
from kvscale.autoscaling.policy import PolicyConfig, PolicyState, decide
from kvscale.metrics.client import (
    AsyncPrometheusClient,
    Missing,
    MissingKind,
    PrometheusError,
    parse_response,
)
from kvscale.metrics.engines import ENGINES
from kvscale.metrics.observe import observe_async
from kvscale.metrics.promql import queries

BASE = "http://prometheus.test"


def vector(*values: Any) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1700000000.0, v]} for v in values]},
    }


def answering(body: Any, status: int = 200) -> httpx.MockTransport:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.MockTransport(lambda request: httpx.Response(status, content=raw))


def reading_of(client: AsyncPrometheusClient, promql: str = "q") -> float | Missing:
    async def go() -> float | Missing:
        try:
            return await client.scalar(promql)
        finally:
            await client.aclose()

    return asyncio.run(go())


def async_reading(body: Any, status: int = 200) -> tuple[float | Missing, AsyncPrometheusClient]:
    client = AsyncPrometheusClient(BASE, retries=0, transport=answering(body, status))
    return reading_of(client), client


MALFORMED: list[tuple[Any, int, MissingKind, str]] = [
    (vector("oops"), 200, MissingKind.MALFORMED, "not a number: 'oops'"),
    (
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}},
        200,
        MissingKind.MALFORMED,
        "without a value",
    ),
    ({"status": "success", "data": None}, 200, MissingKind.MALFORMED, "data null"),
    ([1, 2, 3], 200, MissingKind.MALFORMED, "a JSON list"),
    (
        {"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}},
        200,
        MissingKind.MALFORMED,
        "vector result of type dict",
    ),
    (
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
        200,
        MissingKind.MALFORMED,
        "resultType 'matrix'",
    ),
    (
        {"status": "success", "data": {"resultType": "scalar", "result": [1]}},
        200,
        MissingKind.MALFORMED,
        "not [timestamp, value]",
    ),
    (vector([1, 2]), 200, MissingKind.MALFORMED, "not a number"),
    (vector(True), 200, MissingKind.MALFORMED, "not a number"),
    (
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": 5, "value": [1, "1"]}]}},
        200,
        MissingKind.MALFORMED,
        "labels",
    ),
    (b"<html>oops</html>", 200, MissingKind.MALFORMED, "no JSON"),
    (b"", 502, MissingKind.UNREACHABLE, "HTTP 502"),
    ({"status": "error", "errorType": "bad_data", "error": "parse error"}, 400, MissingKind.REJECTED, "bad_data"),
    ({"status": "error", "errorType": "internal", "error": "boom"}, 500, MissingKind.UNREACHABLE, "boom"),
    (vector("-5"), 200, MissingKind.NEGATIVE, "-5"),
    (vector("1", "2"), 200, MissingKind.AMBIGUOUS, "2 series"),
]


@pytest.mark.parametrize(("body", "status", "kind", "reason"), MALFORMED)
def test_every_wrong_answer_is_a_counted_missing(body: Any, status: int, kind: MissingKind, reason: str) -> None:
    reading, client = async_reading(body, status)
    assert isinstance(reading, Missing) and reading.kind is kind, reading
    assert reason in reading.reason
    assert client.errors == {kind.value: 1}


def test_normal_answers() -> None:
    read = async_reading
    assert read(vector("2.5"))[0] == 2.5
    assert read({"status": "success", "data": {"resultType": "scalar", "result": [1, "7"]}})[0] == 7.0
    empty, client = read(vector())
    assert isinstance(empty, Missing) and empty.kind is MissingKind.EMPTY and not client.errors
    nan, client = read(vector("NaN"))
    assert isinstance(nan, Missing) and nan.kind is MissingKind.NOT_FINITE and not client.errors
    assert isinstance(read(vector("+Inf"))[0], Missing)


@settings(max_examples=200, deadline=None)
@given(
    body=st.recursive(
        st.none() | st.booleans() | st.floats() | st.text(max_size=5) | st.integers(),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=4),
        max_leaves=12,
    ),
    status=st.sampled_from([200, 400, 422, 500, 503]),
)
def test_any_json_parses_or_raises_a_typed_error(body: Any, status: int) -> None:
    for wrapped in (
        body,
        {"status": "success", "data": body},
        {"status": "success", "data": {"resultType": "vector", "result": body}},
    ):
        try:
            samples = parse_response("q", status, json.dumps(wrapped).encode())
        except PrometheusError as exc:
            assert isinstance(exc.kind, MissingKind) and exc.kind.is_error
        else:
            assert all(isinstance(s.value, float) for s in samples)


def test_scalar_tells_no_value_from_an_error() -> None:
    nan = reading_of(AsyncPrometheusClient(BASE, retries=0, transport=answering(vector("NaN"))))
    assert isinstance(nan, Missing) and not nan.is_error
    oops = reading_of(AsyncPrometheusClient(BASE, retries=0, transport=answering(vector("oops"))))
    assert isinstance(oops, Missing) and oops.is_error and "not a number" in oops.reason


def test_retries_then_unreachable() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("refused", request=request)

    client = AsyncPrometheusClient(BASE, retries=2, backoff_s=0.0, transport=httpx.MockTransport(handler))
    reading = reading_of(client, "up")
    assert isinstance(reading, Missing) and reading.kind is MissingKind.UNREACHABLE
    assert "unreachable after 3 tries" in reading.reason and len(calls) == 3


def slow_transport(delay_s: float, body: Any) -> httpx.MockTransport:
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(delay_s)
        return httpx.Response(200, content=json.dumps(body).encode())

    return httpx.MockTransport(handler)


def test_observe_async_holds_its_deadline_and_says_why() -> None:
    client = AsyncPrometheusClient(BASE, timeout_s=5.0, retries=0, transport=slow_transport(10.0, vector("1")))

    async def go() -> tuple[Any, str | None, float]:
        started = time.monotonic()
        obs, why = await observe_async(client, "vllm", "ns", "svc", 95, 2, 0, time.time(), deadline_s=0.3)
        await client.aclose()
        return obs, why, time.monotonic() - started

    obs, why, took = asyncio.run(go())
    assert took < 1.5, took
    assert obs.stale and not obs.complete and obs.ready_replicas == 2
    assert why is not None and "within 0.3s" in why
    assert client.errors["timeout"] >= 1


def test_a_slow_prometheus_does_not_block_the_event_loop() -> None:
    """Other coroutines keep running while a query waits on a slow answer."""
    client = AsyncPrometheusClient(BASE, timeout_s=1.0, retries=0, transport=slow_transport(5.0, vector("1")))

    async def go() -> tuple[float | Missing, int]:
        ticks = 0

        async def other_work() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        worker = asyncio.create_task(other_work())
        reading = await client.scalar("q")
        worker.cancel()
        await client.aclose()
        return reading, ticks

    reading, ticks = asyncio.run(go())
    assert isinstance(reading, Missing) and reading.kind is MissingKind.TIMEOUT
    assert ticks > 20


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (vector("oops"), "not a number"),
        ({"status": "success", "data": None}, "data null"),
        ([1], "JSON list"),
        (vector("-5"), "below 0"),
    ],
)
def test_observe_marks_bad_answers_missing_never_fresh(body: Any, why: str) -> None:
    client = AsyncPrometheusClient(BASE, retries=0, transport=answering(body))
    obs, reason = asyncio.run(observe_async(client, "vllm", "ns", "svc", 95, 3, 0, time.time()))
    assert obs.stale and not obs.complete and obs.ttft_p_s is None
    assert reason is not None and why in reason
    assert sum(client.errors.values()) >= 1


def test_observe_reads_a_healthy_answer() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        value = "3" if query.startswith("time()") else "0.2"
        return httpx.Response(200, content=json.dumps(vector(value)).encode())

    client = AsyncPrometheusClient(BASE, retries=0, transport=httpx.MockTransport(handler))
    obs, why = asyncio.run(observe_async(client, "vllm", "ns", "svc", 95, 1, 0, time.time()))
    assert why is None and obs.complete and not obs.stale
    assert obs.ttft_p_s == 0.2 and obs.running == 0.2 and not client.errors
    assert math.isclose(obs.arrival_rate_per_s or 0.0, 0.2)


def test_timeouts_are_timeouts_and_not_retried() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ReadTimeout("slow", request=request)

    def client() -> AsyncPrometheusClient:
        return AsyncPrometheusClient(
            BASE, timeout_s=0.5, retries=1, backoff_s=0.0, transport=httpx.MockTransport(handler)
        )

    reading = reading_of(client(), "up")
    assert isinstance(reading, Missing) and reading.kind is MissingKind.TIMEOUT and "within 0.5s" in reading.reason
    assert len(calls) == 1  # the deadline covers retries: a timed-out query is not asked again
    calls.clear()
    obs, why = asyncio.run(observe_async(client(), "vllm", "ns", "svc", 95, 1, 0, time.time()))
    assert obs.stale and why is not None and "did not answer" in why
    assert len(calls) == len(queries(ENGINES["vllm"], "ns", "svc", 0.95, "1m"))  # each query once


def _observe_answering(answer: Callable[[str], str]) -> tuple[Observation, str | None]:
    """observe_async against a Prometheus that answers each query with `answer(query)`."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(vector(answer(request.url.params["query"]))).encode())

    client = AsyncPrometheusClient(BASE, retries=0, transport=httpx.MockTransport(handler))
    return asyncio.run(observe_async(client, "vllm", "ns", "svc", 95, 3, 0, time.time()))


def _fresh_but(key: str, value: str) -> Callable[[str], str]:
    """Fresh samples (age 3 s) and 0.2 for every query, `value` for the observation key's query."""
    built = queries(ENGINES["vllm"], "ns", "svc", 0.95, "1m")
    return lambda q: value if q == built[key] else ("3" if q == built["age"] else "0.2")


class _OneReplica:
    """A capacity model: one replica carries 1 req/s."""

    max_batch = 16

    def rate_per_replica(
        self, input_tokens: float, output_tokens: float, fleet_rate_per_s: float | None = None
    ) -> float:
        return 1.0

    def predicted_tpot_s(
        self, rate_per_replica: float, input_tokens: float, output_tokens: float, fleet_rate_per_s: float | None = None
    ) -> float:
        return 0.02


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        # Every query NaN: the series are there, so not "no engine samples in Prometheus".
        (lambda q: "NaN", "age query answered NaN"),
        (_fresh_but("running", "+Inf"), "running query answered +Inf"),
        (_fresh_but("waiting", "-Inf"), "waiting query answered -Inf"),
        (_fresh_but("rate", "NaN"), "rate query answered NaN"),
    ],
)
def test_nan_or_inf_answers_are_said_as_such_and_never_scale_down(answer: Callable[[str], str], said: str) -> None:
    obs, why = _observe_answering(answer)
    assert why is not None and said in why, why
    assert "no engine samples" not in why and "no data for" not in why
    assert not obs.complete  # the policy holds on an incomplete observation: never a scale-down
    config = PolicyConfig(0.5, 0.05, 256, 64, min_replicas=1, max_replicas=8)
    decision, _ = decide(obs, PolicyState(), _OneReplica(), config)
    assert decision.replicas >= obs.current_replicas and decision.kind is DecisionKind.MISSING_METRICS


def test_no_series_at_all_is_still_no_engine_samples() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(vector()).encode())

    client = AsyncPrometheusClient(BASE, retries=0, transport=httpx.MockTransport(handler))
    obs, why = asyncio.run(observe_async(client, "vllm", "ns", "svc", 95, 3, 0, time.time()))
    assert obs.stale and why == "no engine samples in Prometheus"
