"""What one worker of each pool of a disaggregated plan carries within its share of the SLO,
from the sizing model (kvscale.sizing.disaggregation), at observed lengths: the capacity the
one tick (kvscale.autoscaling.tick) acts on for each pool, in the operator
(kvscale.control.pool_scaling) and in the simulator (kvscale.sim.pool_policies) alike.

- prefill: requests/s whose wait + prefill stays within the prefill pool's share of TTFT at
  the percentile (prompt tokens/s over the prompt); its requests emit one token;
- decode: requests/s with TPOT met and no wait for a batch slot at the percentile (running
  sequences, KV use and output tokens/s).
"""

from __future__ import annotations

import math
from functools import lru_cache

from kvscale.autoscaling import tuning
from kvscale.autoscaling.capacity import LOWEST_PERCENTILE, PERCENTILE_STEP, REACHABLE_LOAD_SHARE
from kvscale.autoscaling.policy import PolicyConfig
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.disaggregation import UNBOUNDED_TPOT_S, DecodeWorker, PrefillWorker
from kvscale.sizing.workload import Slo, Workload

_LENGTH_BUCKET_TOKENS = 16  # observed means are rounded so the caches stay small


def _bucket(tokens: float) -> int:
    return max(1, round(tokens / _LENGTH_BUCKET_TOKENS) * _LENGTH_BUCKET_TOKENS)


def _workload(shape: Workload | None, input_tokens: int, output_tokens: int, rate: float | None) -> Workload:
    """The shape (length distributions, burstiness) scaled to observed means, as
    kvscale.autoscaling.capacity.SizingCapacity scales it."""
    if shape is None or shape.is_mean_value:
        fleet = rate if rate is not None else (shape.requests_per_s if shape is not None else 0.0)
        hit = shape.prefix_cache_hit_share if shape is not None else 0.0
        return Workload(input_tokens, output_tokens, fleet, prefix_cache_hit_share=hit)
    inputs = shape.inputs.scaled(input_tokens / shape.inputs.mean)
    outputs = shape.outputs.scaled(output_tokens / shape.outputs.mean)
    fleet = shape.requests_per_s if rate is None else rate
    bursts = shape.burstiness.beyond(fleet - shape.requests_per_s) if shape.burstiness is not None else None
    return Workload.of(inputs, outputs, fleet, burstiness=bursts, prefix_cache_hit_share=shape.prefix_cache_hit_share)


class PrefillCapacity:
    """What one prefill worker carries: requests/s whose wait + prefill stays within the
    prefill pool's share of TTFT at the percentile (kvscale.sizing.disaggregation.PrefillWorker)."""

    def __init__(self, cfg: ServingConfig, slo: Slo, ttft_share_s: float, max_batch: int, shape: Workload | None):
        self.cfg, self.slo, self.share, self.max_batch, self.shape = cfg, slo, ttft_share_s, max_batch, shape
        self._rate = lru_cache(maxsize=256)(self._rate_uncached)

    def _fleet(self, rate: float | None) -> float | None:
        return None if rate is None or not rate > 0 else float(1.1 ** round(math.log(rate, 1.1)))

    def _rate_uncached(self, input_tokens: int, fleet_rate: float | None) -> float:
        worker = PrefillWorker(self.cfg, _workload(self.shape, input_tokens, 1, fleet_rate), least_loaded=True)
        rate = worker.max_rate(self.share, self.slo.percentile)
        if rate > 0:
            return rate
        # The longest prompts of the mix miss the pool's share on their own prefill: no number of
        # workers serves them in time (a capacity of 0 would scale the pool to its maximum for
        # nothing). The rest are sized at the highest percentile still reachable, as an aggregated
        # replica's are (kvscale.autoscaling.capacity.SizingCapacity.reachable_slo); where none
        # is, a worker carries REACHABLE_LOAD_SHARE of its no-queue rate.
        untimed = worker.capacity_rate_per_s()
        percentile = self.slo.percentile
        while percentile > LOWEST_PERCENTILE:
            percentile = max(LOWEST_PERCENTILE, percentile - PERCENTILE_STEP)
            rate = worker.max_rate(self.share, percentile)
            if rate >= REACHABLE_LOAD_SHARE * untimed:
                return rate
        return max(rate, REACHABLE_LOAD_SHARE * untimed)

    def rate_per_replica(
        self, input_tokens: float, output_tokens: float, fleet_rate_per_s: float | None = None
    ) -> float:
        del output_tokens  # a prefill worker's requests emit one token
        return self._rate(_bucket(input_tokens), self._fleet(fleet_rate_per_s))

    def predicted_tpot_s(
        self,
        rate_per_replica: float,
        input_tokens: float,
        output_tokens: float,
        fleet_rate_per_s: float | None = None,
    ) -> float:
        return UNBOUNDED_TPOT_S  # no TPOT is observed at prefill: never used to calibrate


class DecodeCapacity:
    """What one decode worker carries: requests/s with TPOT within the target and no wait for
    a slot at the percentile (kvscale.sizing.disaggregation.DecodeWorker)."""

    def __init__(self, cfg: ServingConfig, slo: Slo, step_target_s: float, max_batch: int, shape: Workload | None):
        self.cfg, self.slo, self.step_target_s, self.max_batch, self.shape = cfg, slo, step_target_s, max_batch, shape
        self._worker = lru_cache(maxsize=256)(self._worker_uncached)

    def _worker_uncached(self, input_tokens: int, output_tokens: int) -> DecodeWorker:
        return DecodeWorker(self.cfg, _workload(self.shape, input_tokens, output_tokens, None), self.step_target_s)

    def rate_per_replica(
        self, input_tokens: float, output_tokens: float, fleet_rate_per_s: float | None = None
    ) -> float:
        return self._worker(_bucket(input_tokens), _bucket(output_tokens)).max_rate(self.slo)

    def predicted_tpot_s(
        self,
        rate_per_replica: float,
        input_tokens: float,
        output_tokens: float,
        fleet_rate_per_s: float | None = None,
    ) -> float:
        worker = self._worker(_bucket(input_tokens), _bucket(output_tokens))
        return worker.at_rate(rate_per_replica, self.slo.percentile).tpot_p_s


def pool_policy_config(
    role: str,
    *,
    ttft_target_s: float,
    tpot_target_s: float,
    input_tokens: float,
    output_tokens: float,
    min_replicas: int,
    max_replicas: int,
    cold_start_s: float,
    interval_s: float,
    window_s: float,
    headroom: float = tuning.DEFAULT_HEADROOM,
    scale_down_stabilization_s: float = tuning.DEFAULT_SCALE_DOWN_STABILIZATION_S,
) -> PolicyConfig:
    """One pool's policy configuration, through the constructor every policy uses: the pool's
    TTFT target (its share of the plan's split), no TPOT at prefill (its requests emit one
    token), and least-loaded routing: a P/D router (llm-d's scheduler, vLLM's proxy) picks
    each pool's pod by load, so a backlog reaches new workers."""
    prefill = role == "prefill"
    return tuning.policy_config(
        ttft_target_s=ttft_target_s,
        tpot_target_s=UNBOUNDED_TPOT_S if prefill else tpot_target_s,
        input_tokens=input_tokens,
        output_tokens=1 if prefill else output_tokens,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        headroom=headroom,
        cold_start_s=cold_start_s,
        interval_s=interval_s,
        window_s=window_s,
        least_loaded_routing=True,
        scale_down_stabilization_s=scale_down_stabilization_s,
    )


def split_pools(
    total_gpus: float, wants: tuple[int, int], rates: tuple[float, float], gpus: tuple[int, int]
) -> tuple[int, int]:
    """(prefill, decode) workers within `total_gpus` that carry the most requests/s together,
    min(P x prefill rate, D x decode rate), each pool at least one worker and at most its want
    (ties: the fewer GPUs, then the more prefill). When not even one worker of each fits, one of
    each (the caller refuses). `wants`, `rates`, `gpus`: (prefill, decode) each."""
    best: tuple[float, int, int, int] | None = None  # (-served, GPUs, -prefill, decode)
    for p in range(1, max(wants[0], 1) + 1):
        left = total_gpus - p * gpus[0]
        if left < gpus[1]:
            break
        d = min(max(wants[1], 1), math.floor(left / gpus[1]))
        served = min(p * rates[0], d * rates[1])
        key = (-served, p * gpus[0] + d * gpus[1], -p, d)
        if best is None or key < best:
            best = key
    return (1, 1) if best is None else (-best[2], best[3])
