"""The stand-in's loop: wait for the InferenceService's plan, then follow its Running pods
(by the labels kvscale.api defines) and advance their simulated engines in real time."""

from __future__ import annotations

import sys
import time
from typing import Any

from kubernetes import client, config
from prometheus_client.registry import CollectorRegistry

from kvscale.api import GROUP, LLMD_ROLE, PLURAL, VERSION, selector
from kvscale.api.intent import parse_intent, resolve_model, serving_config
from kvscale.api.models import PlanStatus
from kvscale.sim.engine import StepTimes
from kvscale.sim.fleet import FleetSpec
from kvscale.sim.load_profile import load_arrivals
from kvscale.sizing.catalog import Catalog
from kvscale.standin.exposition import EngineCollector, serve_metrics
from kvscale.standin.fleet import PodFleet
from kvscale.standin.pools import PoolsPodFleet, pools_setup

POD_SYNC_S = 1.0
TICK_S = 0.1


def api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def wait_for_plan(api: client.ApiClient, namespace: str, name: str, timeout_s: float = 300.0) -> dict[str, Any]:
    objects = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        obj = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        if obj.get("status", {}).get("plan"):
            return dict(obj)
        time.sleep(1.0)  # poll until the operator has planned
    raise TimeoutError(f"InferenceService {namespace}/{name} has no plan in status after {timeout_s:.0f}s")


def pod_fleet(
    catalog: Catalog, obj: dict[str, Any], load: str, cold_start_s: float, seed: int, speed: float = 1.0
) -> tuple[PodFleet | PoolsPodFleet, str]:
    """The fleet the planned configuration describes, and the model name its metrics carry. Its
    engines' clock runs `speed` simulated seconds per wall-clock second (the load's times, the
    cold start and the step times are simulated seconds). A disaggregated plan's is its prefill
    and decode pools (kvscale.standin.pools), each pod in its role's."""
    intent = parse_intent(obj["spec"])
    plan = PlanStatus.model_validate(obj["status"]["plan"])
    arrivals = load_arrivals(load, intent.workload.input_tokens, intent.workload.output_tokens, seed)
    model_name = intent.spec.model.name or resolve_model(intent, catalog).name
    if plan.mode == "disaggregated":
        setup = pools_setup(catalog, intent, plan, cold_start_s, seed)
        return PoolsPodFleet(setup, arrivals, lambda: speed * time.monotonic()), model_name
    cfg = serving_config(intent, plan, catalog)
    spec = FleetSpec(plan.max_batch, cfg.memory.kv_capacity_tokens, cfg.max_num_batched_tokens, cfg.gpus, cold_start_s)
    return PodFleet(spec, StepTimes(cfg), arrivals, lambda: speed * time.monotonic()), model_name


def serve(
    catalog: Catalog,
    namespace: str,
    name: str,
    port: int,
    load: str,
    cold_start_s: float,
    seed: int,
    duration_s: float | None = None,
    speed: float = 1.0,
) -> None:
    api = api_client()
    fleet, model_name = pod_fleet(catalog, wait_for_plan(api, namespace, name), load, cold_start_s, seed, speed)
    registry = CollectorRegistry()
    engines = EngineCollector(fleet, namespace, model_name)
    registry.register(engines)
    serve_metrics(registry, port, engines)
    # Say what is served where: the first thing a person starting it wants to check.
    print(
        f"kvscale sim serve: vLLM metrics ({model_name!r}, load {load}, cold start {cold_start_s:g}s) for the "
        f"Running pods of InferenceService {namespace}/{name} at http://127.0.0.1:{port}/metrics "
        + (f"({speed:g} simulated seconds per second) " if speed != 1.0 else "")
        + "(one pod's: /metrics?pod=NAME; the pods as Prometheus HTTP SD targets: /sd)",
        file=sys.stderr,
        flush=True,
    )
    core = client.CoreV1Api(api)
    last_sync = -POD_SYNC_S
    started = time.monotonic()
    while duration_s is None or time.monotonic() - started < duration_s:
        if time.monotonic() - last_sync >= POD_SYNC_S:
            pods = core.list_namespaced_pod(namespace, label_selector=selector(name)).items
            # Each Running pod with its llm-d.ai/role (PodFleet reads the names alone).
            fleet.sync_pods(
                {
                    p.metadata.name: (p.metadata.labels or {}).get(LLMD_ROLE)
                    for p in pods
                    if p.status.phase == "Running" and not p.metadata.deletion_timestamp
                }
            )
            last_sync = time.monotonic()
        fleet.tick()
        time.sleep(TICK_S)  # real-time pacing of the simulated engines
