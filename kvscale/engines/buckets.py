"""The bucket bounds of engines' request-length histograms (shared by the metrics reader and
the simulator, which counts a replay as the engines do)."""

from __future__ import annotations


def vllm_token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's request token histograms: 1, 2, 5, 10, 20, 50, ... up to max_model_len
    (loggers.py build_1_2_5_buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1
