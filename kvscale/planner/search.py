"""The planner: every GPU type x tensor-parallel degree x precision, the cheapest (or fastest)
that meets the SLO, and for every other candidate the reason it lost."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from kvscale.engines.knobs import CLI_KNOBS, Knobs
from kvscale.sizing.catalog import Catalog, GpuSpec, ModelArch
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.engine_profiles import profile_on
from kvscale.sizing.load import CHUNK_BUDGETS, LoadPoint, ReplicaModel, chunk_budget_for
from kvscale.sizing.queueing import replicas_for_rate
from kvscale.sizing.units import GIB, format_duration
from kvscale.sizing.workload import Slo, Workload

Objective = Literal["cost", "latency"]
Verdict = Literal["chosen", "alternative", "rejected", "outranked"]
TENSOR_PARALLEL_DEGREES = (1, 2, 4, 8)
DEFAULT_HEADROOM = 0.10
BUDGET_RATE_TOLERANCE = 0.02  # a chunk budget must carry 2% more than the best so far to replace it
FULLY_RANKED = 5  # alternatives evaluated in full, beyond the chosen one
DATA_PARALLEL_DEGREES = (2, 4, 8)  # data-parallel attention ranks per replica in one node; also two whole nodes
MAX_PIPELINE_NODES = 4  # most nodes one replica may span (pipeline stages of a whole node each)


@dataclass(frozen=True)
class Prediction:
    """What a feasible candidate is predicted to do at the requested load."""

    max_batch: int
    replicas: int
    rate_per_replica_max: float  # the most one replica sustains within the SLO
    ttft_p_s: float  # at the requested load spread over `replicas`
    tpot_p_s: float
    throughput_tokens_per_s: float  # generated tokens per second per replica at max rate
    limited_by: str
    mbu: float
    mfu: float
    kv_cache_tokens: int
    weights_bytes_per_gpu: float
    cost_usd_per_hour: float
    limited_why: str = ""  # the binding term in a sentence, and why the hardware is not busier
    # The p99 gap between two tokens of one request at the requested load (a chunk step stalls
    # every running request: the per-request TPOT averages it away), and the longest step a
    # running request can sit through (a full chunk budget beside the whole batch): what
    # PlanRequest.max_itl_s bounds.
    itl_p99_s: float = 0.0
    itl_max_s: float = 0.0


class _Configured:
    """The names a candidate with a ServingConfig shows (Feasible and Outranked)."""

    config: ServingConfig

    @property
    def gpu(self) -> str:
        return self.config.gpu.name

    @property
    def tensor_parallel(self) -> int:
        return self.config.tensor_parallel

    @property
    def pipeline_parallel(self) -> int:
        return self.config.pipeline_parallel

    @property
    def nodes(self) -> int:
        return self.config.nodes

    @property
    def expert_parallel(self) -> bool:
        return self.config.expert_parallel

    @property
    def data_parallel(self) -> int:
        return self.config.data_parallel

    @property
    def precision(self) -> str:
        return self.config.precision.name

    @property
    def kv_cache_precision(self) -> str:
        return self.config.kv.name

    @property
    def label(self) -> str:
        return _label(
            self.gpu,
            self.tensor_parallel,
            self.pipeline_parallel,
            self.precision,
            self.expert_parallel,
            self.data_parallel,
        )


def _label(
    gpu: str,
    tensor_parallel: int,
    pipeline_parallel: int,
    precision: str,
    expert_parallel: bool = False,
    data_parallel: int = 1,
) -> str:
    if data_parallel > 1:  # data-parallel attention, experts over the ranks
        return f"{gpu} x{data_parallel}dp {precision}"
    ep = " ep" if expert_parallel else ""
    if pipeline_parallel > 1:
        return f"{gpu} x{tensor_parallel}x{pipeline_parallel}pp{ep} {precision}"
    return f"{gpu} x{tensor_parallel}{ep} {precision}"


@dataclass(frozen=True)
class SimulatedSizing:
    """The replica count the simulated check settled on (a sample of the workload replayed on
    the plan's configuration, the same routing), beside the analytic model's count.

    The analytic model proposes; the simulator disposes: `replicas` is the fewest the search
    found meeting the SLO percentile, below or above the analytic count, or, when no fleet
    it tried meets it (`met` false), the closest fleet: the fewest reaching the best
    attainment seen. Filled by kvscale.sim.check (the sizing core does not simulate)."""

    analytic_replicas: int
    # share of the sample meeting both targets on the analytic count; None: not replayed (far
    # above the fewest the load needs, the search started below it)
    analytic_attainment: float | None
    replicas: int
    attainment: float  # at `replicas`
    target: float  # the SLO percentile as a share (0.99)
    met: bool
    requests: int  # the sample's size
    span_s: float
    routing: Literal["service", "gateway"] = "service"
    # (replicas, attainment) of every replay run in full, in order (one stopped at its first
    # miss beyond the allowance is not listed: it only said no)
    tried: tuple[tuple[int, float], ...] = ()
    why: str = ""  # why the counts differ, in a sentence ("" when they agree)

    @property
    def rate_per_s(self) -> float:
        return self.requests / self.span_s if self.span_s > 0 else 0.0


@dataclass(frozen=True)
class Feasible(_Configured):
    """A candidate that meets the SLO at the requested load: the chosen one or an alternative.

    It carries the exact configuration the prediction was made for (chunk budget
    included), so callers deploy or simulate `config` instead of rebuilding one. A chosen
    plan that was checked in the simulator carries that check: its prediction's replicas are
    then the simulator's count and `check.analytic_replicas` the model's.
    """

    config: ServingConfig
    prediction: Prediction
    verdict: Literal["chosen", "alternative"]
    reason: str
    check: SimulatedSizing | None = None

    @property
    def analytic_replicas(self) -> int:
        """The replicas the analytic model asked for (the prediction's, when unchecked)."""
        return self.check.analytic_replicas if self.check is not None else self.prediction.replicas

    @property
    def max_num_batched_tokens(self) -> int:
        """The chunked-prefill token budget the prediction assumed (`--max-num-batched-tokens`:
        each engine's, with data-parallel attention)."""
        return self.config.rank_chunk_budget_tokens

    @property
    def total_gpus(self) -> int:
        return self.config.gpus * self.prediction.replicas


@dataclass(frozen=True)
class Rejected:
    """A candidate that cannot run, does not fit, or cannot meet the SLO, and why."""

    gpu: str
    tensor_parallel: int
    precision: str
    kv_cache_precision: str
    reason: str
    # For SLO misses: the best this candidate can do, to say what would make it feasible.
    best_ttft_s: float | None = None
    best_tpot_s: float | None = None
    verdict: Literal["rejected"] = "rejected"
    pipeline_parallel: int = 1
    nodes: int = 1
    # Met the SLO per replica but needed more replicas than a limit allows: how many, by which limit.
    replicas_needed: int | None = None
    limit: Literal["max_replicas", "free_gpus"] | None = None
    expert_parallel: bool = False
    data_parallel: int = 1
    # Missed the inter-token latency bound at every chunk budget: its shortest worst step.
    best_itl_s: float | None = None

    @property
    def label(self) -> str:
        return _label(
            self.gpu,
            self.tensor_parallel,
            self.pipeline_parallel,
            self.precision,
            self.expert_parallel,
            self.data_parallel,
        )


@dataclass(frozen=True)
class Outranked(_Configured):
    """A candidate that passed every load-independent check but whose optimistic bound on
    the objective already loses to the fully ranked ones, so it was not evaluated in full."""

    config: ServingConfig
    bound: float  # lower bound of the ranking metric ($/h, or seconds per request)
    reason: str
    verdict: Literal["outranked"] = "outranked"


Candidate = Feasible | Rejected | Outranked


@dataclass(frozen=True)
class PlanRequest:
    model: ModelArch
    workload: Workload
    slo: Slo
    gpus: tuple[str, ...] = ()  # empty: every catalog type
    tensor_parallel: tuple[int, ...] = TENSOR_PARALLEL_DEGREES
    precisions: tuple[str, ...] = ("bf16",)
    kv_cache_precision: str = "auto"
    objective: Objective = "cost"
    headroom: float = DEFAULT_HEADROOM
    max_replicas: int | None = None
    gpu_limits: Mapping[str, int] | None = None  # free GPUs per type (cluster inventory)
    engine: str = "vllm"  # the engine's name (its profile per GPU: engine_image's tag), or a profile key
    # The images the engine pods run, on NVIDIA and on AMD GPUs (spec.engine.image / rocmImage):
    # their tags name the release whose profile sizes them (kvscale.sizing.engine_profiles.profile_on);
    # None: the catalog's image's.
    engine_image: str | None = None
    rocm_engine_image: str | None = None
    # MoE: also replicas of 2, 4 or 8 data-parallel attention ranks (vLLM --data-parallel-size
    # with --enable-expert-parallel); spec.hardware.dataParallelAttention in the operator.
    data_parallel_attention: bool = False
    # Requests reach replicas through a least-loaded router (a gateway's endpoint picker, an
    # InferencePool): a new prompt joins a busy replica only when none is idle, and the
    # fleet's prefill work drains as one queue. False: a plain Service, routed at random.
    least_loaded: bool = False
    # How suggestions name the knobs: the CLI's flags, or the resource's fields (the operator).
    knobs: Knobs = CLI_KNOBS
    # Bound on the gap between two tokens of one request (--itl, spec.slo.maxInterTokenLatency):
    # a chunk budget whose worst step (ReplicaModel.worst_step_s) exceeds it is not used.
    max_itl_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_itl_s is not None and not self.max_itl_s > 0:
            raise ValueError(f"the inter-token latency bound must be positive, got {self.max_itl_s}")

    @property
    def step_target_s(self) -> float:
        """The longest decode step the batch limit allows: the TPOT target, or the inter-token
        bound when it is tighter (a decode step is a token gap too)."""
        if self.max_itl_s is None:
            return self.slo.tpot_s
        return min(self.slo.tpot_s, self.max_itl_s)


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    chosen: Feasible | None
    alternatives: tuple[Feasible, ...]  # fully evaluated runners-up, best first
    rejected: tuple[Rejected, ...]
    suggestions: tuple[str, ...] = field(default=())
    outranked: tuple[Outranked, ...] = field(default=())  # feasible-looking, not evaluated in full

    @property
    def feasible(self) -> bool:
        """A chosen candidate whose simulated check (when one ran) met the SLO: a check no
        fleet passes makes the plan infeasible, its `chosen` then the closest fleet."""
        return self.chosen is not None and (self.chosen.check is None or self.chosen.check.met)

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        head: tuple[Candidate, ...] = (self.chosen,) if self.chosen else ()
        return head + self.alternatives + self.outranked + self.rejected


def _reject(
    cfg: ServingConfig, reason: str, best_ttft_s: float | None = None, best_tpot_s: float | None = None
) -> Rejected:
    return Rejected(
        cfg.gpu.name,
        cfg.tensor_parallel,
        cfg.precision.name,
        cfg.kv.name,
        reason,
        best_ttft_s,
        best_tpot_s,
        pipeline_parallel=cfg.pipeline_parallel,
        nodes=cfg.nodes,
        expert_parallel=cfg.expert_parallel,
        data_parallel=cfg.data_parallel,
    )


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB"


@dataclass(frozen=True)
class _Screened:
    """A candidate that passed the load-independent checks, with its optimistic bound."""

    cfg: ServingConfig
    replica: ReplicaModel
    max_batch: int
    idle: LoadPoint
    bound: float  # lower bound of the ranking metric: cost at no-queueing capacity, or idle latency
    # Every chunk budget the candidate may run with (the first is `cfg`'s): the load model
    # picks the one that carries the most load within the SLO.
    options: tuple[_Option, ...] = ()
    budget_free: bool = True  # the planner picks the chunk budget (the request did not pin one)


@dataclass(frozen=True)
class _Option:
    """One chunk budget of a candidate: its configuration, model and batch limit."""

    cfg: ServingConfig
    replica: ReplicaModel
    max_batch: int
    capacity_per_s: float  # optimistic: no queueing


def _physics_key(cfg: ServingConfig) -> tuple[object, ...]:
    """What the step times depend on: precisions that differ only in name and dtype flag
    (bf16 and fp16: 2 bytes, the 16-bit path) share one screening."""
    p = cfg.precision
    return (
        cfg.gpu.name,
        cfg.tensor_parallel,
        cfg.pipeline_parallel,
        cfg.expert_parallel,
        cfg.data_parallel,
        p.bytes_per_param,
        p.applies_to,
        p.compute,
        p.weight_bandwidth_efficiency,
        p.matmul_efficiency_factor,
        cfg.kv.name,
        cfg.chunk_budget_tokens,
    )


def _screen_once(
    cfg: ServingConfig, request: PlanRequest, twins: dict[tuple[object, ...], Rejected | _Screened]
) -> Rejected | _Screened:
    """_screen, reusing a physically identical twin's verdict under this config's name."""
    unsupported = cfg.unsupported_reason()
    if unsupported:
        return _reject(cfg, unsupported)
    key = _physics_key(cfg)
    twin = twins.get(key)
    if twin is None:
        twin = twins[key] = _screen(cfg, request)
        return twin
    if isinstance(twin, Rejected):
        return replace(twin, precision=cfg.precision.name)
    mine = replace(twin.cfg, precision=cfg.precision)
    options = tuple(
        replace(o, cfg=(c := replace(o.cfg, precision=cfg.precision)), replica=o.replica.renamed(c))
        for o in twin.options
    )
    return replace(twin, cfg=mine, replica=twin.replica.renamed(mine), options=options)


def _screen(cfg: ServingConfig, request: PlanRequest) -> Rejected | _Screened:
    """Load-independent verdicts: can it run, does it fit, can it ever meet the SLO."""
    unsupported = cfg.unsupported_reason()
    if unsupported:
        return _reject(cfg, unsupported)
    steps = ReplicaModel(cfg, request.workload, least_loaded=request.least_loaded)
    pinned = cfg.chunk_budget_tokens is not None
    if not pinned:
        cfg = cfg.with_chunk_budget(
            chunk_budget_for(cfg, request.workload, request.slo.tpot_s, steps, max_step_s=request.max_itl_s)
        )
    mem = cfg.memory
    if not mem.fits:
        return _reject(
            cfg,
            f"does not fit: {_gib(mem.weights_bytes)} of weights + {_gib(mem.reserve_bytes)} engine reserve per GPU "
            f"exceed the {_gib(mem.usable_bytes)} usable of {cfg.gpu.name}",
        )
    replica = ReplicaModel(cfg, request.workload, steps_from=steps, least_loaded=request.least_loaded)
    if not replica.max_context_fits:
        return _reject(
            cfg,
            f"KV cache holds {mem.kv_capacity_tokens} tokens per replica, less than one sequence of "
            f"max context {request.workload.engine_max_context_tokens}",
        )
    slo = request.slo
    max_batch = replica.tpot_batch_limit(request.step_target_s)
    if max_batch >= 1 and request.max_itl_s is not None and replica.worst_step_s(max_batch) > request.max_itl_s:
        within = None if pinned else _itl_smaller_budget(cfg, request, steps)
        if within is None:
            return _itl_reject(cfg, request, steps)
        cfg, replica, max_batch = within.cfg, within.replica, within.max_batch
    idle = replica.zero_load(slo.percentile)
    if max_batch < 1:
        if request.step_target_s < slo.tpot_s:
            return _itl_reject(cfg, request, steps)
        return _reject(
            cfg,
            f"TPOT {format_duration(idle.tpot_p_s)} at batch 1 exceeds the {format_duration(slo.tpot_s)} target",
            best_ttft_s=idle.ttft_p_s,
            best_tpot_s=idle.tpot_p_s,
        )
    options = (
        [_Option(cfg, replica, max_batch, replica.capacity_rate_per_s(max_batch))]
        if idle.ttft_p_s <= slo.ttft_s
        else []
    )
    best_idle = idle
    # The largest budget that fits carries the most with no queueing and has the shortest
    # idle TTFT (fewest, most efficient chunks): it alone sets the optimistic bound; the
    # budgets between are built when the candidate is evaluated in full.
    for budget in () if pinned else sorted(CHUNK_BUDGETS, reverse=True):
        if budget == cfg.max_num_batched_tokens:
            break
        option = _option(cfg.with_chunk_budget(budget), request, replica)
        if option is None:
            continue
        its_idle = option.replica.zero_load(slo.percentile)
        best_idle = min(best_idle, its_idle, key=lambda p: p.ttft_p_s)
        if its_idle.ttft_p_s <= slo.ttft_s:
            options.append(option)
        break
    if not options:
        return _reject(
            cfg,
            f"TTFT {format_duration(best_idle.ttft_p_s)} with no load exceeds the {format_duration(slo.ttft_s)} target",
            best_ttft_s=best_idle.ttft_p_s,
            best_tpot_s=best_idle.tpot_p_s,
        )
    first = options[0]
    if request.objective == "latency":
        bound = best_idle.ttft_p_s + request.workload.output_tokens * best_idle.tpot_p_s
    else:
        capacity = max(o.capacity_per_s for o in options)
        bound = replicas_for_rate(request.workload.requests_per_s, capacity, request.headroom) * cfg.price_usd_per_hour
    return _Screened(first.cfg, first.replica, first.max_batch, best_idle, bound, tuple(options), not pinned)


def _option(cfg: ServingConfig, request: PlanRequest, steps: ReplicaModel) -> _Option | None:
    """The candidate under one chunk budget, or None when it cannot run with it (or its
    worst step exceeds the inter-token latency bound)."""
    if not cfg.memory.fits:
        return None
    model = ReplicaModel(cfg, request.workload, steps_from=steps, least_loaded=request.least_loaded)
    batch = model.tpot_batch_limit(request.step_target_s)
    if batch < 1 or not model.max_context_fits:
        return None
    if request.max_itl_s is not None and model.worst_step_s(batch) > request.max_itl_s:
        return None
    return _Option(cfg, model, batch, model.capacity_rate_per_s(batch))


def _itl_smaller_budget(cfg: ServingConfig, request: PlanRequest, steps: ReplicaModel) -> _Option | None:
    """The largest chunk budget below `cfg`'s whose worst step keeps the inter-token bound
    (with its own batch limit), or None."""
    for budget in sorted(CHUNK_BUDGETS, reverse=True):
        if budget < cfg.max_num_batched_tokens:
            option = _option(cfg.with_chunk_budget(budget), request, steps)
            if option is not None:
                return option
    return None


def _itl_reject(cfg: ServingConfig, request: PlanRequest, steps: ReplicaModel) -> Rejected:
    """Every chunk budget's worst step exceeds the inter-token latency bound: the reason names
    the knob and the shortest worst step there is (the smallest budget, batch limit 1)."""
    assert request.max_itl_s is not None
    smallest = cfg if cfg.chunk_budget_tokens is not None else cfg.with_chunk_budget(min(CHUNK_BUDGETS))
    model = ReplicaModel(smallest, request.workload, steps_from=steps, least_loaded=request.least_loaded)
    best_s = model.worst_step_s(1)
    knob = request.knobs.itl
    return replace(
        _reject(
            smallest,
            f"inter-token latency: a step of the {smallest.max_num_batched_tokens}-token chunk budget (the smallest "
            f"it may run) takes {format_duration(best_s)}, above the {knob} bound of "
            f"{format_duration(request.max_itl_s)}",
        ),
        best_itl_s=best_s,
    )


def _budget_options(s: _Screened, request: PlanRequest) -> list[_Option]:
    """Every chunk budget the candidate can run with and whose idle TTFT meets the target."""
    known = {o.cfg.max_num_batched_tokens: o for o in s.options}
    options = []
    for budget in CHUNK_BUDGETS:
        option = known.get(budget) or _option(s.cfg.with_chunk_budget(budget), request, s.replica)
        if option is not None and option.replica.zero_load(request.slo.percentile).ttft_p_s <= request.slo.ttft_s:
            options.append(option)
    return options or list(s.options)


def _candidate_options(s: _Screened, request: PlanRequest) -> list[_Option]:
    """The chunk budgets _best_option weighs for a candidate."""
    return _budget_options(s, request) if s.budget_free else list(s.options)


def _best_option(s: _Screened, request: PlanRequest, weighed: list[_Option] | None = None) -> tuple[_Option, float]:
    """The chunk budget (and its batch limit) under which one replica carries the most load
    within the SLO, and that rate.

    Budgets are tried by optimistic capacity; each after the first is first checked just
    above the best rate so far (by BUDGET_RATE_TOLERANCE), and only one that beats it is
    bisected in full. Budgets within the tolerance keep the one tried first: the larger
    optimistic capacity. A smaller budget is not preferred on a tie: the simulator's
    per-minute bound is cheaper on the larger budget (2026-11-26: Mooncake behind a gateway
    18.0 GPU-h against 22.3 on the smaller budget a tie-break for small chose), and a larger
    budget drains a burst beyond the planned load in fewer, more efficient steps.
    """
    slo = request.slo
    options = sorted(
        _candidate_options(s, request) if weighed is None else weighed,
        key=lambda o: (-o.capacity_per_s, o.cfg.max_num_batched_tokens),
    )
    tol = BUDGET_RATE_TOLERANCE
    best, best_rate = options[0], options[0].replica.max_rate_meeting(slo, options[0].max_batch)
    for option in options[1:]:
        if option.capacity_per_s <= best_rate * (1.0 + tol) or best_rate <= 0:
            break
        if not option.replica.meets(slo, option.max_batch, best_rate * (1.0 + tol)):
            continue
        best, best_rate = option, option.replica.max_rate_meeting(slo, option.max_batch, best_rate * (1.0 + tol))
    return best, max(best_rate, 0.0)


@dataclass(frozen=True)
class Sized:
    """A candidate's replicas and cost, without its predicted latencies (`cheapest`)."""

    option: _Option
    rate_per_replica_max: float
    replicas: int

    @property
    def config(self) -> ServingConfig:
        return self.option.cfg

    @property
    def cost_usd_per_hour(self) -> float:
        return self.replicas * self.option.cfg.price_usd_per_hour


def _size(s: _Screened, request: PlanRequest, weighed: list[_Option] | None = None) -> Sized | Rejected:
    """The load-dependent part up to the replicas: the rate one replica sustains, and how many
    carry the load within the request's limits."""
    option, rate_max = _best_option(s, request, weighed)
    cfg = option.cfg
    if rate_max <= 0:
        return _reject(
            cfg, "meets neither target under any load", best_ttft_s=s.idle.ttft_p_s, best_tpot_s=s.idle.tpot_p_s
        )
    replicas = replicas_for_rate(request.workload.requests_per_s, rate_max, request.headroom)
    if request.max_replicas is not None and replicas > request.max_replicas:
        return replace(
            _reject(cfg, f"needs {replicas} replicas, more than maxReplicas {request.max_replicas}"),
            replicas_needed=replicas,
            limit="max_replicas",
        )
    if request.gpu_limits is not None:
        free = request.gpu_limits.get(cfg.gpu.name, 0)
        if replicas * cfg.gpus > free:
            return replace(
                _reject(cfg, f"needs {replicas * cfg.gpus} {cfg.gpu.name} GPUs, the cluster has {free} free"),
                replicas_needed=replicas,
                limit="free_gpus",
            )
    return Sized(option, rate_max, replicas)


def _evaluate(s: _Screened, request: PlanRequest) -> Feasible | Rejected:
    """The load-dependent part: the rate one replica sustains, replicas, predictions."""
    slo = request.slo
    size = _size(s, request)
    if isinstance(size, Rejected):
        return size
    option, rate_max, replicas = size.option, size.rate_per_replica_max, size.replicas
    cfg, replica, max_batch = option.cfg, option.replica, option.max_batch
    at_load = replica.at_rate(request.workload.requests_per_s / replicas, max_batch, slo.percentile)
    at_max = replica.at_rate(rate_max, max_batch, slo.percentile)
    mem = cfg.memory
    prediction = Prediction(
        max_batch=max_batch,
        replicas=replicas,
        rate_per_replica_max=rate_max,
        ttft_p_s=at_load.ttft_p_s,
        tpot_p_s=at_load.tpot_p_s,
        throughput_tokens_per_s=rate_max * request.workload.output_tokens,
        limited_by=(limit := replica.limited_by(at_max, slo)),
        limited_why=replica.explain(at_max, slo, limit),
        mbu=at_max.mbu,
        mfu=at_max.mfu,
        kv_cache_tokens=mem.kv_capacity_tokens,
        weights_bytes_per_gpu=mem.weights_bytes,
        cost_usd_per_hour=replicas * cfg.price_usd_per_hour,
        itl_p99_s=replica.itl_percentile_s(at_load),
        itl_max_s=replica.worst_step_s(max_batch),
    )
    return Feasible(cfg, prediction, "alternative", "")


def _metric(candidate: Feasible, objective: Objective, output_tokens: int) -> float:
    p = candidate.prediction
    if objective == "latency":
        return p.ttft_p_s + output_tokens * p.tpot_p_s
    return p.cost_usd_per_hour


def _rank_key(candidate: Feasible, objective: Objective, output_tokens: int) -> tuple[float | str | int, ...]:
    p = candidate.prediction
    latency = p.ttft_p_s + output_tokens * p.tpot_p_s
    tie = (
        candidate.total_gpus,
        candidate.gpu,
        candidate.tensor_parallel,
        candidate.pipeline_parallel,
        candidate.expert_parallel,  # at a tie, experts split by tensor parallelism (the engine's default)
        candidate.data_parallel,
        candidate.precision,
    )
    if objective == "latency":
        return (round(latency, 6), round(p.cost_usd_per_hour, 6), *tie)
    # At equal cost, more and smaller replicas first (2 x TP4 over 1 x TP8): a lost pod or a
    # rolling update takes a smaller share of the fleet, and a surge needs fewer spare GPUs.
    return (round(p.cost_usd_per_hour, 6), candidate.config.gpus, round(latency, 6), *tie)


SMALLER_REPLICAS_WHY = "more, smaller replicas at equal cost: a lost pod or a rollout takes a smaller share"


def _equal_cost_note(best: Feasible, feasible: list[Feasible], objective: Objective) -> str:
    """Says when an equally cheap plan with larger replicas lost to the chosen one."""
    if objective != "cost":
        return ""
    cost = round(best.prediction.cost_usd_per_hour, 6)
    larger = [
        c for c in feasible[1:] if round(c.prediction.cost_usd_per_hour, 6) == cost and c.config.gpus > best.config.gpus
    ]
    if not larger:
        return ""
    other = larger[0]
    return (
        f"; preferred over {other.prediction.replicas} replica(s) x {_replica_shape(other)} at the same cost "
        f"({SMALLER_REPLICAS_WHY})"
    )


def _loss_reason(candidate: Feasible, chosen: Feasible, objective: Objective, output_tokens: int) -> str:
    p, c = candidate.prediction, chosen.prediction
    if objective == "latency":
        mine = p.ttft_p_s + output_tokens * p.tpot_p_s
        best = c.ttft_p_s + output_tokens * c.tpot_p_s
        if mine > best + 1e-9:
            return f"slower: {format_duration(mine)} per request vs {format_duration(best)}"
    if p.cost_usd_per_hour > c.cost_usd_per_hour + 1e-9:
        return (
            f"costs ${p.cost_usd_per_hour:.2f}/h ({p.replicas} replica(s) x {candidate.config.gpus} GPU(s)) "
            f"vs ${c.cost_usd_per_hour:.2f}/h"
        )
    if candidate.expert_parallel and not chosen.expert_parallel and p.cost_usd_per_hour <= c.cost_usd_per_hour + 1e-9:
        return (
            f"same cost with experts split by tensor parallelism (TPOT {format_duration(c.tpot_p_s)} vs "
            f"{format_duration(p.tpot_p_s)} here): with whole experts per rank the busiest rank sets each step"
        )
    if objective == "cost" and candidate.config.gpus > chosen.config.gpus:
        return (
            f"same cost, larger replicas ({candidate.config.gpus} vs {chosen.config.gpus} GPUs): {SMALLER_REPLICAS_WHY}"
        )
    return "ties on cost and latency; lost the deterministic tie-break (fewer GPUs, then name)"


def _suggestions(
    request: PlanRequest, rejected: Iterable[Rejected], node_gpus: Mapping[str, int] | None = None
) -> tuple[str, ...]:
    """For an infeasible SLO: the closest candidates and what would make them feasible.
    `node_gpus`: GPUs a node of each type holds (no "larger tensor-parallel degree" past it)."""
    rejected = list(rejected)
    node_gpus = node_gpus or {}
    slo = request.slo
    knobs = request.knobs
    near: list[tuple[float, Rejected]] = []
    for c in rejected:
        if c.best_ttft_s is None or c.best_tpot_s is None:
            continue
        gap = max(c.best_ttft_s / slo.ttft_s, c.best_tpot_s / slo.tpot_s)
        near.append((gap, c))
    near.sort(key=lambda item: (item[0], item[1].gpu, item[1].tensor_parallel, item[1].precision))
    lines = []
    for _, c in near[:3]:
        assert c.best_ttft_s is not None and c.best_tpot_s is not None
        needs = []
        if c.best_ttft_s > slo.ttft_s:
            needs.append(knobs.to(knobs.ttft, _ceil_ms(c.best_ttft_s * 1.1)))
        if c.best_tpot_s > slo.tpot_s:
            needs.append(knobs.to(knobs.tpot, _ceil_ms(c.best_tpot_s * 1.1)))
        if not needs:
            # Both within their targets with no load, yet no load is carried within them: the
            # target nearer its figure leaves no room for queueing; the same 10% margin, over
            # the target (the figure is already below it).
            ttft_tighter = c.best_ttft_s / slo.ttft_s >= c.best_tpot_s / slo.tpot_s
            knob, target_s = (knobs.ttft, slo.ttft_s) if ttft_tighter else (knobs.tpot, slo.tpot_s)
            lines.append(
                f"{c.label}: best TTFT {format_duration(c.best_ttft_s)}, TPOT {format_duration(c.best_tpot_s)} "
                f"with no load, too close to the target to carry any; feasible with {knobs.to(knob, _ceil_ms(target_s * 1.1))} "
                f"({_bigger(c, node_gpus)})"
            )
            continue
        lines.append(
            f"{c.label}: best TTFT {format_duration(c.best_ttft_s)}, TPOT {format_duration(c.best_tpot_s)}; "
            f"feasible with {knobs.joiner.join(needs)} ({_bigger(c, node_gpus)})"
        )
    limits = _limit_suggestions(request, rejected)
    # When a replica or GPU limit binds, relaxing TTFT/TPOT does not help: the latencies above are
    # a replica's at batch 1, which serves the load with even more replicas. The limit is the fix.
    lines = limits or [*_itl_suggestions(request, rejected), *lines]
    if not lines:
        whole_node = all(c.tensor_parallel >= node_gpus.get(c.gpu, 8) for c in rejected if "does not fit" in c.reason)
        more = "more nodes per replica" if whole_node else "a higher tensor-parallel degree"
        lines.append(
            f"no candidate fits in memory: allow larger GPUs, {more}, or a smaller precision "
            f"(e.g. {knobs.to(knobs.precision, knobs.smaller_precision)})"
        )
    return tuple(lines)


def _itl_suggestions(request: PlanRequest, rejected: Iterable[Rejected]) -> list[str]:
    """Candidates whose every chunk budget steps longer than the inter-token latency bound: the
    bound binds; the shortest worst step says what bound would let one through."""
    missed = [c for c in rejected if c.best_itl_s is not None]
    if not missed or request.max_itl_s is None:
        return []
    best = min(missed, key=lambda c: (c.best_itl_s or 0.0, c.gpu, c.tensor_parallel, c.precision))
    assert best.best_itl_s is not None
    knobs = request.knobs
    return [
        f"{knobs.itl} binds: {len(missed)} candidate(s) step longer than {format_duration(request.max_itl_s)} even "
        f"with the smallest chunk budget; the shortest worst step is {format_duration(best.best_itl_s)} on "
        f"{best.label}: feasible with {knobs.to(knobs.itl, _ceil_ms(best.best_itl_s * 1.1))} (or a faster GPU / more "
        "tensor parallelism)"
    ]


def _limit_suggestions(request: PlanRequest, rejected: Iterable[Rejected]) -> list[str]:
    """Candidates that meet the SLO but need more replicas (or GPUs) than a limit allows: the
    limit binds, not memory or latency. Names the limit and the smallest fleet that would do."""
    lines = []
    knobs = request.knobs
    rps = f"{request.workload.requests_per_s:g} req/s"
    for limit in ("max_replicas", "free_gpus"):
        capped = [c for c in rejected if c.limit == limit and c.replicas_needed is not None]
        if not capped:
            continue
        if limit == "max_replicas":  # the smallest limit that would let one through
            best = min(
                capped,
                key=lambda c: (
                    c.replicas_needed or 0,
                    (c.replicas_needed or 0) * c.tensor_parallel * c.pipeline_parallel,
                ),
            )
        else:  # the fewest GPUs that would do
            best = min(
                capped,
                key=lambda c: (
                    (c.replicas_needed or 0) * c.tensor_parallel * c.pipeline_parallel,
                    c.replicas_needed or 0,
                ),
            )
        n = best.replicas_needed or 0
        if limit == "max_replicas":
            lines.append(
                f"{knobs.to(knobs.max_replicas, str(request.max_replicas))} binds: {len(capped)} candidate(s) meet the "
                f"SLO per replica but need more replicas for {rps}; the fewest is {n} replicas of {best.label}: raise "
                f"{knobs.max_replicas} to {n}, or lower {knobs.rps}"
            )
        else:
            lines.append(
                f"the cluster's free GPUs bind: {len(capped)} candidate(s) meet the SLO per replica but need more GPUs "
                f"than are free for {rps}; the fewest is {n} replicas of {best.label} ({n * best.tensor_parallel * best.pipeline_parallel} "
                f"{best.gpu} GPUs): free or add GPUs, or lower {knobs.rps}"
            )
    return lines


def _bigger(c: Rejected, node_gpus: Mapping[str, int]) -> str:
    """What more hardware would do for a near miss: more TP within the node, else a faster GPU."""
    if c.tensor_parallel < node_gpus.get(c.gpu, 8):
        return "or a larger tensor-parallel degree / faster GPU"
    return f"or a faster GPU: tensor parallel {c.tensor_parallel} is a whole {c.gpu} node"


def _ceil_ms(seconds: float) -> str:
    return f"{math.ceil(seconds * 1000)}ms"


def _engine_on(catalog: Catalog, request: PlanRequest, gpu: GpuSpec) -> str:
    """The key of the engine profile the pods on `gpu` run (the image's release)."""
    return profile_on(catalog, request.engine, gpu, request.engine_image, request.rocm_engine_image).profile


def configurations(catalog: Catalog, request: PlanRequest) -> list[ServingConfig]:
    gpus: list[GpuSpec] = [catalog.gpu(g) for g in request.gpus] if request.gpus else list(catalog.gpus.values())
    engines = {gpu.name: _engine_on(catalog, request, gpu) for gpu in gpus}
    configs = [
        ServingConfig.build(catalog, request.model, gpu, precision, tp, request.kv_cache_precision, engines[gpu.name])
        for gpu in gpus
        for tp in request.tensor_parallel
        for precision in request.precisions
    ]
    configs += _multi_node(configs)
    configs += _expert_parallel(configs)
    if request.data_parallel_attention and request.model.is_moe:
        configs += [
            ServingConfig.build(
                catalog,
                request.model,
                gpu,
                precision,
                1,
                request.kv_cache_precision,
                engines[gpu.name],
                expert_parallel=True,
                data_parallel=ranks,
            )
            for gpu in gpus
            for ranks in (*DATA_PARALLEL_DEGREES, 2 * gpu.max_gpus_per_node)
            if ranks <= gpu.max_gpus_per_node or (ranks > 8 and gpu.internode_bandwidth_bytes_per_s is not None)
            for precision in request.precisions
        ]
    return configs


def _expert_parallel(configs: list[ServingConfig]) -> list[ServingConfig]:
    """MoE models: each tensor-parallel configuration (2 GPUs or more) again with whole experts
    per rank (vLLM --enable-expert-parallel, SGLang --ep-size)."""
    return [replace(cfg, expert_parallel=True) for cfg in configs if cfg.model.is_moe and cfg.tensor_parallel > 1]


def _multi_node(configs: list[ServingConfig]) -> list[ServingConfig]:
    """Replicas spanning nodes where a whole node is not enough: for each GPU type and precision
    whose full-node tensor-parallel configuration runs but does not fit, the fewest pipeline
    stages (one node each, TP within the node) whose weights fit, up to MAX_PIPELINE_NODES."""
    extra = []
    for cfg in configs:
        if cfg.tensor_parallel != cfg.gpu.max_gpus_per_node or cfg.gpu.internode_bandwidth_bytes_per_s is None:
            continue
        if cfg.unsupported_reason() is not None or cfg.memory.fits:
            continue
        for stages in range(2, MAX_PIPELINE_NODES + 1):
            staged = replace(cfg, pipeline_parallel=stages)
            if staged.unsupported_reason() is not None:
                break
            if staged.memory.fits or stages == MAX_PIPELINE_NODES:
                extra.append(staged)
                break
    return extra


def _dominated(cfg: ServingConfig, split: Rejected | _Screened | None) -> Rejected | None:
    """An expert-parallel configuration whose tensor-parallel twin runs is no better than it
    in kvscale's model, so it is not evaluated: the same all-reduces (vLLM all-reduces the
    routed output under EP without data parallelism), at least the weights a step reads (the
    busiest rank's own touched experts, whole, against 1/tp of every touched expert), at
    least the FLOPs (its share of the routed pairs) and at least the memory (ceil(E/tp)
    experts). A twin that misses fails it too (its reason is taken over). It is evaluated
    where the twin cannot run at all (block-FP8 experts that do not split over tp). None:
    evaluate it."""
    if split is None or replace(cfg, expert_parallel=False).unsupported_reason() is not None:
        return None
    if isinstance(split, Rejected):
        reason = split.reason
    else:
        reason = (
            f"no faster than tensor parallel {cfg.tensor_parallel} alone: the same all-reduces, and the busiest "
            "rank reads and multiplies its whole experts"
        )
    return _reject(cfg, reason)


def plan(catalog: Catalog, request: PlanRequest) -> Plan:
    """Ranks every configuration; the best feasible one is chosen, the rest say why they lost.

    Candidates are fully evaluated (queueing, replicas) in order of an optimistic bound on
    the objective; once that bound exceeds the FULLY_RANKED-th best full result, the rest
    cannot place above it: they are listed as outranked, with the bound as their reason.
    """
    rejected, screened = _screen_all(catalog, request)
    out = request.workload.output_tokens
    feasible: list[Feasible] = []
    metrics: list[float] = []  # the feasible candidates' objective values, kept sorted
    outranked: list[_Screened] = []
    for s in screened:
        if len(metrics) >= FULLY_RANKED and s.bound > metrics[FULLY_RANKED - 1] + 1e-9:
            outranked.append(s)
            continue
        candidate = _evaluate(s, request)
        if isinstance(candidate, Rejected):
            rejected.append(candidate)
        else:
            feasible.append(candidate)
            bisect.insort(metrics, _metric(candidate, request.objective, out))
    rejected.sort(
        key=lambda c: (c.gpu, c.data_parallel, c.tensor_parallel, c.pipeline_parallel, c.expert_parallel, c.precision)
    )
    feasible.sort(key=lambda c: _rank_key(c, request.objective, out))
    if not feasible:
        node_gpus = {g.name: g.max_gpus_per_node for g in catalog.gpus.values()}
        return Plan(request, None, (), tuple(rejected), _suggestions(request, rejected, node_gpus))
    best = feasible[0]
    chosen = Feasible(
        best.config,
        best.prediction,
        "chosen",
        _chosen_reason(best, request.objective, len(feasible) + len(outranked))
        + _equal_cost_note(best, feasible, request.objective),
    )
    alternatives = tuple(
        Feasible(c.config, c.prediction, "alternative", _loss_reason(c, best, request.objective, out))
        for c in feasible[1:]
    )
    return Plan(
        request,
        chosen,
        alternatives,
        tuple(rejected),
        outranked=tuple(_outranked(s, best, request.objective) for s in outranked),
    )


def _screen_all(catalog: Catalog, request: PlanRequest) -> tuple[list[Rejected], list[_Screened]]:
    """Every configuration's load-independent verdict: the rejected ones, and the rest in
    order of their optimistic bound (the order they are evaluated in)."""
    rejected: list[Rejected] = []
    screened: list[_Screened] = []
    twins: dict[tuple[object, ...], Rejected | _Screened] = {}
    split: dict[tuple[str, int, int, str], Rejected | _Screened] = {}  # experts split by TP: the verdicts
    for cfg in configurations(catalog, request):
        key = (cfg.gpu.name, cfg.tensor_parallel, cfg.pipeline_parallel, cfg.precision.name)
        dominated = _dominated(cfg, split.get(key)) if cfg.expert_parallel and cfg.data_parallel == 1 else None
        verdict = dominated if dominated is not None else _screen_once(cfg, request, twins)
        if not cfg.expert_parallel and cfg.data_parallel == 1:
            split[key] = verdict
        if isinstance(verdict, Rejected):
            rejected.append(verdict)
        else:
            screened.append(verdict)
    screened.sort(
        key=lambda s: (
            s.bound,
            s.cfg.gpus,
            s.cfg.gpu.name,
            s.cfg.tensor_parallel,
            s.cfg.expert_parallel,
            s.cfg.precision.name,
        )
    )
    return rejected, screened


def cheapest(catalog: Catalog, request: PlanRequest) -> Sized | None:
    """The configuration, replicas and cost of `plan(catalog, request).chosen` (None when no
    candidate is feasible) for the cost objective, without ranking the rest: what a line
    beside a plan needs (`kvscale plan`'s fp8 comparison).

    A candidate is sized (its best chunk budget searched, its replicas counted) only while
    the cost of the fewest replicas its no-queueing capacity allows, over every chunk budget
    it may run with, does not exceed the cheapest found at the planner's rounding: a
    replica never carries more than that capacity, so such a candidate can only cost more.
    Predicted latencies are computed only to break a tie on cost and replica size, as the
    planner's ranking does (tests/unit/test_planner_speed.py checks the answers against
    plan()).
    """
    if request.objective != "cost":
        raise ValueError("cheapest() ranks by cost: use plan() for the latency objective")
    _, screened = _screen_all(catalog, request)
    rate = request.workload.requests_per_s
    sized: list[Sized] = []
    best = math.inf
    for s in screened:  # in the planner's order: the likely cheapest first
        weighed = _candidate_options(s, request)
        if not _may_cost_at_most(s, weighed, request, best):
            continue
        size = _size(s, request, weighed)
        if isinstance(size, Sized):
            sized.append(size)
            best = min(best, size.cost_usd_per_hour)
    if not sized:
        return None
    key = min((round(c.cost_usd_per_hour, 6), c.config.gpus) for c in sized)
    tied = [c for c in sized if (round(c.cost_usd_per_hour, 6), c.config.gpus) == key]
    if len(tied) == 1:
        return tied[0]
    # Equal cost and replica size: the planner ranks by predicted latency, then by name.
    out = request.workload.output_tokens
    ranked = []
    for c in tied:
        point = c.option.replica.at_rate(rate / c.replicas, c.option.max_batch, request.slo.percentile)
        latency = point.ttft_p_s + out * point.tpot_p_s
        cfg = c.config
        ranked.append(
            (
                (
                    round(latency, 6),
                    cfg.gpus * c.replicas,
                    cfg.gpu.name,
                    cfg.tensor_parallel,
                    cfg.pipeline_parallel,
                    cfg.expert_parallel,
                    cfg.data_parallel,
                    cfg.precision.name,
                ),
                c,
            )
        )
    return min(ranked, key=lambda item: item[0])[1]


def _may_cost_at_most(s: _Screened, weighed: list[_Option], request: PlanRequest, best_usd_per_hour: float) -> bool:
    """False when the candidate cannot cost `best_usd_per_hour` or less (at the planner's
    rounding): at the per-replica rate that the replicas this buys must carry, it meets the
    SLO under none of its chunk budgets. The rate a candidate is sized at is one where its
    chosen budget meets the SLO (every search keeps a rate that meets it), and a higher rate
    only lengthens the queues, so it would need more replicas."""
    if math.isinf(best_usd_per_hour):
        return True
    price = s.cfg.price_usd_per_hour
    most = math.floor(best_usd_per_hour / price)
    while round((most + 1) * price, 6) <= round(best_usd_per_hour, 6):
        most += 1
    while most >= 1 and round(most * price, 6) > round(best_usd_per_hour, 6):
        most -= 1
    if most < 1:
        return False
    rate = request.workload.requests_per_s
    if rate <= 0:
        return True
    # Below this per-replica rate, more than `most` replicas are needed (replicas_for_rate's
    # ceiling; a hair lower, so that rounding never prunes a candidate that would fit).
    needed = rate * (1.0 + request.headroom) / (most + 1e-9) * (1.0 - 1e-9)
    return any(o.replica.meets(request.slo, o.max_batch, needed) for o in weighed)


def _outranked(s: _Screened, best: Feasible, objective: Objective) -> Outranked:
    if objective == "latency":
        reason = f"slower: at least {format_duration(s.bound)} per request even with no load"
    else:
        reason = f"costs at least ${s.bound:.2f}/h vs ${best.prediction.cost_usd_per_hour:.2f}/h"
    return Outranked(s.cfg, s.bound, reason)


def _replica_shape(c: Feasible) -> str:
    if c.data_parallel > 1:
        return f"{c.config.gpus} {c.gpu} (data-parallel attention x{c.data_parallel}, expert parallel)"
    ep = ", expert parallel" if c.expert_parallel else ""
    if c.nodes > 1:
        return f"{c.config.gpus} {c.gpu} over {c.nodes} nodes (TP {c.tensor_parallel} x PP {c.pipeline_parallel}{ep})"
    return f"{c.config.gpus} {c.gpu}" + (f" (TP {c.tensor_parallel}{ep})" if ep else "")


def _chosen_reason(best: Feasible, objective: Objective, feasible_count: int) -> str:
    p = best.prediction
    what = "cheapest" if objective == "cost" else "fastest"
    return (
        f"{what} of {feasible_count} feasible: {p.replicas} replica(s) x {_replica_shape(best)} at "
        f"${p.cost_usd_per_hour:.2f}/h, each up to {p.rate_per_replica_max:.2f} req/s within the SLO, "
        f"batch limit {p.max_batch}, limited by {p.limited_by}"
    )


def with_check(planned: Plan, check: SimulatedSizing, suggestions: tuple[str, ...] = ()) -> Plan:
    """The plan with its chosen candidate sized by the simulated check: the check's replicas
    (and their cost) replace the analytic count; the analytic count stays in `check`. When no
    fleet met the SLO in the check, the plan is infeasible and `suggestions` say what would
    make it feasible."""
    chosen = planned.chosen
    if chosen is None:
        raise ValueError("only a plan with a chosen candidate can carry a simulated check")
    prediction = replace(
        chosen.prediction,
        replicas=check.replicas,
        cost_usd_per_hour=check.replicas * chosen.config.price_usd_per_hour,
    )
    return replace(
        planned,
        chosen=replace(chosen, prediction=prediction, check=check),
        suggestions=planned.suggestions + (suggestions if not check.met else ()),
    )


def ranked_by_checks(planned: Plan, checks: tuple[SimulatedSizing | None, ...]) -> Plan | None:
    """`planned` re-ranked after the simulated check of its first candidates (`checks[i]` is
    the check of the i-th in the analytic order, chosen first; None: not replayed), or None
    when no check met the SLO.

    The cheapest checked candidate whose check met the SLO wins (the fastest, for the latency
    objective: the first that met, in the analytic order); checked candidates carry the
    simulator's replicas and cost, and every reason quotes those. A candidate whose check
    stopped at the replicas that would still cost less than the winner (`most`, see
    kvscale.sim.check) lost there."""
    chosen = planned.chosen
    if chosen is None:
        raise ValueError("only a plan with a chosen candidate can be ranked by its checks")
    request = planned.request
    ranked = (chosen, *planned.alternatives)
    sized = [_checked(c, checks[i] if i < len(checks) else None) for i, c in enumerate(ranked)]
    passed = [i for i, c in enumerate(sized) if c.check is not None and c.check.met]
    if not passed:
        return None
    if request.objective == "cost":
        win = min(passed, key=lambda i: (round(sized[i].prediction.cost_usd_per_hour, 6), i))
    else:
        win = passed[0]
    best = sized[win]
    checked = sum(1 for c in sized if c.check is not None)
    reason = (
        _chosen_reason(best, request.objective, len(ranked) + len(planned.outranked))
        + f"; {_checked_note(best, checked)}"
    )
    alternatives = tuple(
        replace(
            c, verdict="alternative", reason=_checked_loss(c, best, request.objective, request.workload.output_tokens)
        )
        for i, c in enumerate(sized)
        if i != win
    )
    # Checked ones first, by what the simulator confirmed; the rest in the analytic order.
    alternatives = tuple(
        sorted(
            alternatives,
            key=lambda c: (
                (0, round(c.prediction.cost_usd_per_hour, 6))
                if c.check is not None and c.check.met and request.objective == "cost"
                else (1, 0.0)
            ),
        )
    )
    outranked = tuple(
        replace(o, reason=_outranked_by_check(o, best)) if request.objective == "cost" else o for o in planned.outranked
    )
    return replace(
        planned,
        chosen=replace(best, verdict="chosen", reason=reason),
        alternatives=alternatives,
        outranked=outranked,
    )


def _checked(c: Feasible, check: SimulatedSizing | None) -> Feasible:
    """A candidate with its check: a check that met sets its replicas and cost."""
    if check is None:
        return c
    if not check.met:
        return replace(c, check=check)
    prediction = replace(
        c.prediction, replicas=check.replicas, cost_usd_per_hour=check.replicas * c.config.price_usd_per_hour
    )
    return replace(c, prediction=prediction, check=check)


def _checked_note(best: Feasible, checked: int) -> str:
    assert best.check is not None
    asked = best.check.analytic_replicas
    counted = "the analytic count" if asked == best.prediction.replicas else f"the analytic model asked for {asked}"
    return (
        f"{best.prediction.replicas} replica(s) meet the SLO in the simulated check ({counted}); "
        f"{checked} candidate(s) replayed, the cheapest that passes wins"
    )


def _checked_loss(c: Feasible, best: Feasible, objective: Objective, output_tokens: int) -> str:
    """Why a candidate lost to the one the simulated check chose, in checked figures."""
    b = best.prediction.cost_usd_per_hour
    check = c.check
    pct = f"p{best.check.target * 100:g}" if best.check is not None else "the percentile"
    if check is not None and check.met:
        if objective == "latency":
            return f"replayed after the chosen one in the analytic order (both pass the {pct} simulated check)"
        return (
            f"costs ${c.prediction.cost_usd_per_hour:.2f}/h in the simulated check ({c.prediction.replicas} replica(s) "
            f"x {c.config.gpus} GPU(s); analytic {check.analytic_replicas}) vs ${b:.2f}/h"
        )
    if check is not None:
        most = max(n for n, _ in check.tried)
        reached = dict(check.tried)[most]
        return (
            f"misses in the simulated check: {most} replica(s) (${most * c.config.price_usd_per_hour:.2f}/h) reach "
            f"{reached:.2%} of {pct}; the chosen {best.prediction.replicas} x {best.gpu} pass at ${b:.2f}/h"
        )
    if objective == "latency":
        return _loss_reason(c, best, objective, output_tokens)
    price = c.config.price_usd_per_hour
    if price > b + 1e-9:
        return f"costs at least ${price:.2f}/h (one replica of {c.config.gpus} GPU(s)) vs ${b:.2f}/h checked"
    a = c.prediction.cost_usd_per_hour
    if a > b + 1e-9:
        return f"costs ${a:.2f}/h by the analytic model (not replayed) vs ${b:.2f}/h checked"
    return (
        f"not replayed: the check replays the cheapest few by the analytic model; analytic ${a:.2f}/h "
        f"({c.prediction.replicas} replica(s)) vs ${b:.2f}/h checked"
    )


def _outranked_by_check(o: Outranked, best: Feasible) -> str:
    b = best.prediction.cost_usd_per_hour
    if o.bound > b + 1e-9:
        return f"costs at least ${o.bound:.2f}/h vs ${b:.2f}/h checked"
    return (
        f"not evaluated in full (costs at least ${o.bound:.2f}/h by the analytic model, above the {FULLY_RANKED} "
        f"cheapest) nor replayed; ${b:.2f}/h checked"
    )
