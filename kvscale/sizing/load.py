"""One replica under load: its batch limit, the rate it sustains within the SLO, and its
latency at a percentile under a given arrival rate (queueing, not the empty-server value)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from kvscale.sizing.config import ServingConfig
from kvscale.sizing.memory import max_batch_for_context
from kvscale.sizing.queueing import md1_wait_percentile_s, mmc_wait_percentile_s
from kvscale.sizing.roofline import StepTime, decode_step, prefill
from kvscale.sizing.workload import Slo, Workload

_BISECTION_STEPS = 14  # 2^-14 of the capacity rate: far finer than the model is accurate


@dataclass(frozen=True)
class LoadPoint:
    """Steady state of one replica at `rate_per_s` arrivals with max-num-seqs `max_batch`."""

    rate_per_s: float
    max_batch: int
    concurrency: float  # mean requests running
    prefill_s: float
    decode: StepTime  # the step at the mean running batch
    ttft_p_s: float
    tpot_mean_s: float
    tpot_p_s: float
    gpu_prefill_share: float  # share of GPU time spent on prefill

    @property
    def stable(self) -> bool:
        return math.isfinite(self.ttft_p_s) and math.isfinite(self.tpot_p_s)


class ReplicaModel:
    """Latency of one replica of a configuration for one workload, with its steps cached."""

    def __init__(self, cfg: ServingConfig, workload: Workload) -> None:
        self.cfg = cfg
        self.workload = workload
        self.prefill_step = prefill(cfg, 1, workload.input_tokens)
        self._decode = lru_cache(maxsize=None)(self._decode_uncached)

    def _decode_uncached(self, batch: int) -> StepTime:
        return decode_step(self.cfg, batch, self.workload.mean_decode_context_tokens)

    def decode(self, batch: int) -> StepTime:
        return self._decode(max(1, batch))

    @property
    def kv_max_batch(self) -> int:
        """Most typical requests the KV cache holds at once (capped at the engine's limit)."""
        mem = self.cfg.memory
        if not mem.fits:
            return 0
        by_kv = max_batch_for_context(
            mem.kv_capacity_tokens, self.workload.context_tokens, self.cfg.engine.kv_block_tokens
        )
        return min(by_kv, self.cfg.engine.max_num_seqs_limit)

    @property
    def max_context_fits(self) -> bool:
        """vLLM refuses to start unless one sequence of max-model-len fits in the KV cache."""
        return self.cfg.memory.kv_capacity_tokens >= self.workload.engine_max_context_tokens

    def tpot_batch_limit(self, tpot_target_s: float) -> int:
        """Largest batch (<= KV limit) whose decode step, with its tail factor, meets TPOT."""
        tail = self.cfg.engine.tpot_tail_factor
        lo, hi = 0, self.kv_max_batch
        if hi >= 1 and tail * self.decode(hi).seconds <= tpot_target_s:
            return hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tail * self.decode(mid).seconds <= tpot_target_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def capacity_rate_per_s(self, max_batch: int) -> float:
        """Arrival rate at which every slot is busy: B / (out x step(B) + B x prefill)."""
        step = self.decode(max_batch).seconds
        return max_batch / (self.workload.output_tokens * step + max_batch * self.prefill_step.seconds)

    def at_rate(self, rate_per_s: float, max_batch: int, percentile: float) -> LoadPoint:
        """Steady state at an arrival rate: running concurrency by fixed point, then queues."""
        s_p = self.prefill_step.seconds
        out = self.workload.output_tokens
        prefill_share = rate_per_s * s_p
        if prefill_share >= 1.0 or rate_per_s >= self.capacity_rate_per_s(max_batch):
            step = self.decode(max_batch)
            return LoadPoint(
                rate_per_s,
                max_batch,
                float(max_batch),
                s_p,
                step,
                math.inf,
                math.inf,
                math.inf,
                min(prefill_share, 1.0),
            )
        concurrency = min(rate_per_s * (s_p + out * self.decode(1).seconds), float(max_batch))
        for _ in range(2):  # converges fast: step time grows slowly with batch
            step = self.decode(math.ceil(concurrency))
            hold = s_p + out * step.seconds / (1.0 - prefill_share)
            concurrency = min(rate_per_s * hold, float(max_batch))
        step = self.decode(math.ceil(concurrency))
        tpot_mean = step.seconds / (1.0 - prefill_share)
        hold = s_p + out * tpot_mean
        slot_wait = mmc_wait_percentile_s(max_batch, rate_per_s, hold, percentile)
        prefill_wait = md1_wait_percentile_s(rate_per_s, s_p, percentile)
        ttft = s_p + step.seconds + slot_wait + prefill_wait
        return LoadPoint(
            rate_per_s=rate_per_s,
            max_batch=max_batch,
            concurrency=concurrency,
            prefill_s=s_p,
            decode=step,
            ttft_p_s=ttft,
            tpot_mean_s=tpot_mean,
            tpot_p_s=self.cfg.engine.tpot_tail_factor * tpot_mean,
            gpu_prefill_share=prefill_share,
        )

    def zero_load(self, percentile: float) -> LoadPoint:
        return self.at_rate(0.0, 1, percentile)

    def max_rate_meeting(self, slo: Slo, max_batch: int) -> float:
        """Highest arrival rate at which p-TTFT and p-TPOT both meet the SLO (0 when none)."""

        def meets(rate: float) -> bool:
            point = self.at_rate(rate, max_batch, slo.percentile)
            return point.ttft_p_s <= slo.ttft_s and point.tpot_p_s <= slo.tpot_s

        lo, hi = 0.0, self.capacity_rate_per_s(max_batch)
        if not meets(lo):
            return 0.0
        for _ in range(_BISECTION_STEPS):
            mid = (lo + hi) / 2.0
            if meets(mid):
                lo = mid
            else:
                hi = mid
        return lo
