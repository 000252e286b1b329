"""Starts and stops a real control plane from locally built binaries.

etcd -> kube-apiserver (TLS, RBAC, service-account keys) -> kube-controller-manager and
kube-scheduler -> kwok (makes the GPU Nodes Ready and runs pods bound to them). Every
readiness wait polls; every component logs to its own file, shown when a test fails.
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.cluster.pki import Pki, make_pki

REPO = Path(__file__).resolve().parents[2]
NODEPOOL = Path(__file__).with_name("nodepool.yaml")
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
KWOK_TAINT = {"key": KWOK_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


class ClusterError(RuntimeError):
    """The cluster could not be brought up; the message carries the failing component's log tail."""


class ComponentDied(ClusterError):
    """A component process exited: waiting longer cannot help."""


# Ports handed to processes that bind them later (an operator, a stand-in, Prometheus): drawn
# below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default), where
# a port kvscale picked and released is not handed out again by bind(0) or a client's connect
# before its process binds it (a CI run lost a stand-in's port that way: EADDRINUSE).
PORTS = range(20000, 32000)
_picked: set[int] = set()


def free_port() -> int:
    """A port no one listens on now, not given out before by this process."""
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(PORTS)
        if port in _picked:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _picked.add(port)
        return port
    raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1} after 200 tries")


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.2) -> None:
    """Polls `check` until it is true; raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except ComponentDied:
            raise
        except (httpx.HTTPError, OSError, ClusterError) as exc:  # still starting: refuses or errors
            last_error = exc
        time.sleep(interval_s)  # poll interval
    raise TimeoutError(
        f"timed out after {timeout_s:.0f}s waiting for {what}" + (f": {last_error}" if last_error else "")
    )


def holds_for(check: Callable[[], bool], duration_s: float, what: str, interval_s: float = 0.5) -> None:
    """Polls `check` for `duration_s`; fails at the first poll where it is false (a steady state)."""
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        assert check(), f"{what} did not hold"
        time.sleep(interval_s)  # poll interval


def find_bins() -> Path:
    """The directory of built binaries: $KVSCALE_CLUSTER_BINS, else build (or reuse) them."""
    configured = os.environ.get("KVSCALE_CLUSTER_BINS")
    if configured:
        path = Path(configured)
    else:
        out = subprocess.run(
            ["bash", str(REPO / "hack" / "build-cluster-bins.sh")], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            raise ClusterError(f"building the cluster binaries failed:\n{out.stderr[-4000:]}")
        path = Path(out.stdout.strip().splitlines()[-1])
    needed = (*COMPONENTS, "helm", "kubectl", "kwok-stages.yaml", "prometheus", "promtool")
    missing = [c for c in needed if not (path / c).is_file()]
    if missing:
        raise ClusterError(f"{path} lacks {', '.join(missing)}; run `make cluster-bins`")
    return path


def _fetched_crd(env: str, script: str, what: str) -> Path:
    """A CRD file: $`env`, else fetched (or reused from the cache) by hack/`script`."""
    configured = os.environ.get(env)
    if configured:
        path = Path(configured)
    else:
        out = subprocess.run(["bash", str(REPO / "hack" / script)], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise ClusterError(f"fetching the {what} CRD failed:\n{out.stderr[-4000:]}")
        path = Path(out.stdout.strip().splitlines()[-1])
    if not path.is_file():
        raise ClusterError(f"{path} is not a file; run `bash hack/{script}`")
    return path


def find_inference_crd() -> Path:
    """The InferencePool CRD of the Gateway API inference extension: $KVSCALE_INFERENCE_CRD, else
    fetched (or reused from the cache) by hack/fetch-inference-crd.sh from the extension's Go module."""
    return _fetched_crd("KVSCALE_INFERENCE_CRD", "fetch-inference-crd.sh", "InferencePool")


def find_lws_crd() -> Path:
    """The LeaderWorkerSet CRD: $KVSCALE_LWS_CRD, else fetched (or reused from the cache) by
    hack/fetch-lws-crd.sh from the Go module sigs.k8s.io/lws."""
    return _fetched_crd("KVSCALE_LWS_CRD", "fetch-lws-crd.sh", "LeaderWorkerSet")


def find_prometheus_operator_crds() -> Path:
    """The Prometheus Operator's PodMonitor, ServiceMonitor and PrometheusRule CRDs:
    $KVSCALE_PROMETHEUS_OPERATOR_CRDS, else fetched (or reused from the cache) by
    hack/fetch-prometheus-operator-crds.sh from the operator's Go module."""
    configured = os.environ.get("KVSCALE_PROMETHEUS_OPERATOR_CRDS")
    if configured:
        path = Path(configured)
    else:
        out = subprocess.run(
            ["bash", str(REPO / "hack" / "fetch-prometheus-operator-crds.sh")],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise ClusterError(f"fetching the Prometheus Operator CRDs failed:\n{out.stderr[-4000:]}")
        path = Path(out.stdout.strip().splitlines()[-1])
    if not path.is_dir() or len(list(path.glob("monitoring.coreos.com_*.yaml"))) < 3:
        raise ClusterError(f"{path} lacks the CRDs; run `bash hack/fetch-prometheus-operator-crds.sh`")
    return path


@dataclass
class Cluster:
    workdir: Path
    bins: Path
    nodepool: Path = NODEPOOL
    apiserver_port: int = 0
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    pki: Pki | None = None
    external_kubeconfig: Path | None = None  # set by attach(): someone else's cluster

    @classmethod
    def attach(cls, kubeconfig: Path, workdir: Path) -> Cluster:
        """Uses an existing cluster (kind, a real one): kubectl and helm from PATH, nothing started."""
        tools = {name: shutil.which(name) for name in ("kubectl", "helm")}
        missing = [name for name, path in tools.items() if path is None]
        if missing:
            raise ClusterError(f"{', '.join(missing)} not on PATH; needed to test against {kubeconfig}")
        bins = workdir / "bin"
        bins.mkdir(parents=True, exist_ok=True)
        for name, path in tools.items():
            link = bins / name
            if not link.exists():
                link.symlink_to(str(path))
        return cls(workdir=workdir, bins=bins, external_kubeconfig=kubeconfig)

    @property
    def kubeconfig(self) -> Path:
        return self.external_kubeconfig or self.workdir / "admin.kubeconfig"

    @property
    def helm(self) -> Path:
        return self.bins / "helm"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def log_path(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    def log_tail(self, component: str, lines: int = 15) -> str:
        path = self.log_path(component)
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def logs_report(self) -> str:
        return "\n".join(f"----- {c} (last lines) -----\n{self.log_tail(c)}" for c in COMPONENTS)

    def admin_tls(self) -> ssl.SSLContext:
        """TLS context that trusts the cluster CA and presents the admin client certificate."""
        assert self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, timeout_s: float = 120.0, control_plane_only: bool = False) -> Cluster:
        """Starts the cluster; `control_plane_only`: etcd and the API server alone (no
        controllers, no nodes), a bare cluster to test what a client sees before anything is installed."""
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.pki = make_pki(self.workdir / "pki")
        try:
            self._start_etcd(timeout_s)
            self._start_apiserver(timeout_s)
            self._write_kubeconfig()
            if not control_plane_only:
                self._start_controllers(timeout_s)
                self._start_kwok()
                self.create_node_pool(timeout_s)
        except Exception as exc:
            report = self.logs_report()
            self.stop()
            raise ClusterError(f"cluster did not come up: {exc}\n{report}") from exc
        return self

    def _spawn(self, component: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = self.log_path(component).open("ab")
        proc = subprocess.Popen(
            [str(self.bins / component), *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.processes[component] = proc
        return proc

    def _alive(self, component: str) -> None:
        proc = self.processes[component]
        if proc.poll() is not None:
            raise ComponentDied(f"{component} exited with {proc.returncode}:\n{self.log_tail(component)}")

    def _start_etcd(self, timeout_s: float) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            [
                "--name=kvscale",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=kvscale=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            self._alive("etcd")
            return bool(httpx.get(f"{self.etcd_url}/health", timeout=2).json().get("health") == "true")

        wait_until(healthy, timeout_s, "etcd /health")

    def _start_apiserver(self, timeout_s: float) -> None:
        assert self.pki is not None
        p = self.pki
        self.apiserver_port = self.apiserver_port or free_port()
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={self.etcd_url}",
                f"--cert-dir={self.workdir / 'pki'}",
                f"--tls-cert-file={p.serving_cert}",
                f"--tls-private-key-file={p.serving_key}",
                f"--client-ca-file={p.ca_cert}",
                f"--secure-port={self.apiserver_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={p.sa_public}",
                f"--service-account-signing-key-file={p.sa_private}",
                "--profiling=false",
                "--endpoint-reconciler-type=none",  # loopback is not a valid Endpoints address
                "--v=1",
            ],
        )

        def ready() -> bool:
            self._alive("kube-apiserver")
            return httpx.get(f"{self.server}/readyz", verify=self.admin_tls(), timeout=5).status_code == 200

        wait_until(ready, timeout_s, "kube-apiserver /readyz")

    def _write_kubeconfig(self) -> None:
        assert self.pki is not None
        p = self.pki

        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kvscale-test",
                    "cluster": {"server": self.server, "certificate-authority-data": b64(p.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": "kvscale-admin",
                    "user": {"client-certificate-data": b64(p.admin_cert), "client-key-data": b64(p.admin_key)},
                }
            ],
            "contexts": [{"name": "kvscale-test", "context": {"cluster": "kvscale-test", "user": "kvscale-admin"}}],
            "current-context": "kvscale-test",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)

    def _start_controllers(self, timeout_s: float) -> None:
        assert self.pki is not None
        p = self.pki
        kc = str(self.kubeconfig)
        kcm_port, sched_port = free_port(), free_port()
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                f"--service-account-private-key-file={p.sa_private}",
                f"--root-ca-file={p.ca_cert}",
                "--use-service-account-credentials",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                "--v=1",
            ],
        )
        for component, port in (("kube-controller-manager", kcm_port), ("kube-scheduler", sched_port)):

            def healthy(component: str = component, port: int = port) -> bool:
                self._alive(component)
                # Self-signed serving certificate; /healthz needs no authentication.
                return httpx.get(f"https://127.0.0.1:{port}/healthz", verify=False, timeout=2).status_code == 200

            wait_until(healthy, timeout_s, f"{component} /healthz")
        # The service-account controller is up once it has made the default namespace's account.
        wait_until(
            lambda: self.kubectl_ok("get", "serviceaccount", "default", "-n", "default"),
            timeout_s,
            "the default ServiceAccount (controller manager working)",
        )

    def _start_kwok(self) -> None:
        self._spawn(
            "kwok",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--config={self.bins / 'kwok-stages.yaml'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.244.0.1",
                f"--server-address=127.0.0.1:{free_port()}",
            ],
        )

    def stop(self) -> None:
        for component in reversed(list(self.processes)):
            proc = self.processes[component]
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.processes.clear()

    # -- node pool ---------------------------------------------------------------------

    def create_node_pool(self, timeout_s: float = 60.0) -> list[str]:
        nodes = list(node_objects(self.nodepool))
        self.kubectl_apply(nodes)
        names = [n["metadata"]["name"] for n in nodes]

        def all_ready() -> bool:
            self._alive("kwok")
            out = self.kubectl("get", "nodes", "-o", "yaml")
            items = yaml.safe_load(out)["items"]
            ready = {
                i["metadata"]["name"]
                for i in items
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in i.get("status", {}).get("conditions", [])
                )
            }
            return set(names) <= ready

        wait_until(all_ready, timeout_s, f"{len(names)} GPU nodes Ready (kwok)")
        return names

    # -- kubectl -----------------------------------------------------------------------

    def kubectl(self, *args: str, input_text: str | None = None) -> str:
        out = self._kubectl_once(args, input_text)
        # `kubectl wait --for=condition=...` on an object just created, whose status has no
        # conditions yet, fails at once instead of waiting: polled until it has them.
        if out.returncode != 0 and args[:1] == ("wait",) and ".status.conditions accessor error" in out.stderr:
            answers = [out]

            def settled() -> bool:
                answers.append(self._kubectl_once(args, input_text))
                return ".status.conditions accessor error" not in answers[-1].stderr

            with contextlib.suppress(TimeoutError):  # the last answer's error is raised below
                wait_until(settled, 60, f"kubectl {' '.join(args)}", interval_s=0.5)
            out = answers[-1]
        if out.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def _kubectl_once(self, args: tuple[str, ...], input_text: str | None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input_text,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def kubectl_ok(self, *args: str) -> bool:
        try:
            self.kubectl(*args)
        except ClusterError:
            return False
        return True

    def kubectl_apply(self, objects: list[dict[str, Any]]) -> str:
        return self.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(objects))


def node_objects(pool_file: Path) -> Iterator[dict[str, Any]]:
    """Node manifests for the pool: GPU capacity, NVIDIA feature-discovery labels, taints."""
    pools = yaml.safe_load(pool_file.read_text())["pools"]
    for pool in pools:
        for i in range(int(pool["count"])):
            name = f"{pool['name']}-{i}"
            resources = {
                "cpu": str(pool["cpu"]),
                "memory": str(pool["memory"]),
                "pods": "110",
                "nvidia.com/gpu": str(pool["gpus"]),
            }
            yield {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        "nvidia.com/gpu.product": pool["product"],
                        "nvidia.com/gpu.count": str(pool["gpus"]),
                        "nvidia.com/gpu.present": "true",
                    },
                },
                "spec": {"taints": [KWOK_TAINT, GPU_TAINT]},
                "status": {"capacity": resources, "allocatable": resources},
            }
