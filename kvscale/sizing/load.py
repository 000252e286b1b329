"""One replica under load, as a continuous-batching engine runs it.

Every engine step carries all running decodes (one token each) and, while prompts wait,
a prefill chunk filling the rest of the token budget (`--max-num-batched-tokens`). Under
an arrival rate lambda with prompts of I tokens and outputs of O tokens:

- a step without a chunk takes t_d(n) (n running decodes), a step with one t_m(n, c);
- chunk steps happen at lambda x I / c per second, so the mean token gap is
  t_mean = t_d / (1 - lambda x I x (t_m - t_d) / c) and the share of steps carrying a
  chunk is f = lambda x I x t_mean / c (f < 1: prefill compute keeps up);
- a request's TPOT is the mean of its O - 1 gaps; K of them carry a chunk, K binomial
  (O - 1, f), so its percentile comes from K's percentile; a single token gap (ITL) is
  t_m at the percentile once f exceeds the tail share;
- TTFT = waiting for a batch slot (M/M/c) + waiting for the prefill server (M/D/1 at
  utilization f x t_m / t_mean) + the step in flight + the prompt's own chunk steps.

Capacity is whichever binds first: prefill compute (f reaches 1), decode (the TPOT of
the running batch), KV capacity or batch slots (every slot busy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from kvscale.sizing.config import ServingConfig, default_chunk_budget_tokens
from kvscale.sizing.memory import max_batch_for_context
from kvscale.sizing.queueing import mmc_wait_percentile_s
from kvscale.sizing.roofline import StepTime, decode_step, mixed_step
from kvscale.sizing.workload import Slo, Workload

_BISECTION_STEPS = 10  # 2^-10 (0.1%) of the capacity rate: far finer than the model is accurate
_FIXED_POINT_STEPS = 3
_CHUNK_GRAIN_TOKENS = 64  # packed chunks are costed in whole 64-token units (cache sharing)
CHUNK_BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384)  # --max-num-batched-tokens the planner considers
REFERENCE_CHUNK_SHARE = 0.5  # the budget keeps TPOT when half of a request's token gaps carry a full chunk
PREFILL_BOUND_SHARE = 0.5  # limited by prefill compute when prefill takes more GPU time than decode


@dataclass(frozen=True)
class LoadPoint:
    """Steady state of one replica at `rate_per_s` arrivals with max-num-seqs `max_batch`."""

    rate_per_s: float
    max_batch: int
    concurrency: float  # mean requests running (decoding)
    prefill_s: float  # the prompt's own chunk steps, no waiting
    decode: StepTime  # a step without a chunk, at the mean running batch
    mixed: StepTime  # a step with a chunk, at the mean running batch
    ttft_p_s: float
    tpot_mean_s: float
    tpot_p_s: float  # per request: the mean gap over its output, at the percentile
    itl_p_s: float  # per token gap, at the percentile
    chunk_share: float  # share of steps that carry a prefill chunk
    gpu_prefill_share: float  # share of GPU time spent on prefill work
    slot_wait_p_s: float = 0.0  # TTFT's wait for a batch slot, at the percentile
    prefill_wait_p_s: float = 0.0  # TTFT's wait behind other prompts' chunks, at the percentile

    @property
    def stable(self) -> bool:
        return math.isfinite(self.ttft_p_s) and math.isfinite(self.tpot_p_s)

    @property
    def mfu(self) -> float:
        """Time-averaged model FLOPs utilization over the mix of decode and chunk steps."""
        f = self.chunk_share
        flops = (1 - f) * self.decode.flops_per_gpu + f * self.mixed.flops_per_gpu
        seconds = (1 - f) * self.decode.seconds + f * self.mixed.seconds
        return flops / (seconds * self.decode.peak_flops_per_s)

    @property
    def mbu(self) -> float:
        """Time-averaged model bandwidth utilization over the same mix."""
        f = self.chunk_share
        moved = (1 - f) * self.decode.bytes_per_gpu + f * self.mixed.bytes_per_gpu
        seconds = (1 - f) * self.decode.seconds + f * self.mixed.seconds
        return moved / (seconds * self.decode.peak_bandwidth_bytes_per_s)


def running_bucket(concurrency: float) -> int:
    """The running batch a step is costed at: the concurrency rounded up to 4 significant
    bits (at most 6% more sequences), so nearby load points share cached step times."""
    n = max(1, math.ceil(concurrency))
    if n <= 16:
        return n
    grain = 1 << (n.bit_length() - 4)
    return -(-n // grain) * grain


def decode_life_percentile_s(decode_s: float, per_prompt_s: float, rate_per_s: float, percentile: float) -> float:
    """A request's decode life at the percentile: its decode steps plus the extra time of the
    chunks of every prompt that arrives meanwhile.

    Arrivals are Poisson, and a longer life sees more of them: L = a + d x N(L), N at the
    percentile lambda L + z sqrt(lambda L) + 1/2 (normal approximation with continuity
    correction). With A = 1 - d lambda (the GPU time share prefill leaves to decode), this is
    a quadratic in sqrt(L): A L - d z sqrt(lambda) sqrt(L) - (a + d/2) = 0.
    """
    if per_prompt_s <= 0 or rate_per_s <= 0:
        return decode_s
    a_coef = 1.0 - per_prompt_s * rate_per_s
    if a_coef <= 0:
        return math.inf
    z = max(NormalDist().inv_cdf(percentile / 100.0), 0.0)
    b_coef = per_prompt_s * z * math.sqrt(rate_per_s)
    c_coef = decode_s + 0.5 * per_prompt_s
    root = (b_coef + math.sqrt(b_coef * b_coef + 4.0 * a_coef * c_coef)) / (2.0 * a_coef)
    return root * root


class ReplicaModel:
    """Latency of one replica of a configuration for one workload, with its steps cached."""

    def __init__(self, cfg: ServingConfig, workload: Workload, steps_from: ReplicaModel | None = None) -> None:
        """`steps_from`: a model of the same configuration under another chunk budget, whose
        cached step times this one shares (a step's time does not depend on the budget, only
        how many prompt tokens fit beside the decodes does)."""
        self.cfg = cfg
        self.workload = workload
        self.budget = cfg.max_num_batched_tokens
        self._context = workload.mean_decode_context_tokens
        # Plain dicts: one planner run builds hundreds of these, and lru_cache wrappers cost
        # more to create than the look-ups they save.
        self._decodes: dict[int, StepTime] = steps_from._decodes if steps_from else {}
        self._mixeds: dict[tuple[int, int], StepTime] = steps_from._mixeds if steps_from else {}
        self._own_prefills: dict[int, StepTime] = {}

    @property
    def prefill_step(self) -> StepTime:
        """The prompt's own chunk steps on an idle engine."""
        return self.own_prefill(0)

    def renamed(self, cfg: ServingConfig) -> ReplicaModel:
        """The same model for a physically identical configuration (another precision name),
        sharing the cached steps."""
        twin = object.__new__(ReplicaModel)
        twin.__dict__.update(self.__dict__)
        twin.cfg = cfg
        return twin

    def _decode(self, batch: int) -> StepTime:
        step = self._decodes.get(batch)
        if step is None:
            step = self._decodes[batch] = decode_step(self.cfg, batch, self._context)
        return step

    def _mixed(self, batch: int, chunk: int) -> StepTime:
        step = self._mixeds.get((batch, chunk))
        if step is None:
            step = self._mixeds[(batch, chunk)] = mixed_step(
                self.cfg, batch, self._context, chunk, self.workload.input_tokens
            )
        return step

    def decode(self, batch: int) -> StepTime:
        return self._decode(max(1, batch))

    def chunk_room(self, batch: int) -> int:
        """Prefill tokens a step has room for beside `batch` running decodes."""
        return max(1, self.budget - batch)

    def mixed(self, batch: int, chunk: int | None = None) -> StepTime:
        """A step with `batch` decodes and a chunk (default: as much of one prompt as fits)."""
        room = self.chunk_room(batch)
        return self._mixed(max(0, batch), min(room, chunk if chunk is not None else self.workload.input_tokens))

    def own_prefill_s(self, batch: int) -> float:
        """own_prefill(batch).seconds, without building the summed StepTime."""
        room = self.chunk_room(batch)
        full, rest = divmod(self.workload.input_tokens, room)
        seconds = full * self._mixed(batch, room).seconds if full else 0.0
        return seconds + (self._mixed(batch, rest).seconds if rest else 0.0)

    def own_prefill(self, batch: int) -> StepTime:
        """The chunk steps one prompt needs beside `batch` running decodes, summed."""
        batch = max(0, batch)
        step = self._own_prefills.get(batch)
        if step is None:
            step = self._own_prefills[batch] = self._own_prefill_uncached(batch)
        return step

    def _own_prefill_uncached(self, batch: int) -> StepTime:
        room = self.chunk_room(batch)
        full, rest = divmod(self.workload.input_tokens, room)
        whole = self._mixed(batch, room) if full else self._mixed(batch, rest)
        part = self._mixed(batch, rest) if full and rest else None
        k = full if full else 1

        def total(field: str) -> float:
            value: float = k * getattr(whole, field) + (getattr(part, field) if part is not None else 0.0)
            return value

        return StepTime(
            seconds=total("seconds"),
            compute_s=total("compute_s"),
            memory_s=total("memory_s"),
            communication_s=total("communication_s"),
            overhead_s=total("overhead_s"),
            flops_per_gpu=total("flops_per_gpu"),
            bytes_per_gpu=total("bytes_per_gpu"),
            peak_flops_per_s=whole.peak_flops_per_s,
            peak_bandwidth_bytes_per_s=whole.peak_bandwidth_bytes_per_s,
        )

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
    def slot_limit(self) -> int:
        """Most sequences the engine may run: KV, its own limit, and max-num-seqs <= budget (vLLM)."""
        return min(self.kv_max_batch, self.budget)

    @property
    def max_context_fits(self) -> bool:
        """vLLM refuses to start unless one sequence of max-model-len fits in the KV cache."""
        return self.cfg.memory.kv_capacity_tokens >= self.workload.engine_max_context_tokens

    def tpot_batch_limit(self, tpot_target_s: float) -> int:
        """Largest batch (<= KV and budget limits) whose decode step alone meets TPOT.

        The step time is increasing and convex in the batch (a max of linear terms plus
        linear terms; MoE weight reads saturate), so the chord between a batch that meets
        the target and one that misses it never overshoots the crossing: false position
        on integers brackets it in a few step evaluations instead of a dozen bisections.
        """
        top = self.slot_limit
        if top < 1 or self.decode(1).seconds > tpot_target_s:
            return 0
        if self.decode(top).seconds <= tpot_target_s:
            return top
        lo, hi = 1, top  # decode(lo) meets, decode(hi) misses
        t_lo, t_hi = self.decode(lo).seconds, self.decode(hi).seconds
        while hi - lo > 1:
            guess = lo + int((tpot_target_s - t_lo) / (t_hi - t_lo) * (hi - lo))
            guess = min(max(guess, lo + 1), hi - 1)
            t = self.decode(guess).seconds
            if t <= tpot_target_s:
                lo, t_lo = guess, t
                if hi - lo > 1 and self.decode(lo + 1).seconds > tpot_target_s:
                    return lo
            else:
                hi, t_hi = guess, t
        return lo

    def _chunk(self, rate_per_s: float, batch: int) -> int:
        """Prefill tokens per chunk step: one prompt plus those that arrive while the previous
        chunk step runs (the scheduler packs every waiting prompt the budget holds)."""
        room = self.chunk_room(batch)
        inp = self.workload.input_tokens
        one = self.mixed(batch, min(room, inp)).seconds  # a chunk step of one prompt
        packed = math.ceil(inp * (1.0 + rate_per_s * one) / _CHUNK_GRAIN_TOKENS) * _CHUNK_GRAIN_TOKENS
        return max(1, min(room, packed))

    def _mix(self, rate_per_s: float, batch: int) -> tuple[StepTime, StepTime, float, float]:
        """Decode step, chunk step, mean gap and chunk share at `batch` running decodes."""
        dec = self.decode(batch)
        chunk = self._chunk(rate_per_s, batch)
        mix = self.mixed(batch, chunk)
        chunk_rate = rate_per_s * self.workload.input_tokens / chunk  # chunk steps per second
        busy = chunk_rate * (mix.seconds - dec.seconds)
        if busy >= 1.0 or chunk_rate * mix.seconds >= 1.0:
            return dec, mix, math.inf, 1.0
        gap = dec.seconds / (1.0 - busy)
        return dec, mix, gap, chunk_rate * gap

    def capacity_rate_per_s(self, max_batch: int) -> float:
        """An upper bound on the arrival rate one replica sustains: where prefill compute or
        the batch slots saturate (the planner's optimistic bound and the top of its search).

        Prefill is taken with the whole budget free for chunks; running decodes take their
        share of it in at_rate, so this never understates what the replica can do.
        """
        batch = max(1, max_batch)
        dec = self.decode(batch)
        room = self.chunk_room(1)
        mix = self.mixed(1, room)
        inp, out = self.workload.input_tokens, self.workload.output_tokens
        # Prefill compute: chunk steps (full) fill the whole time: rate x I / room x t_m = 1.
        prefill_rate = room / (inp * mix.seconds)
        # Slots: every slot busy for its request's life (prefill plus out decode gaps).
        slot_rate = batch / (self.own_prefill_s(batch) + out * dec.seconds)
        return min(prefill_rate, slot_rate)

    def at_rate(self, rate_per_s: float, max_batch: int, percentile: float) -> LoadPoint:
        """Steady state at an arrival rate: running concurrency by fixed point, then queues."""
        out = self.workload.output_tokens
        batch_cap = max(1, max_batch)
        if rate_per_s <= 0:  # an idle engine: the prompt's own chunks, then decode alone
            dec = self.decode(1)
            own = self.own_prefill(0).seconds
            return LoadPoint(
                0.0, max_batch, 0.0, own, dec, dec, own + dec.seconds, dec.seconds, dec.seconds, dec.seconds, 0.0, 0.0
            )
        concurrency = min(rate_per_s * (self.prefill_step.seconds + out * self.decode(1).seconds), float(batch_cap))
        gap = self.decode(1).seconds
        dec, mix, share = self.decode(1), self.mixed(1), 0.0
        for _ in range(_FIXED_POINT_STEPS):  # converges fast: step time grows slowly with batch
            n = running_bucket(concurrency)
            dec, mix, gap, share = self._mix(rate_per_s, n)
            if not math.isfinite(gap):
                break
            hold = self.own_prefill_s(n) + (out - 1) * gap + gap
            concurrency = min(rate_per_s * hold, float(batch_cap))
        n = running_bucket(concurrency)
        own = self.own_prefill(n).seconds
        if not math.isfinite(gap):
            return LoadPoint(
                rate_per_s,
                max_batch,
                float(batch_cap),
                own,
                dec,
                mix,
                math.inf,
                math.inf,
                math.inf,
                mix.seconds,
                1.0,
                1.0,
            )
        hold = own + out * gap
        slot_wait = mmc_wait_percentile_s(batch_cap, rate_per_s, hold, percentile)
        prefill_util = share * mix.seconds / gap  # share of time in chunk steps
        prefill_wait = _md1_wait_percentile_s(prefill_util, own, percentile)
        ttft = slot_wait + prefill_wait + gap / 2.0 + own  # an arrival lands mid-step on average
        gaps = max(out - 1, 0)
        chunk = self._chunk(rate_per_s, n)
        per_prompt_s = self.workload.input_tokens * (mix.seconds - dec.seconds) / chunk
        tpot_p = (
            decode_life_percentile_s(gaps * dec.seconds, per_prompt_s, rate_per_s, percentile) / gaps if gaps else 0.0
        )
        itl_p = mix.seconds if share > 1.0 - percentile / 100.0 else dec.seconds
        prefill_time_share = rate_per_s * per_prompt_s
        return LoadPoint(
            rate_per_s=rate_per_s,
            max_batch=max_batch,
            concurrency=concurrency,
            prefill_s=own,
            decode=dec,
            mixed=mix,
            ttft_p_s=ttft,
            tpot_mean_s=gap,
            tpot_p_s=max(tpot_p, gap) if gaps else 0.0,
            itl_p_s=itl_p,
            chunk_share=share,
            gpu_prefill_share=min(prefill_time_share, 1.0),
            slot_wait_p_s=slot_wait,
            prefill_wait_p_s=prefill_wait,
        )

    def zero_load(self, percentile: float) -> LoadPoint:
        return self.at_rate(0.0, 1, percentile)

    def limited_by(self, point: LoadPoint, slo: Slo) -> str:
        """What keeps this replica from carrying more than `point` (its highest rate within
        the SLO): the target that a little more load would break, and what drives it.

        TTFT: waiting for a batch slot (kv-capacity when the KV cache sets max-num-seqs,
        batch-slots otherwise) or behind other prompts' chunks (prefill-compute). TPOT:
        prefill-compute when prefill takes most of the GPU's time (its chunks stretch the
        token gaps), else what bounds the decode step (decode-bandwidth / decode-compute,
        or its fixed overhead / communication).
        """
        above = self.at_rate(point.rate_per_s * 1.02 + 1e-6, point.max_batch, slo.percentile)
        decode_part = point.decode.limited_by
        decode_name = {"bandwidth": "decode-bandwidth", "compute": "decode-compute"}.get(decode_part, decode_part)
        if not above.stable:
            if above.chunk_share >= 1.0:
                return "prefill-compute"
            return "kv-capacity" if point.max_batch >= self.kv_max_batch else "batch-slots"
        if above.ttft_p_s > slo.ttft_s and above.tpot_p_s <= slo.tpot_s:
            if above.slot_wait_p_s > above.prefill_wait_p_s:
                return "kv-capacity" if point.max_batch >= self.kv_max_batch else "batch-slots"
            return "prefill-compute"
        return "prefill-compute" if above.gpu_prefill_share >= PREFILL_BOUND_SHARE else decode_name

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


def _md1_wait_percentile_s(utilization: float, service_s: float, percentile: float) -> float:
    """Waiting time at a percentile for a single server busy `utilization` of the time:
    P(wait) = rho with an exponential tail of the M/D/1 conditional mean S / (2 (1 - rho))."""
    if utilization >= 1.0:
        return math.inf
    tail = 1.0 - percentile / 100.0
    if utilization <= tail:
        return 0.0
    return math.log(utilization / tail) * service_s / (2.0 * (1.0 - utilization))


def chunk_budget_for(
    cfg: ServingConfig, workload: Workload, tpot_target_s: float, replica: ReplicaModel | None = None
) -> int:
    """The largest `--max-num-batched-tokens` whose full mixed step keeps the TPOT target.

    A step of C tokens (decodes plus a prompt's chunk) is what a decoding request waits for
    when a chunk shares its step; under prefill-heavy load nearly every step does. The
    largest such budget is also the best for TTFT (fewest chunks, least per-step cost),
    so nothing larger is worth its TPOT and nothing smaller is needed. The step time grows
    with C and does not depend on the target, so a tighter target never gets a larger
    budget. When even the smallest budget's step is too slow, the smallest is used (and the
    load model decides whether the averaged TPOT still holds).
    """

    steps = replica if replica is not None else ReplicaModel(cfg, workload)
    decode_s = steps.decode(1).seconds

    def keeps(budget: int) -> bool:
        mixed_s = steps._mixed(0, budget).seconds  # a chunk of C prompt tokens, no decodes beside it
        return decode_s + REFERENCE_CHUNK_SHARE * (mixed_s - decode_s) <= tpot_target_s

    # The step time grows with the budget: walk the ladder from the engine's default for this
    # GPU (usually a step or two from the answer).
    default = default_chunk_budget_tokens(cfg.engine, cfg.gpu)
    i = min(range(len(CHUNK_BUDGETS)), key=lambda k: abs(CHUNK_BUDGETS[k] - default))
    if keeps(CHUNK_BUDGETS[i]):
        while i + 1 < len(CHUNK_BUDGETS) and keeps(CHUNK_BUDGETS[i + 1]):
            i += 1
        return CHUNK_BUDGETS[i]
    while i > 0 and not keeps(CHUNK_BUDGETS[i - 1]):
        i -= 1
    return CHUNK_BUDGETS[max(i - 1, 0)]
