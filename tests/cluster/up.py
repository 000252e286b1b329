"""`make cluster-up` / `make cluster-down`: the test cluster in the background, for a person.

python -m tests.cluster.up          # starts it, prints `export KUBECONFIG=...`
python -m tests.cluster.up --down   # stops it and removes its state: everything `up` wrote there
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from contextlib import suppress
from pathlib import Path

from tests.cluster.harness import Cluster, ClusterError, find_bins

STATE_DIR = Path(os.environ.get("KVSCALE_CLUSTER_DIR", Path.home() / ".cache" / "kvscale" / "dev-cluster"))
STATE = STATE_DIR / "state.json"
# What a cluster writes in its directory (tests/cluster/harness.py): data, logs, the CA and the
# API server's keys, the controller-manager's and scheduler's serving certificates and the admin
# kubeconfig (which embeds the admin client key). `--down` once left the last three behind.
WRITTEN = ("etcd", "pki", "logs", "kcm-certs", "scheduler-certs", "admin.kubeconfig")


def up() -> int:
    if STATE.exists():
        state = json.loads(STATE.read_text())
        if all(_alive(pid) for pid in state["pids"].values()):
            print(f"already running\nexport KUBECONFIG={state['kubeconfig']} PATH={state['bins']}:$PATH")
            return 0
        down()
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in STATE_DIR.iterdir()}
    started = time.monotonic()
    cluster = Cluster(STATE_DIR, find_bins())
    try:
        cluster.start()
    except ClusterError as exc:
        print(exc, file=sys.stderr)
        return 1
    # Leave the processes running: they were started in their own sessions.
    state = {
        "kubeconfig": str(cluster.kubeconfig),
        "bins": str(cluster.bins),
        "pids": {c: p.pid for c, p in cluster.processes.items()},
        # Removed by --down: what this start added (a later harness may write more than WRITTEN).
        "written": sorted({p.name for p in STATE_DIR.iterdir()} - before),
    }
    STATE.write_text(json.dumps(state, indent=2))
    print(f"cluster up in {time.monotonic() - started:.1f}s; logs in {STATE_DIR / 'logs'}")
    print(f"export KUBECONFIG={cluster.kubeconfig} PATH={cluster.bins}:$PATH")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def down() -> int:
    if not STATE.exists():
        print("no cluster state; nothing to stop")
        return 0
    state = json.loads(STATE.read_text())
    for pid in reversed(list(state["pids"].values())):
        with suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in state["pids"].values()):
        time.sleep(0.2)  # poll for exit
    for pid in state["pids"].values():
        with suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    for name in {*WRITTEN, *state.get("written", ())} - {STATE.name}:
        path = STATE_DIR / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    STATE.unlink()
    with suppress(OSError):  # only when empty: the directory may be one the user named
        STATE_DIR.rmdir()
    print("cluster stopped")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--down", action="store_true", help="stop the background cluster")
    args = parser.parse_args()
    return down() if args.down else up()


if __name__ == "__main__":
    raise SystemExit(main())
