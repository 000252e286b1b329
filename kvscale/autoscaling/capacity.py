"""What one replica can carry within the SLO, from the sizing model, for observed lengths."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from kvscale.sizing.checkpoints import replica_cold_start
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.load import ReplicaModel
from kvscale.sizing.workload import Slo, Workload

_LENGTH_BUCKET_TOKENS = 16  # observed means are rounded so the cache stays small
PERCENTILE_STEP = 0.5  # an SLO percentile no idle replica meets is lowered in these steps
LOWEST_PERCENTILE = 50.0
REACHABLE_LOAD_SHARE = 0.5  # a lowered percentile must let a replica carry this share of its TTFT-free rate
# Prompts that miss the TTFT target on an idle replica taking more than this share of the misses
# the percentile allows leave queueing less than they take: the percentile is then checked as
# a lowered one is (REACHABLE_LOAD_SHARE)
UNSERVED_SHARE = 0.5
_FLEET_RATE_STEP = 1.1  # fleet rates are rounded to powers of this (10% steps) so the cache stays small


class SizingCapacity:
    """Per-replica capacity and predicted latency of one serving configuration."""

    def __init__(
        self, cfg: ServingConfig, slo: Slo, max_batch: int, shape: Workload | None = None, least_loaded: bool = False
    ) -> None:
        """`shape`: the workload's length distributions and burstiness (fitted from a trace or
        observed), scaled to each observed mean; without it, constant lengths and Poisson.
        `least_loaded`: requests reach replicas through a least-loaded router (a gateway's
        endpoint picker), which keeps new prompts off busy replicas while others are idle."""
        self.cfg = cfg
        self.least_loaded = least_loaded
        self.slo = slo
        self.max_batch = max_batch
        self.shape = shape
        self._replica = lru_cache(maxsize=256)(self._replica_uncached)
        self._rate = lru_cache(maxsize=256)(self._rate_uncached)
        self._reachable = lru_cache(maxsize=256)(self._reachable_uncached)

    @staticmethod
    def _bucket(tokens: float) -> int:
        return max(1, round(tokens / _LENGTH_BUCKET_TOKENS) * _LENGTH_BUCKET_TOKENS)

    def _fleet_bucket(self, fleet_rate_per_s: float | None) -> float | None:
        """The fleet rate a replica's share is taken of, rounded (None: the shape's own rate)."""
        if fleet_rate_per_s is None or not fleet_rate_per_s > 0.0 or self.shape is None:
            return None
        return float(_FLEET_RATE_STEP ** round(math.log(fleet_rate_per_s, _FLEET_RATE_STEP)))

    def _replica_uncached(
        self, input_tokens: int, output_tokens: int, fleet_rate_per_s: float | None, burst_at_most: float | None
    ) -> ReplicaModel:
        shape = self.shape
        if shape is None or shape.is_mean_value:
            fleet = fleet_rate_per_s if shape is not None and fleet_rate_per_s is not None else 0.0
            return ReplicaModel(self.cfg, Workload(input_tokens, output_tokens, fleet), least_loaded=self.least_loaded)
        inputs = shape.inputs.scaled(input_tokens / shape.inputs.mean)
        outputs = shape.outputs.scaled(output_tokens / shape.outputs.mean)
        # A replica carrying a share of the fleet's rate sees that share of each burst. The
        # bursts are the fitted ones, in requests: a fleet sized above the fitted mean splits
        # them over more replicas, and its spare rate carries part of each as it arrives
        # (Burstiness.beyond); the shape's own rate when no fleet rate is given.
        rate = shape.requests_per_s if fleet_rate_per_s is None else fleet_rate_per_s
        bursts = shape.burstiness.beyond(rate - shape.requests_per_s) if shape.burstiness is not None else None
        if bursts is not None and burst_at_most is not None:
            bursts = bursts.at_most(burst_at_most)
        workload = Workload.of(inputs, outputs, rate, burstiness=bursts)
        return ReplicaModel(self.cfg, workload, least_loaded=self.least_loaded)

    def _rate_uncached(
        self, input_tokens: int, output_tokens: int, fleet_rate_per_s: float | None, burst_at_most: float | None
    ) -> float:
        replica = self._replica(input_tokens, output_tokens, fleet_rate_per_s, burst_at_most)
        batch = min(self.max_batch, max(1, replica.kv_max_batch))
        return replica.max_rate_meeting(self.reachable_slo(input_tokens, output_tokens), batch)

    def reachable_slo(self, input_tokens: float, output_tokens: float) -> Slo:
        """The SLO at the highest percentile a replica meets for these lengths under load:
        where the longest prompts of the mix miss the TTFT target on their own prefill, no
        number of replicas serves them in time, and the rest of the requests are sized at the
        percentile that is still reachable (the SLO itself when a replica under load meets it).
        Those prompts take their share of the misses the percentile allows before any queue
        does: when they take more than UNSERVED_SHARE of it and the share left lets a replica
        carry less than REACHABLE_LOAD_SHARE of the rate it would carry without the TTFT
        target (else the capacity is ~0 and the fleet unbounded), the percentile goes down
        until it does. Prompts just inside the target on an idle replica miss it behind any
        queue alike.
        Judged at the shape's own rate, so the percentile does not move with the load."""
        return self._reachable(self._bucket(input_tokens), self._bucket(output_tokens))

    def _reachable_uncached(self, input_tokens: int, output_tokens: int) -> Slo:
        replica = self._replica(input_tokens, output_tokens, None, None)
        idle = replica.zero_load(self.slo.percentile)
        if idle.ttft_p_s <= self.slo.ttft_s and idle.tpot_p_s <= self.slo.tpot_s:
            # The prompts an idle replica misses take at most UNSERVED_SHARE of the misses the
            # percentile allows: queueing has the rest, and sets the rate
            allowance = 100.0 - self.slo.percentile
            if replica.zero_load(100.0 - UNSERVED_SHARE * allowance).ttft_p_s <= self.slo.ttft_s:
                return self.slo
        batch = min(self.max_batch, max(1, replica.kv_max_batch))
        percentile = self.slo.percentile
        first = True
        while percentile > LOWEST_PERCENTILE:
            if not first:
                percentile = max(LOWEST_PERCENTILE, percentile - PERCENTILE_STEP)
            first = False
            slo = replace(self.slo, percentile=percentile)
            idle = replica.zero_load(percentile)
            if idle.ttft_p_s > slo.ttft_s or idle.tpot_p_s > slo.tpot_s:
                continue
            untimed = replica.max_rate_meeting(replace(slo, ttft_s=math.inf), batch)
            if replica.max_rate_meeting(slo, batch) >= REACHABLE_LOAD_SHARE * untimed:
                return slo
        return replace(self.slo, percentile=LOWEST_PERCENTILE)

    def rate_per_replica(
        self,
        input_tokens: float,
        output_tokens: float,
        fleet_rate_per_s: float | None = None,
        burst_at_most: float | None = None,
    ) -> float:
        """Requests/s one replica sustains with p-TTFT and p-TPOT within the SLO (0: never),
        in a fleet carrying `fleet_rate_per_s` in all (its share of each burst, and behind a
        least-loaded router the pool its prefill queue drains into; None: the shape's rate).
        `burst_at_most`: requests a burst can hold at most (a schedule that knows the span's
        arrivals; rounded up to the fleet-rate steps)."""
        cap = None
        if burst_at_most is not None:
            cap = float(_FLEET_RATE_STEP ** math.ceil(math.log(max(burst_at_most, 1.0), _FLEET_RATE_STEP) - 1e-9))
        return self._rate(
            self._bucket(input_tokens), self._bucket(output_tokens), self._fleet_bucket(fleet_rate_per_s), cap
        )

    def predicted_tpot_s(
        self,
        rate_per_replica: float,
        input_tokens: float,
        output_tokens: float,
        fleet_rate_per_s: float | None = None,
    ) -> float:
        replica = self._replica(
            self._bucket(input_tokens), self._bucket(output_tokens), self._fleet_bucket(fleet_rate_per_s), None
        )
        batch = min(self.max_batch, max(1, replica.kv_max_batch))
        return replica.at_rate(rate_per_replica, batch, self.slo.percentile).tpot_p_s


class ConfirmedCapacity:
    """Per-replica capacity at the level the simulated sizing search confirmed on the
    service's own traffic (the fewest warm replicas meeting the SLO on a replay of it, as
    `plan --trace` sizes a plan), with the sizing model's shape around it.

    The model says how the rate moves with the observed lengths and the fleet's rate (a
    minute of long prompts needs more replicas than a minute of short ones); the search says
    where it is on the traffic it replayed: every rate is the model's times the confirmed
    figure over the model's own at that traffic. The model sizes each term at its percentile
    at once; the replay meets the percentile on the requests themselves, where the terms'
    tails fall on different requests. Predicted TPOT (the engine-speed calibration's yardstick)
    stays the model's at the load it is asked at."""

    def __init__(
        self,
        model: SizingCapacity,
        confirmed_rate_per_s: float,
        input_tokens: float,
        output_tokens: float,
        fleet_rate_per_s: float | None = None,
        analytic_rate_per_s: float | None = None,
    ) -> None:
        """`confirmed_rate_per_s`: requests/s one replica carried within the SLO in the search
        (the replayed rate over the replicas it confirmed); the lengths and fleet rate: the
        replayed traffic's. `analytic_rate_per_s`: the model's figure for the replayed traffic
        itself, its own burstiness and length mix (kvscale.sim.online.search_capacity); without
        it, `model`'s at the replayed lengths and rate. The ratio of the two is the model's
        error on that traffic, and it is what carries over: a quiet window replays no burst, and
        set against a model that expects the plan's bursts it would read as a replica carrying
        several times what the model says (the online search on a spiky trace confirmed 3.8-4.1
        req/s per replica in quiet windows where bursts need 0.8, and the fleet missed 17% of
        requests in the next spike)."""
        if not confirmed_rate_per_s > 0.0:
            raise ValueError(f"a confirmed rate per replica must be positive, got {confirmed_rate_per_s}")
        self.model = model
        self.max_batch = model.max_batch
        self.confirmed_rate_per_s = confirmed_rate_per_s
        self.analytic_rate_per_s = (
            analytic_rate_per_s
            if analytic_rate_per_s is not None
            else model.rate_per_replica(input_tokens, output_tokens, fleet_rate_per_s)
        )
        # a model that gives the replayed traffic no rate at all has no shape to keep: the
        # confirmed figure stands alone
        self.scale = confirmed_rate_per_s / self.analytic_rate_per_s if self.analytic_rate_per_s > 0.0 else None

    def rate_per_replica(
        self,
        input_tokens: float,
        output_tokens: float,
        fleet_rate_per_s: float | None = None,
        burst_at_most: float | None = None,
    ) -> float:
        if self.scale is None:
            return self.confirmed_rate_per_s
        return self.scale * self.model.rate_per_replica(input_tokens, output_tokens, fleet_rate_per_s, burst_at_most)

    def predicted_tpot_s(
        self,
        rate_per_replica: float,
        input_tokens: float,
        output_tokens: float,
        fleet_rate_per_s: float | None = None,
    ) -> float:
        return self.model.predicted_tpot_s(rate_per_replica, input_tokens, output_tokens, fleet_rate_per_s)


def default_cold_start_s(cfg: ServingConfig, weights_cached: bool = False, source: str | None = None) -> float:
    """A new replica's start-to-ready time before any was observed, from the model size:
    the engine's start, downloading the checkpoint (`source`, or the 16-bit one) when the pod
    has no weight cache (spec.model.cache), and loading each GPU's shard."""
    return replica_cold_start(
        cfg.model, cfg.precision, cfg.tensor_parallel * cfg.data_parallel, cfg.engine, source, cached=weights_cached
    ).total_s
