"""README's quickstart on the test cluster, as written: its kubectl block, line by line, in a
shell (the hand-run operator in the background, as the `&` says). The only additions are the
harness's: a kubeconfig whose context namespace is the test's own, and a Lease and metrics port
of the test's own so that other tests' operators are not in the way (issue 31: following
README's `kvscale operator &`, pods stayed Pending on kwok's taint and the status said they
waited for GPUs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

from kubernetes import client

from tests.cluster.harness import Cluster, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
SETTLED = {"Ready", "Recommended"}


def quickstart_lines() -> list[str]:
    """The commands of README's cluster block (the one that applies the CRDs), comments dropped."""
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if "kubectl apply -f crds/" in b)
    return [line.split("   #")[0].split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_quickstart_runs_as_written(
    cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    lines = quickstart_lines()
    assert lines[0] == "kubectl apply -f crds/" and any(line.endswith("&") for line in lines)
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copy(cluster.kubeconfig, kubeconfig)
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PATH": f"{cluster.bins}:{os.environ['PATH']}",
        "KVSCALE_LEASE_NAME": f"quickstart-{uuid.uuid4().hex[:8]}",
        "KVSCALE_LEASE_NAMESPACE": "default",
        "KVSCALE_METRICS_PORT": str(free_port()),
    }
    subprocess.run(["kubectl", "config", "set-context", "--current", f"--namespace={namespace}"], env=env, check=True)
    log = (tmp_path / "operator.log").open("wb")
    background: list[subprocess.Popen[bytes]] = []
    outputs: dict[str, str] = {}

    def settled() -> bool:
        items = json.loads(
            subprocess.run(["kubectl", "get", "kvis", "-o", "json"], env=env, capture_output=True, check=True).stdout
        )["items"]
        samples = len(list((ROOT / "deploy" / "samples").glob("*.yaml")))
        return len(items) == samples and all((i.get("status") or {}).get("phase") in SETTLED for i in items)

    try:
        for line in lines:
            if line.endswith("&"):
                background.append(
                    subprocess.Popen(
                        ["bash", "-c", line[:-1]],
                        cwd=ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
                continue
            if line.startswith("kubectl get kvis"):
                try:
                    wait_until(settled, 180, "every sample Ready (or Recommended)", interval_s=1.0)
                except TimeoutError as exc:
                    raise AssertionError(f"{exc}\n{(tmp_path / 'operator.log').read_text()[-3000:]}") from exc
            done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{line}: {done.stderr}"
            outputs[line] = done.stdout
    finally:
        for proc in background:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
        log.close()
    table = next(out for line, out in outputs.items() if line.startswith("kubectl get kvis"))
    assert "llama-8b-chat" in table and "Ready" in table
    status = next(out for line, out in outputs.items() if "kvscale status" in line)
    assert status.startswith(f"llama-8b-chat in {namespace}: Ready"), status
    assert "waiting for" not in status
