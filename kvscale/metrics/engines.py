"""Engine metric names: vLLM (current and older names), SGLang and TGI, mapped to one vocabulary."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineMetrics:
    """Each entry lists metric names to try in order (newest first); None: the engine has none."""

    ttft_histogram: tuple[str, ...]
    tpot_histogram: tuple[str, ...]
    running_gauge: tuple[str, ...]
    waiting_gauge: tuple[str, ...]
    kv_usage_gauge: tuple[str, ...]
    success_counter: tuple[str, ...]
    prompt_tokens_histogram: tuple[str, ...]
    generation_tokens_histogram: tuple[str, ...]


ENGINES: dict[str, EngineMetrics] = {
    "vllm": EngineMetrics(
        ttft_histogram=("vllm:time_to_first_token_seconds",),
        tpot_histogram=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        running_gauge=("vllm:num_requests_running",),
        waiting_gauge=("vllm:num_requests_waiting",),
        kv_usage_gauge=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        success_counter=("vllm:request_success_total",),
        prompt_tokens_histogram=("vllm:request_prompt_tokens",),
        generation_tokens_histogram=("vllm:request_generation_tokens",),
    ),
    "sglang": EngineMetrics(
        ttft_histogram=("sglang:time_to_first_token_seconds",),
        tpot_histogram=("sglang:inter_token_latency_seconds",),
        running_gauge=("sglang:num_running_reqs",),
        waiting_gauge=("sglang:num_queue_reqs",),
        kv_usage_gauge=("sglang:token_usage",),
        success_counter=("sglang:num_requests_total",),
        prompt_tokens_histogram=("sglang:prompt_tokens",),
        generation_tokens_histogram=("sglang:generation_tokens",),
    ),
    "tgi": EngineMetrics(
        ttft_histogram=("tgi_request_queue_duration",),
        tpot_histogram=("tgi_request_mean_time_per_token_duration",),
        running_gauge=("tgi_batch_current_size",),
        waiting_gauge=("tgi_queue_size",),
        kv_usage_gauge=(),
        success_counter=("tgi_request_success",),
        prompt_tokens_histogram=("tgi_request_input_length",),
        generation_tokens_histogram=("tgi_request_generated_tokens",),
    ),
}
