"""Prefill/decode disaggregation: two pools of workers and the KV transfer between them.

A disaggregated layout runs P prefill workers and D decode workers. A request's prompt is
prefilled on a prefill worker (vLLM: a request with max_tokens 1 that its KV connector keeps
for a remote decode), its KV cache moves to a decode worker, which then emits the output
tokens in steps that carry no prefill:

- TTFT = waiting at prefill + the prompt's prefill (the prefill worker as an engine that
  emits one token: `ReplicaModel` on the workload with outputs of 1, so its queueing, length
  mix, bursts and router are the aggregated model's) + the KV transfer (the percentile
  prompt's uncached tokens x the KV bytes per token of one prefill GPU, over the path between
  the pools) + waiting for a decode slot (M/M/c over the batch limit) + the first decode step.
  The parts' percentiles are added: at least the percentile of the sum (a bound, not a fit).
- TPOT = the decode step at the running batch not exceeded at the percentile (the mean
  concurrency plus z standard deviations, the variance the replica's index of dispersion x
  the mean), capped by the batch limit, stretched by the intake of the requests admitted
  meanwhile. No chunk ever shares a decode worker's step.

Each pool is matched to the load on its own: P = rate / (prefill worker's rate within its
share of TTFT), D = rate / (decode worker's rate with no slot wait at the percentile), each
rounded up to whole workers with the planner's headroom (`workers_for_rate`): rate matching,
as in the published DeepSeek and RTP-LLM pool arithmetic (`rate_matched_workers`), with
queueing at both pools instead of averages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from statistics import NormalDist
from typing import Literal

import yaml

from kvscale.sizing.catalog import Catalog, GpuSpec, KvPrecisionSpec, ModelArch
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.load import ReplicaModel, running_bucket
from kvscale.sizing.memory import kv_bytes_per_token
from kvscale.sizing.queueing import mmc_wait_percentile_s, replicas_for_rate
from kvscale.sizing.workload import LengthDistribution, Slo, Workload

PathName = Literal["nvlink", "network"]
_RATE_BISECTION_STEPS = 14
_FIXED_POINT_STEPS = 6
UNBOUNDED_TPOT_S = 3600.0  # a prefill worker emits one token: no TPOT to meet


@dataclass(frozen=True)
class TransferPathSpec:
    """What a transfer engine gets out of a link (catalog/kv_transfer.yaml)."""

    efficiency: float
    setup_latency_s: float
    source: str


@cache
def transfer_path_specs() -> dict[str, TransferPathSpec]:
    """The built-in KV-transfer paths, from catalog/kv_transfer.yaml."""
    text = resources.files("kvscale.sizing.catalog").joinpath("kv_transfer.yaml").read_text()
    raw = yaml.safe_load(text)["paths"]
    specs = {}
    for name, entry in raw.items():
        spec = TransferPathSpec(float(entry["efficiency"]), float(entry["setup_latency_s"]), str(entry["source"]))
        if not 0.0 < spec.efficiency <= 1.0 or spec.setup_latency_s < 0.0:
            raise ValueError(f"kv_transfer.yaml {name}: efficiency in (0, 1] and a non-negative setup latency")
        specs[str(name)] = spec
    return specs


@dataclass(frozen=True)
class KvTransferPath:
    """The path a prefill GPU's KV shard takes to its decode GPU: bandwidth per GPU, per
    direction, after the transfer engine's efficiency, and the fixed cost of one transfer."""

    name: PathName
    bandwidth_bytes_per_s: float
    setup_s: float
    source: str


def kv_transfer_path(
    catalog: Catalog, prefill_gpu: GpuSpec, decode_gpu: GpuSpec, within_node: bool = False
) -> KvTransferPath | None:
    """NVLink (the GPU's own link) when both pools share a node and a GPU type; else the
    network between nodes, at the slower side's per-GPU share of its NICs. None when a side
    has no known inter-node fabric."""
    specs = transfer_path_specs()
    if within_node and prefill_gpu.name == decode_gpu.name:
        link = catalog.link(prefill_gpu)
        spec = specs["nvlink"]
        return KvTransferPath(
            "nvlink", link.bandwidth_bytes_per_s_per_direction * spec.efficiency, spec.setup_latency_s, spec.source
        )
    sides = (prefill_gpu.internode_bandwidth_bytes_per_s, decode_gpu.internode_bandwidth_bytes_per_s)
    if sides[0] is None or sides[1] is None:
        return None
    spec = specs["network"]
    return KvTransferPath("network", min(sides[0], sides[1]) * spec.efficiency, spec.setup_latency_s, spec.source)


def kv_transfer_bytes_per_gpu(model: ModelArch, kv: KvPrecisionSpec, prefill_tp: int, tokens: float) -> float:
    """Bytes one prefill GPU sends for `tokens` of prompt: its shard of every layer's KV
    (kv_bytes_per_token at the prefill TP; MLA: the whole latent on every rank). vLLM 0.11.0's
    NixlConnector needs the decode TP to be a multiple of the prefill TP ("Decode TP cannot be
    smaller than prefill TP", distributed/kv_transfer/kv_connector/v1/nixl_connector.py), so
    the prefill side holds the larger shard and sets the time."""
    return kv_bytes_per_token(model, kv, prefill_tp) * tokens


def kv_transfer_s(model: ModelArch, kv: KvPrecisionSpec, prefill_tp: int, tokens: float, path: KvTransferPath) -> float:
    """One request's KV transfer: setup + one prefill GPU's shard over its path (every GPU of
    the group sends its own shard at once)."""
    if tokens <= 0:
        return 0.0
    return path.setup_s + kv_transfer_bytes_per_gpu(model, kv, prefill_tp, tokens) / path.bandwidth_bytes_per_s


def uncached_prompt_tokens(workload: Workload, prompt_tokens: float) -> float:
    """Prompt tokens whose KV must move: those the prefix cache does not already hold."""
    return prompt_tokens * (1.0 - workload.prefix_cache_hit_share)


def rate_matched_workers(demand_tokens_per_s: float, tokens_per_s_per_worker: float) -> float:
    """Workers a pool needs by average-rate matching (fractional): the demand over one
    worker's rate. DeepSeek's production day and Dynamo's planner count pools this way."""
    if tokens_per_s_per_worker <= 0:
        raise ValueError("a worker's rate must be positive")
    return demand_tokens_per_s / tokens_per_s_per_worker


def prefill_per_decode(
    input_tokens: float,
    output_tokens: float,
    prefill_tokens_per_s_per_unit: float,
    decode_tokens_per_s_per_unit: float,
) -> float:
    """Prefill units one decode unit needs at its own rate: the requests its output rate
    serves (decode rate / output) bring input x that many prompt tokens per second."""
    requests_per_s = decode_tokens_per_s_per_unit / output_tokens
    return rate_matched_workers(requests_per_s * input_tokens, prefill_tokens_per_s_per_unit)


def workers_for_rate(total_rate_per_s: float, rate_per_worker_per_s: float, headroom: float) -> int:
    """Whole workers of a pool: the aggregated planner's rounding (replicas_for_rate)."""
    return replicas_for_rate(total_rate_per_s, rate_per_worker_per_s, headroom)


def prefill_workload(workload: Workload) -> Workload:
    """What a prefill worker serves: the same prompts, rate, burstiness and context limit,
    each request emitting one token (vLLM's disaggregated proxies send max_tokens 1)."""
    return Workload(
        workload.input_tokens,
        1,
        workload.requests_per_s,
        workload.engine_max_context_tokens,
        workload.input_lengths,
        LengthDistribution.constant(1),
        workload.burstiness,
        workload.prefix_cache_hit_share,
    )


class PrefillWorker:
    """One prefill worker: an engine whose requests emit one token each."""

    def __init__(self, cfg: ServingConfig, workload: Workload, least_loaded: bool = False) -> None:
        self.cfg = cfg
        self.workload = prefill_workload(workload)
        self.replica = ReplicaModel(cfg, self.workload, least_loaded=least_loaded)

    @property
    def runs(self) -> bool:
        return self.cfg.memory.fits and self.replica.max_context_fits and self.max_batch >= 1

    @property
    def max_batch(self) -> int:
        """Sequences in flight: only while prefilled, so the slot limit (KV, budget)."""
        return self.replica.slot_limit

    def ttft_p_s(self, rate_per_s: float, percentile: float) -> float:
        """Waiting + the prompt's own prefill at the percentile (the worker's first token)."""
        return self.replica.at_rate(rate_per_s, self.max_batch, percentile).ttft_p_s

    def idle_ttft_p_s(self, percentile: float) -> float:
        return self.replica.zero_load(percentile).ttft_p_s

    def capacity_rate_per_s(self) -> float:
        """No-queueing bound: prefill compute (or the slots) saturated."""
        return self.replica.capacity_rate_per_s(self.max_batch)

    def max_rate(self, ttft_budget_s: float, percentile: float) -> float:
        """The highest rate at which its TTFT percentile stays within `ttft_budget_s`."""
        if ttft_budget_s <= 0:
            return 0.0
        slo = Slo(ttft_budget_s, UNBOUNDED_TPOT_S, percentile)
        return max(0.0, self.replica.max_rate_meeting(slo, self.max_batch))


@dataclass(frozen=True)
class DecodePoint:
    """A decode worker at an arrival rate."""

    rate_per_s: float
    concurrency: float  # mean running sequences
    running_p: float  # running sequences not exceeded at the percentile (capped by the batch limit)
    gap_s: float  # mean token gap (decode step and the intake of admitted requests)
    tpot_p_s: float
    slot_wait_p_s: float  # waiting for a batch slot at the percentile (joins TTFT)
    first_step_s: float  # the first decode step a request waits for

    @property
    def stable(self) -> bool:
        return math.isfinite(self.tpot_p_s) and math.isfinite(self.slot_wait_p_s)


class DecodeWorker:
    """One decode worker: steps of running decodes only, a batch limit set by TPOT and KV."""

    def __init__(self, cfg: ServingConfig, workload: Workload, step_target_s: float) -> None:
        self.cfg = cfg
        self.workload = workload
        self.replica = ReplicaModel(cfg, workload)
        self.max_batch = self.replica.tpot_batch_limit(step_target_s) if cfg.memory.fits else 0
        self.intake_s = cfg.engine.request_overhead_s

    @property
    def runs(self) -> bool:
        return self.cfg.memory.fits and self.replica.max_context_fits and self.max_batch >= 1

    def step_s(self, running: float) -> float:
        return self.replica.decode(max(1, min(self.max_batch, math.ceil(running)))).seconds

    def _dispersion(self, rate_per_s: float) -> float:
        """The index of dispersion one worker sees: its share of the fleet's excess."""
        fleet = self.workload.arrivals
        total = self.workload.requests_per_s
        share = min(1.0, rate_per_s / total) if total > 0 else 1.0
        return 1.0 + (fleet.index_of_dispersion - 1.0) * share

    def at_rate(self, rate_per_s: float, percentile: float) -> DecodePoint:
        """Concurrency by fixed point (Little: rate x output x gap), then the percentiles."""
        out = self.workload.output_tokens
        batch = self.max_batch
        if rate_per_s <= 0:
            step = self.step_s(1)
            return DecodePoint(0.0, 0.0, 1.0, step, step, 0.0, step)
        intake_share = rate_per_s * self.intake_s
        if intake_share >= 1.0 or batch < 1:
            return DecodePoint(rate_per_s, batch, batch, math.inf, math.inf, math.inf, math.inf)
        concurrency = rate_per_s * out * self.step_s(1) / (1.0 - intake_share)
        for _ in range(_FIXED_POINT_STEPS):
            gap = self.replica.decode(min(batch, running_bucket(concurrency))).seconds / (1.0 - intake_share)
            concurrency = rate_per_s * out * gap
        gap = self.replica.decode(min(batch, running_bucket(concurrency))).seconds / (1.0 - intake_share)
        if concurrency >= batch:
            return DecodePoint(rate_per_s, concurrency, batch, gap, math.inf, math.inf, gap)
        z = NormalDist().inv_cdf(percentile / 100.0)
        running_p = min(float(batch), concurrency + z * math.sqrt(self._dispersion(rate_per_s) * concurrency))
        tpot_p = self.step_s(running_p) / (1.0 - intake_share)
        slot_wait = mmc_wait_percentile_s(batch, rate_per_s, out * gap, percentile)
        return DecodePoint(rate_per_s, concurrency, running_p, gap, max(tpot_p, gap), slot_wait, gap)

    def meets(self, rate_per_s: float, slo: Slo) -> bool:
        """TPOT within the target and no wait for a slot at the percentile."""
        point = self.at_rate(rate_per_s, slo.percentile)
        return point.stable and point.tpot_p_s <= slo.tpot_s and point.slot_wait_p_s <= 0.0

    def capacity_rate_per_s(self) -> float:
        """No-queueing bound: every slot busy at the batch limit's step."""
        if self.max_batch < 1:
            return 0.0
        gap = self.step_s(self.max_batch)
        return self.max_batch / (self.workload.output_tokens * gap + self.intake_s * self.max_batch)

    def max_rate(self, slo: Slo) -> float:
        """The highest rate meeting `meets`, by bisection to 2^-14 of the no-queueing bound."""
        top = self.capacity_rate_per_s()
        if top <= 0 or not self.meets(top * 1e-6, slo):
            return 0.0
        lo, hi = top * 1e-6, top
        for _ in range(_RATE_BISECTION_STEPS):
            mid = (lo + hi) / 2.0
            if self.meets(mid, slo):
                lo = mid
            else:
                hi = mid
        return lo


def transfer_tokens_at_percentile(workload: Workload, percentile: float) -> float:
    """The uncached prompt tokens of the percentile prompt (whose transfer TTFT counts)."""
    return uncached_prompt_tokens(workload, workload.inputs.spread_quantile(percentile / 100.0))
