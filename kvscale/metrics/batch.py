"""Batched reads: one query per metric for every service at once, shared by their ticks.

Asking each InferenceService's queries on its own tick costs ~13 queries per service per
interval (667 queries/s at 1,000 services, most of a Prometheus core). `FleetReader` asks each
key's query once for every service of an engine and percentile (grouped by namespace and
service, `promql.Scope.fleet`) and serves every tick from that answer while it is younger than
`max_age_s`; ticks that arrive while a read is in flight wait for it instead of asking again.
So the query rate is (keys x reads per interval), whatever the number of services.

Totality is `observe`'s: a query that fails (timeout, unreachable, malformed) is a Missing of
that kind for every service of the batch; a service without series is EMPTY, as alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvscale.metrics.client import AsyncPrometheusClient, Missing, MissingKind, PrometheusError, Sample, one_value
from kvscale.metrics.engines import ENGINES, EngineMetrics
from kvscale.metrics.promql import SERVICE_LABEL, Scope

Service = tuple[str, str]  # (namespace, name)
Builder = Callable[[EngineMetrics, Scope, str], dict[str, str]]  # (engine, scope, group key) -> PromQL per key


@dataclass(frozen=True)
class Answers:
    """One batch: per key, each service's samples (or the error every service shares)."""

    queries: Mapping[str, str]
    samples: Mapping[str, Mapping[Service, list[Sample]] | Missing]
    namespaces: frozenset[str]
    taken_at: float

    def samples_of(self, key: str, service: Service) -> list[Sample] | Missing:
        got = self.samples[key]
        if isinstance(got, Missing):
            return got
        return got.get(service, [])

    def value(self, key: str, service: Service, minimum: float = 0.0) -> float | Missing:
        """The key's one value for the service, checked as a single service's answer would be."""
        got = self.samples_of(key, service)
        if isinstance(got, Missing):
            return got
        return one_value(self.queries[key], got, minimum)


def _by_service(samples: list[Sample]) -> dict[Service, list[Sample]]:
    out: dict[Service, list[Sample]] = {}
    for s in samples:
        name = s.labels.get(SERVICE_LABEL)
        if name:
            out.setdefault((s.labels.get("namespace", ""), name), []).append(s)
    return out


@dataclass
class _Group:
    namespaces: set[str] = field(default_factory=set)  # every namespace a tick asked for
    answers: Answers | None = None
    reading: asyncio.Future[Answers] | None = None
    reading_namespaces: frozenset[str] = frozenset()


class FleetReader:
    """Batched reads of `build`'s queries (per engine and group key, e.g. the percentile),
    reused for `max_age_s`. `queries_sent` counts the HTTP queries made (for the benchmark)."""

    def __init__(self, client: AsyncPrometheusClient, build: Builder, max_age_s: float) -> None:
        self.client, self.build, self.max_age_s = client, build, max_age_s
        self._groups: dict[tuple[str, str], _Group] = {}
        self.queries_sent = 0

    async def answers(self, engine: str, group: str, namespace: str, deadline_s: float) -> Answers | Missing:
        """The batch covering `namespace` for this engine and group: the current one while
        fresh, else the one in flight, else a new read. A Missing (TIMEOUT) when none arrives
        within `deadline_s`."""
        state = self._groups.setdefault((engine, group), _Group())
        state.namespaces.add(namespace)
        fresh = state.answers is not None and time.monotonic() - state.answers.taken_at < self.max_age_s
        if fresh and state.answers is not None and namespace in state.answers.namespaces:
            return state.answers
        if state.reading is None or state.reading.done() or namespace not in state.reading_namespaces:
            state.reading_namespaces = frozenset(state.namespaces)
            state.reading = asyncio.ensure_future(self._read(engine, group, state, state.reading_namespaces))
        try:
            async with asyncio.timeout(deadline_s):
                return await asyncio.shield(state.reading)
        except TimeoutError:
            return Missing(MissingKind.TIMEOUT, f"Prometheus did not answer the batched read within {deadline_s:g}s")

    async def _read(self, engine: str, group: str, state: _Group, namespaces: frozenset[str]) -> Answers:
        queries = self.build(ENGINES[engine], Scope.fleet(tuple(namespaces)), group)
        keys = list(queries)
        self.queries_sent += len(keys)
        results = await asyncio.gather(*(self._one(queries[k]) for k in keys))
        answers = Answers(queries, dict(zip(keys, results, strict=True)), namespaces, time.monotonic())
        state.answers = answers
        return answers

    async def _one(self, promql: str) -> dict[Service, list[Sample]] | Missing:
        try:
            samples = await self.client.query(promql)
        except PrometheusError as exc:
            self.client.errors[exc.kind.value] += 1
            return Missing(exc.kind, str(exc))
        return _by_service(samples)
