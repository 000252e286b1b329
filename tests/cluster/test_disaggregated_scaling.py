"""A disaggregated InferenceService's two pools scale, each on its own signal (issue 36, part 5),
end to end: the operator deploys the prefill and decode pools; the stand-in's pools
(kvscale.standin.pools, the simulator's P/D run) serve each real pod's vLLM metrics by its
llm-d.ai/role; a real Prometheus scrapes them; the operator's scale tick reads each pool's own
pods and scales each pool's Deployment.

- Phase A, long prompts and short outputs at ~4 prefill workers' worth of requests: the prefill
  pool grows past the plan's count; the decode pool, carrying short decodes, does not.
- Phase B, short prompts and long outputs: the decode pool grows past the plan's count.
- Phase C, a GPUBudget smaller than both pools: they come down within it, split by what they
  serve together, and the budget's status lists each pool.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from kvscale.api import GROUP, LLMD_ROLE, PLURAL, VERSION, selector
from kvscale.api.intent import Intent, read_spec
from kvscale.api.models import parse_status
from kvscale.sim.load_profile import Arrivals
from kvscale.sizing.catalog import default_catalog
from kvscale.standin.exposition import EngineCollector, serve_metrics
from kvscale.standin.pools import PoolsPodFleet, pools_setup
from tests.cluster.harness import Cluster, wait_until
from tests.cluster.processes import Operator
from tests.cluster.prometheus import Prometheus
from tests.cluster.test_disaggregated_deploy import BODY as DEPLOYED
from tests.cluster.test_multinode_operator import deployment
from tests.cluster.test_operator import ROOT, create, get

NAME = "pd-scale"
LIMIT = 6  # H100s the phase-C budget allows both pools
# The deploy test's service (long prompts, a tight TPOT: the pools), room to grow to 6 a pool.
BODY: dict[str, Any] = {
    **DEPLOYED,
    "metadata": {"name": NAME},
    "spec": {**DEPLOYED["spec"], "scaling": {"maxReplicas": 6}},
}


def _pods(api: client.ApiClient, namespace: str) -> dict[str, str | None]:
    """The service's Running engine pods and their roles, as the stand-in's serve loop reads them."""
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector(NAME)).items
    return {
        p.metadata.name: (p.metadata.labels or {}).get(LLMD_ROLE)
        for p in pods
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
    }


def _replicas(api: client.ApiClient, namespace: str, role: str) -> int:
    dep = deployment(api, namespace, f"{NAME}-{role}")
    return int(dep.spec.replicas) if dep is not None else 0


def test_each_pool_scales_on_its_own_signal(
    cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
    objects = client.CustomObjectsApi(api)
    budget = f"pools-{namespace}"
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
                    "KVSCALE_SCALE_INTERVAL": "2s",
                    "KVSCALE_METRICS_WINDOW": "20s",
                    "KVSCALE_CALIBRATION_INTERVAL": "off",
                    "KVSCALE_WORKLOAD_INTERVAL": "3s",
                    "KVSCALE_WORKLOAD_WINDOW": "20s",
                    "KVSCALE_REPLAN_DRIFT": "off",  # the phases' lengths are not the plan's: no re-plan here
                }
            )
            op.start()
            create(api, namespace, BODY)
            wait_until(lambda: get(api, namespace, NAME).get("status", {}).get("plan", {}).get("decode"), 60, "pools")
            status = parse_status(get(api, namespace, NAME)["status"])
            intent = read_spec(BODY["spec"])
            assert status.plan is not None and status.plan.prefill and status.plan.decode
            assert isinstance(intent, Intent)
            planned = {"prefill": status.plan.prefill.replicas, "decode": status.plan.decode.replicas}
            prefill_rate = status.plan.prefill.rate_per_worker

            # Phase A: ~4 prefill workers' worth of 4000-token prompts with 16-token answers.
            phase = {"rate": 4 * prefill_rate}
            arrivals = Arrivals(lambda _t: phase["rate"], 8 * prefill_rate, 4000, 16, seed=3)
            start = time.monotonic()
            standin = PoolsPodFleet(
                pools_setup(default_catalog(), intent, status.plan, 0.0, seed=3),
                arrivals,
                clock=lambda: time.monotonic() - start,
            )
            registry.register(EngineCollector(standin, namespace, "meta-llama/Llama-3.1-8B-Instruct"))

            def advance() -> None:
                synced = 0.0
                while running.is_set():
                    if time.monotonic() - synced > 1.0:
                        standin.sync_pods(_pods(api, namespace))
                        synced = time.monotonic()
                    standin.tick()
                    time.sleep(0.02)

            threading.Thread(target=advance, daemon=True).start()
            wait_until(lambda: _replicas(api, namespace, "prefill") > planned["prefill"], 150, "the prefill pool grown")
            assert _replicas(api, namespace, "decode") <= planned["decode"]
            obj = get(api, namespace, NAME)
            cond = next(c for c in obj["status"]["conditions"] if c["type"] == "PoolsAutoscaled")
            assert (cond["status"], cond["reason"]) == ("True", "EachOnItsSignal"), cond
            assert obj["status"]["plan"]["prefill"]["replicas"] >= _replicas(api, namespace, "prefill") - 1
            events = client.CoreV1Api(api).list_namespaced_event(namespace).items
            assert any(e.reason == "Scaled" and "prefill pool" in (e.message or "") for e in events)
            # The operator's own metrics carry each pool as a service of its own (the dashboards' panels).
            metrics = httpx.get(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=10).text
            desired = {
                sample.labels.get("inferenceservice"): sample.value
                for family in text_string_to_metric_families(metrics)
                if family.name == "kvscale_desired_replicas"
                for sample in family.samples
                if sample.labels.get("namespace") == namespace
            }
            assert {f"{NAME}-prefill", f"{NAME}-decode"} <= set(desired), desired
            # The service's observed workload is the decode pool's: 16-token answers (the prefill
            # pool's engines count each request with one output token).

            def observed() -> dict[str, Any]:
                return dict(get(api, namespace, NAME)["status"].get("observedWorkload") or {})

            def answers_of_16() -> bool:
                w = observed()
                return abs(((w.get("outputTokens") or {}).get("mean") or 0) - 16) <= 2 and bool(
                    w.get("requestsPerSecond")
                )

            try:
                wait_until(answers_of_16, 60, "the decode pool's 16-token answers in status.observedWorkload")
            except TimeoutError as exc:
                raise AssertionError(f"{exc}: {observed()}\n{op.tail()}") from exc
            assert abs(observed()["inputTokens"]["mean"] - 4000) <= 400, observed()

            # Phase B: short prompts, long answers at ~3 decode workers' worth.
            with standin.lock:
                arrivals.lengths = ((standin.now(), 256, 1200),)
                phase["rate"] = 3 * status.plan.decode.rate_per_worker * 300 / 1200
            wait_until(lambda: _replicas(api, namespace, "decode") > planned["decode"], 180, "the decode pool grown")
            cond = next(c for c in get(api, namespace, NAME)["status"]["conditions"] if c["type"] == "PoolsAutoscaled")
            assert "decode" in cond["message"], cond

            # Phase C: a GPUBudget of LIMIT H100s over both pools: they come down within it, split
            # by what they serve together (not in proportion), and the budget lists both.
            budget_body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GPUBudget",
                "metadata": {"name": budget},
                "spec": {"limits": {"H100-SXM": LIMIT}, "selector": {"namespaces": [namespace]}},
            }
            objects.create_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget_body)
            gpus = {"prefill": status.plan.prefill.tensor_parallel, "decode": status.plan.decode.tensor_parallel}

            def within() -> bool:
                used = sum(_replicas(api, namespace, r) * gpus[r] for r in ("prefill", "decode"))
                return used <= LIMIT and all(_replicas(api, namespace, r) >= 1 for r in ("prefill", "decode"))

            wait_until(within, 120, f"both pools within {LIMIT} H100s")
            held = next(c for c in get(api, namespace, NAME)["status"]["conditions"] if c["type"] == "HeldByBudget")
            assert held["status"] == "True" and "not in proportion" in held["message"], held

            def listed() -> bool:
                got = objects.get_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget).get("status", {})
                names = {(s.get("namespace"), s.get("name")) for s in got.get("services", [])}
                return {(namespace, f"{NAME}-prefill"), (namespace, f"{NAME}-decode")} <= names

            wait_until(listed, 30, "the budget's status listing both pools")
            print(
                f"pools: {_replicas(api, namespace, 'prefill')} prefill, {_replicas(api, namespace, 'decode')} decode"
            )
    except BaseException:
        print(op.tail())
        raise
    finally:
        with contextlib.suppress(client.ApiException):  # not created: an earlier phase failed
            objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget)
        running.clear()
        server.shutdown()
        op.stop()
