"""`make demo`: the test cluster, the chart, a sample, the serving stand-in under a load ramp,
a real Prometheus and the operator; prints the timeline of decisions and draws load, replicas
and latency to out/demo.png. Runs about four minutes; `--duration` shortens the load ramp (the
cluster test runs it so, through the same steps)."""

from __future__ import annotations

import argparse
import copy
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from kubernetes import client, config

from tests.cluster.harness import Cluster, find_bins, free_port, wait_until
from tests.cluster.processes import KvscaleProcess, Operator, standin
from tests.cluster.prometheus import Prometheus
from tests.cluster.test_operator import SAMPLES, create, get
from tests.cluster.test_operator_rbac import service_account_kubeconfig

ROOT = Path(__file__).resolve().parents[1]
RUN_S = 210
# The chart's release namespace: its Role for the operator's Lease covers this namespace only
# (charts/kvscale/templates/rbac.yaml), so the operator's Lease must live here.
RELEASE_NAMESPACE = "kvscale-system"


def load_ramp(run_s: float) -> str:
    """The stand-in's load: 0.5 req/s, 6 req/s from 1/7 of the run (a scale-up), 1 req/s from
    13/21 of it (a scale-down after the 30 s stabilization window)."""
    return f"steps:0.5@0,6@{run_s * 30 / 210:.0f},1@{run_s * 130 / 210:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=RUN_S, help="seconds of load ramp to record")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "demo.png", help="the PNG to write")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kvscale-demo-"))
    try:
        run(work, args.duration, args.out)
    except Exception as exc:
        operator_log = work / "operator.log"
        if operator_log.exists():  # the cause is usually here (the temp dir goes below)
            tail = "\n".join(operator_log.read_text(errors="replace").splitlines()[-30:])
            print(f"----- operator log (last lines) -----\n{tail}", file=sys.stderr)
        print(f"demo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def run(work: Path, run_s: float, out: Path) -> None:
    load_profile = load_ramp(run_s)
    print("starting the test cluster ...", flush=True)
    cluster = Cluster(work, find_bins()).start()
    processes: list[KvscaleProcess] = []
    prom = None
    operator = None
    try:
        subprocess.run(
            [
                str(cluster.helm),
                f"--kubeconfig={cluster.kubeconfig}",
                "install",
                "kvscale",
                str(ROOT / "charts" / "kvscale"),
                "-n",
                RELEASE_NAMESPACE,
                "--create-namespace",
                "--set",
                "serviceAccount.name=kvscale-operator",
            ],
            check=True,
            capture_output=True,
        )
        print("chart installed (CRD, RBAC, ServiceAccount); the operator runs here under that account", flush=True)
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        standin_port = free_port()
        operator = Operator(
            Cluster(
                workdir=work,
                bins=cluster.bins,
                external_kubeconfig=service_account_kubeconfig(cluster, api, work / "sa.kubeconfig"),
            ),
            work,
            {"KVSCALE_LEASE_NAMESPACE": RELEASE_NAMESPACE},
        )
        prom = Prometheus(
            work / "prom", targets=[f"127.0.0.1:{standin_port}", f"127.0.0.1:{operator.metrics_port}"]
        ).start()
        operator.env.update(
            {"KVSCALE_PROMETHEUS_URL": prom.url, "KVSCALE_SCALE_INTERVAL": "3s", "KVSCALE_METRICS_WINDOW": "20s"}
        )
        operator.start()
        body = copy.deepcopy(SAMPLES["custom-architecture"])
        body["metadata"]["name"] = "demo"
        body["spec"]["scaling"] = {"minReplicas": 1, "maxReplicas": 4, "scaleDownStabilization": "30s"}
        body["spec"]["slo"]["timePerOutputToken"] = "60ms"
        create(api, "default", body)
        wait_until(lambda: get(api, "default", "demo").get("status", {}).get("phase") == "Ready", 120, "Ready")
        processes.append(standin(cluster, "demo", "default", standin_port, load_profile, "5s", work / "standin.log"))
        print(f"load {load_profile} (req/s @ s) for {run_s:.0f}s; decisions:", flush=True)
        start = time.monotonic()
        seen: set[str] = set()
        series: list[tuple[float, float, int, float]] = []
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        while time.monotonic() - start < run_s:
            t = time.monotonic() - start
            observed = get(api, "default", "demo").get("status", {}).get("observed") or {}
            replicas = apps.read_namespaced_deployment("demo", "default").spec.replicas
            ttft = observed.get("ttft")
            series.append((t, observed.get("requestsPerSecond") or 0.0, replicas, _seconds(ttft)))
            for event in core.list_namespaced_event("default").items:
                if (
                    event.involved_object.name == "demo"
                    and event.metadata.uid not in seen
                    and event.reason in ("Scaled", "Planned")
                ):
                    seen.add(event.metadata.uid)
                    print(f"  t={t:5.0f}s  {event.reason}: {event.message[:150]}", flush=True)
            time.sleep(3.0)  # sampling the timeline
        _draw(series, out)
    finally:
        for p in processes:
            p.stop()
        if operator is not None:
            operator.stop()
        if prom is not None:
            prom.stop()
        cluster.stop()


def _seconds(text: str | None) -> float:
    if not text:
        return float("nan")
    from kvscale.sizing.units import parse_duration_s

    return parse_duration_s(text)


def _draw(series: list[tuple[float, float, int, float]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    t = [s[0] for s in series]
    fig, (load, reps, lat) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    load.plot(t, [s[1] for s in series], color="black")
    load.set_ylabel("observed req/s")
    reps.step(t, [s[2] for s in series], where="post")
    reps.set_ylabel("replicas")
    lat.plot(t, [s[3] * 1e3 for s in series])
    lat.axhline(300, color="red", linestyle="--", label="TTFT target")
    lat.set_ylabel("observed TTFT p95 (ms)")
    lat.set_xlabel("seconds")
    lat.legend()
    for ax in (load, reps, lat):
        ax.grid(True, alpha=0.3)
    fig.suptitle("kvscale demo: replicas follow a load ramp (test cluster, simulated engines)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
