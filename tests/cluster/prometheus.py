"""A real Prometheus on loopback for tests: generated config, short intervals, HTTP API queries.
The binary is the one `hack/build-cluster-bins.sh` builds from the Go module proxy (a current
3.x release), not whatever `prometheus` is on PATH."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.cluster.harness import ClusterError, find_bins, free_port, wait_until


@dataclass
class Prometheus:
    workdir: Path
    targets: list[str]  # host:port of each /metrics endpoint
    scrape_interval: str = "1s"
    binary: str = field(default_factory=lambda: str(find_bins() / "prometheus"))
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    rule_files: list[Path] = field(default_factory=list)
    scrape_options: dict[str, Any] = field(default_factory=dict)  # extra keys of the scrape config
    jobs: list[dict[str, Any]] = field(default_factory=list)  # more scrape configs (e.g. from monitors)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def config(self) -> dict[str, Any]:
        test_job = {
            "job_name": "test",
            "scrape_interval": self.scrape_interval,
            "static_configs": [{"targets": self.targets}],
            **self.scrape_options,
        }
        return {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [*([test_job] if self.targets else []), *self.jobs],
        }

    def start(self, timeout_s: float = 60.0) -> Prometheus:
        if not Path(self.binary).exists():
            raise ClusterError(f"{self.binary} does not exist; run `make cluster-bins`")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(self.config()))
        self.port = self.port or free_port()
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise ClusterError(f"prometheus exited: {self.log_path.read_text()[-2000:]}")
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200

        wait_until(ready, timeout_s, "prometheus /-/ready")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.process = None

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector; raises on a PromQL error."""
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise ClusterError(f"query {promql!r} failed: {body.get('errorType')}: {body.get('error')}")
        return list(body["data"]["result"])

    def wait_for_series(self, promql: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = []

        def present() -> bool:
            nonlocal result
            result = self.query(promql)
            return bool(result)

        wait_until(present, timeout_s, f"a series for {promql!r}", interval_s=0.5)
        return result

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
