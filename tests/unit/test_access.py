"""A refused watch is retried without end and said in a condition, an Event and a log line
(kvscale.operator.access); the hand-run operator's Lease and /metrics defaults."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from pathlib import Path

import kopf
import pytest

from kvscale.api.models import InferenceServiceStatus
from kvscale.control.reconcile import Resource
from kvscale.control.settings import Settings
from kvscale.operator import access, leader, telemetry
from kvscale.operator.handlers import configure

RES = Resource("t1", "lead", "uid-1", 3)


def test_kopf_retries_a_refused_request_without_end() -> None:
    """kopf's default: nine attempts in 54 s, then the watch (and the operator) ends."""
    settings = kopf.OperatorSettings()
    default = list(settings.networking.error_backoffs)  # type: ignore[arg-type]
    assert sum(default) == 54 and len(default) + 1 == 9
    configure(settings)
    backoffs = settings.networking.error_backoffs
    assert isinstance(backoffs, access.RetryForever)
    first = list(itertools.islice(iter(backoffs), 200))
    assert len(first) == 200, "endless"
    assert first[: len(default)] == default  # kopf's own start
    assert max(first) == access.RETRY_CAP_S and first[-1] == access.RETRY_CAP_S
    assert list(itertools.islice(iter(backoffs), 3)) == first[:3]  # kopf iterates it once per request
    assert not hasattr(backoffs, "__len__")  # kopf counts attempts without a total


def test_needs_are_budgets_cluster_wide_and_services_where_watched() -> None:
    everywhere = access.needs(())
    assert [n.describe() for n in everywhere] == [
        "list, watch, patch gpubudgets.kvscale.io cluster-wide",
        "patch gpubudgets.kvscale.io/status cluster-wide",
        "list, watch, patch inferenceservices.kvscale.io cluster-wide",
    ]
    scoped = access.needs(("a", "b"))
    assert [n.namespace for n in scoped] == [None, None, "a", "b"]  # budgets stay cluster-wide


def test_a_refused_budget_watch_names_verbs_kind_and_the_rule_to_fix() -> None:
    wanted = access.needs(("t1",))
    refused = {("gpubudgets", "", "list"), ("gpubudgets", "", "watch")}
    denials = access.check(lambda need, verb: (need.resource, need.subresource, verb) not in refused, wanted)
    assert [(n.resource, verbs) for n, verbs in denials] == [("gpubudgets", ("list", "watch"))]
    text = access.budget_message(denials)
    assert text is not None
    assert text.startswith("the operator may not list, watch gpubudgets.kvscale.io cluster-wide (GPUBudgets are not")
    assert "GPUBudgets are not enforced" in text
    assert "ClusterRole" in text and "charts/kvscale/files/rbac-cluster-rules.yaml" in text
    assert access.budget_message(access.check(lambda need, verb: True, wanted)) is None
    services_only = access.check(lambda need, verb: need.resource != "inferenceservices", wanted)
    assert services_only and access.budget_message(services_only) is None  # not a budget's business


def test_the_condition_comes_once_with_a_warning_and_goes_with_a_normal_event() -> None:
    status = InferenceServiceStatus(phase="Ready")
    said = "the operator may not list gpubudgets.kvscale.io cluster-wide: GPUBudgets are not enforced; fix"
    first = access.budgets_watched(status, RES, said)
    assert first is not None
    marked, events = first
    held = next(c for c in marked.conditions if c.type == access.WATCH_CONDITION)
    assert (held.status, held.reason, held.message, held.observed_generation) == ("False", "Forbidden", said, 3)
    assert [(e.type, e.reason, e.message) for e in events] == [("Warning", "Forbidden", said)]
    assert access.budgets_watched(marked, RES, said) is None  # unchanged: no write, no second Event
    assert access.budgets_watched(status, RES, None) is None  # nothing refused, nothing to remove
    cleared = access.budgets_watched(marked, RES, None)
    assert cleared is not None
    assert all(c.type != access.WATCH_CONDITION for c in cleared[0].conditions)
    assert [(e.type, e.reason) for e in cleared[1]] == [("Normal", access.WATCH_CONDITION)]


def test_checks_back_off_while_refused() -> None:
    delays, delay = [], None
    for _ in range(7):
        delay = access.next_backoff(delay)
        delays.append(delay)
    assert delays == [2, 4, 8, 16, 32, 60, 60]


def test_one_log_line_per_change(caplog: pytest.LogCaptureFixture) -> None:
    state = access.Access()
    denials = access.check(lambda need, verb: need.resource != "gpubudgets", access.needs(()))
    with caplog.at_level(logging.INFO, logger="kvscale.operator"):
        state.update(())
        state.update(denials)
        state.update(denials)
        state.update(())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("Access refused, retrying with backoff: the operator may not list, watch, patch")
    assert lines[1].startswith("Access granted")
    assert all(line[0].isupper() and not line.endswith(".") for line in lines)


def test_the_checker_keeps_running_through_failed_checks() -> None:
    calls: list[str] = []

    def review(need: access.Need, verb: str) -> bool:
        calls.append(verb)
        if len(calls) == 1:
            raise ConnectionError("API server away")
        return need.resource != "gpubudgets"

    async def run() -> access.Access:
        state = access.Access()
        task = asyncio.create_task(access.watch(state, review, access.needs(())))
        for _ in range(200):  # the first check fails; the next (after 2 s) answers
            await asyncio.sleep(0.05)
            if state.checked:
                break
        task.cancel()
        return state

    state = asyncio.run(run())
    assert state.checked and state.budgets is not None


def test_the_hand_run_lease_is_the_charts_for_the_readme_install(tmp_path: Path) -> None:
    """`helm install kvscale charts/kvscale -n kvscale-system`: the chart names its Lease after the
    release's full name, "kvscale", in the release namespace (tests/cluster/test_chart_modes.py
    renders it); a hand-run operator's defaults are the same Lease."""
    settings = Settings.from_env({})
    assert settings.lease_name == "kvscale"
    assert leader.lease_namespace(settings.lease_namespace, tmp_path / "not-in-a-pod") == "kvscale-system"


def _listening(port: int) -> set[str]:
    """Local addresses listening on `port`, from the kernel's socket table (/proc/net/tcp)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            out.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return out


def test_metrics_bind_loopback_unless_configured() -> None:
    settings = Settings.from_env({})
    assert settings.metrics_address == "127.0.0.1"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    telemetry.serve(port, settings.metrics_address)
    assert _listening(port) == {"127.0.0.1"}
    assert Settings.from_env({"KVSCALE_METRICS_ADDRESS": "0.0.0.0"}).metrics_address == "0.0.0.0"
