"""The Lease rules (client-go's): someone else holds the Lease while its record changed less
than its duration ago on our own clock; an empty holder or our own is free to (re)take."""

from __future__ import annotations

from pathlib import Path

from kvscale.operator.leader import Record, fallback_namespace, held_by_other, lease_namespace


def test_a_fresh_record_of_another_holder_is_held() -> None:
    record = Record("b-1", "2026-11-25T01:00:00+00:00", 15.0)
    assert held_by_other(record, "a-1", 3.0)
    assert not held_by_other(record, "a-1", 15.0)  # expired: unchanged for its whole duration
    assert not held_by_other(record, "b-1", 3.0)  # our own
    assert not held_by_other(Record(None, None, 15.0), "a-1", 0.0)  # released


def test_the_lease_namespace_is_configured_else_the_pods_else_the_charts(tmp_path: Path) -> None:
    assert lease_namespace("ops", tmp_path / "none") == "ops"
    assert lease_namespace("", tmp_path / "none") == "kvscale-system"  # the README's release namespace
    mounted = tmp_path / "namespace"
    mounted.write_text("team-a\n")
    assert lease_namespace("", mounted) == "team-a"


def test_a_hand_run_operator_falls_back_to_default_only_when_nothing_was_configured(tmp_path: Path) -> None:
    """Without the chart's namespace (a test cluster, kind) a hand-run operator still starts."""
    assert fallback_namespace("", tmp_path / "not-in-a-pod") == "default"
    assert fallback_namespace("ops", tmp_path / "not-in-a-pod") is None  # configured: a missing one is an error
    mounted = tmp_path / "namespace"
    mounted.write_text("team-a\n")
    assert fallback_namespace("", mounted) is None  # a pod's own namespace exists
