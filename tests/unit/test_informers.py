"""The informer without a cluster: list, then apply watch events; relist when the watch expires."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from kubernetes.client.rest import ApiException

from kvscale.operator.informers import Informer


def pod(uid: str, node: str, version: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": uid, "resourceVersion": version}, "spec": {"nodeName": node}}


class Scripted(Informer[str]):
    """An informer whose list and watch answer from scripts instead of an API server."""

    def __init__(self, lists: list[list[dict[str, Any]]], watches: list[list[dict[str, Any]] | int]) -> None:
        self.lists_left, self.watches_left = lists, watches
        self.watched_from: list[str] = []

        def list_fn(**_: Any) -> Any:
            items = self.lists_left.pop(0)
            return SimpleNamespace(data=json.dumps({"metadata": {"resourceVersion": "10"}, "items": items}))

        super().__init__("test", list_fn, lambda o: (o["spec"]["nodeName"], o["metadata"]["name"]))

    def _events(self, version: str) -> Iterator[dict[str, Any]]:
        self.watched_from.append(version)
        if not self.watches_left:
            self.stop()
            return
        script = self.watches_left.pop(0)
        if isinstance(script, int):
            raise ApiException(status=script)
        yield from script


def test_list_then_watch_events_then_relist_after_410() -> None:
    informer = Scripted(
        lists=[[pod("a", "n1", "5")], [pod("b", "n2", "20")]],
        watches=[
            [
                {"type": "ADDED", "raw_object": pod("c", "n1", "11")},
                {"type": "MODIFIED", "raw_object": pod("a", "n3", "12")},
                {"type": "DELETED", "raw_object": pod("c", "n1", "13")},
            ],
            410,  # expired: list again
        ],
    )
    informer.start()
    assert informer.wait_synced(5)
    deadline = time.monotonic() + 5
    while informer.watched_from[-1:] != ["10"] or len(informer.watched_from) < 3:
        assert time.monotonic() < deadline, informer.watched_from
        time.sleep(0.01)  # the informer's thread runs the script
    assert informer.watched_from == ["10", "13", "10"]  # resumed from the last version, relisted after 410
    assert informer.lists == 2 and informer.values() == ["b"] and informer.get("n2") == ["b"]


def test_entries_the_selector_function_refuses_are_dropped() -> None:
    informer = Scripted(lists=[[pod("a", "n1", "5"), pod("x", "", "6")]], watches=[])
    informer.entry = lambda o: (o["spec"]["nodeName"], o["metadata"]["name"]) if o["spec"]["nodeName"] else None
    informer.start()
    assert informer.wait_synced(5)
    assert informer.values() == ["a"] and informer.get("n1") == ["a"] and informer.get("") == []
