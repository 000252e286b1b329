"""Starting the operator (issue 21, item 10): a metrics port in use stops it at once with the
port named, before anything else (no kubeconfig is needed to see it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def test_a_metrics_port_in_use_fails_fast_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "KVSCALE_METRICS_PORT": str(port), "KUBECONFIG": str(tmp_path / "absent")}
        out = subprocess.run(
            [sys.executable, "-m", "kvscale.cli", "operator"], env=env, capture_output=True, text=True, timeout=120
        )
    assert out.returncode != 0
    assert f"KVSCALE_METRICS_PORT: port {port} cannot be served" in out.stderr, out.stderr[-2000:]
