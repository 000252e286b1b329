"""The Prometheus HTTP API client (async, as the operator runs it).

Parsing is total: whatever comes back (HTTP 500, HTML, `data: null`, a bare list, a value
of "oops", NaN, -5) ends either as numbers or as a `Missing` that says why, of a known
`MissingKind`; nothing raises out of `scalar()`. Every error is counted by kind in
`client.errors` so the operator can export it.

The async client gives each call a deadline (`timeout_s`, retries included) that the caller
keeps shorter than its tick, and bounds the requests in flight, so a slow Prometheus costs a
tick at most and never blocks other work on the event loop.

    client = AsyncPrometheusClient("http://prometheus:9090", timeout_s=2.0)
    reading = await client.scalar('sum(vllm:num_requests_running{...})')
    if isinstance(reading, Missing): ...   # reading.kind, reading.reason
    await client.aclose()
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx


class MissingKind(StrEnum):
    """Why a reading has no value. The first three are normal (no traffic yet, an empty
    histogram); the rest are errors, counted and reported as MetricsAvailable=False."""

    EMPTY = "empty"  # the query matched no series
    NOT_FINITE = "not_finite"  # NaN or an infinity (e.g. a quantile of an empty histogram)
    UNREACHABLE = "unreachable"  # connection refused, DNS, HTTP 5xx after retries
    TIMEOUT = "timeout"  # no answer within the deadline
    REJECTED = "rejected"  # Prometheus refused the query (bad_data, HTTP 4xx)
    MALFORMED = "malformed"  # an answer of the wrong shape or a value that is not a number
    NEGATIVE = "negative"  # a negative value where only non-negative ones make sense
    AMBIGUOUS = "ambiguous"  # several series where the query was meant to aggregate to one

    @property
    def is_error(self) -> bool:
        return self not in (MissingKind.EMPTY, MissingKind.NOT_FINITE)


@dataclass(frozen=True)
class Missing:
    """No value, and why."""

    kind: MissingKind
    reason: str
    value: float | None = None  # the answer itself where it was one but not usable (NaN, an infinity)

    @property
    def is_error(self) -> bool:
        return self.kind.is_error


class PrometheusError(RuntimeError):
    """Prometheus could not answer (unreachable, timed out, rejected the query, or answered
    in a shape that cannot be read). `kind` says which."""

    def __init__(self, message: str, kind: MissingKind = MissingKind.UNREACHABLE) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    timestamp_s: float


def short(promql: str, limit: int = 60) -> str:
    """A query abbreviated for messages: conditions and logs stay one readable line."""
    return repr(promql) if len(promql) <= limit else repr(promql[: limit - 3] + "...")


def _malformed(promql: str, what: str) -> PrometheusError:
    return PrometheusError(f"Prometheus answered {short(promql)} with {what}", MissingKind.MALFORMED)


def _number(raw: Any, promql: str) -> float:
    """A sample value: Prometheus sends strings ("1.5", "NaN", "+Inf"); numbers are accepted."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise _malformed(promql, f"a value that is not a number: {raw!r:.80}")
    try:
        return float(raw)
    except ValueError:
        raise _malformed(promql, f"a value that is not a number: {raw!r:.80}") from None


def _pair(raw: Any, promql: str) -> tuple[float, float]:
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        raise _malformed(promql, f"a sample that is not [timestamp, value]: {raw!r:.80}")
    return _number(raw[0], promql), _number(raw[1], promql)


def parse_response(promql: str, status_code: int, body: bytes) -> list[Sample]:
    """An instant query's samples from the raw HTTP answer (a scalar comes back as one
    unlabelled sample); raises PrometheusError of a known kind for anything else."""
    import json

    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        kind = MissingKind.UNREACHABLE if status_code >= 500 else MissingKind.MALFORMED
        raise PrometheusError(
            f"Prometheus answered HTTP {status_code} with no JSON for {short(promql)}: {body[:80]!r}", kind
        ) from None
    if not isinstance(answer, dict):
        raise _malformed(promql, f"a JSON {type(answer).__name__} instead of an object")
    if answer.get("status") != "success":
        kind = MissingKind.UNREACHABLE if status_code >= 500 else MissingKind.REJECTED
        raise PrometheusError(
            f"query {short(promql)} failed (HTTP {status_code}): {answer.get('errorType')}: {answer.get('error')}", kind
        )
    data = answer.get("data")
    if not isinstance(data, dict):
        raise _malformed(promql, f"data {json.dumps(data)[:40]} instead of an object")
    result_type, result = data.get("resultType"), data.get("result")
    if result_type == "scalar":
        ts, value = _pair(result, promql)
        return [Sample({}, value, ts)]
    if result_type != "vector":
        raise _malformed(promql, f"resultType {result_type!r} where a vector or scalar was expected")
    if not isinstance(result, list):
        raise _malformed(promql, f"a vector result of type {type(result).__name__}")
    samples = []
    for item in result:
        if not isinstance(item, dict) or "value" not in item:
            raise _malformed(promql, f"a vector element without a value: {item!r:.80}")
        labels = item.get("metric") or {}
        if not isinstance(labels, dict):
            raise _malformed(promql, f"labels that are not an object: {labels!r:.80}")
        ts, value = _pair(item["value"], promql)
        samples.append(Sample({str(k): str(v) for k, v in labels.items()}, value, ts))
    return samples


def prometheus_float(value: float) -> str:
    """A value as Prometheus writes it in its answers ("NaN", "+Inf", "-Inf", "1.5")."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:g}"


def one_value(promql: str, samples: list[Sample], minimum: float = 0.0) -> float | Missing:
    """The single value of an aggregating query, or why there is none. Values below
    `minimum` (default: negative ones) are refused, not passed on."""
    if not samples:
        return Missing(MissingKind.EMPTY, f"no data for {short(promql)}")
    if len(samples) > 1:
        return Missing(
            MissingKind.AMBIGUOUS, f"query {short(promql)} returned {len(samples)} series where one was expected"
        )
    value = samples[0].value
    if not math.isfinite(value):
        return Missing(MissingKind.NOT_FINITE, f"{short(promql)} answered {prometheus_float(value)}", value)
    if value < minimum:
        return Missing(MissingKind.NEGATIVE, f"{short(promql)} is {value:g}, below {minimum:g}")
    return value


class AsyncPrometheusClient:
    """Instant queries on httpx.AsyncClient. Each call (retries included) ends within
    `timeout_s`; at most `max_in_flight` requests run at once."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 2.0,
        retries: int = 1,
        backoff_s: float = 0.1,
        max_in_flight: int = 16,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self.errors: Counter[str] = Counter()  # MissingKind value -> count, errors only
        # Requests wait for a slot here, not in httpx's pool: the pool rescans its whole queue
        # on every change, which grows quadratic with thousands of waiters (200 services x 9
        # queries against a slow Prometheus took 75 s instead of 1 s).
        self._slots = asyncio.Semaphore(max_in_flight)
        self._http = httpx.AsyncClient(
            timeout=timeout_s,
            # No cap on connections (the semaphore caps requests): a connection given up on at
            # the deadline can stay in the pool until the server answers, and with the cap at
            # max_in_flight such connections took every place (no query was sent again).
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=max_in_flight),
            transport=transport,
        )

    @property
    def url(self) -> str:
        return f"{self.base_url}/api/v1/query"

    def _count(self, reading: float | Missing) -> float | Missing:
        if isinstance(reading, Missing) and reading.is_error:
            self.errors[reading.kind.value] += 1
        return reading

    def _unreachable(self, promql: str, tries: int, last: object) -> PrometheusError:
        return PrometheusError(
            f"Prometheus at {self.base_url} unreachable after {tries} tries for {short(promql)}: {last}",
            MissingKind.UNREACHABLE,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def query(self, promql: str, timeout_s: float | None = None) -> list[Sample]:
        """An instant query's samples; PrometheusError (with its kind) when there are none to read."""
        budget = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        deadline = asyncio.get_running_loop().time() + budget
        timed_out = PrometheusError(
            f"Prometheus at {self.base_url} did not answer {short(promql)} within {budget:g}s", MissingKind.TIMEOUT
        )
        try:
            async with asyncio.timeout_at(deadline):  # a backstop: httpx's own timeouts end the request first
                return await self._query(promql, deadline)
        except (TimeoutError, httpx.TimeoutException):
            raise timed_out from None

    async def _query(self, promql: str, deadline: float) -> list[Sample]:
        loop = asyncio.get_running_loop()
        last: object = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            async with self._slots:
                # httpx ends the request itself, a little before the deadline: a request cancelled
                # from outside (asyncio.timeout) can leave its pooled connection stuck in CONNECTING,
                # and after a minute of a slow Prometheus every slot was stuck (no query sent again).
                remaining = (deadline - loop.time()) * 0.9
                if remaining <= 0:
                    raise TimeoutError
                try:
                    response = await self._http.get(
                        self.url, params={"query": promql}, timeout=httpx.Timeout(remaining)
                    )
                except httpx.TimeoutException:
                    raise
                except httpx.HTTPError as exc:
                    last = str(exc) or type(exc).__name__
                    continue
            try:
                return parse_response(promql, response.status_code, response.content)
            except PrometheusError as exc:
                if exc.kind is not MissingKind.UNREACHABLE:
                    raise
                last = exc
        raise self._unreachable(promql, self.retries + 1, last)

    async def query_range(self, promql: str, start_s: float, end_s: float, step_s: float) -> dict[str, Any]:
        """A range query's JSON answer (https://prometheus.io/docs/prometheus/latest/querying/api/#range-queries),
        within `timeout_s`, one try (the calibration reads again on its next tick); PrometheusError
        when there is none to read."""
        params: dict[str, str | float] = {"query": promql, "start": start_s, "end": end_s, "step": f"{round(step_s)}s"}
        try:
            async with self._slots:
                response = await self._http.get(f"{self.base_url}/api/v1/query_range", params=params)
        except httpx.HTTPError as exc:
            raise self._unreachable(promql, 1, str(exc) or type(exc).__name__) from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else response.text[:200]
            raise PrometheusError(
                f"Prometheus at {self.base_url} refused a range query (HTTP {response.status_code}): {error}",
                MissingKind.REJECTED,
            )
        return body

    async def vector(self, promql: str, timeout_s: float | None = None) -> list[Sample] | Missing:
        """Every series of the answer (a histogram's buckets by `le`, say), or a Missing that
        says why; never raises for Prometheus's answers. No series is EMPTY."""
        try:
            samples = await self.query(promql, timeout_s)
        except PrometheusError as exc:
            missing = Missing(exc.kind, str(exc))
            self._count(missing)
            return missing
        if not samples:
            return Missing(MissingKind.EMPTY, f"no data for {short(promql)}")
        return samples

    async def scalar(self, promql: str, minimum: float = 0.0, timeout_s: float | None = None) -> float | Missing:
        """One value, or a Missing that says why; never raises for Prometheus's answers."""
        try:
            samples = await self.query(promql, timeout_s)
        except PrometheusError as exc:
            return self._count(Missing(exc.kind, str(exc)))
        return self._count(one_value(promql, samples, minimum))
