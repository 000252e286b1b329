"""Operator timings and memory on the test cluster (not a test: prints a table).

- time from `create` to the Deployment existing, and to status phase Ready (kwok pods);
- operator resident memory with 200 InferenceServices (recommend mode: plans, no pods).
Run: KVSCALE_CLUSTER_BINS=... .venv/bin/python benchmarks/operator.py
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from rich.console import Console
from rich.table import Table

from kvscale.api import GROUP, PLURAL, VERSION
from tests.cluster.harness import Cluster, find_bins, wait_until
from tests.cluster.processes import Operator

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = yaml.safe_load((ROOT / "deploy" / "samples" / "custom-architecture.yaml").read_text())
RECOMMEND = yaml.safe_load((ROOT / "deploy" / "samples" / "mistral-7b-recommend.yaml").read_text())


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="kvscale-bench-"))
    cluster = Cluster(workdir, find_bins()).start()
    operator = Operator(cluster, workdir)
    try:
        cluster.kubectl("apply", "-f", str(ROOT / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
        operator.start()
        assert operator.process is not None
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        objs, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
        to_deployment, to_ready = [], []
        for i in range(5):
            body = copy.deepcopy(SAMPLE)
            body["metadata"] = {"name": f"timed-{i}", "namespace": "default"}
            start = time.monotonic()
            objs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

            def deployed(name: str = f"timed-{i}") -> bool:
                try:
                    apps.read_namespaced_deployment(name, "default")
                except ApiException:
                    return False
                return True

            wait_until(deployed, 120, "the Deployment", interval_s=0.05)
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
        table = Table(title="kvscale operator on the test cluster (kwok nodes, 1 s status interval)")
        for col in ("measure", "value"):
            table.add_column(col)
        table.add_row("create -> Deployment exists (median of 5)", f"{statistics.median(to_deployment):.2f} s")
        table.add_row("create -> phase Ready (median of 5)", f"{statistics.median(to_ready):.2f} s")
        table.add_row("operator RSS, idle after 5 services", f"{baseline:.0f} MiB")
        table.add_row("200 InferenceServices planned (recommend mode)", f"{planned_all:.1f} s")
        table.add_row("operator RSS with 200 InferenceServices", f"{max(samples):.0f} MiB (max of 10 samples)")
        Console(width=120).print(table)
    finally:
        operator.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
