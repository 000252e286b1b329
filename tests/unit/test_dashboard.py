"""The Grafana dashboard reads the pods of exactly the selected InferenceService (the operator's
own pod-name pattern: `pod=~"$inferenceservice-.*"` also matched chat-2's pods under chat), and
each engine panel answers for SGLang and TGI where the engine exports the metric (issue 31, LOW)."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

from kvscale.metrics.engines import ENGINES
from kvscale.metrics.promql import POD_NAME_SUFFIX

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "kvscale.json").read_text())
EXPRS = [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p.get("targets", [])]


def test_every_pod_selector_is_the_operators_pattern() -> None:
    pods = [m for _, e in EXPRS for m in re.findall(r'pod=~"([^"]*)"', e)]
    assert pods and set(pods) == {"$inferenceservice" + POD_NAME_SUFFIX}
    pattern = re.compile("chat" + POD_NAME_SUFFIX)
    assert pattern.fullmatch("chat-7d9f8-x2x9q") and pattern.fullmatch("chat-lws-0")  # a leader pod
    assert not pattern.fullmatch("chat-2-7d9f8-x2x9q")  # another service's pod


def names_in(expr: str, prefix: str) -> set[str]:
    return set(re.findall(rf"{re.escape(prefix)}[a-z_]+?(?=_bucket\b|_sum\b|_count\b|[{{\[])", expr))


def test_each_engine_panel_answers_for_every_engine_that_exports_its_metrics() -> None:
    vllm = ENGINES["vllm"]
    for engine, names in ENGINES.items():
        if engine == "vllm":
            continue
        same: dict[str, str] = {}
        for f in fields(vllm):
            ours, theirs = getattr(vllm, f.name), getattr(names, f.name)
            if isinstance(ours, tuple) and ours and isinstance(ours[0], str) and isinstance(theirs, tuple) and theirs:
                same |= {n: str(theirs[0]) for n in ours}
        for title, expr in EXPRS:
            wanted = names_in(expr, "vllm:")
            if wanted and all(n in same for n in wanted):
                assert all(same[n] in expr for n in wanted), (engine, title)


def test_the_fleet_picture_says_what_the_services_share() -> None:
    from kvscale.cli.simulate_fleet import fleet_title

    assert fleet_title(3, {"H100-SXM": 8}, "fleet.yaml") == "3 services sharing 8 H100-SXM (fleet.yaml)"
    assert fleet_title(1, {"L4": 2, "A10G": 1}, "f.yaml") == "1 service sharing 1 A10G, 2 L4 (f.yaml)"
