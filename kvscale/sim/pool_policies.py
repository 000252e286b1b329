"""How a disaggregated fleet's two pools are scaled (kvscale.sim.disaggregated_fleet).

- `kvscale`: the deployed policy on each pool, both through the one tick
  (kvscale.autoscaling.tick.tick_all) as two services; under GPU limits they share one budget
  (SplitPooled: kvscale.autoscaling.budget's allocator, then on one GPU type the split that
  serves the most, as the operator's kvscale.control.pool_budget). Each pool acts on its own
  capacity from the sizing model: a prefill worker's requests/s within the prefill pool's
  share of TTFT at the observed prompt lengths (prompt tokens/s over the prompt), and a decode
  worker's requests/s with TPOT met and no wait for a slot at the observed lengths (running
  sequences and output tokens/s). Each pool's TTFT target is the plan's split of TTFT.
- `static`: the plan's workers in each pool, fixed.
- `ratematch`: NVIDIA Dynamo's planner (ai-dynamo/dynamo, components/src/dynamo/planner/core/):
  every adjustment interval, the average request rate and mean prompt/output lengths of the
  interval just over, and
      N_P = max(ceil(rate x ISL / prefill tokens/s per worker), ceil(TTFT_pred / TTFT_slo), 1)
  with the worker's tokens/s from one prompt's forward passes alone (a batch-1 profile, chunked
  at the token budget), and
      N_D = ceil(rate x OSL x t_step(B) / B)
  with B the largest batch whose decode step at context ISL + OSL/2 stays within the ITL
  (TPOT) target, capped by the KV cache and max-num-seqs. No queueing term, no length
  distribution. Above a GPU budget both counts are scaled down proportionally (the prefill
  count first, the decode count from the GPUs left), as its code does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvscale.autoscaling.budget import Budget, Grant
from kvscale.autoscaling.observation import Decision, DecisionKind
from kvscale.autoscaling.pool_capacity import DecodeCapacity, PrefillCapacity, pool_policy_config, split_pools
from kvscale.autoscaling.tick import BudgetAnswer, Pooled, Seat, SeatOption, TickDecision, TickInput, Want, tick_all
from kvscale.sim.disaggregated_fleet import DisaggregatedSetup, PoolsView
from kvscale.sim.engine import StepTimes
from kvscale.sim.policies import KvscalePolicy
from kvscale.sizing.workload import Workload

# Dynamo's SLA planner's default adjustment interval (its `--adjustment-interval`, 180 s, as we
# know its defaults; the published summary we work from does not give it: unverified here).
RATEMATCH_INTERVAL_S = 180.0


def _pool_policy(
    setup: DisaggregatedSetup, role: str, capacity: PrefillCapacity | DecodeCapacity, max_replicas: int, headroom: float
) -> KvscalePolicy:
    pool = setup.prefill if role == "prefill" else setup.decode
    inp = capacity.shape.input_tokens if capacity.shape is not None else 512
    out = capacity.shape.output_tokens if capacity.shape is not None else 256
    config = pool_policy_config(  # the operator's constructor (kvscale.control.pool_scaling)
        role,
        ttft_target_s=setup.prefill_ttft_target_s if role == "prefill" else setup.decode_ttft_target_s,
        tpot_target_s=pool.slo.tpot_s,
        input_tokens=inp,
        output_tokens=out,
        min_replicas=1,
        max_replicas=max_replicas,
        headroom=headroom,
        cold_start_s=pool.cold_start_s,
        interval_s=pool.tick_s,
        window_s=pool.window_s,
    )
    return KvscalePolicy(capacity, config, name=f"kvscale-{role}")


class SplitPooled(Pooled):
    """The pools' budget stage in a replay, as the operator's (kvscale.control.pool_budget): the
    allocator's grants over every seat, and for each service's two pools on one GPU type the
    budget limits, what they get together split by what the two serve together
    (kvscale.autoscaling.pool_capacity.split_pools), not in proportion. `pairs`: the indices of
    each service's (prefill, decode) wants among a tick's (default: the two wants of a tick of
    one service's pools)."""

    def __init__(
        self, budget: Budget, previous: Mapping[str, Grant], pairs: Sequence[tuple[int, int]] | None = None
    ) -> None:
        super().__init__(budget, previous)
        self.pairs = pairs

    def answer(self, wants: Sequence[Want]) -> list[BudgetAnswer]:
        answers = super().answer(wants)
        pairs = self.pairs if self.pairs is not None else (((0, 1),) if len(answers) == 2 else ())
        for i, j in pairs:
            answers[i], answers[j] = self._split((wants[i], wants[j]), (answers[i], answers[j]))
        return answers

    def _split(
        self, wants: tuple[Want, Want], answers: tuple[BudgetAnswer, BudgetAnswer]
    ) -> tuple[BudgetAnswer, BudgetAnswer]:
        seats = [w.seat for w in wants]
        if any(s is None for s in seats):
            return answers
        options = [s.options[s.active] for s in seats if s is not None]
        if options[0].gpu_type != options[1].gpu_type or options[0].gpu_type not in self.budget.limits:
            return answers  # each keeps its grant: no one limit to share (as the operator's)
        gpus = (options[0].gpus_per_replica, options[1].gpus_per_replica)
        total = sum(a.replicas * g for a, g in zip(answers, gpus, strict=True))
        want = (max(wants[0].decision.replicas, 1), max(wants[1].decision.replicas, 1))
        p, d = split_pools(total, want, (options[0].rate_per_replica, options[1].rate_per_replica), gpus)
        return replace(answers[0], replicas=p), replace(answers[1], replicas=d)


@dataclass
class KvscalePools:
    """kvscale's policy on both pools, one tick for the two (and one budget when limited)."""

    prefill: KvscalePolicy
    decode: KvscalePolicy
    seats: tuple[Seat, Seat] | None = None  # with a budget: each pool's seat in it
    budget: Budget | None = None
    name: str = "kvscale"
    previous: dict[str, Grant] = field(default_factory=dict)

    def tick_inputs(self, view: PoolsView, seats: tuple[Seat | None, Seat | None] | None = None) -> list[TickInput]:
        """Both pools' inputs to the one tick (`seats`: each pool's seat in a budget; default its own)."""
        s = seats or self.seats or (None, None)
        return [self.prefill.tick_input(view.prefill, seat=s[0]), self.decode.tick_input(view.decode, seat=s[1])]

    def ticked(self, done_p: TickDecision, done_d: TickDecision) -> tuple[Decision, Decision]:
        """The tick's outcome: each pool's policy state, and what each pool runs."""
        self.prefill.ticked(done_p)
        self.decode.ticked(done_d)
        return (
            replace(done_p.decision, replicas=done_p.replicas),
            replace(done_d.decision, replicas=done_d.replicas),
        )

    def decide(self, view: PoolsView) -> tuple[Decision, Decision]:
        pooled = SplitPooled(self.budget, self.previous) if self.budget is not None and self.seats is not None else None
        done_p, done_d = tick_all(self.tick_inputs(view), pooled)
        if pooled is not None and pooled.allocation is not None:
            self.previous = pooled.allocation.by_name
        return self.ticked(done_p, done_d)


def pool_seats(
    setup: DisaggregatedSetup,
    pools: KvscalePools,
    shape: Workload | None,
    names: tuple[str, str] = ("prefill", "decode"),
    priority: int = 0,
    min_replicas: int = 1,
    max_replicas: int = 100,
) -> tuple[Seat, Seat]:
    """Each pool's seat in a budget: its one GPU type (a pool is not moved), a worker's rate at
    the shape's mean lengths (the split weighs the two by it), the service's priority and a
    floor of at least one worker (as the operator's budget book seats them)."""
    inp = shape.input_tokens if shape is not None else 512
    out = shape.output_tokens if shape is not None else 256
    seats = []
    for name, pool, policy in zip(names, (setup.prefill, setup.decode), (pools.prefill, pools.decode), strict=True):
        rate = max(policy.capacity.rate_per_replica(inp, out), 1e-9)
        option = SeatOption(pool.cfg.gpu.name, pool.cfg.gpus, rate)
        seats.append(Seat(name, (option,), 0, priority, max(1, min_replicas), max_replicas, pool.cfg.gpu.name))
    return seats[0], seats[1]


def kvscale_pools(
    setup: DisaggregatedSetup,
    shape: Workload | None,
    max_replicas: int = 100,
    headroom: float = 0.10,
    step_target_s: float | None = None,
) -> KvscalePools:
    """kvscale's pools policy for a setup: each pool's capacity from the sizing model, and
    with the setup's GPU limits both pools seated in one budget."""
    ps, ds = setup.prefill, setup.decode
    prefill_cap = PrefillCapacity(ps.cfg, ps.slo, setup.prefill_ttft_target_s, ps.max_batch, shape)
    decode_cap = DecodeCapacity(ds.cfg, ds.slo, step_target_s or ds.slo.tpot_s, ds.max_batch, shape)
    pools = KvscalePools(
        _pool_policy(setup, "prefill", prefill_cap, max_replicas, headroom),
        _pool_policy(setup, "decode", decode_cap, max_replicas, headroom),
    )
    if setup.gpu_limits is not None:
        pools.seats = pool_seats(setup, pools, shape, max_replicas=max_replicas)
        pools.budget = Budget("pools", dict(setup.gpu_limits))
    return pools


# -- Dynamo's rate matching ------------------------------------------------------------------


def prefill_pass_s(steps: StepTimes, prompt_tokens: int) -> float:
    """One prompt's prefill alone on an idle worker (a batch-1 profile point): its chunks of
    the token budget, and the engine's intake."""
    budget = max(1, steps.cfg.max_num_batched_tokens)
    full, rest = divmod(max(1, prompt_tokens), budget)
    seconds = full * steps.mixed(0, 0.0, budget, prompt_tokens) if full else 0.0
    seconds += steps.mixed(0, 0.0, rest, prompt_tokens) if rest else 0.0
    return seconds + steps.cfg.engine.request_overhead_s


def decode_batch_within(steps: StepTimes, itl_target_s: float, context_tokens: float, batch_cap: int) -> int:
    """The largest batch whose decode step at `context_tokens` stays within the ITL target,
    capped by the KV cache (whole contexts) and max-num-seqs; at least 1."""
    kv_cap = int(steps.cfg.memory.kv_capacity_tokens // max(context_tokens, 1.0))
    top = max(1, min(batch_cap, kv_cap))
    lo, hi = 1, top
    if steps.decode(top, context_tokens) <= itl_target_s:
        return top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if steps.decode(mid, context_tokens) <= itl_target_s:
            lo = mid
        else:
            hi = mid
    return lo


def ratematch_workers(
    rate_per_s: float,
    input_tokens: float,
    output_tokens: float,
    prefill_tokens_per_s_per_worker: float,
    decode_tokens_per_s_per_worker: float,
) -> tuple[float, float]:
    """Average-rate matching, fractional: prompt tokens/s over a prefill worker's, output
    tokens/s over a decode worker's (the published DeepSeek and RTP-LLM pool arithmetic)."""
    if prefill_tokens_per_s_per_worker <= 0 or decode_tokens_per_s_per_worker <= 0:
        raise ValueError("a worker's rate must be positive")
    return (
        rate_per_s * input_tokens / prefill_tokens_per_s_per_worker,
        rate_per_s * output_tokens / decode_tokens_per_s_per_worker,
    )


def proportional_clamp(
    prefill: int, decode: int, prefill_gpus: int, decode_gpus: int, max_gpus: int | None, least: int = 1
) -> tuple[int, int]:
    """Dynamo's budget rule: above the budget both counts scale by budget / required (the
    prefill count rounded, at least `least`), and decode takes the GPUs left (at least `least`)."""
    need = prefill * prefill_gpus + decode * decode_gpus
    if max_gpus is None or need <= max_gpus:
        return prefill, decode
    scale = max_gpus / need
    p = max(least, round(prefill * scale))
    d = max(least, (max_gpus - p * prefill_gpus) // decode_gpus)
    return p, d


@dataclass
class RateMatchPolicy:
    """Dynamo's planner (module docstring), every `interval_s`, on the last interval's averages."""

    prefill_steps: StepTimes
    decode_steps: StepTimes
    ttft_target_s: float
    itl_target_s: float
    decode_batch_cap: int  # the decode engine's max-num-seqs
    prefill_workers: int  # until the first interval is over
    decode_workers: int
    max_gpus: int | None = None
    interval_s: float = RATEMATCH_INTERVAL_S
    max_replicas: int = 100
    name: str = "ratematch"
    _last: tuple[float, int, float, float] = (0.0, 0, 0.0, 0.0)
    _why: str = "ratematch: the first interval is not over"

    def counts(self, rate_per_s: float, input_tokens: float, output_tokens: float) -> tuple[int, int, str]:
        """The pools for one interval's averages, clamped to the budget."""
        isl = max(1, round(input_tokens))
        t_prefill = prefill_pass_s(self.prefill_steps, isl)
        prefill_tps = isl / t_prefill
        context = input_tokens + output_tokens / 2.0
        batch = decode_batch_within(self.decode_steps, self.itl_target_s, context, self.decode_batch_cap)
        decode_tps = batch / self.decode_steps.decode(batch, context)
        p_frac, d_frac = ratematch_workers(rate_per_s, input_tokens, output_tokens, prefill_tps, decode_tps)
        p = max(math.ceil(p_frac - 1e-9), math.ceil(t_prefill / self.ttft_target_s - 1e-9), 1)
        d = max(math.ceil(d_frac - 1e-9), 1)
        p, d = min(p, self.max_replicas), min(d, self.max_replicas)
        clamped = proportional_clamp(p, d, self.prefill_steps.cfg.gpus, self.decode_steps.cfg.gpus, self.max_gpus)
        why = (
            f"ratematch: {rate_per_s:.2f} req/s x {input_tokens:.0f} in / {prefill_tps:.0f} tok/s per prefill worker "
            f"= {p_frac:.2f}; x {output_tokens:.0f} out / {decode_tps:.0f} tok/s per decode worker (batch {batch}) "
            f"= {d_frac:.2f}"
        )
        if clamped != (p, d):
            why += f"; clamped proportionally to {self.max_gpus} GPUs"
        return clamped[0], clamped[1], why

    def decide(self, view: PoolsView) -> tuple[Decision, Decision]:
        since, arrived, inputs, outputs = self._last
        if view.time_s - since >= self.interval_s - 1e-9:
            n = view.arrived - arrived
            span = view.time_s - since
            if n > 0:
                p, d, self._why = self.counts(
                    n / span, (view.input_tokens - inputs) / n, (view.output_tokens - outputs) / n
                )
                self.prefill_workers, self.decode_workers = p, d
            else:
                self._why = "ratematch: no request in the last interval, holding"
            self._last = (view.time_s, view.arrived, view.input_tokens, view.output_tokens)
        return (
            Decision(self.prefill_workers, self._why, DecisionKind.FEEDBACK),
            Decision(self.decode_workers, self._why, DecisionKind.FEEDBACK),
        )
