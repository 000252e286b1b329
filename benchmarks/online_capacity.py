"""CPU cost of the operator's online capacity search (status.capacity, issue 35 part 1).

One search = kvscale.control.capacity.measure on an observed workload window: the capacity
model built, arrivals synthesized from the window (at most MAX_REPLAY_REQUESTS), the simulated
sizing search on the plan, and the replay played faster on the confirmed fleet. Each case is
timed in thread CPU seconds (the best of REPEATS: the machine is shared), behind a Service and
behind a gateway (which steps every replica at every event), at loads from 1 to 150 requests/s
over a 10-minute window (a busy window is thinned at random to the cap over its whole span, so
the search sizes about one replica's share), with a bursty case. The last lines say what 300
services searching every KVSCALE_CAPACITY_INTERVAL cost the operator's one search thread.

Run: PYTHONPATH=. .venv/bin/python benchmarks/online_capacity.py [--services 300] [--interval 300]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import time
from pathlib import Path

from kvscale.api.intent import Intent, parse_intent
from kvscale.api.models import InferenceServiceStatus, PlanStatus
from kvscale.autoscaling.observation import LengthHistogram, ObservedWorkload
from kvscale.control.capacity import measure
from kvscale.control.inventory import gpu_inventory
from kvscale.control.reconcile import Observed, Resource, reconcile
from kvscale.control.settings import Settings
from kvscale.sim.online import MAX_REPLAY_REQUESTS
from kvscale.sizing.catalog import default_catalog
from tests.cluster.harness import node_objects

REPEATS = 3
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
PROMPTS = LengthHistogram((128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, math.inf), (5, 15, 30, 30, 15, 4, 1))
OUTPUTS = LengthHistogram((32.0, 64.0, 128.0, 256.0, 512.0, math.inf), (10, 25, 35, 20, 8, 2))
SPEC = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 700, "outputTokens": 150, "requestsPerSecond": 10},
    "slo": {"timeToFirstToken": "1s", "timePerOutputToken": "50ms", "percentile": 99},
    "hardware": {"gpuTypes": ["H100-SXM"], "maxTensorParallel": 1},
}


def planned(spec: dict[str, object]) -> tuple[Intent, PlanStatus]:
    catalog = default_catalog()
    nodes = list(node_objects(Path(__file__).resolve().parents[1] / "tests" / "cluster" / "nodepool.yaml"))
    pools = gpu_inventory(catalog, nodes, [])
    intent = parse_intent(spec)
    res = Resource("bench", "svc", "uid", 1)
    result = reconcile(intent, res, InferenceServiceStatus(), Observed(pools), catalog, Settings(), now=NOW)
    assert result.status.plan is not None, result.status
    return intent, result.status.plan


def window(rate: float, bursty: bool) -> ObservedWorkload:
    burst = (
        {"arrival_dispersion": 12.0, "burst_window_s": 5.0, "arrivals_in_bursts": 0.4, "burst_requests": 40.0}
        if bursty
        else {}
    )
    return ObservedWorkload(0.0, 600.0, rate, 700.0, 150.0, PROMPTS, OUTPUTS, **burst)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--services", type=int, default=300)
    parser.add_argument("--interval", type=float, default=300.0, help="KVSCALE_CAPACITY_INTERVAL in seconds")
    args = parser.parse_args()
    catalog = default_catalog()
    intent, plan = planned(SPEC)
    print(
        f"plan: {plan.gpu_type} TP{plan.tensor_parallel}, max batch {plan.max_batch}; replay cap {MAX_REPLAY_REQUESTS}"
    )
    print(f"{'routing':8} {'load':>9} {'bursty':>6} {'replayed':>8} {'replicas':>8} {'req/s/replica':>13} "
          f"{'analytic':>8} {'CPU s':>6}")  # fmt: skip
    worst = 0.0
    costs = []
    for gateway in (False, True):
        it = dataclasses.replace(intent, routing=dataclasses.replace(intent.routing, inference_pool=gateway))
        for rate, bursty in ((1.0, False), (5.0, False), (20.0, False), (60.0, False), (150.0, False), (20.0, True)):
            best = math.inf
            for _ in range(REPEATS):
                started = time.thread_time()
                done = measure(it, plan, window(rate, bursty), None, None, catalog, 200, NOW)
                best = min(best, time.thread_time() - started)
            s = done.status
            worst = max(worst, best)
            costs.append(best)
            print(
                f"{'gateway' if gateway else 'service':8} {rate:7g}/s {('yes' if bursty else 'no'):>6} {s.requests:8d} "
                f"{s.replicas or 0:8d} {s.requests_per_second_per_replica:13.3f} {s.analytic:8.3f} {best:6.3f}"
            )
    mean = sum(costs) / len(costs)
    for label, each in (("mean", mean), ("worst", worst)):
        share = args.services * each / args.interval
        print(
            f"{args.services} services every {args.interval:g} s at the {label} case ({each:.3f} s): "
            f"{args.services * each:.0f} CPU s per interval, {share:.0%} of one core"
        )


if __name__ == "__main__":
    main()
