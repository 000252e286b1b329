"""The Lease rules (client-go's): someone else holds the Lease while its record changed less
than its duration ago on our own clock; an empty holder or our own is free to (re)take."""

from __future__ import annotations

from pathlib import Path

from kvscale.operator.leader import Record, held_by_other, lease_namespace


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
