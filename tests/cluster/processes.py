"""kvscale processes the cluster tests, the demo and the benchmarks start: the operator and
the serving stand-in, each in its own session with its own log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from tests.cluster.harness import Cluster, free_port, wait_until


class KvscaleProcess:
    """`python -m kvscale.cli ARGS` in its own process group, logging to a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kvscale.cli", *self.args],
            env=self.env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""


class Operator(KvscaleProcess):
    """`kvscale operator` with test-sized intervals, tolerating kwok's taint; `extra_env` adds
    or overrides settings (Prometheus, scale interval). Each one elects itself on a Lease of its
    own (a test that runs two operators against one Lease sets KVSCALE_LEASE_NAME for both)."""

    def __init__(self, cluster: Cluster, workdir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.cluster = cluster
        self.metrics_port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "KVSCALE_METRICS_PORT": str(self.metrics_port),
            "KVSCALE_EXTRA_TOLERATIONS": "kwok.x-k8s.io/node:NoSchedule",
            "KVSCALE_STATUS_INTERVAL": "1s",
            "KVSCALE_UNSCHEDULABLE_TIMEOUT": "4s",
            "KVSCALE_RETRY_BACKOFF": "2s",
            "KVSCALE_LEASE_NAME": f"kvscale-test-{uuid.uuid4().hex[:8]}",
            "KVSCALE_LEASE_NAMESPACE": "default",
            **(extra_env or {}),
        }
        super().__init__(["operator"], env, workdir / "operator.log")


def standin(
    cluster: Cluster,
    name: str,
    namespace: str,
    port: int,
    load: str,
    cold_start: str,
    log: Path,
    catalog: Path | None = None,
) -> KvscaleProcess:
    """`kvscale sim serve` for one InferenceService, started (on `catalog` laid over the built-in one)."""
    process = KvscaleProcess(
        [
            "sim",
            "serve",
            *(("--catalog", str(catalog)) if catalog is not None else ()),
            "--name",
            name,
            "--namespace",
            namespace,
            "--port",
            str(port),
            "--load",
            load,
            "--cold-start",
            cold_start,
        ],
        {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        log,
    )
    process.start()
    return process


def serving_since(process: KvscaleProcess, port: int, timeout_s: float = 120.0) -> float:
    """When the stand-in started serving its metrics on `port` (time.monotonic()): its load's
    clock starts as it opens the port, after its imports and the plan it waits for, which on a
    loaded machine take seconds a test timing the load from the process's start would count."""

    def answers() -> bool:
        if process.process is not None and process.process.poll() is not None:
            raise AssertionError(f"the stand-in exited ({process.process.returncode}):\n{process.tail()}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(answers, timeout_s, f"the stand-in serving on :{port}", interval_s=0.2)
    return time.monotonic()
