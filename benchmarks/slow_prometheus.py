"""The operator with a Prometheus answering in 10 s and 200 InferenceServices (not a test:
prints a table). Issue 14's probe: a slow Prometheus once stalled the whole operator (a new
resource's Deployment after 115-124 s with 57 services).

- A fake Prometheus on 127.0.0.1 answers every query after 10 s; the operator's scale tick
  runs every 5 s against it (observation deadline min(2 s, tick / 3)); status tick 1 s
  (the test settings; `--status-interval 10s --scale-interval 15s` for the defaults).
- 200 recommend-mode InferenceServices (planned, ticking, no pods), then 5 auto-mode ones
  created one at a time: create -> Deployment exists, and -> phase Ready (kwok pods).
- At rest with the 200: API requests/s over an idle minute from the API server's own
  `apiserver_request_total`, with the operator running and then stopped (the difference is
  the operator's), by verb and resource; operator RSS; tick durations from its /metrics.

Run: KVSCALE_CLUSTER_BINS=... .venv/bin/python -m benchmarks.slow_prometheus [--idle 60] [--status-interval 10s]
    [--scale-interval 15s]
"""

from __future__ import annotations

import argparse
import copy
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from rich.console import Console
from rich.table import Table

from benchmarks.cluster_probes import deployment_exists, operator_metric, request_counts, rss_mib
from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.sizing.units import parse_duration_s
from tests.cluster.harness import Cluster, find_bins, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_reliability import FakePrometheus, vector

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = yaml.safe_load((ROOT / "deploy" / "samples" / "custom-architecture.yaml").read_text())
RECOMMEND = yaml.safe_load((ROOT / "deploy" / "samples" / "mistral-7b-recommend.yaml").read_text())
SERVICES = 200
PROMETHEUS_DELAY_S = 10.0


def idle_rates(cluster: Cluster, seconds: float) -> tuple[Counter[tuple[str, str]], float]:
    before, start = request_counts(cluster), time.monotonic()
    time.sleep(seconds)  # the idle interval being measured
    after, took = request_counts(cluster), time.monotonic() - start
    return after - before, took


def create_and_time(objs: client.CustomObjectsApi, apps: client.AppsV1Api, name: str) -> tuple[float, float]:
    body = copy.deepcopy(SAMPLE)
    body["metadata"] = {"name": name, "namespace": "default"}
    start = time.monotonic()
    objs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    wait_until(lambda: deployment_exists(apps, name), 300, f"the Deployment of {name}", interval_s=0.05)
    to_deployment = time.monotonic() - start

    def ready() -> bool:
        obj = objs.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
        return bool(obj.get("status", {}).get("phase") == "Ready")

    wait_until(ready, 300, f"{name} Ready", interval_s=0.05)
    to_ready = time.monotonic() - start
    objs.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)  # frees its L4

    def gone() -> bool:
        try:
            objs.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_until(gone, 120, f"{name} deleted", interval_s=0.2)
    return to_deployment, to_ready


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of each idle measurement")
    parser.add_argument("--status-interval", default="1s", help="KVSCALE_STATUS_INTERVAL (default 10s)")
    parser.add_argument("--scale-interval", default="5s", help="KVSCALE_SCALE_INTERVAL (default 15s)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster on `kill` too
    workdir = Path(tempfile.mkdtemp(prefix="kvscale-slowprom-"))
    cluster = Cluster(workdir, find_bins()).start()
    fake = FakePrometheus(PROMETHEUS_DELAY_S, vector("1")).__enter__()
    intervals = {"KVSCALE_STATUS_INTERVAL": args.status_interval, "KVSCALE_SCALE_INTERVAL": args.scale_interval}
    operator = Operator(cluster, workdir, {"KVSCALE_PROMETHEUS_URL": fake.url, **intervals})
    rows: list[tuple[str, str]] = []
    try:
        cluster.kubectl("apply", "-f", str(ROOT / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
        operator.start()
        assert operator.process is not None
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        objs, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
        alone = [create_and_time(objs, apps, f"alone-{i}") for i in range(3)]
        start = time.monotonic()
        for i in range(SERVICES):
            body = copy.deepcopy(RECOMMEND)
            body["metadata"] = {"name": f"many-{i}", "namespace": "default"}
            objs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

        def all_recommended() -> bool:
            items = objs.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
            return sum(1 for o in items if o.get("status", {}).get("phase") == "Recommended") >= SERVICES

        wait_until(all_recommended, 900, f"{SERVICES} plans", interval_s=1.0)
        planned_s = time.monotonic() - start
        asked = fake.requests
        wait_until(lambda: fake.requests >= asked + 16, 60, "ticks asking the slow Prometheus", interval_s=0.5)
        loaded = [create_and_time(objs, apps, f"timed-{i}") for i in range(5)]
        ticks = operator_metric(operator, "kvscale_tick_duration_seconds_count")
        tick_sum = operator_metric(operator, "kvscale_tick_duration_seconds_sum")
        timeouts = operator_metric(operator, 'kvscale_prometheus_errors_total{kind="timeout"}')
        # At rest: Prometheus answers at once again (every query the value 1); after two ticks
        # the statuses are settled and nothing should change.
        fake.delay_s = 0.0
        time.sleep(2 * parse_duration_s(args.scale_interval) + 2)  # two ticks at the fast answers
        at_rest, took = idle_rates(cluster, args.idle)
        rss = max(rss_mib(operator.process.pid) for _ in range(3))
        operator.stop()
        without, took_without = idle_rates(cluster, args.idle)
        total, total_without = sum(at_rest.values()) / took, sum(without.values()) / took_without
        rows += [
            (
                "create -> Deployment, no other services (median of 3)",
                f"{statistics.median(a for a, _ in alone):.2f} s",
            ),
            (f"{SERVICES} recommend-mode services planned", f"{planned_s:.1f} s"),
            (
                f"create -> Deployment with {SERVICES} services ticking on a {PROMETHEUS_DELAY_S:.0f} s Prometheus",
                f"median {statistics.median(d for d, _ in loaded):.2f} s, max {max(d for d, _ in loaded):.2f} s",
            ),
            ("create -> phase Ready, same (median of 5)", f"{statistics.median(r for _, r in loaded):.2f} s"),
            ("autoscale ticks so far / mean tick wall time", f"{ticks:.0f} / {tick_sum / max(ticks, 1):.2f} s"),
            ("Prometheus queries timed out (counted by the operator)", f"{timeouts:.0f}"),
            (
                f"API requests/s at rest, {SERVICES} services, Prometheus fast again, operator running",
                f"{total:.2f} (operator stopped: {total_without:.2f})",
            ),
            ("operator RSS at rest", f"{rss:.0f} MiB"),
        ]
        diff = Counter({k: v for k, v in (at_rest - without).items() if v > 0})
        for (verb, resource), count in diff.most_common(6):
            rows.append((f"  operator's share: {verb} {resource}", f"{count / took:.2f}/s"))
    finally:
        operator.stop()
        fake.__exit__(None, None, None)
        cluster.stop()
    table = Table(
        title=f"Operator with a {PROMETHEUS_DELAY_S:.0f} s Prometheus and {SERVICES} InferenceServices "
        f"(status interval {args.status_interval}, scale interval {args.scale_interval})"
    )
    for col in ("measure", "value"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
