"""PromQL builders: one InferenceService's pods, escaped labels, older metric names."""

from kvscale.metrics.engines import ENGINES
from kvscale.metrics.promql import escape_label_value, pod_selector, queries


def test_label_values_are_escaped() -> None:
    assert escape_label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    selector = pod_selector('ns"x', "svc.v1")
    assert 'namespace="ns\\"x"' in selector
    assert 'pod=~"svc\\\\.v1-[a-z0-9]+-[a-z0-9]+"' in selector  # the dot is a literal, twice escaped


def test_vllm_queries_cover_old_and_new_names() -> None:
    q = queries(ENGINES["vllm"], "ns", "svc", 0.95, "1m")
    assert (
        "vllm:request_time_per_output_token_seconds_bucket" in q["tpot"]
        and "vllm:inter_token_latency_seconds_bucket" in q["tpot"]
        and "vllm:time_per_output_token_seconds_bucket" in q["tpot"]
    )
    assert "vllm:kv_cache_usage_perc" in q["kv_usage"] and "vllm:gpu_cache_usage_perc" in q["kv_usage"]
    assert q["ttft"].startswith("histogram_quantile(0.95,")
    assert "deriv(" in q["rate"] and "request_success_total" in q["rate"]


def test_other_engines() -> None:
    assert "sglang:num_queue_reqs" in queries(ENGINES["sglang"], "n", "s", 0.9, "30s")["waiting"]
    tgi = queries(ENGINES["tgi"], "n", "s", 0.9, "30s")
    assert "tgi_queue_size" in tgi["waiting"] and "kv_usage" not in tgi
