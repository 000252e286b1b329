"""CPU cost of the operator's holding tune (status.holding, KVSCALE_HOLDING=tuned, issue 35 part 2).

One tune = kvscale.control.holding.tune_holding on a service's history: 30 minutes of arrivals
counted per 30 s (KVSCALE_HOLDING_HISTORY, KVSCALE_BURST_WINDOW), arrivals synthesized from them
with lengths from the engines' histograms and thinned at random to MAX_HOLDING_REQUESTS, then
five candidate settings replayed through the deployed tick. Timed in thread CPU seconds (the
best of REPEATS: the machine is shared), behind a Service and behind a gateway, at loads from
2 to 150 requests/s, steady and in bursts (a batch of 8 x the mean rate for one 30 s step
every 5 min). The last lines say what 300 services tuning every KVSCALE_CAPACITY_INTERVAL cost
the operator's one search thread (a replay at most every kvscale.control.holding.RETUNE_S).

Run: PYTHONPATH=. .venv/bin/python benchmarks/holding_tune.py [--services 300] [--interval 900]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

from benchmarks.online_capacity import NOW, SPEC, planned, window
from kvscale.control.capacity import acted_on, measure
from kvscale.control.holding import MAX_HOLDING_REQUESTS, RETUNE_S, tune_holding
from kvscale.control.memory import ServiceMemory
from kvscale.control.scaling import prepared
from kvscale.control.settings import Settings
from kvscale.sizing.catalog import default_catalog

REPEATS = 2
STEP_S = 30.0
STEPS = 60  # 30 minutes
CASES = [(rate, False) for rate in (2.0, 4.0, 20.0, 150.0)] + [(rate, True) for rate in (2.0, 4.0, 20.0)]


def history(rate: float, bursty: bool) -> list[float]:
    """Arrivals per step, `rate` on average: steady, or a batch of 8 x the mean every 10 steps."""
    if not bursty:
        return [rate * STEP_S] * STEPS
    batch, every = 8 * rate * STEP_S, 10
    quiet = (rate * STEP_S * every - batch) / (every - 1)
    return [batch if i % every == every - 1 else quiet for i in range(STEPS)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--services", type=int, default=300)
    parser.add_argument("--interval", type=float, default=RETUNE_S, help="seconds between a service's replays")
    args = parser.parse_args()
    catalog = default_catalog()
    settings = Settings()
    intent, plan = planned(SPEC)
    print(f"plan: {plan.gpu_type} TP{plan.tensor_parallel}; replay cap {MAX_HOLDING_REQUESTS} requests x 5 candidates")
    print(f"{'routing':8} {'load':>9} {'bursty':>6} {'replayed':>8} {'runs':>10} {'CPU s':>6}")
    costs = []
    for gateway in (False, True):
        it = dataclasses.replace(intent, routing=dataclasses.replace(intent.routing, inference_pool=gateway))
        model, config, _ = prepared(it, plan, ServiceMemory().scaler, catalog, settings)
        for rate, bursty in CASES:
            confirmed = measure(it, plan, window(rate, bursty), None, None, catalog, 200, NOW).confirmed
            acting = acted_on(model, confirmed, it, plan)
            counts = history(rate, bursty)
            replicas = max(1, math.ceil(rate / acting.rate_per_replica(700.0, 150.0, rate)))
            best = math.inf
            for _ in range(REPEATS):
                started = time.thread_time()
                tuned = tune_holding(
                    it, plan, catalog, config, acting, window(rate, bursty), counts, STEP_S, replicas, None, 200, NOW
                )
                best = min(best, time.thread_time() - started)
            s = tuned.status
            if s.replayed_requests:
                costs.append(best)
            print(
                f"{'gateway' if gateway else 'service':8} {rate:7g}/s {('yes' if bursty else 'no'):>6} "
                f"{s.replayed_requests:8d} {s.settings:>10} {best:6.2f}"
            )
            if s.source != "tuned":
                print(f"{'':28} {s.message}")
            for c in s.candidates:
                print(f"{'':28} {c.name:>10} {c.attainment:.2%} {c.gpu_hours:.2f} GPU-h")
    mean, worst = sum(costs) / len(costs), max(costs)  # the tunes that replayed (the others skip it)
    for label, each in (("mean", mean), ("worst", worst)):
        share = args.services * each / args.interval
        print(
            f"{args.services} services every {args.interval:g} s at the {label} case ({each:.2f} s): "
            f"{args.services * each:.0f} CPU s per interval, {share:.0%} of one core"
        )


if __name__ == "__main__":
    main()
