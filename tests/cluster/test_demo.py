"""`make demo` as a user runs it: hack/demo.py itself, with a shorter load ramp. It builds its own
cluster, installs the chart, runs the operator under the chart's ServiceAccount (its RBAC, its
Lease Role), applies the sample, loads it through the stand-in and Prometheus, and draws the PNG."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_demo(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    temp = tmp_path / "tmp"  # the demo's mkdtemp lands here, so a leftover is ours to see
    temp.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(ROOT / "hack" / "demo.py"), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(temp), **(env or {})},
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )


def test_demo_scales_a_sample_under_the_charts_rbac(tmp_path: Path) -> None:
    out = tmp_path / "demo.png"
    # 90 s of ramp: 6 req/s from 13 s; the scale-up came at 33 s on 2 busy cores.
    done = run_demo(tmp_path, "--duration", "90", "--out", str(out))
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-6000:]}"
    assert done.returncode == 0, report
    assert "chart installed" in done.stdout, report
    assert re.search(r"Planned: Deployed 1 x", done.stdout), report
    assert re.search(r"Scaled: Scaled 1 -> [2-9]", done.stdout), report
    assert out.read_bytes()[:8] == PNG_MAGIC, report
    assert not list((tmp_path / "tmp").glob("kvscale-demo-*")), "the demo left its temp dir behind"


def test_a_failed_demo_removes_its_temp_dir(tmp_path: Path) -> None:
    empty = tmp_path / "no-bins"
    empty.mkdir()
    done = run_demo(
        tmp_path, "--duration", "5", "--out", str(tmp_path / "x.png"), env={"KVSCALE_CLUSTER_BINS": str(empty)}
    )
    assert not list((tmp_path / "tmp").glob("kvscale-demo-*")), "a failed demo left its temp dir behind"
    assert done.returncode == 1, done.stdout + done.stderr
    assert "demo failed: ClusterError" in done.stderr, done.stderr
    assert not (tmp_path / "x.png").exists()
