"""The stand-in without a cluster: pods become replicas of the simulator's fleet, and the
metrics it exposes carry the names the operator's queries read (one table)."""

from __future__ import annotations

import httpx
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from kvscale.api.intent import parse_intent, serving_config
from kvscale.api.models import PlanStatus
from kvscale.metrics.engines import ENGINES
from kvscale.metrics.promql import queries
from kvscale.sim.engine import StepTimes
from kvscale.sim.fleet import FleetSpec
from kvscale.sim.load_profile import parse_profile
from kvscale.sizing.catalog import default_catalog
from kvscale.standin.exposition import EngineCollector, serve_metrics
from kvscale.standin.fleet import PodFleet

CAT = default_catalog()
SPEC = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 256, "outputTokens": 32, "requestsPerSecond": 2},
    "slo": {"timeToFirstToken": "1s", "timePerOutputToken": "100ms"},
}
PLAN = {"gpuType": "A100-80GB", "gpuProduct": "x", "tensorParallel": 1, "precision": "bf16", "maxBatch": 16,
        "maxContextTokens": 288, "replicas": 1, "predictedTtft": "100ms", "predictedTpot": "20ms",
        "throughputTokensPerSecond": 1.0, "ratePerReplica": 1.0, "limitedBy": "bandwidth", "mbu": 0.5,
        "mfu": 0.1, "costPerHour": 2.0, "reason": "r"}  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def fleet(clock: Clock) -> PodFleet:
    intent = parse_intent(SPEC)
    cfg = serving_config(intent, PlanStatus.model_validate(PLAN), CAT)
    spec = FleetSpec(16, cfg.memory.kv_capacity_tokens, cfg.max_num_batched_tokens, cfg.gpus, 2.0)
    return PodFleet(spec, StepTimes(cfg), parse_profile("constant:4", 256, 32, seed=1), clock)


def test_pods_serve_after_their_cold_start_and_leave_with_their_pod() -> None:
    clock = Clock()
    f = fleet(clock)
    f.sync_pods(["a", "b"])
    assert f.serving() == []
    for _ in range(100):
        clock.t += 0.1
        f.tick()
    assert sorted(s.pod for s in f.serving()) == ["a", "b"]
    done = sum(s.success for s in f.pods.values())
    assert 20 <= done <= 40, done  # 4 req/s for 8 s of serving, less what is in flight
    assert all(s.success > 0 for s in f.pods.values()), "least-loaded routing uses both pods"
    f.sync_pods(["b"])
    assert [s.pod for s in f.serving()] == ["b"]


def test_exposed_names_are_the_ones_the_queries_read() -> None:
    clock = Clock()
    f = fleet(clock)
    f.sync_pods(["chat-5d9c-x1"])
    for _ in range(60):
        clock.t += 0.1
        f.tick()
    registry = CollectorRegistry()
    registry.register(EngineCollector(f, "ns", "llama-3.1-8b"))
    text = generate_latest(registry).decode()
    vllm = ENGINES["vllm"]
    for name in (vllm.ttft_histogram[0] + "_bucket", vllm.tpot_histogram[0] + "_bucket", vllm.itl_histogram[0] + "_bucket", vllm.running_gauge[0],
                 vllm.waiting_gauge[0], vllm.kv_usage_gauge[0], vllm.success_counter[0],
                 vllm.prompt_tokens_histogram[0] + "_sum", vllm.generation_tokens_histogram[0] + "_count"):  # fmt: skip
        assert f"\n{name}{{" in text, name
        assert any(name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") in q
                   for q in queries(vllm, "ns", "chat", 0.95, "1m").values()), name  # fmt: skip
    assert 'pod="chat-5d9c-x1"' in text and 'namespace="ns"' in text


def test_each_pod_is_a_target_of_its_own_as_kubernetes_discovery_gives_it() -> None:
    # Prometheus's http_sd_configs reads /sd; each target's __param_pod makes its scrape ask
    # /metrics?pod=NAME, which serves that pod's series with vLLM's labels only (a real engine
    # exports no pod or namespace: the scrape's target labels add them, and win).
    clock = Clock()
    f = fleet(clock)
    f.sync_pods(["chat-5d9c-x1", "chat-5d9c-x2"])
    for _ in range(60):
        clock.t += 0.1
        f.tick()
    engines = EngineCollector(f, "t2", "llama-3.1-8b")
    registry = CollectorRegistry()
    registry.register(engines)
    server = serve_metrics(registry, 0, engines)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        targets = httpx.get(f"{base}/sd", timeout=5).json()
        assert [t["labels"]["__param_pod"] for t in targets] == ["chat-5d9c-x1", "chat-5d9c-x2"]
        for t in targets:
            assert t["targets"] == [base.removeprefix("http://")]
            assert t["labels"]["__meta_kubernetes_namespace"] == "t2"
            assert t["labels"]["__meta_kubernetes_pod_name"] == t["labels"]["__param_pod"]
            assert t["labels"]["__meta_kubernetes_pod_container_name"] == "engine"
            assert t["labels"]["__meta_kubernetes_pod_container_port_name"] == "http"
        one = httpx.get(f"{base}/metrics", params={"pod": "chat-5d9c-x2"}, timeout=5).text
        running = [line for line in one.splitlines() if line.startswith("vllm:num_requests_running")]
        assert running == [f'vllm:num_requests_running{{engine="0",model_name="llama-3.1-8b"}} {_running(f, 1)}']
        assert "pod=" not in one and "namespace=" not in one and "chat-5d9c-x1" not in one
        assert "vllm:time_to_first_token_seconds_bucket{" in one
        # The unfiltered /metrics (plain static scrapes) still has every pod, labelled.
        every = httpx.get(f"{base}/metrics", timeout=5).text
        assert 'pod="chat-5d9c-x1"' in every and 'pod="chat-5d9c-x2"' in every and 'namespace="t2"' in every
        assert (
            httpx.get(f"{base}/metrics", params={"pod": "gone"}, timeout=5).text.count("vllm:num_requests_running{")
            == 0
        )
    finally:
        server.shutdown()


def _running(f: PodFleet, index: int) -> str:
    stats = sorted(f.serving(), key=lambda s: s.pod)[index]
    return f"{float(len(stats.replica.running))}"
