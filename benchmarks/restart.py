"""An operator restart with many InferenceServices (not a test: prints a table). Issue 21,
item 4: after a restart with ~1,000 resources a new InferenceService waited 78 s behind the
resumed ones, and every resume re-posted its Event.

- The test cluster and N recommend-mode InferenceServices (planned, no pods), made by a first
  operator that is then stopped.
- A second operator starts; 2 s later one InferenceService is created: the time from its
  `create` to its Deployment, and the Events the resumes posted within `--settle` seconds of
  the start (Recommended/Planned Events about the N, which a resume that changes nothing
  should not post).
- `--compare DIR`: the same restart with the operator from another checkout, for the table:
  a cluster of its own, with that checkout's CRD and samples (an older operator refuses
  fields a newer CRD defaults), its own first operator and N resources.

Run: KVSCALE_CLUSTER_BINS=... .venv/bin/python -m benchmarks.restart [--services 1000] [--compare DIR]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from rich.console import Console
from rich.table import Table

from benchmarks.cluster_probes import deployment_exists, start_operator
from kvscale.api import GROUP, PLURAL, VERSION
from tests.cluster.harness import Cluster, find_bins, wait_until
from tests.cluster.processes import Operator

ROOT = Path(__file__).resolve().parents[1]


def sample(root: Path, name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((root / "deploy" / "samples" / f"{name}.yaml").read_text())
    return loaded


def started(workdir: Path, cluster: Cluster, label: str, checkout: str | None) -> Operator:
    (workdir / label).mkdir(parents=True, exist_ok=True)
    return start_operator(Operator(cluster, workdir / label, {"KVSCALE_STATUS_INTERVAL": "10s"}), checkout)


def resume_events(core: client.CoreV1Api, since: dt.datetime) -> int:
    items = core.list_namespaced_event("default").items
    return sum(
        1
        for e in items
        if e.reason in ("Recommended", "Planned")
        and e.involved_object.name.startswith("many-")
        and (e.last_timestamp or e.event_time or e.metadata.creation_timestamp) >= since
    )


def restart(cluster: Cluster, workdir: Path, label: str, checkout: str | None, settle_s: float) -> tuple[float, int]:
    """An operator (of `checkout`, default this one) started over the resources: the time from
    a new resource's create to its Deployment, and the resume Events."""
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    objs, apps, core = client.CustomObjectsApi(api), client.AppsV1Api(api), client.CoreV1Api(api)
    since = dt.datetime.now(dt.UTC)
    operator = started(workdir, cluster, label, checkout)
    name = f"new-{label}"
    try:
        time.sleep(2)  # the operator is listing and resuming
        body = sample(Path(checkout) if checkout else ROOT, "custom-architecture")
        body["metadata"] = {"name": name, "namespace": "default"}
        start = time.monotonic()
        objs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
        wait_until(lambda: deployment_exists(apps, name), 600, "the new service's Deployment", interval_s=0.05)
        took = time.monotonic() - start
        time.sleep(max(0.0, settle_s - (time.monotonic() - start)))  # let the resumes finish
        events = resume_events(core, since)
    finally:
        operator.stop()
    objs.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    return took, events


def variant(label: str, checkout: str | None, services: int, settle_s: float) -> tuple[float, int]:
    """A cluster with the checkout's CRD, N recommend-mode resources planned by a first operator
    of the checkout, then the restart measured."""
    root = Path(checkout) if checkout else ROOT
    workdir = Path(tempfile.mkdtemp(prefix=f"kvscale-restart-{label}-"))
    cluster = Cluster(workdir, find_bins()).start()
    try:
        cluster.kubectl("apply", "-f", str(root / "crds"))
        established = ("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
        wait_until(lambda: cluster.kubectl_ok(*established), 120, "the CRD established", interval_s=1.0)
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        objs = client.CustomObjectsApi(api)
        first = started(workdir, cluster, "first", checkout)
        recommend = sample(root, "mistral-7b-recommend")
        for i in range(services):
            body = copy.deepcopy(recommend)
            body["metadata"] = {"name": f"many-{i}", "namespace": "default"}
            objs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

        def all_recommended() -> bool:
            items = objs.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
            return bool(sum(1 for o in items if o.get("status", {}).get("phase") == "Recommended") >= services)

        wait_until(all_recommended, 1800, f"{services} plans", interval_s=2.0)
        first.stop()
        return restart(cluster, workdir, label, checkout, settle_s)
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=120.0, help="seconds after the start to count Events")
    parser.add_argument("--compare", help="another checkout's root, run as the 'before' operator")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster on `kill` too
    rows = []
    variants = {"this checkout": None, **({"before": args.compare} if args.compare else {})}
    for label, checkout in variants.items():
        took, events = variant(label.split()[0], checkout, args.services, args.settle)
        rows.append((label, f"{took:.2f} s", str(events)))
        print(rows[-1], flush=True)
    table = Table(title=f"Operator restart with {args.services} recommend-mode InferenceServices")
    for col in ("operator", "new service: create -> Deployment", f"resume Events in {args.settle:.0f} s"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
