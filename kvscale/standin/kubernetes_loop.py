"""The stand-in's Kubernetes side: which pods of the InferenceService are Running, and its plan."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.api.models import parse_spec
from kvscale.operator.k8s import api_client
from kvscale.operator.planning import resolve_model, serving_config_from_plan
from kvscale.operator.resources import selector
from kvscale.sim.engine import StepTimes
from kvscale.sim.load_profile import parse_profile
from kvscale.sim.serve import StandIn
from kvscale.sizing.catalog import Catalog

POD_SYNC_S = 1.0
TICK_S = 0.1


def serve_text_metrics(registry: CollectorRegistry, port: int) -> ThreadingHTTPServer:
    """/metrics in the classic text format whatever the scraper asks for: vLLM's names carry
    ':' which prometheus_client's OpenMetrics output renames in samples but not in TYPE lines."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_for_plan(api: client.ApiClient, namespace: str, name: str, timeout_s: float = 300.0) -> dict[str, Any]:
    objects = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        obj = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        if obj.get("status", {}).get("plan"):
            return dict(obj)
        time.sleep(1.0)  # poll until the operator has planned
    raise TimeoutError(f"InferenceService {namespace}/{name} has no plan in status after {timeout_s:.0f}s")


def serve(
    catalog: Catalog,
    namespace: str,
    name: str,
    port: int,
    load: str,
    cold_start_s: float,
    seed: int,
    duration_s: float | None = None,
) -> None:
    api = api_client()
    obj = wait_for_plan(api, namespace, name)
    spec = parse_spec(obj["spec"])
    plan = obj["status"]["plan"]
    model = resolve_model(spec, catalog)
    cfg = serving_config_from_plan(spec, plan, catalog)
    arrivals = parse_profile(load, spec.workload.input_tokens, spec.workload.output_tokens, seed)
    standin = StandIn(
        namespace,
        spec.model.name or model.name,
        StepTimes(cfg),
        int(plan["maxBatch"]),
        cfg.memory.kv_capacity_tokens,
        cfg.max_num_batched_tokens,
        cold_start_s,
        arrivals,
    )
    registry = CollectorRegistry()
    registry.register(standin)
    serve_text_metrics(registry, port)
    core = client.CoreV1Api(api)
    last_sync = -POD_SYNC_S
    started = time.monotonic()
    while duration_s is None or time.monotonic() - started < duration_s:
        if time.monotonic() - last_sync >= POD_SYNC_S:
            pods = core.list_namespaced_pod(namespace, label_selector=selector(name)).items
            standin.sync_pods(
                [p.metadata.name for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
            )
            last_sync = time.monotonic()
        standin.tick()
        time.sleep(TICK_S)  # real-time pacing of the simulated engines
