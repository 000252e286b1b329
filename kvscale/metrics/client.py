"""A small Prometheus HTTP API client: timeouts, retries, and errors that say what failed."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import httpx


class PrometheusError(RuntimeError):
    """Prometheus could not answer (unreachable, timed out, or rejected the query)."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    timestamp_s: float


class PrometheusClient:
    def __init__(self, base_url: str, timeout_s: float = 5.0, retries: int = 2, backoff_s: float = 0.2) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._http = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def query(self, promql: str) -> list[Sample]:
        """An instant query's vector (a scalar comes back as one unlabelled sample)."""
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                response = self._http.get(f"{self.base_url}/api/v1/query", params={"query": promql})
            except httpx.HTTPError as exc:
                last = exc
                if attempt < self.retries:
                    time.sleep(self.backoff_s * (2**attempt))  # retry backoff, bounded by `retries`
                continue
            return self._parse(promql, response)
        raise PrometheusError(f"Prometheus at {self.base_url} unreachable after {self.retries + 1} tries: {last}")

    def _parse(self, promql: str, response: httpx.Response) -> list[Sample]:
        try:
            body = response.json()
        except ValueError as exc:
            raise PrometheusError(
                f"Prometheus answered HTTP {response.status_code} with no JSON for {promql!r}"
            ) from exc
        if body.get("status") != "success":
            raise PrometheusError(f"query {promql!r} failed: {body.get('errorType')}: {body.get('error')}")
        data = body.get("data", {})
        if data.get("resultType") == "scalar":
            ts, value = data["result"]
            return [Sample({}, float(value), float(ts))]
        return [
            Sample(dict(r.get("metric", {})), float(r["value"][1]), float(r["value"][0]))
            for r in data.get("result", [])
        ]

    def scalar(self, promql: str) -> float | None:
        """One number, or None when the answer is empty, NaN or infinite. Several series are
        an error: the query was meant to aggregate."""
        samples = self.query(promql)
        if not samples:
            return None
        if len(samples) > 1:
            raise PrometheusError(f"query {promql!r} returned {len(samples)} series where one was expected")
        value = samples[0].value
        return value if math.isfinite(value) else None
