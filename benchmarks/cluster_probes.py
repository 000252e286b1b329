"""What the operator benchmarks read from the test cluster: the operator's memory and the API
server's request counters. One copy for benchmarks/operator.py and benchmarks/slow_prometheus.py."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import httpx

from tests.cluster.harness import Cluster

_REQUEST = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def request_counts(cluster: Cluster, watches: bool = True) -> Counter[tuple[str, str]]:
    """The API server's request counters by (verb, resource[/subresource]); `watches=False`
    leaves WATCH out (a watch counts once when it starts, not per event)."""
    text = httpx.get(f"{cluster.server}/metrics", verify=cluster.admin_tls(), timeout=30).text
    counts: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        m = _REQUEST.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        if not watches and labels.get("verb") == "WATCH":
            continue
        resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        counts[(labels.get("verb", ""), resource)] += int(float(m["value"]))
    return counts
