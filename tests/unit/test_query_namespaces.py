"""Every PromQL the operator sends for a service names that service's namespace (issue 28): the
per-service tick and workload reads, the batched (fleet) reads, and the gateway queue reads of
scale to zero. A query without it would sum another tenant's series of the same name.

The walk covers what the operator asks: `observe_async`/`observe_workload_async` send
`queries`/`workload_queries`, the FleetReaders send `tick_queries`/`workload_reads` (as
kvscale/operator/handlers.py builds them), and the scale-to-zero read sends `queue_queries`.
"""

from __future__ import annotations

import re

import pytest

from kvscale.api.intent import parse_intent
from kvscale.control.reconcile import Resource
from kvscale.control.scale_zero import queue_queries
from kvscale.metrics.engines import ENGINES
from kvscale.metrics.observe import tick_queries, workload_reads
from kvscale.metrics.promql import Scope, queries, workload_queries
from tests.unit.test_reconcile import spec

NS, NAME = "t2", "lead"
OTHERS = ("evil", "t2x", "xt2", "t20", "default")  # namespaces no matcher for t2 may take in
SELECTOR = re.compile(r"(?:[a-zA-Z_:][\w:]*)?\{([^{}]*)\}")  # a vector selector (name and braces); its matchers
MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
# PromQL words left once the selectors, strings and ranges are taken out: anything else would
# be a bare metric name, a series read without a namespace.
WORDS = {
    "sum", "avg", "max", "count", "by", "rate", "deriv", "idelta", "histogram_quantile", "label_replace",
    "clamp_min", "time", "timestamp", "sqrt", "or", "offset", "max_over_time", "avg_over_time", "sum_over_time",
    "le", "namespace", "pod", "kvscale_service",
}  # fmt: skip


def unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def matchers(selector: str) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    rest = selector
    while rest.strip():
        m = MATCHER.match(rest)
        assert m is not None, f"cannot read the matchers {selector!r}"
        out[m.group(1)] = (m.group(2), unescape(m.group(3)))
        rest = rest[m.end() :].removeprefix(",")
    return out


def names_the_namespace(selector: str, namespace: str) -> bool:
    """The selector takes series of `namespace` and of no other (a regex matcher is anchored in
    PromQL, as re.fullmatch is)."""
    got = matchers(selector)
    if "host" in got:  # the KEDA interceptor's count: the service is "<namespace>/<name>" in `host`
        op, value = got["host"]
        return op == "=" and value.startswith(f"{namespace}/")
    op, value = got.get("namespace", ("", ""))
    if op == "=":
        return value == namespace
    if op == "=~":
        return re.fullmatch(value, namespace) is not None and not any(re.fullmatch(value, o) for o in OTHERS)
    return False


def sent_for(namespace: str, name: str) -> dict[str, str]:
    """Every query the operator sends for the service, by where it comes from."""
    out: dict[str, str] = {}
    for engine_name, engine in ENGINES.items():
        fleet = Scope.fleet((namespace,))
        built = {
            "tick": queries(engine, namespace, name, 0.95, "1m"),
            "workload": workload_queries(engine, namespace, name, "10m", "1m", "15s"),
            "batched tick": tick_queries("1m")(engine, fleet, "95"),
            "batched workload": workload_reads("10m", "1m", "15s")(engine, fleet, ""),
        }
        for where, promql in built.items():
            out |= {f"{engine_name} {where} {key}": q for key, q in promql.items()}
    res = Resource(namespace, name, "uid", 1)
    routing: dict[str, object] = {"inferencePool": {}, "kedaHttp": {}}
    for i, q in enumerate(queue_queries(parse_intent(spec(scaling={"minReplicas": 0}, routing=routing)), res)):
        out[f"gateway queue {i}"] = q
    return out


SENT = sent_for(NS, NAME)


def test_the_walk_covers_every_read() -> None:
    # The burstiness (nested subqueries) and the gateway queues of both routings are in it.
    assert any(k.endswith("arrival_dispersion") for k in SENT) and "gateway queue 1" in SENT
    assert len(SENT) > 100


@pytest.mark.parametrize("key", sorted(SENT))
def test_every_selector_names_the_services_namespace(key: str) -> None:
    promql = SENT[key]
    selectors = SELECTOR.findall(promql)
    assert selectors, promql
    for selector in selectors:
        assert names_the_namespace(selector, NS), f"{key}: {{{selector}}} does not name namespace {NS!r}"
    # No series read outside a selector: what remains once they, the strings and the ranges
    # are taken out is PromQL's own words and numbers.
    rest = re.sub(r'"(?:[^"\\]|\\.)*"', "", SELECTOR.sub("", promql))
    rest = re.sub(r"\[[^\]]*\]", "", rest)
    words = set(re.findall(r"(?<![\w.])[a-zA-Z_:][\w:]*", rest))
    assert words <= WORDS, f"{key}: {sorted(words - WORDS)} read without a selector in {promql}"


def test_the_check_refuses_what_it_should() -> None:
    assert not names_the_namespace('__name__="m"', NS)
    assert not names_the_namespace('__name__="m",namespace="evil"', NS)
    assert not names_the_namespace('__name__="m",namespace=~"t2.*"', NS)  # takes t2x in
    assert not names_the_namespace('__name__="m",namespace!="evil"', NS)
    assert not names_the_namespace('inference_pool="lead"', NS)  # the old gateway queue query
    assert names_the_namespace('namespace="t2",inference_pool="lead"', NS)
    assert names_the_namespace('__name__="m",namespace=~"t2|t3",pod=~".+-[a-z0-9]+-[a-z0-9]+"', NS)


def test_label_values_with_quotes_stay_inside_their_matcher() -> None:
    # A name cannot end the matcher and add its own (names are DNS labels, but escape anyway).
    for key, promql in sent_for('t"2', NAME).items():
        for selector in SELECTOR.findall(promql):
            assert names_the_namespace(selector, 't"2'), f"{key}: {{{selector}}}"
