"""Operator timings, API requests and memory on the test cluster (not a test: prints tables).

Sections (`--section`, default all):
- small: time from `create` to the Deployment existing and to phase Ready (kwok pods),
  operator memory with 200 InferenceServices (recommend mode: plans, no pods);
- large: 1,000 kwok GPU nodes and 5,000 pods (3,000 holding a GPU), then InferenceServices
  created one at a time: reconcile latency (create -> Deployment) and the API requests the
  operator made per reconcile, read from the API server's own request counters.
  `--compare-pythonpath DIR` runs a second operator from another checkout (e.g. the commit
  before the watch-based inventory) on the same cluster, for the before/after table.

Run: KVSCALE_CLUSTER_BINS=... PYTHONPATH=. .venv/bin/python benchmarks/operator.py [--section large]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from rich.console import Console
from rich.table import Table

from benchmarks.cluster_probes import deployment_exists as deployed
from benchmarks.cluster_probes import request_counts, rss_mib, start_operator
from kvscale.api import GROUP, PLURAL, VERSION
from tests.cluster.harness import GPU_TAINT, KWOK_TAINT, Cluster, find_bins, node_objects, wait_until
from tests.cluster.processes import Operator

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = yaml.safe_load((ROOT / "deploy" / "samples" / "custom-architecture.yaml").read_text())
RECOMMEND = yaml.safe_load((ROOT / "deploy" / "samples" / "mistral-7b-recommend.yaml").read_text())
LARGE_POOL = {
    "pools": [
        {"name": "h100", "count": 250, "gpus": 8, "product": "NVIDIA-H100-80GB-HBM3", "cpu": "208", "memory": "2000Gi"},
        {"name": "a100", "count": 250, "gpus": 8, "product": "NVIDIA-A100-SXM4-80GB", "cpu": "96", "memory": "1000Gi"},
        {"name": "a10g", "count": 200, "gpus": 4, "product": "NVIDIA-A10G", "cpu": "48", "memory": "192Gi"},
        {"name": "l4", "count": 300, "gpus": 1, "product": "NVIDIA-L4", "cpu": "8", "memory": "32Gi"},
    ]
}
PODS, GPU_PODS, TIMED = 5000, 3000, 10


def small(cluster: Cluster, workdir: Path, status_interval: str = "1s") -> Table:
    operator = Operator(cluster, workdir, extra_env={"KVSCALE_STATUS_INTERVAL": status_interval})
    operator.start()
    try:
        if operator.process is None:
            raise RuntimeError("the operator did not start")
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        objs, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
        to_deployment, to_ready = [], []
        for i in range(5):
            body = copy.deepcopy(SAMPLE)
            body["metadata"] = {"name": f"timed-{i}", "namespace": "default"}
            start = time.monotonic()
            objs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
            name = f"timed-{i}"
            wait_until(lambda: deployed(apps, name), 120, "the Deployment", interval_s=0.05)  # noqa: B023
            to_deployment.append(time.monotonic() - start)

            def ready(name: str = f"timed-{i}") -> bool:
                obj = objs.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
                return bool(obj.get("status", {}).get("phase") == "Ready")

            wait_until(ready, 120, "Ready", interval_s=0.05)
            to_ready.append(time.monotonic() - start)
            objs.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, f"timed-{i}")
        baseline = rss_mib(operator.process.pid)
        start = time.monotonic()
        for i in range(200):
            body = copy.deepcopy(RECOMMEND)
            body["metadata"] = {"name": f"many-{i}", "namespace": "default"}
            objs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

        def all_recommended() -> bool:
            items = objs.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
            return sum(1 for o in items if o.get("status", {}).get("phase") == "Recommended") >= 200

        wait_until(all_recommended, 600, "200 plans", interval_s=1.0)
        planned_all = time.monotonic() - start
        samples = []
        for _ in range(10):
            samples.append(rss_mib(operator.process.pid))
            time.sleep(1.0)  # sample memory over ten seconds of steady timers
    finally:
        operator.stop()
    table = Table(title=f"kvscale operator on the test cluster (12 kwok nodes, {status_interval} status interval)")
    for col in ("measure", "value"):
        table.add_column(col)
    table.add_row("create -> Deployment exists (median of 5)", f"{statistics.median(to_deployment):.2f} s")
    table.add_row("create -> phase Ready (median of 5)", f"{statistics.median(to_ready):.2f} s")
    table.add_row("operator RSS, idle after 5 services", f"{baseline:.0f} MiB")
    table.add_row("200 InferenceServices planned (recommend mode)", f"{planned_all:.1f} s")
    table.add_row("operator RSS with 200 InferenceServices", f"{max(samples):.0f} MiB (max of 10 samples)")
    return table


def _pods(nodes: list[str]) -> list[dict[str, Any]]:
    """5,000 pods bound to the GPU nodes (kwok runs them): the first 3,000 hold one GPU each."""
    gpu_nodes = [n for n in nodes if n.startswith(("h100-", "a100-"))]
    out = []
    for i in range(PODS):
        node = gpu_nodes[i % len(gpu_nodes)] if i < GPU_PODS else nodes[i % len(nodes)]
        limits = {"nvidia.com/gpu": "1"} if i < GPU_PODS else {}
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"load-{i}", "namespace": "default", "labels": {"app": "load"}},
                "spec": {
                    "nodeName": node,
                    "tolerations": [
                        {"key": KWOK_TAINT["key"], "operator": "Exists"},
                        {"key": GPU_TAINT["key"], "operator": "Exists"},
                    ],
                    "containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}],
                },
            }
        )
    return out


def populate(cluster: Cluster, nodes: list[str]) -> float:
    start = time.monotonic()
    pods = _pods(nodes)
    for i in range(0, len(pods), 500):
        cluster.kubectl("create", "-f", "-", input_text=yaml.safe_dump_all(pods[i : i + 500]))
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))

    def running() -> bool:
        listed = core.list_namespaced_pod("default", label_selector="app=load", field_selector="status.phase=Running")
        return len(listed.items) >= PODS

    wait_until(running, 600, f"{PODS} pods Running", interval_s=5.0)
    return time.monotonic() - start


def timed_reconciles(cluster: Cluster, workdir: Path, label: str, pythonpath: str | None) -> dict[str, Any]:
    """Starts an operator, waits until it serves, then creates TIMED services one at a time."""
    env = {"KVSCALE_STATUS_INTERVAL": "10s"}  # the default: the timers' own reads stay rare
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    operator = Operator(cluster, workdir / label, extra_env=env)
    (workdir / label).mkdir(parents=True, exist_ok=True)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    objs, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
    started = time.monotonic()
    start_operator(operator, pythonpath)
    try:
        warm = copy.deepcopy(SAMPLE)
        warm["metadata"] = {"name": f"{label}-warm", "namespace": "default"}
        objs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, warm)
        wait_until(lambda: deployed(apps, f"{label}-warm"), 300, "the first Deployment", interval_s=0.1)
        first = time.monotonic() - started
        before = request_counts(cluster, watches=False)
        latencies = []
        for i in range(TIMED):
            body = copy.deepcopy(SAMPLE)
            body["metadata"] = {"name": f"{label}-{i}", "namespace": "default"}
            start = time.monotonic()
            objs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
            name = f"{label}-{i}"
            wait_until(lambda: deployed(apps, name), 120, "the Deployment", interval_s=0.02)  # noqa: B023
            latencies.append(time.monotonic() - start)
        after = request_counts(cluster, watches=False)
        rss = rss_mib(operator.process.pid) if operator.process else float("nan")
    finally:
        operator.stop()
    for i in range(TIMED):
        objs.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, f"{label}-{i}")
    objs.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, f"{label}-warm")
    return {"first": first, "latencies": latencies, "requests": after - before, "rss": rss}


def large(cluster: Cluster, workdir: Path, compare: str | None) -> list[Table]:
    nodes = [n["metadata"]["name"] for n in node_objects(cluster.nodepool)]  # Ready: start() waited
    populated = populate(cluster, nodes)
    runs = {"this checkout": timed_reconciles(cluster, workdir, "now", None)}
    if compare:
        runs["--compare-pythonpath"] = timed_reconciles(cluster, workdir, "before", compare)
    table = Table(title=f"{len(nodes)} kwok GPU nodes, {PODS} pods ({GPU_PODS} holding a GPU); {TIMED} creates")
    table.add_column("measure")
    for name in runs:
        table.add_column(name, justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("operator start -> first Deployment", [f"{r['first']:.1f} s" for r in runs.values()]),
        ("create -> Deployment, median", [f"{statistics.median(r['latencies']):.2f} s" for r in runs.values()]),
        ("create -> Deployment, max", [f"{max(r['latencies']):.2f} s" for r in runs.values()]),
        ("operator RSS after the creates", [f"{r['rss']:.0f} MiB" for r in runs.values()]),
    ]
    kinds = sorted(
        {k for r in runs.values() for k, v in r["requests"].items() if v and k[0] in ("LIST", "GET")},
        key=lambda k: (k[1], k[0]),
    )
    for verb, resource in kinds:
        rows.append(
            (f"{verb} {resource} per create", [f"{r['requests'][(verb, resource)] / TIMED:.1f}" for r in runs.values()])
        )
    for name, values in rows:
        table.add_row(name, *values)
    setup = Table(title="Setup")
    setup.add_column("measure")
    setup.add_column("value", justify="right")
    setup.add_row(f"{PODS} pods created and Running", f"{populated:.0f} s")
    return [setup, table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=("small", "large", "all"), default="all")
    parser.add_argument("--status-interval", default="1s", help="the operator's KVSCALE_STATUS_INTERVAL (small)")
    parser.add_argument("--compare-pythonpath", help="another checkout's root, run as a second operator (large)")
    args = parser.parse_args()
    console = Console(width=120)
    if args.section in ("small", "all"):
        workdir = Path(tempfile.mkdtemp(prefix="kvscale-bench-"))
        cluster = Cluster(workdir, find_bins()).start()
        try:
            cluster.kubectl("apply", "-f", str(ROOT / "crds"))
            cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
            console.print(small(cluster, workdir, args.status_interval))
        finally:
            cluster.stop()
    if args.section in ("large", "all"):
        workdir = Path(tempfile.mkdtemp(prefix="kvscale-bench-large-"))
        pool = workdir / "nodepool.yaml"
        pool.write_text(yaml.safe_dump(LARGE_POOL))
        cluster = Cluster(workdir, find_bins(), nodepool=pool).start(timeout_s=600)
        try:
            cluster.kubectl("apply", "-f", str(ROOT / "crds"))
            cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
            for table in large(cluster, workdir, args.compare_pythonpath):
                console.print(table)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
