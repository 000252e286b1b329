"""Prometheus queries/s and status PATCH/s from the operator at 200 and 1,000 InferenceServices
(not a test: prints a table). Issue 21, item 5: every service asked ~13 queries per tick, also
recommend-mode services with no pods, and a timing-out Prometheus rewrote MetricsAvailable's
message (a status PATCH) every tick.

- The test cluster, a fake Prometheus on 127.0.0.1 (tests/cluster/test_reliability.py) counting
  the queries it is asked, and N recommend-mode InferenceServices (planned, ticking, no pods).
- The operator at the default intervals (scale 15 s, status 10 s). After a warm-up (every
  service ticked at least once since the phase began), over `--window` seconds: queries/s the
  fake answered and status PATCH/s from the API server's own request counters, in two phases:
  Prometheus answering at once with no series, and Prometheus too slow for the deadline.
- `--compare DIR`: the same runs with the operator from another checkout (e.g. a worktree of
  the commit before batching), for the before/after table, in a cluster of its own with that
  checkout's CRD and sample.
- A phase starts once every service is planned and two status intervals have passed.

Run: KVSCALE_CLUSTER_BINS=... .venv/bin/python -m benchmarks.prometheus_load [--services 200,1000]
    [--window 60] [--compare /tmp/kvscale-before]
"""

from __future__ import annotations

import argparse
import copy
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

import yaml
from kubernetes import client, config
from rich.console import Console
from rich.table import Table

from benchmarks.cluster_probes import operator_metric, request_counts, start_operator
from kvscale.api import GROUP, PLURAL, VERSION
from tests.cluster.harness import Cluster, find_bins, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_reliability import FakePrometheus

ROOT = Path(__file__).resolve().parents[1]
EMPTY = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
SLOW_S = 10.0  # far past the observation deadline (2 s)


def tick_count(operator: Operator) -> float:
    return operator_metric(operator, "kvscale_tick_duration_seconds_count")


def status_patches(cluster: Cluster) -> int:
    counts = request_counts(cluster, watches=False)
    return sum(v for (verb, resource), v in counts.items() if verb == "PATCH" and resource == f"{PLURAL}/status")


def measure(
    cluster: Cluster, fake: FakePrometheus, operator: Operator, services: int, window_s: float
) -> tuple[float, float]:
    """(queries/s, status PATCH/s) over the window, after every service ticked in this phase."""
    ticked = tick_count(operator)
    # Ticks are spread over one to two intervals from each object's start; a phase waits for as
    # many ticks as services (each one at least once, on average) before it counts.
    wait_until(lambda: tick_count(operator) >= ticked + services, 1800, "a tick per service", interval_s=2.0)
    asked, patched, start = fake.requests, status_patches(cluster), time.monotonic()
    time.sleep(window_s)  # the window being measured
    took = time.monotonic() - start
    return (fake.requests - asked) / took, (status_patches(cluster) - patched) / took


def run(
    cluster: Cluster, fake: FakePrometheus, workdir: Path, services: int, window_s: float, checkout: str | None
) -> dict[str, tuple[float, float]]:
    env = {"KVSCALE_PROMETHEUS_URL": fake.url, "KVSCALE_STATUS_INTERVAL": "10s", "KVSCALE_SCALE_INTERVAL": "15s"}
    label = "before" if checkout else "now"
    (workdir / f"{label}-{services}").mkdir(parents=True, exist_ok=True)
    operator = start_operator(Operator(cluster, workdir / f"{label}-{services}", env), checkout)
    out = {}
    try:
        fake.delay_s, fake.answer = 0.0, EMPTY
        planned(cluster, services)
        time.sleep(20.0)  # two status intervals: the first ticks' writes are not the steady state
        out["answered (no series)"] = measure(cluster, fake, operator, services, window_s)
        fake.delay_s = SLOW_S
        out[f"timing out ({SLOW_S:.0f} s)"] = measure(cluster, fake, operator, services, window_s)
    finally:
        fake.delay_s = 0.0
        operator.stop()
    return out


def planned(cluster: Cluster, services: int) -> None:
    """Wait until every service is planned (phase Recommended)."""
    objs = client.CustomObjectsApi(config.new_client_from_config(config_file=str(cluster.kubeconfig)))

    def all_recommended() -> bool:
        items = objs.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
        return sum(1 for o in items if o.get("status", {}).get("phase") == "Recommended") >= services

    wait_until(all_recommended, 1800, f"{services} plans", interval_s=2.0)


def variant(checkout: str | None, counts: list[int], window_s: float) -> list[tuple[str, ...]]:
    """A cluster with the checkout's CRD and sample (an older operator refuses fields today's
    CRD defaults), the services created in steps, each step measured."""
    root = Path(checkout) if checkout else ROOT
    recommend = yaml.safe_load((root / "deploy" / "samples" / "mistral-7b-recommend.yaml").read_text())
    name = "before" if checkout else "this checkout"
    workdir = Path(tempfile.mkdtemp(prefix="kvscale-promload-"))
    cluster = Cluster(workdir, find_bins()).start()
    fake = FakePrometheus(0.0, EMPTY).__enter__()
    rows: list[tuple[str, ...]] = []
    try:
        cluster.kubectl("apply", "-f", str(root / "crds"))
        established = ("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
        wait_until(lambda: cluster.kubectl_ok(*established), 120, "the CRD established", interval_s=1.0)
        objs = client.CustomObjectsApi(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
        made = 0
        for services in counts:
            for i in range(made, services):
                body = copy.deepcopy(recommend)
                body["metadata"] = {"name": f"many-{i}", "namespace": "default"}
                objs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
            made = services
            for phase, (qps, patches) in run(cluster, fake, workdir, services, window_s, checkout).items():
                rows.append((str(services), name, phase, f"{qps:.1f}", f"{patches:.2f}"))
                print(rows[-1], flush=True)
    finally:
        fake.__exit__(None, None, None)
        cluster.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", default="200,1000", help="comma-separated service counts, ascending")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of each measurement")
    parser.add_argument("--compare", help="another checkout's root, run as the 'before' operator")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster on `kill` too
    counts = [int(n) for n in args.services.split(",")]
    rows: list[tuple[str, ...]] = []
    for checkout in (None, *([args.compare] if args.compare else [])):
        rows += variant(checkout, counts, args.window)
    table = Table(title=f"Prometheus load: recommend-mode services, scale interval 15 s, {args.window:.0f} s windows")
    for col in ("services", "operator", "Prometheus", "queries/s", "status PATCH/s"):
        table.add_column(col, justify="right" if col in ("queries/s", "status PATCH/s", "services") else "left")
    for row in rows:
        table.add_row(*row)
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
