"""status.capacity end to end (issue 35, part 1): two stand-in engines on the catalog's own
profile (so a replica's true capacity is the simulator's) serve vLLM's metrics for an
InferenceService's pods, a real Prometheus scrapes them, the operator runs its capacity timer
every few seconds. Before traffic status.capacity is the model's figure (source analytic);
under steady Poisson traffic (played SPEED times faster than the wall clock) its simulated
figure, on at least KVSCALE_CAPACITY_MIN_REQUESTS observed requests, lands within 15% of the
stand-in replica's true capacity, closer than the model's figure (and is acted on where above
it): the highest Poisson rate one replica serves within
the SLO percentile at the load's lengths, found here by bisection on the simulator.

The operator runs with KVSCALE_HOLDING=tuned (issue 35, part 2) over a one-minute history: before
traffic status.holding says the trailing rule runs (no history); once half the history holds
traffic, the same worker replays it with the five candidate settings and status.holding shows
the choice, on how many requests, why, and each candidate's replayed attainment and GPU-hours."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry

from kvscale.api.intent import Intent, read_spec, serving_config
from kvscale.api.models import parse_status
from kvscale.sim.check import service_attainment
from kvscale.sim.engine import StepTimes
from kvscale.sim.fleet import FleetSpec
from kvscale.sim.load_profile import parse_profile
from kvscale.sim.run import SimSetup
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.standin.exposition import EngineCollector, serve_metrics
from kvscale.standin.fleet import PodFleet
from tests.cluster.harness import Cluster, wait_until
from tests.cluster.processes import Operator
from tests.cluster.prometheus import Prometheus
from tests.cluster.test_operator import ROOT, create, get

SPEED = 5.0  # simulated seconds per wall-clock second
# Requests/s (simulated) over the two stand-in pods: the operator reads SPEED x RATE = 12/s of
# wall-clock time, about one replica's worth (13/s), so its replay of the 1-minute window runs
# ~700 requests over a minute (the stand-in's clock runs SPEED x faster than the window's: a
# busier load would replay the window's minute as SPEED minutes of engine time compressed).
RATE = 2.4
INPUT, OUTPUT = 512, 256
NAME = "capacity"
BODY: dict[str, Any] = {
    "apiVersion": "kvscale.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": NAME},
    "spec": {
        "model": {"name": "llama-3.1-8b"},
        "workload": {"inputTokens": INPUT, "outputTokens": OUTPUT, "requestsPerSecond": RATE},
        "slo": {"timeToFirstToken": "1s", "timePerOutputToken": "50ms"},
        "hardware": {"gpuTypes": ["H100-SXM"], "maxTensorParallel": 1},
    },
}


def _capacity(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    return dict(get(api, namespace, NAME).get("status", {}).get("capacity") or {})


def _holding(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    return dict(get(api, namespace, NAME).get("status", {}).get("holding") or {})


def true_capacity(setup: SimSetup, steps: StepTimes, requests: int = 1500) -> float:
    """The highest Poisson rate (fixed lengths, the load's) one replica serves within the SLO
    percentile, bisected to 2%."""

    def meets(rate: float) -> bool:
        rng, t, arrivals = random.Random(11), 0.0, []
        for _ in range(requests):
            t += rng.expovariate(rate)
            arrivals.append(TraceRequest(t, INPUT, OUTPUT))
        return service_attainment(setup, arrivals, 1, steps) >= setup.slo.percentile / 100

    lo, hi = 0.25, 0.5
    while meets(hi):
        lo, hi = hi, 2 * hi
    while hi / lo > 1.02:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo


def test_status_capacity_moves_from_the_model_to_the_stand_ins_true_capacity(
    cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/inferenceservices.kvscale.io", "--timeout=60s")
    catalog = default_catalog()
    registry = CollectorRegistry()
    running = threading.Event()
    running.set()
    op = Operator(cluster, tmp_path)
    # Bound now, on a port the kernel picks: a port chosen here and bound only once the stand-in
    # starts (minutes later) was taken meanwhile by another process in a CI run (EADDRINUSE). Until
    # the stand-in's collector is registered it serves an empty page.
    server = serve_metrics(registry, 0)
    port = server.server_address[1]
    try:
        with Prometheus(tmp_path / "prom", targets=[f"127.0.0.1:{port}"]) as prom:
            op.env.update(
                {
                    "KVSCALE_PROMETHEUS_URL": prom.url,
                    "KVSCALE_CALIBRATION_INTERVAL": "off",  # the stand-in runs the catalog's profile
                    "KVSCALE_CAPACITY_INTERVAL": "4s",
                    "KVSCALE_WORKLOAD_INTERVAL": "4s",
                    "KVSCALE_WORKLOAD_WINDOW": "1m",
                    "KVSCALE_BURST_WINDOW": "5s",
                    "KVSCALE_HOLDING": "tuned",
                    "KVSCALE_HOLDING_HISTORY": "1m",
                }
            )
            op.start()
            create(api, namespace, BODY)
            wait_until(lambda: get(api, namespace, NAME).get("status", {}).get("plan"), 60, "a plan")
            status = parse_status(get(api, namespace, NAME)["status"])
            intent = read_spec(BODY["spec"])
            assert status.plan is not None and isinstance(intent, Intent)
            plan = status.plan
            cfg = serving_config(intent, plan, catalog)
            steps = StepTimes(cfg)

            # Before traffic: the model's figure, said so
            wait_until(lambda: _capacity(api, namespace).get("source") == "analytic", 60, "an analytic capacity")
            before = _capacity(api, namespace)
            assert before["requestsPerSecondPerReplica"] == before["analytic"] > 0, before
            assert before.get("requests", 0) == 0 and "not read" in before["message"], before
            # no history yet: the trailing rule runs, and status.holding says so
            wait_until(lambda: _holding(api, namespace).get("source") == "beforeHistory", 60, "status.holding")
            untuned = _holding(api, namespace)
            assert untuned["settings"] == "trailing" and untuned["trailingMargin"] == 1.3, untuned
            assert "until there is history to replay" in untuned["message"], untuned

            clock = {"t": 0.0}
            standin = PodFleet(
                FleetSpec(plan.max_batch, cfg.memory.kv_capacity_tokens, cfg.max_num_batched_tokens, cfg.gpus, 0.0),
                steps,
                parse_profile(f"constant:{RATE:g}", INPUT, OUTPUT, seed=5),
                clock=lambda: clock["t"],
            )
            standin.sync_pods([f"{NAME}-abc12-x1y2z", f"{NAME}-abc12-q8r9s"])
            registry.register(EngineCollector(standin, namespace, "meta-llama/Llama-3.1-8B-Instruct"))

            def advance() -> None:
                start = time.monotonic()
                while running.is_set():
                    clock["t"] = SPEED * (time.monotonic() - start)
                    standin.tick()
                    time.sleep(0.02)

            threading.Thread(target=advance, daemon=True).start()
            started = time.time()

            def simulated() -> bool:
                seen = _capacity(api, namespace)
                when = seen.get("measuredAt")
                return bool(
                    seen.get("simulated") is not None
                    and when
                    and dt.datetime.fromisoformat(when).timestamp() > started + 60  # a full window of traffic
                )

            wait_until(simulated, 150, "a simulated capacity after a minute of traffic", 0.5)
            wait_until(lambda: _holding(api, namespace).get("source") == "tuned", 60, "a tuned status.holding", 0.5)
            holding = _holding(api, namespace)
            events = client.CoreV1Api(api).list_namespaced_event(namespace).items
            tuned_events = [e.message for e in events if e.reason == "HoldingTuned"]
    except BaseException:
        print(op.tail())
        raise
    finally:
        running.clear()
        server.shutdown()
        op.stop()
    print(f"status.holding {holding}; Events {tuned_events}")
    assert holding["requests"] >= 200 and holding["replayedRequests"] >= 200, holding
    assert [c["name"] for c in holding["candidates"]] == ["configured", "lean", "thin", "reserve", "trailing"]
    assert holding["settings"] in {c["name"] for c in holding["candidates"]}, holding
    assert "on the replayed past" in holding["message"] and holding["chosenAt"], holding
    # an Event when the settings changed from the trailing rule that ran before the history
    assert bool(tuned_events) == (holding["settings"] != "trailing"), (holding, tuned_events)
    after = _capacity(api, namespace)
    assert after["requests"] >= 200 and after["replicas"] >= 1, after
    assert after["analytic"] > 0, after
    truth = true_capacity(SimSetup(cfg, intent.slo, plan.max_batch, 0.0, 1), steps)
    print(f"status.capacity {after}; true capacity {truth:.3f} req/s")
    # 13.9 against 13.2 req/s in the first runs (the model's 15.4: 17% off); the synthesized
    # lengths are drawn within the engines' histogram buckets, the truth's are the load's own
    error = abs(after["simulated"] / truth - 1)
    assert error < 0.15, (after, truth)
    assert error < abs(after["analytic"] / truth - 1), (after, truth)
    # what the policy acts on: the confirmed figure where it raises the model's, the model's otherwise
    acts = after["simulated"] > after["analytic"]
    assert after["source"] == ("simulated" if acts else "analytic"), after
    assert after["requestsPerSecondPerReplica"] == (after["simulated"] if acts else after["analytic"]), after
