"""The stand-in's /metrics: each serving pod's engine metrics, named from the one engine
metric table (the newest name of each), with vLLM's help texts and labels, plus `pod` and
`namespace` as a Prometheus pod scrape would add."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from kvscale.metrics.engines import ENGINES, EngineMetrics
from kvscale.standin.fleet import PodFleet, PodStats

ENGINE_INDEX = "0"  # vLLM's `engine` label: the engine core's index within the server


class EngineCollector(Collector):
    """Collects the fleet's per-pod metrics under an engine's names (newest name of each)."""

    def __init__(self, fleet: PodFleet, namespace: str, model_name: str, engine: str = "vllm") -> None:
        self.fleet, self.namespace, self.model_name = fleet, namespace, model_name
        self.names: EngineMetrics = ENGINES[engine]
        self.labels = [*self.names.labels, "pod", "namespace"]

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
        }

    def _add(self, families: dict[str, Any], s: PodStats) -> None:
        values, r = [self.model_name, ENGINE_INDEX, s.pod, self.namespace], s.replica
        families["running"].add_metric(values, len(r.running))
        families["waiting"].add_metric(values, len(r.waiting))
        families["kv"].add_metric(values, r.kv_usage)
        families["success"].add_metric(values, s.success)
        families["prompt_total"].add_metric(values, s.prompt_tokens)
        families["generation_total"].add_metric(values, s.generation_tokens)
        families["preemptions"].add_metric(values, r.preemptions)
        # The simulator has no prefix cache: every prompt token is looked up, none is found.
        families["cache_queries"].add_metric(values, s.prompt_tokens)
        families["cache_hits"].add_metric(values, 0.0)
        hists = {
            "ttft": s.ttft,
            "itl": s.itl,
            "tpot": s.tpot,
            "e2e": s.e2e,
            "prompt": s.prompt,
            "generation": s.generation,
        }
        for key, hist in hists.items():
            families[key].add_metric(values, hist.buckets(), hist.total)

    def collect(self) -> Iterator[Any]:
        families = self._families()
        with self.fleet.lock:
            for stats in self.fleet.serving():
                self._add(families, stats)
        yield from families.values()


def serve_metrics(registry: CollectorRegistry, port: int) -> ThreadingHTTPServer:
    """/metrics in the format the scraper asks for, as vLLM serves it (prometheus_client's
    content negotiation, vllm/entrypoints/openai/api_server.py `mount_metrics`). So the names a
    Prometheus stores are a real engine's: `vllm:...` where the scrape allows UTF-8 names
    (Prometheus 3), `vllm_...` in samples where it asks for escaped names (OpenMetrics from
    Prometheus 2, or `metric_name_validation_scheme: legacy`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            body = encoder(registry)
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
