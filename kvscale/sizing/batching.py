"""Static batches: the `predict` answer and the throughput-latency curve over batch sizes."""

from __future__ import annotations

from dataclasses import dataclass

from kvscale.sizing.config import ServingConfig
from kvscale.sizing.roofline import StepTime, decode_step, prefill


@dataclass(frozen=True)
class BatchPrediction:
    """B requests of N in / M out, prefilled together, then decoded together."""

    batch: int
    input_tokens: int
    output_tokens: int
    fits: bool
    kv_cache_tokens: int
    max_batch: int
    limited_by: str
    prefill: StepTime | None
    decode: StepTime | None

    @property
    def ttft_s(self) -> float | None:
        return self.prefill.seconds if self.prefill else None

    @property
    def tpot_s(self) -> float | None:
        return self.decode.seconds if self.decode else None

    @property
    def latency_s(self) -> float | None:
        if self.prefill is None or self.decode is None:
            return None
        return self.prefill.seconds + self.output_tokens * self.decode.seconds

    @property
    def throughput_tokens_per_s(self) -> float | None:
        """Generated tokens per second of the whole tensor-parallel group."""
        latency = self.latency_s
        return None if latency is None else self.batch * self.output_tokens / latency

    @property
    def requests_per_s(self) -> float | None:
        latency = self.latency_s
        return None if latency is None else self.batch / latency


def predict_batch(cfg: ServingConfig, batch: int, input_tokens: int, output_tokens: int) -> BatchPrediction:
    """Predicts one static batch; the decode step is taken at the mean context of its life."""
    if batch < 1 or input_tokens < 1 or output_tokens < 1:
        raise ValueError("batch, input and output tokens must each be at least 1")
    mem = cfg.memory
    context = input_tokens + output_tokens
    max_batch = mem.max_batch_for_context(context) if mem.fits else 0
    if not mem.fits:
        return BatchPrediction(batch, input_tokens, output_tokens, False, 0, 0, "memory", None, None)
    pre = prefill(cfg, batch, input_tokens)
    dec = decode_step(cfg, batch, input_tokens + output_tokens / 2.0)
    fits = batch <= max_batch
    limited_by = dec.limited_by if fits else "kv-capacity"
    return BatchPrediction(
        batch, input_tokens, output_tokens, fits, mem.kv_capacity_tokens, max_batch, limited_by, pre, dec
    )


def batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to max_batch, with max_batch itself as the last point."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    if max_batch >= 1:
        sizes.append(max_batch)
    return sizes


def throughput_latency_curve(cfg: ServingConfig, input_tokens: int, output_tokens: int) -> list[BatchPrediction]:
    """One static-batch prediction per batch size up to the KV-limited maximum."""
    first = predict_batch(cfg, 1, input_tokens, output_tokens)
    if not first.fits:
        return [first]
    cap = min(first.max_batch, cfg.engine.max_num_seqs_limit)
    return [predict_batch(cfg, b, input_tokens, output_tokens) for b in batch_sizes(cap)]
