"""What one replica can carry within the SLO, from the sizing model, for observed lengths."""

from __future__ import annotations

from functools import lru_cache

from kvscale.sizing.checkpoints import replica_cold_start
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.load import ReplicaModel
from kvscale.sizing.workload import Slo, Workload

_LENGTH_BUCKET_TOKENS = 16  # observed means are rounded so the cache stays small


class SizingCapacity:
    """Per-replica capacity and predicted latency of one serving configuration."""

    def __init__(self, cfg: ServingConfig, slo: Slo, max_batch: int, shape: Workload | None = None) -> None:
        """`shape`: the workload's length distributions and burstiness (fitted from a trace or
        observed), scaled to each observed mean; without it, constant lengths and Poisson."""
        self.cfg = cfg
        self.slo = slo
        self.max_batch = max_batch
        self.shape = shape
        self._replica = lru_cache(maxsize=256)(self._replica_uncached)
        self._rate = lru_cache(maxsize=256)(self._rate_uncached)

    @staticmethod
    def _bucket(tokens: float) -> int:
        return max(1, round(tokens / _LENGTH_BUCKET_TOKENS) * _LENGTH_BUCKET_TOKENS)

    def _replica_uncached(self, input_tokens: int, output_tokens: int) -> ReplicaModel:
        shape = self.shape
        if shape is None or shape.is_mean_value:
            return ReplicaModel(self.cfg, Workload(input_tokens, output_tokens, 0.0))
        inputs = shape.inputs.scaled(input_tokens / shape.inputs.mean)
        outputs = shape.outputs.scaled(output_tokens / shape.outputs.mean)
        # The fleet rate the burstiness was measured at: a replica carrying a share of it sees
        # that share of each burst.
        workload = Workload.of(inputs, outputs, shape.requests_per_s, burstiness=shape.burstiness)
        return ReplicaModel(self.cfg, workload)

    def _rate_uncached(self, input_tokens: int, output_tokens: int) -> float:
        replica = self._replica(input_tokens, output_tokens)
        batch = min(self.max_batch, max(1, replica.kv_max_batch))
        return replica.max_rate_meeting(self.slo, batch)

    def rate_per_replica(self, input_tokens: float, output_tokens: float) -> float:
        """Requests/s one replica sustains with p-TTFT and p-TPOT within the SLO (0: never)."""
        return self._rate(self._bucket(input_tokens), self._bucket(output_tokens))

    def predicted_tpot_s(self, rate_per_replica: float, input_tokens: float, output_tokens: float) -> float:
        replica = self._replica(self._bucket(input_tokens), self._bucket(output_tokens))
        batch = min(self.max_batch, max(1, replica.kv_max_batch))
        return replica.at_rate(rate_per_replica, batch, self.slo.percentile).tpot_p_s


def default_cold_start_s(cfg: ServingConfig, weights_cached: bool = False, source: str | None = None) -> float:
    """A new replica's start-to-ready time before any was observed, from the model size:
    the engine's start, downloading the checkpoint (`source`, or the 16-bit one) when the pod
    has no weight cache (spec.model.cache), and loading each GPU's shard."""
    return replica_cold_start(
        cfg.model, cfg.precision, cfg.tensor_parallel, cfg.engine, source, cached=weights_cached
    ).total_s
