"""Aggregated and disaggregated layouts searched together: the cheapest that meets the SLO,
and why the other layout lost.

A disaggregated candidate is a prefill pool and a decode pool (kvscale.sizing.disaggregation):
each pool's GPU type, tensor-parallel degree and chunk budget / batch limit are chosen for the
lowest cost per request/s it carries within its share of the SLO, the best few of each are
paired (decode TP a multiple of prefill TP, the same precisions, one GPU vendor and engine
release: vLLM's NixlConnector), and
each pair is sized exactly: the decode pool with no slot wait at the percentile, then the
prefill pool within what TTFT leaves after the transfer and the first decode step. Whole
workers per pool, with the aggregated planner's headroom.

`plan_layouts` compares the best of each layout: in `auto` the disaggregated one wins only
when it is strictly better by the objective, so an aggregated winner stays as it was.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Literal

from kvscale.engines.args import PlannedLaunch, plan_launch, vllm_args
from kvscale.planner.search import Feasible, Plan, PlanRequest, configurations
from kvscale.planner.search import plan as plan_aggregated
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.disaggregation import (
    DecodeWorker,
    KvTransferPath,
    PrefillWorker,
    kv_transfer_path,
    kv_transfer_s,
    transfer_tokens_at_percentile,
    uncached_prompt_tokens,
    workers_for_rate,
)
from kvscale.sizing.load import CHUNK_BUDGETS
from kvscale.sizing.units import format_duration

Disaggregation = Literal["auto", "on", "off"]
Layout = Literal["aggregated", "disaggregated"]
Role = Literal["prefill", "decode"]
POOL_FINALISTS = 4  # per pool, the cheapest per request/s that are paired and sized exactly
PREFILL_MIN_BUDGET = 2048  # a prefill-only worker runs large chunks: nothing shares its steps
# vLLM 0.11.0: NixlConnector is registered in distributed/kv_transfer/kv_connector/factory.py; its
# roles come per request from kv_transfer_params (do_remote_decode on the prefill side,
# do_remote_prefill on the decode side, v1/nixl_connector.py), so both pools run kv_both.
KV_CONNECTOR = "NixlConnector"
KV_ROLE = "kv_both"


@dataclass(frozen=True)
class Pool:
    """One pool of a disaggregated plan."""

    role: Role
    cfg: ServingConfig
    workers: int
    max_batch: int
    rate_per_worker_max: float

    @property
    def gpus(self) -> int:
        return self.cfg.gpus * self.workers

    @property
    def cost_usd_per_hour(self) -> float:
        return self.workers * self.cfg.price_usd_per_hour

    @property
    def max_num_batched_tokens(self) -> int:
        return self.cfg.rank_chunk_budget_tokens

    @property
    def shape(self) -> str:
        return f"{self.workers} x {self.cfg.gpu.name} x{self.cfg.tensor_parallel} {self.cfg.precision.name}"


@dataclass(frozen=True)
class DisaggregatedPlan:
    """The best disaggregated layout at the requested load."""

    request: PlanRequest
    prefill: Pool
    decode: Pool
    path: KvTransferPath
    kv_transfer_s: float  # per request at the mean prompt (its uncached tokens)
    kv_transfer_p_s: float  # at the percentile prompt: what TTFT counts
    ttft_p_s: float  # at the requested load
    tpot_p_s: float
    prefill_ttft_s: float  # the prefill pool's share of TTFT at the load (wait + prefill)
    decode_first_step_s: float
    reason: str = ""

    @property
    def gpus_total(self) -> int:
        return self.prefill.gpus + self.decode.gpus

    @property
    def cost_usd_per_hour(self) -> float:
        return self.prefill.cost_usd_per_hour + self.decode.cost_usd_per_hour

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Output tokens per second per GPU at the planned rate."""
        w = self.request.workload
        return w.requests_per_s * w.outputs.mean / self.gpus_total if self.gpus_total else 0.0

    @property
    def latency_s(self) -> float:
        return self.ttft_p_s + self.request.workload.output_tokens * self.tpot_p_s

    @property
    def prefill_ttft_target_s(self) -> float:
        """What TTFT leaves the prefill pool (wait + prefill): the target less the transfer and
        the decode pool's share (its slot wait and first step at the plan's load)."""
        decode_share = self.ttft_p_s - self.prefill_ttft_s - self.kv_transfer_p_s
        return max(self.request.slo.ttft_s - self.kv_transfer_p_s - decode_share, 1e-3)

    @property
    def decode_ttft_target_s(self) -> float:
        """What TTFT leaves the decode pool (slot wait + first step): the target less the
        prefill pool's share at the plan's load and the transfer."""
        return max(self.request.slo.ttft_s - self.prefill_ttft_s - self.kv_transfer_p_s, 1e-3)


@dataclass(frozen=True)
class LayoutPlan:
    """The layout chosen (`mode`, None when neither meets the SLO), the best plan of each
    layout searched, and why the chosen one won."""

    request: PlanRequest
    disaggregation: Disaggregation
    mode: Layout | None
    aggregated: Plan | None  # None: not searched (--disaggregation on)
    disaggregated: DisaggregatedPlan | None
    disaggregated_why_none: str  # why no disaggregated plan exists ("" when one does, or off)
    reason: str


@dataclass(frozen=True)
class _PrefillOption:
    worker: PrefillWorker
    rate_estimate: float


@dataclass(frozen=True)
class _DecodeOption:
    worker: DecodeWorker
    rate: float


def _pool_configs(catalog: Catalog, request: PlanRequest) -> list[ServingConfig]:
    """Single-node tensor-parallel configurations (no pipeline stages, no data-parallel ranks)."""
    return [
        c
        for c in configurations(catalog, request)
        if c.pipeline_parallel == 1 and c.data_parallel == 1 and c.unsupported_reason() is None
    ]


def _own_path(catalog: Catalog, cfg: ServingConfig, within_node: bool) -> KvTransferPath | None:
    return kv_transfer_path(catalog, cfg.gpu, cfg.gpu, within_node)


def _prefill_options(catalog: Catalog, request: PlanRequest, within_node: bool) -> list[_PrefillOption]:
    """Per configuration its best chunk budget as a prefill worker, the cheapest per request/s
    first (its TTFT share estimated with itself on both sides and no decode wait); evaluated in
    order of the no-queueing bound until POOL_FINALISTS are known and the next cannot beat them."""
    slo, w = request.slo, request.workload
    tokens_p = transfer_tokens_at_percentile(w, slo.percentile)
    bounded: list[tuple[float, str, int, PrefillWorker, float]] = []
    for cfg in _pool_configs(catalog, request):
        path = _own_path(catalog, cfg, within_node)
        if path is None:
            continue
        share = slo.ttft_s - kv_transfer_s(cfg.model, cfg.kv, cfg.tensor_parallel, tokens_p, path)
        for budget in sorted((b for b in CHUNK_BUDGETS if b >= PREFILL_MIN_BUDGET), reverse=True):
            worker = PrefillWorker(cfg.with_chunk_budget(budget), w, request.least_loaded)
            if not worker.runs or worker.idle_ttft_p_s(slo.percentile) > share:
                continue
            capacity = worker.capacity_rate_per_s()
            if capacity > 0:
                bounded.append((cfg.price_usd_per_hour / capacity, cfg.gpu.name, -budget, worker, share))
    bounded.sort(key=lambda b: (b[0], b[1], b[2], b[3].cfg.tensor_parallel, b[3].cfg.precision.name))
    best: dict[tuple[str, int, str, bool], _PrefillOption] = {}
    costs: list[float] = []
    for bound, _, _, worker, share in bounded:
        if len(costs) >= POOL_FINALISTS and bound > sorted(costs)[POOL_FINALISTS - 1]:
            break
        rate = worker.max_rate(share, slo.percentile)
        if rate <= 0:
            continue
        c = worker.cfg
        key = (c.gpu.name, c.tensor_parallel, c.precision.name, c.expert_parallel)
        known = best.get(key)
        if known is None or rate > known.rate_estimate * 1.02:
            best[key] = _PrefillOption(worker, rate)
            costs.append(c.price_usd_per_hour / rate)
    return sorted(
        best.values(), key=lambda o: (o.worker.cfg.price_usd_per_hour / o.rate_estimate, _name(o.worker.cfg))
    )[: 2 * POOL_FINALISTS]


def _decode_options(catalog: Catalog, request: PlanRequest) -> list[_DecodeOption]:
    """Per configuration its rate as a decode worker, the cheapest per request/s first."""
    bounded: list[tuple[float, DecodeWorker]] = []
    for cfg in _pool_configs(catalog, request):
        worker = DecodeWorker(cfg, request.workload, request.step_target_s)
        if worker.runs:
            capacity = worker.capacity_rate_per_s()
            if capacity > 0:
                bounded.append((cfg.price_usd_per_hour / capacity, worker))
    bounded.sort(key=lambda b: (b[0], _name(b[1].cfg)))
    options: list[_DecodeOption] = []
    costs: list[float] = []
    for bound, worker in bounded:
        if len(costs) >= POOL_FINALISTS and bound > sorted(costs)[POOL_FINALISTS - 1]:
            break
        rate = worker.max_rate(request.slo)
        if rate > 0:
            options.append(_DecodeOption(worker, rate))
            costs.append(worker.cfg.price_usd_per_hour / rate)
    options.sort(key=lambda o: (o.worker.cfg.price_usd_per_hour / o.rate, _name(o.worker.cfg)))
    return options[: 2 * POOL_FINALISTS]


def _name(cfg: ServingConfig) -> tuple[str, int, str, bool]:
    return (cfg.gpu.name, cfg.tensor_parallel, cfg.precision.name, cfg.expert_parallel)


def _pair(
    catalog: Catalog, request: PlanRequest, p: _PrefillOption, d: _DecodeOption, within_node: bool
) -> DisaggregatedPlan | None:
    """One prefill configuration with one decode configuration, sized exactly; None when
    they cannot pair (the connector's TP rule, precisions, no path) or miss the SLO."""
    pc, dc = p.worker.cfg, d.worker.cfg
    if dc.tensor_parallel % pc.tensor_parallel or pc.precision.name != dc.precision.name or pc.kv.name != dc.kv.name:
        return None
    if pc.gpu.vendor != dc.gpu.vendor or pc.engine.profile != dc.engine.profile:
        return None  # one engine build on both sides: the same KV layout and transfer library
    path = kv_transfer_path(catalog, pc.gpu, dc.gpu, within_node)
    if path is None:
        return None
    slo, w = request.slo, request.workload
    rate = w.requests_per_s
    decode_workers = workers_for_rate(rate, d.rate, request.headroom)
    at_load = d.worker.at_rate(rate / decode_workers, slo.percentile)
    transfer_p = kv_transfer_s(
        pc.model, pc.kv, pc.tensor_parallel, transfer_tokens_at_percentile(w, slo.percentile), path
    )
    share = slo.ttft_s - transfer_p - at_load.slot_wait_p_s - at_load.first_step_s
    prefill_rate = p.worker.max_rate(share, slo.percentile)
    if prefill_rate <= 0:
        return None
    prefill_workers = workers_for_rate(rate, prefill_rate, request.headroom)
    prefill_ttft = p.worker.ttft_p_s(rate / prefill_workers, slo.percentile) if rate > 0 else 0.0
    if not math.isfinite(prefill_ttft):
        return None
    if request.max_replicas is not None and max(prefill_workers, decode_workers) > request.max_replicas:
        return None  # the replica limit bounds each pool's workers
    if request.gpu_limits is not None:
        wanted: dict[str, int] = {}
        for cfg, n in ((pc, prefill_workers), (dc, decode_workers)):
            wanted[cfg.gpu.name] = wanted.get(cfg.gpu.name, 0) + n * cfg.gpus
        if any(n > request.gpu_limits.get(g, 0) for g, n in wanted.items()):
            return None
    mean_tokens = uncached_prompt_tokens(w, w.inputs.mean)
    return DisaggregatedPlan(
        request=request,
        prefill=Pool("prefill", pc, prefill_workers, p.worker.max_batch, prefill_rate),
        decode=Pool("decode", dc, decode_workers, d.worker.max_batch, d.rate),
        path=path,
        kv_transfer_s=kv_transfer_s(pc.model, pc.kv, pc.tensor_parallel, mean_tokens, path),
        kv_transfer_p_s=transfer_p,
        ttft_p_s=prefill_ttft + transfer_p + at_load.slot_wait_p_s + at_load.first_step_s,
        tpot_p_s=at_load.tpot_p_s,
        prefill_ttft_s=prefill_ttft,
        decode_first_step_s=at_load.first_step_s,
    )


def _rank(d: DisaggregatedPlan) -> tuple[float | int | str | bool, ...]:
    objective = d.request.objective
    head = (
        (round(d.latency_s, 6), round(d.cost_usd_per_hour, 6))
        if objective == "latency"
        else (
            round(d.cost_usd_per_hour, 6),
            d.gpus_total,
        )
    )
    return (*head, *_name(d.prefill.cfg), *_name(d.decode.cfg))


def plan_disaggregated(catalog: Catalog, request: PlanRequest, within_node: bool = False) -> DisaggregatedPlan | str:
    """The best disaggregated layout, or why there is none. `within_node`: the pools' workers
    share nodes (the transfer takes NVLink); by default they are separate groups of pods and
    the KV crosses the network between nodes."""
    engines = {c.engine.name for c in _pool_configs(catalog, request)}
    if engines and engines != {"vllm"}:
        return f"disaggregated layouts are planned for vLLM's KV connectors only (engine {', '.join(sorted(engines))})"
    if not any(c.memory.fits for c in _pool_configs(catalog, request)):
        return (
            "no worker of one node holds the model (pools of workers that span nodes are not planned yet): "
            "allow larger GPUs or a smaller precision"
        )
    decodes = _decode_options(catalog, request)
    if not decodes:
        return (
            f"no decode worker meets TPOT {format_duration(request.slo.tpot_s)} at batch 1 with the KV of one request"
        )
    prefills = _prefill_options(catalog, request, within_node)
    if not prefills:
        return (
            f"no prefill worker prefills the p{request.slo.percentile:g} prompt and moves its KV within TTFT "
            f"{format_duration(request.slo.ttft_s)}"
        )
    sized = [
        plan for p in prefills for d in decodes if (plan := _pair(catalog, request, p, d, within_node)) is not None
    ]
    if not sized:
        limited = request.max_replicas is not None or request.gpu_limits is not None
        within = ", within the replica limit per pool and the free GPUs" if limited else ""
        return (
            "no prefill and decode pools pair within the SLO (decode TP a multiple of prefill TP, the same "
            f"precision, GPU vendor and engine release{within})"
        )
    return min(sized, key=_rank)


def _ratio_text(mine: float, other: float, what: str) -> str:
    return f"{other / mine:.1f}x {what}" if mine > 0 else what


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _agg_summary(c: Feasible) -> str:
    p = c.prediction
    return f"{p.replicas} x {c.label} ({_gpus(c.total_gpus)}, ${p.cost_usd_per_hour:.2f}/h)"


def _dis_summary(d: DisaggregatedPlan) -> str:
    return (
        f"{d.prefill.workers} prefill x {d.prefill.cfg.gpu.name} x{d.prefill.cfg.tensor_parallel} + "
        f"{d.decode.workers} decode x {d.decode.cfg.gpu.name} x{d.decode.cfg.tensor_parallel} "
        f"({_gpus(d.gpus_total)}, ${d.cost_usd_per_hour:.2f}/h)"
    )


def _disaggregated_wins(d: DisaggregatedPlan, a: Feasible) -> str:
    ap = a.prediction
    if d.request.objective == "latency":
        head = (
            f"disaggregated: {format_duration(d.latency_s)} per request vs "
            f"{format_duration(ap.ttft_p_s + d.request.workload.output_tokens * ap.tpot_p_s)} aggregated"
        )
    elif d.gpus_total < a.total_gpus:
        head = f"disaggregated: {_ratio_text(d.gpus_total, a.total_gpus, 'fewer GPUs')}"
    else:
        head = f"disaggregated: {_ratio_text(d.cost_usd_per_hour, ap.cost_usd_per_hour, 'cheaper')}"
    per_gpu = ap.rate_per_replica_max / a.config.gpus
    return (
        f"{head} ({_dis_summary(d)} vs {_agg_summary(a)}): TPOT {format_duration(d.request.slo.tpot_s)} with "
        f"prompt chunks in the steps holds an aggregated replica ({_gpus(a.config.gpus)}, batch limit {ap.max_batch}) "
        f"to {ap.rate_per_replica_max:.2f} req/s ({per_gpu:.2f} per GPU), while a decode-only worker "
        f"({_gpus(d.decode.cfg.gpus)}) runs batches up to {d.decode.max_batch} at {d.decode.rate_per_worker_max:.2f} "
        f"req/s ({d.decode.rate_per_worker_max / d.decode.cfg.gpus:.2f} per GPU) and a prefill worker carries "
        f"{d.prefill.rate_per_worker_max:.2f}; the KV transfer adds {format_duration(d.kv_transfer_s)} per request "
        f"over {d.path.name}"
    )


def _aggregated_wins(a: Feasible, d: DisaggregatedPlan) -> str:
    w = d.request.workload
    if d.request.objective == "latency":
        ap = a.prediction
        versus = (
            f"{format_duration(ap.ttft_p_s + w.output_tokens * ap.tpot_p_s)} per request vs "
            f"{format_duration(d.latency_s)}"
        )
    else:
        versus = f"{_agg_summary(a)} vs {_dis_summary(d)} disaggregated"
    agg_batch, dec_batch = a.prediction.max_batch, d.decode.max_batch
    if dec_batch > agg_batch:
        freed = f"decode-only batch {dec_batch} vs {agg_batch} aggregated"
    else:  # prompt chunks do not hold the aggregated batch down: a decode-only worker frees nothing
        freed = f"the aggregated replica already runs batch {agg_batch}, the decode-only worker's {dec_batch}"
    return (
        f"aggregated: {versus}; the KV transfer ({format_duration(d.kv_transfer_p_s)} at the "
        f"p{d.request.slo.percentile:g} prompt) and a second queue cost more than they free at "
        f"{w.input_tokens}/{w.output_tokens} ({freed})"
    )


def _better(d: DisaggregatedPlan, a: Feasible) -> bool:
    """Strictly better by the objective (a tie keeps the aggregated plan)."""
    if d.request.objective == "latency":
        ap = a.prediction
        return round(d.latency_s, 6) < round(ap.ttft_p_s + d.request.workload.output_tokens * ap.tpot_p_s, 6)
    return round(d.cost_usd_per_hour, 6) < round(a.prediction.cost_usd_per_hour, 6)


def plan_layouts(
    catalog: Catalog,
    request: PlanRequest,
    disaggregation: Disaggregation = "auto",
    aggregated: Plan | None = None,
    within_node: bool = False,
) -> LayoutPlan:
    """Both layouts searched (`on`: only disaggregated, `off`: only aggregated) and the best
    chosen. `aggregated`: the aggregated plan already made for this request (the CLI's, with
    its simulated check), else it is planned here."""
    if disaggregation not in ("auto", "on", "off"):
        raise ValueError(f"disaggregation must be auto, on or off, got {disaggregation!r}")
    agg = None
    if disaggregation != "on":
        agg = aggregated if aggregated is not None else plan_aggregated(catalog, request)
    dis: DisaggregatedPlan | None = None
    why_none = ""
    if disaggregation != "off":
        found = plan_disaggregated(catalog, request, within_node)
        if isinstance(found, str):
            why_none = found
        else:
            dis = found
    a = agg.chosen if agg is not None and agg.feasible else None
    if disaggregation == "off":
        mode: Layout | None = "aggregated" if a is not None else None
        reason = "aggregated only (--disaggregation off)"
    elif disaggregation == "on":
        mode = "disaggregated" if dis is not None else None
        reason = "disaggregated only (--disaggregation on)" if dis is not None else why_none
    elif dis is None:
        mode = "aggregated" if a is not None else None
        reason = f"aggregated: {why_none}"
    elif a is None:
        mode = "disaggregated"
        reason = "disaggregated: no aggregated replica meets the SLO"
    elif _better(dis, a):
        mode, reason = "disaggregated", _disaggregated_wins(dis, a)
    else:
        mode, reason = "aggregated", _aggregated_wins(a, dis)
    if dis is not None:
        dis = _with_reason(dis, reason if mode == "disaggregated" else "")
    return LayoutPlan(request, disaggregation, mode, agg, dis, why_none, reason)


def _with_reason(d: DisaggregatedPlan, reason: str) -> DisaggregatedPlan:
    return replace(d, reason=reason)


def kv_transfer_config(role: Role) -> str:
    """The `--kv-transfer-config` JSON a pool's vLLM runs with (vllm/config/kv_transfer.py
    KVTransferConfig: kv_connector, kv_role; the role is required once a connector is set)."""
    del role  # NixlConnector takes each request's role from its kv_transfer_params
    return json.dumps({"kv_connector": KV_CONNECTOR, "kv_role": KV_ROLE}, separators=(",", ":"))


def pool_launch(
    pool: Pool,
    source: str | None,
    requested_max_context: int | None,
    typical_context: int,
    port: int = 8000,
    cached: bool = False,
) -> PlannedLaunch:
    """A pool's engine launch (may raise CheckpointError or ContextLimitError, as plan_launch)."""
    return plan_launch(
        pool.cfg,
        source,
        requested_max_context,
        typical_context,
        pool.max_batch,
        pool.cfg.memory.kv_capacity_tokens,
        port,
        cached,
    )


def pool_engine_args(launch: PlannedLaunch, role: Role) -> list[str]:
    """The pool's vLLM arguments: the plan's, and its KV connector."""
    return [*vllm_args(launch.launch), "--kv-transfer-config", kv_transfer_config(role)]
