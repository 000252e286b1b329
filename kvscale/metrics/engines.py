"""Engine metric names, labels and histogram buckets: vLLM, SGLang and TGI mapped to one
vocabulary. One table for both sides: the reader (PromQL) and the stand-in that produces
vLLM's metrics in test clusters.

Checked against the engines' source:
- vLLM 0.11.0 vllm/v1/metrics/loggers.py (PrometheusStatLogger): labels model_name and
  engine; histogram buckets below; vllm:request_time_per_output_token_seconds is observed
  once per request (its mean time per output token: what TPOT means in an SLO),
  vllm:inter_token_latency_seconds once per token gap (its tail carries prefill stalls).
  vLLM 0.33.0 keeps the names and the buckets (vllm/v1/metrics/buckets.py) and drops
  vllm:time_per_output_token_seconds and vllm:gpu_cache_usage_perc.
  Work counters (prometheus_client adds `_total` to a Counter's name): vllm:prompt_tokens
  counts every prompt token once, when its request's prefill completes (stats.py
  IterationStats.update_from_output: num_prompt_tokens += prompt_len), cached or not;
  vllm:generation_tokens every generated token. vllm:prefix_cache_queries / _hits count
  tokens looked up in the prefix cache and found there (v1/core/kv_cache_manager.py
  get_computed_blocks: queries += request.num_tokens, hits += num_new_computed_tokens; a
  request that waits is looked up again each step it is tried, so both grow together and
  only their ratio means something). vllm:gpu_prefix_cache_* are the pre-0.9.2 names,
  shown in 0.11 only with --show-hidden-metrics-for-version=0.10. Length histograms
  vllm:request_prompt_tokens / vllm:request_generation_tokens are observed once per
  finished request, buckets 1, 2, 5, 10, ... up to max_model_len.
  What calibration reads (same file; per-request phases from vllm/v1/metrics/stats.py
  update_from_finished_request, observed once per finished request):
  vllm:request_prefill_time_seconds = first token less scheduled (a preempted request keeps
  its first scheduling), vllm:request_decode_time_seconds = last token less first token
  (request latency buckets); vllm:iteration_tokens_total is a histogram (its series are
  `_bucket`, `_sum`, `_count`), one observation per engine step of the step's prompt tokens
  (a prompt counted whole in the step that completes its prefill) plus generated tokens,
  buckets 1, 8, 16, ... 16384; vllm:cache_config_info is a gauge fixed at 1 whose labels are
  the CacheConfig's fields (num_gpu_blocks, block_size among them).
- SGLang 0.5.23 sglang/srt/observability/metrics_collector.py: exported only with
  --enable-metrics; sglang:request_time_per_output_token_seconds is per request;
  token histograms are sglang:prompt_tokens_histogram / sglang:generation_tokens_histogram.
  observe_one_finished_request counts sglang:prompt_tokens_total and
  sglang:generation_tokens_total per finished request (label is_streaming), and the prompt
  tokens served from the prefix cache in sglang:cached_tokens_total (label cache_source:
  device/host/storage, or total; summed here): every prompt token is looked up, so the
  hit ratio is cached over prompt tokens. SGLang 0.5.3 sglang/srt/metrics/collector.py has
  the same five names.
- TGI 3.3.7 (per kvscale DESIGN.md; TGI is not on PyPI and its router is not on crates.io,
  so this table was not checked against TGI's source): tgi_request_queue_duration is queue
  time only, so TGI has no TTFT histogram: kvscale reports TTFT as unavailable rather than a
  number that reads low by the whole prefill. tgi_request_mean_time_per_token_duration is
  per request. No token counters and no prefix-cache counter are known for TGI: its token
  rates are read from the length histograms' sums (finished requests only) and its prefill
  work counts every prompt token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# vllm/v1/metrics/loggers.py (0.11.0) = vllm/v1/metrics/buckets.py (0.33.0)
VLLM_TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
# vllm:inter_token_latency_seconds and vllm:request_time_per_output_token_seconds
VLLM_TPOT_BUCKETS_S: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
# vllm:e2e_request_latency_seconds, request_queue_time_seconds and the other phase histograms
VLLM_REQUEST_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
VLLM_ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
VLLM_LABELS = ("model_name", "engine")


@dataclass(frozen=True)
class EngineMetrics:
    """Each entry lists metric names to try in order (newest first); empty: the engine has none."""

    ttft_histogram: tuple[str, ...]
    tpot_histogram: tuple[str, ...]  # per request: what the plan predicts and the SLO means
    itl_histogram: tuple[str, ...]  # per token gap: the fallback for TPOT, its tail heavier
    running_gauge: tuple[str, ...]
    waiting_gauge: tuple[str, ...]
    kv_usage_gauge: tuple[str, ...]
    success_counter: tuple[str, ...]
    prompt_tokens_histogram: tuple[str, ...]
    generation_tokens_histogram: tuple[str, ...]
    labels: tuple[str, ...] = ()
    buckets_s: dict[str, tuple[float, ...]] = field(default_factory=dict)
    ttft_unavailable_reason: str | None = None
    # Work counters, with their `_total`: prompt and generated tokens, and the prefix cache's
    # token lookups and hits. No queries counter: every prompt token is looked up (SGLang).
    prompt_tokens_counter: tuple[str, ...] = ()
    generation_tokens_counter: tuple[str, ...] = ()
    prefix_cache_queries_counter: tuple[str, ...] = ()
    prefix_cache_hits_counter: tuple[str, ...] = ()
    # Read by no query today, exposed by the stand-in:
    e2e_histogram: tuple[str, ...] = ()
    preemptions_counter: tuple[str, ...] = ()
    # Read by calibration (kvscale.metrics.calibration): the phases of a request, the engine
    # steps, and the KV cache's size.
    prefill_time_histogram: tuple[str, ...] = ()
    decode_time_histogram: tuple[str, ...] = ()
    iteration_tokens_histogram: tuple[str, ...] = ()
    cache_config_info: tuple[str, ...] = ()

    def tpot_source(self, per_request_present: bool) -> str:
        """What a TPOT quantile was read from, for status."""
        if per_request_present or not self.itl_histogram:
            return "per-request TPOT"
        return "inter-token latency (no per-request TPOT histogram: its tail includes prefill stalls)"


ENGINES: dict[str, EngineMetrics] = {
    "vllm": EngineMetrics(
        ttft_histogram=("vllm:time_to_first_token_seconds",),
        tpot_histogram=("vllm:request_time_per_output_token_seconds",),
        itl_histogram=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        running_gauge=("vllm:num_requests_running",),
        waiting_gauge=("vllm:num_requests_waiting",),
        kv_usage_gauge=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        success_counter=("vllm:request_success_total",),
        prompt_tokens_histogram=("vllm:request_prompt_tokens",),
        generation_tokens_histogram=("vllm:request_generation_tokens",),
        labels=VLLM_LABELS,
        e2e_histogram=("vllm:e2e_request_latency_seconds",),
        prompt_tokens_counter=("vllm:prompt_tokens_total",),
        generation_tokens_counter=("vllm:generation_tokens_total",),
        prefix_cache_queries_counter=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        prefix_cache_hits_counter=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        preemptions_counter=("vllm:num_preemptions_total",),
        prefill_time_histogram=("vllm:request_prefill_time_seconds",),
        decode_time_histogram=("vllm:request_decode_time_seconds",),
        iteration_tokens_histogram=("vllm:iteration_tokens_total",),
        cache_config_info=("vllm:cache_config_info",),
        buckets_s={
            "vllm:time_to_first_token_seconds": VLLM_TTFT_BUCKETS_S,
            "vllm:request_time_per_output_token_seconds": VLLM_TPOT_BUCKETS_S,
            "vllm:inter_token_latency_seconds": VLLM_TPOT_BUCKETS_S,
            "vllm:e2e_request_latency_seconds": VLLM_REQUEST_LATENCY_BUCKETS_S,
            "vllm:request_queue_time_seconds": VLLM_REQUEST_LATENCY_BUCKETS_S,
            "vllm:request_prefill_time_seconds": VLLM_REQUEST_LATENCY_BUCKETS_S,
            "vllm:request_decode_time_seconds": VLLM_REQUEST_LATENCY_BUCKETS_S,
            "vllm:iteration_tokens_total": VLLM_ITERATION_TOKENS_BUCKETS,
        },
    ),
    "sglang": EngineMetrics(
        ttft_histogram=("sglang:time_to_first_token_seconds",),
        tpot_histogram=("sglang:request_time_per_output_token_seconds",),
        itl_histogram=("sglang:inter_token_latency_seconds",),
        running_gauge=("sglang:num_running_reqs",),
        waiting_gauge=("sglang:num_queue_reqs",),
        kv_usage_gauge=("sglang:token_usage",),
        success_counter=("sglang:num_requests_total",),
        prompt_tokens_histogram=("sglang:prompt_tokens_histogram",),
        generation_tokens_histogram=("sglang:generation_tokens_histogram",),
        prompt_tokens_counter=("sglang:prompt_tokens_total",),
        generation_tokens_counter=("sglang:generation_tokens_total",),
        prefix_cache_hits_counter=("sglang:cached_tokens_total",),
        labels=("model_name",),
    ),
    "tgi": EngineMetrics(
        ttft_histogram=(),
        tpot_histogram=("tgi_request_mean_time_per_token_duration",),
        itl_histogram=(),
        running_gauge=("tgi_batch_current_size",),
        waiting_gauge=("tgi_queue_size",),
        kv_usage_gauge=(),
        success_counter=("tgi_request_success",),
        prompt_tokens_histogram=("tgi_request_input_length",),
        generation_tokens_histogram=("tgi_request_generated_tokens",),
        ttft_unavailable_reason=(
            "TGI exports no TTFT histogram (tgi_request_queue_duration is queue time only, without the prefill)"
        ),
    ),
}
