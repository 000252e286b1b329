"""The stand-in's /metrics: each serving pod's engine metrics, named from the one engine
metric table (the newest name of each), with vLLM's help texts and labels, plus `pod` and
`namespace` as a Prometheus pod scrape would add.

One process plays every pod, yet each pod can be scraped as its own target, as Kubernetes
service discovery gives a real engine pod: `/sd` lists the pods for Prometheus's
`http_sd_configs` (each with the `__meta_kubernetes_*` labels the pod role sets and
`__param_pod`), and `/metrics?pod=NAME` serves that pod's series alone, with vLLM's labels only
(a real engine exports no `pod` or `namespace`: the scrape's target labels add them). So a
monitor's relabelling runs per pod and target labels can win (honor_labels false) without every
pod's series collapsing into one target's identity.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from kvscale.metrics.engines import ENGINES, EngineMetrics
from kvscale.standin.fleet import EngineFleet, PodStats

KV_BLOCK_TOKENS = 16  # vLLM's default block size (the catalog's kv_block_tokens)
ENGINE_INDEX = "0"  # vLLM's `engine` label: the engine core's index within the server


ENGINE_CONTAINER, ENGINE_PORT_NAME = "engine", "http"  # as kvscale.control.resources names them


class EngineCollector(Collector):
    """Collects the fleet's per-pod metrics under an engine's names (newest name of each):
    every pod's, labelled with `pod` and `namespace`, or (`pod` given) that pod's alone with the
    engine's own labels, as the engine itself serves them."""

    def __init__(
        self, fleet: EngineFleet, namespace: str, model_name: str, engine: str = "vllm", pod: str | None = None
    ) -> None:
        self.fleet, self.namespace, self.model_name, self.engine, self.pod = fleet, namespace, model_name, engine, pod
        self.names: EngineMetrics = ENGINES[engine]
        self.labels = [*self.names.labels] if pod is not None else [*self.names.labels, "pod", "namespace"]

    def of_pod(self, pod: str) -> EngineCollector:
        """The same fleet's metrics as pod `pod`'s engine serves them (no `pod`, `namespace`)."""
        return EngineCollector(self.fleet, self.namespace, self.model_name, self.engine, pod)

    def targets(self, address: str) -> list[dict[str, Any]]:
        """Prometheus HTTP service discovery's answer: each Running pod of the fleet as a target
        at `address` (this server), with the labels Kubernetes SD's pod role gives the engine
        container's port (prometheus/discovery/kubernetes/pod.go), and `__param_pod` so the
        scrape asks for that pod's series (https://prometheus.io/docs/prometheus/latest/
        configuration/configuration/#http_sd_config). Kubernetes SD lists a pod whatever its
        readiness; one still in its cold start answers no series, as a real engine's port is
        closed then."""
        with self.fleet.lock:
            pods = sorted(self.fleet.pods)
        return [
            {
                "targets": [address],
                "labels": {
                    "__meta_kubernetes_namespace": self.namespace,
                    "__meta_kubernetes_pod_name": pod,
                    "__meta_kubernetes_pod_container_name": ENGINE_CONTAINER,
                    "__meta_kubernetes_pod_container_port_name": ENGINE_PORT_NAME,
                    "__param_pod": pod,
                },
            }
            for pod in pods
        ]

    def _families(self) -> dict[str, Any]:
        n, labels = self.names, self.labels

        def counter(names: tuple[str, ...], doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(names[0].removesuffix("_total"), doc, labels=labels)

        def histogram(names: tuple[str, ...], doc: str) -> HistogramMetricFamily:
            return HistogramMetricFamily(names[0], doc, labels=labels)

        return {
            "running": GaugeMetricFamily(
                n.running_gauge[0], "Number of requests in model execution batches.", labels=labels
            ),
            "waiting": GaugeMetricFamily(
                n.waiting_gauge[0], "Number of requests waiting to be processed.", labels=labels
            ),
            "kv": GaugeMetricFamily(n.kv_usage_gauge[0], "KV-cache usage. 1 means 100 percent usage.", labels=labels),
            "success": counter(n.success_counter, "Count of successfully processed requests."),
            "prompt_total": counter(n.prompt_tokens_counter, "Number of prefill tokens processed."),
            "generation_total": counter(n.generation_tokens_counter, "Number of generation tokens processed."),
            "preemptions": counter(n.preemptions_counter, "Cumulative number of preemption."),
            "cache_queries": counter(
                n.prefix_cache_queries_counter, "Prefix cache queries, in terms of number of queried tokens."
            ),
            "cache_hits": counter(
                n.prefix_cache_hits_counter, "Prefix cache hits, in terms of number of cached tokens."
            ),
            "ttft": histogram(n.ttft_histogram, "Histogram of time to first token in seconds."),
            "itl": histogram(n.itl_histogram, "Histogram of inter-token latency in seconds."),
            "tpot": histogram(n.tpot_histogram, "Histogram of time_per_output_token_seconds per request."),
            "e2e": histogram(n.e2e_histogram, "Histogram of e2e request latency in seconds."),
            "prompt": histogram(n.prompt_tokens_histogram, "Number of prefill tokens processed."),
            "generation": histogram(n.generation_tokens_histogram, "Number of generation tokens processed."),
            "prefill_time": histogram(
                n.prefill_time_histogram, "Histogram of time spent in PREFILL phase for request."
            ),
            "decode_time": histogram(n.decode_time_histogram, "Histogram of time spent in DECODE phase for request."),
            "iterations": histogram(n.iteration_tokens_histogram, "Histogram of number of tokens per engine_step."),
            # An info metric as vLLM emulates it (a gauge at 1 whose labels are the CacheConfig's
            # fields; the stand-in's: the block size and the blocks its KV capacity makes).
            "cache_config": GaugeMetricFamily(
                n.cache_config_info[0],
                "Information of the LLMEngine CacheConfig",
                labels=["block_size", "num_gpu_blocks", "engine", *labels[len(n.labels) :]],
            ),
        }

    def _add(self, families: dict[str, Any], s: PodStats) -> None:
        values, r = [self.model_name, ENGINE_INDEX], s.replica
        if self.pod is None:
            values += [s.pod, self.namespace]
        families["running"].add_metric(values, len(r.running))
        families["waiting"].add_metric(values, len(r.waiting))
        families["kv"].add_metric(values, r.kv_usage)
        families["success"].add_metric(values, s.success)
        families["prompt_total"].add_metric(values, s.prompt_tokens)
        # vLLM counts generated tokens per engine step (IterationStats), in-flight requests' too.
        families["generation_total"].add_metric(values, r.generated_tokens)
        families["preemptions"].add_metric(values, r.preemptions)
        # The simulator has no prefix cache: every prompt token is looked up, none is found.
        families["cache_queries"].add_metric(values, s.prompt_tokens)
        families["cache_hits"].add_metric(values, 0.0)
        hists = {
            "ttft": s.ttft,
            "itl": self.fleet.inter_token_latency(s),
            "tpot": s.tpot,
            "e2e": s.e2e,
            "prompt": s.prompt,
            "generation": s.generation,
            "prefill_time": s.prefill_time,
            "decode_time": s.decode_time,
            "iterations": self.fleet.iterations(s),
        }
        for key, hist in hists.items():
            families[key].add_metric(values, hist.buckets(), hist.total)
        blocks = r.kv_capacity // KV_BLOCK_TOKENS
        families["cache_config"].add_metric([str(KV_BLOCK_TOKENS), str(blocks), *values[1:]], 1.0)

    def collect(self) -> Iterator[Any]:
        families = self._families()
        with self.fleet.lock:
            for stats in self.fleet.serving():
                if self.pod is None or stats.pod == self.pod:
                    self._add(families, stats)
        yield from families.values()


def serve_metrics(
    registry: CollectorRegistry, port: int, engines: EngineCollector | None = None
) -> ThreadingHTTPServer:
    """/metrics in the format the scraper asks for, as vLLM serves it (prometheus_client's
    content negotiation, vllm/entrypoints/openai/api_server.py `mount_metrics`). So the names a
    Prometheus stores are a real engine's: `vllm:...` where the scrape allows UTF-8 names
    (Prometheus 3), `vllm_...` in samples where it asks for escaped names (OpenMetrics from
    Prometheus 2, or `metric_name_validation_scheme: legacy`). With `engines`, also
    `/metrics?pod=NAME` (that pod's engine alone) and `/sd` (the pods as HTTP SD targets)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            pod = parse_qs(url.query).get("pod", [None])[0]
            if engines is not None and url.path == "/sd":
                address = f"127.0.0.1:{server.server_port}"  # the port bound (0 asks for any)
                self._send(json.dumps(engines.targets(address)).encode(), "application/json")
                return
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            source = registry
            if engines is not None and pod is not None:
                source = CollectorRegistry()
                source.register(engines.of_pod(pod))
            self._send(encoder(source), content_type)

        def _send(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
