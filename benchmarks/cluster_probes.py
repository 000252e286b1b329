"""What the operator benchmarks read from the test cluster: the operator's memory and the API
server's request counters and the operator's metrics, an operator started from another checkout.
One copy for the operator benchmarks."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import httpx
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.harness import Cluster
from tests.cluster.processes import Operator

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


def operator_metric(operator: Operator, name: str) -> float:
    """The operator's own metric `name` (summed over its series; 0 when it does not answer)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10).text
    except httpx.HTTPError:
        return 0.0
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def start_operator(operator: Operator, checkout: str | None) -> Operator:
    """Starts `operator` from another checkout's code (None: this one), for before/after runs."""
    here = Path.cwd()
    if checkout:
        os.chdir(checkout)  # `python -m` puts the working directory first on sys.path
    try:
        operator.start()
    finally:
        os.chdir(here)
    return operator


def deployment_exists(apps: client.AppsV1Api, name: str, namespace: str = "default") -> bool:
    try:
        apps.read_namespaced_deployment(name, namespace)
    except ApiException:
        return False
    return True
