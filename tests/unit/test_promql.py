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


def test_every_query_reads_the_names_as_served_and_as_escaped() -> None:
    # prometheus_client escapes `vllm:` to `vllm_` in OpenMetrics samples unless the scraper
    # allows UTF-8 names (Prometheus 3 does; Prometheus 2 and legacy validation do not).
    q = queries(ENGINES["vllm"], "ns", "svc", 0.95, "1m")
    for name in ("ttft", "tpot", "running", "waiting", "kv_usage", "rate"):
        colon = q[name].count('__name__="vllm:')
        assert colon > 0 and q[name].count('__name__="vllm_') == colon, q[name]
    assert 'vllm_time_to_first_token_seconds_bucket"' in q["ttft"]
    assert q["ttft"].index("vllm:time_to_first") < q["ttft"].index("vllm_time_to_first")  # served name first
    tgi = queries(ENGINES["tgi"], "n", "s", 0.9, "30s")
    assert tgi["waiting"].count("tgi_queue_size") == 1  # no colon, nothing to escape
