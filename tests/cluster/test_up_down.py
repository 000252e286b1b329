"""`make cluster-up` / `make cluster-down` (tests/cluster/up.py): down stops the cluster and leaves
nothing of it behind, certificates and keys included (issue 31, LOW: the controller-manager's and
scheduler's serving certificates and the admin kubeconfig stayed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def up_py(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.cluster.up", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "KVSCALE_CLUSTER_DIR": str(state)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_cluster_down_removes_every_certificate_and_key(tmp_path: Path) -> None:
    state = tmp_path / "dev-cluster"
    started = up_py(state)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        written = {p.relative_to(state).as_posix() for p in state.rglob("*")}
        assert {"admin.kubeconfig", "pki/ca.key"} <= written, sorted(written)
        assert any(p.startswith(("kcm-certs/", "scheduler-certs/")) for p in written), sorted(written)
    finally:
        stopped = up_py(state, "--down")
    assert stopped.returncode == 0 and "cluster stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    left = sorted(p.relative_to(state).as_posix() for p in state.rglob("*")) if state.exists() else []
    assert left == [], f"cluster-down left {left}"
