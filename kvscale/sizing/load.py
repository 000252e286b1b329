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

Each admitted request also costs the engine r seconds of intake (EngineProfile.request_overhead_s:
HTTP, tokenization, admission), serial with the steps as kvscale.sim.engine charges it: the
step a prompt is admitted in ends r later for every running decode, so the prefill server's
work per prompt is its chunk steps plus r (lambda x r of the replica's time, the TTFT queue's
service times, each prompt's own TTFT), and a prompt token adds r / I to the decodes' gaps.

Capacity is whichever binds first: prefill compute (f reaches 1), decode (the TPOT of
the running batch), KV capacity or batch slots (every slot busy).

Where the engine runs prefill steps alone (SGLang, TensorRT-LLM: the profile's
decodes_during_prefill), t_m is the prefill-only step plus the decode step the running
requests take after waiting it out, and a prompt's own chunks carry no decodes; without
chunked prefill a prompt is one step. The formulas above hold as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

from kvscale.sizing.config import ServingConfig, default_chunk_budget_tokens
from kvscale.sizing.queueing import erlang_c, mmc_wait_percentile_s
from kvscale.sizing.roofline import StepTime, decode_step, mixed_step
from kvscale.sizing.workload import Burstiness, Slo, Workload

_BISECTION_STEPS = 10  # 2^-10 (0.1%) of the capacity rate: far finer than the model is accurate
_FIXED_POINT_STEPS = 3
_PERCENTILE_BISECTION_STEPS = 20  # 2^-20 of the range: about a microsecond for a 1 s step
_NEWTON_STEPS = 30
_MD1_DECAY: dict[float, float] = {}  # rho -> theta x S of M/D/1, cached (it depends on rho alone)
_CHUNK_GRAIN_TOKENS = 64  # packed chunks are costed in whole 64-token units (cache sharing)
CHUNK_BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384)  # --max-num-batched-tokens the planner considers
PREFILL_BUSY_SHARE = 0.7  # the TTFT tail is prefill compute once chunk steps fill this much of the time
MAX_BATCH_SHARE_OF_BUDGET = 0.5  # max-num-seqs <= half the token budget: the other half is room for chunks
REFERENCE_CHUNK_SHARE = 0.5  # the budget keeps TPOT when half of a request's token gaps carry a full chunk
_MAX_PACKED_PROMPTS = 64  # prompts sharing a step beyond this count as a full budget
ITL_PERCENTILE = 99.0  # the per-token gap a plan reports (itl_p99): the stalls a streaming user sees


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


def running_bucket_below(tokens: float) -> int:
    """The running bucket at or below `tokens` (running_bucket is the one at or above)."""
    n = max(1, math.floor(tokens))
    if n <= 16:
        return n
    grain = 1 << (n.bit_length() - 4)
    return n // grain * grain


class ReplicaModel:
    """Latency of one replica of a configuration for one workload, with its steps cached."""

    def __init__(
        self,
        cfg: ServingConfig,
        workload: Workload,
        steps_from: ReplicaModel | None = None,
        least_loaded: bool = False,
    ) -> None:
        """`steps_from`: a model of the same configuration under another chunk budget, whose
        cached step times this one shares (a step's time does not depend on the budget, only
        how many prompt tokens fit beside the decodes does). `least_loaded`: requests reach
        the fleet's replicas through a least-loaded router (a gateway's endpoint picker), not
        at random."""
        self.cfg = cfg
        self.workload = workload
        self.least_loaded = least_loaded
        self.budget = cfg.max_num_batched_tokens
        self._context = workload.mean_decode_context_tokens
        # Per admitted request, serial with the steps (kvscale.sim.engine Replica._prefill)
        self.intake_s = cfg.engine.request_overhead_s
        # Plain dicts: one planner run builds hundreds of these, and lru_cache wrappers cost
        # more to create than the look-ups they save.
        self._decodes: dict[int, StepTime] = steps_from._decodes if steps_from else {}
        self._mixeds: dict[tuple[int, int], StepTime] = steps_from._mixeds if steps_from else {}
        self._own_prefills: dict[int, StepTime] = {}
        self._length_steps: dict[tuple[int, int, int], float] = {}
        self._length_prefills: dict[tuple[int, int], float] = {}
        # (batch, decode step) -> the longest chunk step and, per output length's gaps, the
        # mean and variance of what one arrival adds to a request's life (_tpot_percentile)
        self._arrival_moments: dict[tuple[int, float], tuple[float, dict[int, _Extras]]] = {}

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
            step = self._mixeds[(batch, chunk)] = self._chunk_step(batch, chunk, self.workload.input_tokens)
        return step

    def _chunk_step(self, batch: int, chunk: int, prompt_tokens: int) -> StepTime:
        """A step with a prefill chunk as the running decodes see it: one step that carries
        them (vLLM), or a prefill-only step they wait out and then their own decode step
        (SGLang, TensorRT-LLM: the profile's decodes_during_prefill). Either way every
        formula below reads it as one token gap that holds a chunk."""
        if self.cfg.engine.decodes_during_prefill or batch <= 0:
            return mixed_step(self.cfg, batch, self._context, chunk, prompt_tokens)
        alone = mixed_step(self.cfg, 0, self._context, chunk, prompt_tokens)
        dec = self._decode(batch)
        return StepTime(
            seconds=alone.seconds + dec.seconds,
            compute_s=alone.compute_s + dec.compute_s,
            memory_s=alone.memory_s + dec.memory_s,
            communication_s=alone.communication_s + dec.communication_s,
            overhead_s=alone.overhead_s + dec.overhead_s,
            flops_per_gpu=alone.flops_per_gpu + dec.flops_per_gpu,
            bytes_per_gpu=alone.bytes_per_gpu + dec.bytes_per_gpu,
            peak_flops_per_s=alone.peak_flops_per_s,
            peak_bandwidth_bytes_per_s=alone.peak_bandwidth_bytes_per_s,
        )

    def _own_batch(self, batch: int) -> int:
        """Decodes beside a prompt's own chunks: none where prefill steps run alone."""
        return batch if self.cfg.engine.decodes_during_prefill else 0

    def decode(self, batch: int) -> StepTime:
        return self._decode(max(1, batch))

    def chunk_room(self, batch: int) -> int:
        """Prefill tokens a step has room for beside `batch` running decodes: the budget less
        one token per decode (vLLM: running requests first); the whole budget where prefill
        steps run alone; whole prompts, however long, without chunked prefill."""
        engine = self.cfg.engine
        if not engine.chunked_prefill:
            return max(self.budget, self.workload.inputs.max)
        if not engine.decodes_during_prefill:
            return self.budget
        return max(1, self.budget - batch)

    def mixed(self, batch: int, chunk: int | None = None) -> StepTime:
        """A step with `batch` decodes and a chunk (default: as much of one prompt as fits)."""
        room = self.chunk_room(batch)
        return self._mixed(max(0, batch), min(room, chunk if chunk is not None else self.workload.input_tokens))

    def own_prefill_s(self, batch: int) -> float:
        """own_prefill(batch).seconds, without building the summed StepTime."""
        batch = self._own_batch(batch)
        room = self.chunk_room(batch)
        full, rest = divmod(self.workload.input_tokens, room)
        seconds = full * self._mixed(batch, room).seconds if full else 0.0
        return seconds + (self._mixed(batch, rest).seconds if rest else 0.0)

    def length_chunk_s(self, batch: int, chunk: int, prompt_tokens: int) -> float:
        """One step of `batch` decodes and a chunk of a prompt of `prompt_tokens` (bucketed)."""
        room = self.chunk_room(batch)
        key = (batch, min(chunk, room), running_bucket(prompt_tokens))
        seconds = self._length_steps.get(key)
        if seconds is None:
            seconds = self._chunk_step(batch, key[1], key[2]).seconds
            self._length_steps[key] = seconds
        return seconds

    def length_prefill_s(self, batch: int, prompt_tokens: int) -> float:
        """Chunk steps of one prompt of `prompt_tokens` (bucketed up) beside `batch` decodes (its
        attention over its own length: a long prompt of the mix costs more per token than the mean)."""
        batch = self._own_batch(batch)
        return self._bucket_prefill_s(batch, running_bucket(prompt_tokens))

    def prompt_prefill_s(self, batch: int, prompt_tokens: int) -> float:
        """length_prefill_s for a request's own TTFT: costed at the running buckets either side
        of the length and interpolated between them. Costing a prompt at the bucket above (up to
        1/8 longer) put a prompt just inside the TTFT target on an idle replica outside it."""
        batch = self._own_batch(batch)
        known = self._length_prefills.get((batch, prompt_tokens))
        if known is not None:
            return known
        above = running_bucket(prompt_tokens)
        below = running_bucket_below(prompt_tokens)
        seconds = self._bucket_prefill_s(batch, above)
        if below < above:
            share = (above - prompt_tokens) / (above - below)
            seconds += share * (self._bucket_prefill_s(batch, below) - seconds)
        self._length_prefills[(batch, prompt_tokens)] = seconds
        return seconds

    def _bucket_prefill_s(self, batch: int, prompt: int) -> float:
        """Chunk steps of a prompt of `prompt` tokens (a running bucket) beside `batch` decodes."""
        key = (batch, -prompt)  # beside the per-length entries, apart from them
        known = self._length_prefills.get(key)
        if known is not None:
            return known
        room = self.chunk_room(batch)
        full, rest = divmod(prompt, room)
        rest = -(-rest // _CHUNK_GRAIN_TOKENS) * _CHUNK_GRAIN_TOKENS if rest else 0
        seconds = (full * self.length_chunk_s(batch, room, prompt) if full else 0.0) + (
            self.length_chunk_s(batch, rest, prompt) if rest else 0.0
        )
        self._length_prefills[key] = seconds
        return seconds

    def own_prefill(self, batch: int) -> StepTime:
        """The chunk steps one prompt needs beside `batch` running decodes, summed."""
        batch = self._own_batch(max(0, batch))
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
        by_kv = mem.max_batch_for_context(self.workload.context_tokens)
        return min(by_kv, self.cfg.engine.max_num_seqs_limit * self.cfg.data_parallel)  # per engine (rank)

    @property
    def slot_limit(self) -> int:
        """Most sequences the engine may run: KV, its own limit, and max-num-seqs at most half
        the budget (vLLM requires <= budget; a batch limit next to the budget leaves a step no
        room for prefill, so prompts wait behind full decode steps)."""
        return min(self.kv_max_batch, max(1, int(self.budget * MAX_BATCH_SHARE_OF_BUDGET)))

    @property
    def max_context_fits(self) -> bool:
        """vLLM refuses to start unless one sequence of max-model-len fits in the KV cache."""
        mem = self.cfg.memory  # with data-parallel attention, in one rank's cache
        rank = mem.kv_capacity_tokens // self.cfg.data_parallel
        return rank >= mem.sequence_tokens(self.workload.engine_max_context_tokens)

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

    def _mix(self, rate_per_s: float, batch: int) -> tuple[StepTime, StepTime, float, float, float]:
        """Decode step, chunk step, mean gap, chunk share and the intake a chunk step's gap
        carries (the prompts it admits, chunk / I of them on average, r each) at `batch` running
        decodes."""
        dec = self.decode(batch)
        chunk = self._chunk(rate_per_s, batch)
        mix = self.mixed(batch, chunk)
        chunk_rate = rate_per_s * self.workload.input_tokens / chunk  # chunk steps per second
        intake = self.intake_s * chunk / self.workload.input_tokens
        busy = chunk_rate * (mix.seconds + intake - dec.seconds)
        if busy >= 1.0 or chunk_rate * (mix.seconds + intake) >= 1.0:
            return dec, mix, math.inf, 1.0, intake
        gap = dec.seconds / (1.0 - busy)
        return dec, mix, gap, chunk_rate * gap, intake

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
        # Prefill compute: chunk steps (full) and intake fill the whole time: rate x (I / room x
        # t_m + r) = 1.
        prefill_rate = 1.0 / (inp * mix.seconds / room + self.intake_s)
        # Slots: every slot busy for its request's life (intake, prefill, out decode gaps).
        slot_rate = batch / (self.intake_s + self.own_prefill_s(batch) + out * dec.seconds)
        return min(prefill_rate, slot_rate)

    def at_rate(
        self,
        rate_per_s: float,
        max_batch: int,
        percentile: float,
        against: tuple[float, float] | None = None,
    ) -> LoadPoint:
        """Steady state at an arrival rate: running concurrency by fixed point, then queues.

        `against` (TTFT, TPOT seconds): only whether the percentiles are within these matters
        (`meets`): each is then resolved only that far (at most the target when within, above
        it when not), one evaluation of its tail where the full search takes twenty; a TTFT
        already past its target leaves TPOT unresolved (infinite): the answer is no either way."""
        out = self.workload.output_tokens
        batch_cap = max(1, max_batch)
        if rate_per_s <= 0:  # an idle engine: the prompt's own chunks, then decode alone
            dec = self.decode(1)
            own = self.own_prefill(0).seconds
            ttft_idle = self.intake_s + own + dec.seconds
            if not self.workload.inputs.is_constant:  # the percentile prompt's own chunks
                ttft_idle = (
                    self.intake_s
                    + self.prompt_prefill_s(0, self.workload.inputs.spread_quantile(percentile / 100.0))
                    + dec.seconds
                )
            return LoadPoint(
                0.0, max_batch, 0.0, own, dec, dec, ttft_idle, dec.seconds, dec.seconds, dec.seconds, 0.0, 0.0
            )
        intake = self.intake_s
        concurrency = min(
            rate_per_s * (intake + self.prefill_step.seconds + out * self.decode(1).seconds), float(batch_cap)
        )
        gap = self.decode(1).seconds
        dec, mix, share, chunk_intake = self.decode(1), self.mixed(1), 0.0, 0.0
        for _ in range(_FIXED_POINT_STEPS):  # converges fast: step time grows slowly with batch
            n = running_bucket(concurrency)
            dec, mix, gap, share, chunk_intake = self._mix(rate_per_s, n)
            if not math.isfinite(gap):
                break
            hold = intake + self.own_prefill_s(n) + (out - 1) * gap + gap
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
        hold = intake + own + out * gap
        slot_wait = mmc_wait_percentile_s(batch_cap, rate_per_s, hold, percentile)
        prefill_util = share * (mix.seconds + chunk_intake) / gap  # share of time in chunk steps and intake
        # What a prompt token adds to a step, costed at one prompt's chunk (packing several
        # under load costs less per token, but the tail is made of the steps that do not).
        one = min(self.chunk_room(n), self.workload.input_tokens)
        per_token_gpu_s = (self.mixed(n, one).seconds - dec.seconds) / one
        per_prompt_s = self.workload.input_tokens * per_token_gpu_s
        per_token_s = per_token_gpu_s + intake / self.workload.input_tokens  # the intake, spread over the prompt
        arrivals = self._replica_arrivals(rate_per_s)
        ttft_against, tpot_against = against if against is not None else (None, None)
        ttft, prefill_wait = self._ttft_percentile(
            n, prefill_util, slot_wait + gap / 2.0, arrivals, percentile, ttft_against, self._fleet_size(rate_per_s)
        )
        gaps = max(out - 1, 0)
        if ttft_against is not None and ttft > ttft_against:
            tpot_p = math.inf  # misses on TTFT: the TPOT tail (the costlier one) cannot change that
        else:
            tpot_p = self._tpot_percentile(
                rate_per_s, n, dec.seconds, per_token_s, arrivals, percentile, hold, tpot_against
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

    def _fleet_size(self, rate_per_s: float) -> float:
        """Replicas sharing one queue: behind a least-loaded router, the fleet rate over this
        replica's (1: a random router, every replica its own queue)."""
        total = self.workload.requests_per_s
        if not self.least_loaded or rate_per_s <= 0.0 or total <= rate_per_s:
            return 1.0
        return total / rate_per_s

    def _joins_share(self, rate_per_s: float, hold_s: float) -> float:
        """Share of the fleet's arrivals during a request's life that join its replica, over the
        share a random router sends there. Behind a least-loaded router (the gateway's endpoint
        picker) a replica holding a request takes a new one only when no other replica is idle:
        with N = fleet rate / replica rate replicas each holding rate x hold requests on
        average, the other N - 1 hold (N - 1) x rate x hold between them (Poisson), and the
        router leaves none idle only when they hold at least N - 1. Behind a random router, or
        for a fleet of one, every arrival meant for this replica comes."""
        total = self.workload.requests_per_s
        if not self.least_loaded or rate_per_s <= 0.0 or total <= rate_per_s:
            return 1.0
        others = total / rate_per_s - 1.0
        return _poisson_at_least(others * rate_per_s * hold_s, others)

    def _replica_arrivals(self, rate_per_s: float) -> Burstiness:
        """The burstiness one replica sees: routing spreads a burst over the fleet, so of the
        fleet's excess dispersion D - 1 a replica carrying a share s of the load sees s (D - 1)."""
        fleet = self.workload.arrivals
        total = self.workload.requests_per_s
        share = min(1.0, rate_per_s / total) if total > 0 else 1.0
        requests = 1.0 + (fleet.burst_requests - 1.0) * share if fleet.burst_requests > 0.0 else 0.0
        return Burstiness(1.0 + (fleet.index_of_dispersion - 1.0) * share, fleet.window_s, fleet.burst_share, requests)

    def _ttft_percentile(
        self,
        batch: int,
        prefill_util: float,
        fixed_s: float,
        arrivals: Burstiness,
        percentile: float,
        against_s: float | None = None,
        fleet: float = 1.0,
    ) -> tuple[float, float]:
        """TTFT at the percentile over the prompt-length mix, and its wait behind other prompts
        (resolved only as far as a comparison with `against_s` needs, when given: see `at_rate`).

        A request's TTFT is `fixed_s` (slot wait, the step in flight) + its own chunk steps +
        its wait behind other prompts' chunks: the burst companions that arrived just before
        it (a request sees D - 1 others of its burst, uniformly placed around it, so up to
        D - 1 prompts ahead) plus the background queue (M/G/1: waits with probability rho,
        exponential tail at the Cramer-Lundberg decay rate of the prompts' prefill times).

        A request's own chunk steps are read over the lengths' spread pieces (each bin's
        lengths spread between its shortest and longest, LengthDistribution.pieces), their time
        even over a piece: where the TTFT target cuts through the longest bin, only the part of
        it beyond the cut misses on an idle replica. Costing the bin at its mean put all of it
        on one side: with the p99 cut inside the top 1% bin, the whole 1% missed at idle, no
        load was left within the percentile and a replica's rate came out ~0 (issue 35).
        """
        if prefill_util >= 1.0:
            return math.inf, math.inf
        inputs = self.workload.inputs
        # The prefill server's service per prompt: its intake, then its chunk steps
        owns = [(self.intake_s + self.prompt_prefill_s(batch, t), w) for t, w in inputs.points]
        # A request's own: the start of its piece, the spread over it, the weight
        pieces = []
        for first, last, w in inputs.pieces:
            start = self.intake_s + self.prompt_prefill_s(batch, first)
            end = start if last == first else self.intake_s + self.prompt_prefill_s(batch, last)
            pieces.append((start, max(0.0, end - start), w))
        room = self.chunk_room(batch)
        per_token_full_s = self.mixed(batch, room).seconds / room
        width = arrivals.companions_span * (inputs.mean * per_token_full_s + self.intake_s)
        in_burst = arrivals.burst_share
        mean_wait = _mg1_tail_scale_s(owns, prefill_util)
        busy = prefill_util
        if fleet > 1.0:
            # Behind a least-loaded router the fleet's prefill work is one queue: a prompt
            # waits only when no replica is free of chunks (Erlang C over the fleet, each
            # replica busy prefill_util), and the wait drains fleet-fold faster (M/M/c).
            busy = erlang_c(math.ceil(fleet), fleet * prefill_util)
            mean_wait /= fleet
        tail = 1.0 - percentile / 100.0

        alone = 0.0 if in_burst >= 1.0 else (1.0 - in_burst)

        def over(x: float, stop_above: float) -> float:
            # The spread of a piece's own time and the companions' are both even: their sum is
            # taken as one even spread of the summed width (the same mean, exact when either is 0)
            total = 0.0
            for own, spread, w in pieces:
                if total > stop_above:  # the rest only adds (see _bisect_percentile)
                    break
                total += w * (
                    in_burst * _queue_tail(x - fixed_s - own, spread + width, busy, mean_wait)
                    + (alone * _queue_tail(x - fixed_s - own, spread, busy, mean_wait) if alone else 0.0)
                )
            return total

        if len(pieces) == 1 and pieces[0][1] <= 0.0 and width <= 0.0:  # one length, Poisson: closed form
            queued = mean_wait * math.log(busy / tail) if busy > tail and mean_wait > 0 else 0.0
            return fixed_s + owns[0][0] + queued, queued
        longest = max(own + spread for own, spread, _ in pieces)
        queue_top = mean_wait * math.log(busy / tail) if busy > tail and mean_wait > 0 else 0.0
        hi = fixed_s + longest + width + queue_top + 1e-9
        lo = fixed_s + min(own for own, _, _ in pieces)
        ttft = _bisect_percentile(over, lo, hi, tail, against_s)
        own_p = (
            self.intake_s + self.prompt_prefill_s(batch, inputs.spread_quantile(percentile / 100.0))
            if not inputs.is_constant
            else owns[0][0]
        )
        return ttft, max(0.0, ttft - fixed_s - own_p)

    def _tpot_percentile(
        self,
        rate_per_s: float,
        batch: int,
        decode_s: float,
        per_token_s: float,
        arrivals: Burstiness,
        percentile: float,
        hold_s: float = 0.0,
        against_s: float | None = None,
    ) -> float:
        """Per-request TPOT at the percentile over the output-length mix (resolved only as far
        as a comparison with `against_s` needs, when given: see `at_rate`).

        A request with g token gaps waits g decode steps plus the chunks of the prompt tokens
        computed during its life (g x its TPOT: a slower request sees more arrivals): those
        arriving meanwhile (a Poisson count, negative binomial when over-dispersed, each
        arrival's tokens normal around the mean prompt; normal in total for many arrivals)
        plus its burst companions queued behind it (uniform over 0..D-1 prompts). At most one
        chunk per gap: one prompt adds at most g chunk steps, and its TPOT never exceeds the
        full mixed step. Behind a least-loaded router only the arrivals that find no idle
        replica join its replica (`_joins_share`). Short outputs average few
        gaps, so under bursts they run at the full mixed step.
        """
        outputs = self.workload.outputs
        inputs = self.workload.inputs
        room = self.chunk_room(batch)
        # The longest gap: a full chunk step and the intake of the prompts it admits (one at
        # least; room / I when several whole prompts fit)
        intake_s = self.intake_s * max(1.0, room / inputs.mean)
        full_s = max(self.mixed(batch, room).seconds + intake_s, decode_s)
        if per_token_s <= 0 or (rate_per_s <= 0 and arrivals.is_poisson):
            return decode_s
        mean_in = inputs.mean
        square_in = sum(t * t * w for t, w in inputs.points)
        width = arrivals.companions_span * mean_in
        gaps = [(o - 1, w) for o, w in outputs.points if o > 1]
        if not gaps:
            return 0.0
        tail = 1.0 - percentile / 100.0
        arrivals_rate = rate_per_s * mean_in

        if len(gaps) == 1 and width <= 0.0 and arrivals.is_poisson:
            # One output length, Poisson: (x - decode) g / per_token = mean(gx) + z sd(gx) is a
            # quadratic in sqrt(x).
            g = gaps[0][0]
            z = NormalDist().inv_cdf(1.0 - tail)
            a = g / per_token_s - arrivals_rate * g
            if a <= 0.0:
                return full_s
            b = z * math.sqrt(rate_per_s * g * square_in)
            c = decode_s * g / per_token_s + 0.5 * mean_in
            root = (b + math.sqrt(b * b + 4.0 * a * c)) / (2.0 * a)
            return min(max(root * root, decode_s), full_s)

        # Each arrival adds its chunk steps' time beyond the decode steps they replace; a long
        # prompt's chunks attend over more context, so the cost is per prompt length. A request
        # of g gaps shares at most g steps with one prompt: a prompt of more chunks adds only g
        # chunk steps to it (the rest run after it finished).
        known = self._arrival_moments.get((batch, decode_s))
        if known is None:  # the same for every rate at this running batch
            steps = [
                (t, math.ceil(t / room), self.length_prefill_s(batch, t), self.length_chunk_s(batch, room, t))
                for t, _ in inputs.points
            ]
            per_gaps: dict[int, _Extras] = {}
            for g, _ in gaps:
                # ... and its intake, once, when it is admitted during the request's life
                extras = tuple(
                    (min(own_s - chunks * decode_s, g * (chunk_s - decode_s)) + self.intake_s, w)
                    for (_, chunks, own_s, chunk_s), (_, w) in zip(steps, inputs.points, strict=True)
                )
                mean_x = sum(x * w for x, w in extras)
                per_gaps[g] = (mean_x, max(0.0, sum(x * x * w for x, w in extras) - mean_x * mean_x), extras)
            known = self._arrival_moments[(batch, decode_s)] = (max(chunk_s for *_, chunk_s in steps), per_gaps)
        longest_chunk_s, per_gaps = known
        full_s = max(full_s, longest_chunk_s + intake_s)
        span = arrivals.companions_span
        moments = {g: (mean_x, var_x, span * mean_x, one) for g, (mean_x, var_x, one) in per_gaps.items()}
        joins = self._joins_share(rate_per_s, hold_s)
        in_burst = arrivals.burst_share

        def over(x: float, stop_above: float) -> float:
            """P(TPOT > x): a request whose TPOT is x lives g x, and the prompts that arrive
            over that life (and join its replica) must add more than (x - decode) g of chunk time.
            Once the sum passes `stop_above` the rest is not added (see _bisect_percentile)."""
            if x >= full_s:
                return 0.0
            total = 0.0
            for g, w in gaps:
                if total > stop_above:
                    break
                life = g * x
                mean_x, var_x, width_s, one = moments[g]
                count, dispersion = rate_per_s * life * joins, arrivals.dispersion_at(life)
                y = (x - decode_s) * g
                total += w * in_burst * _arrival_tokens_tail(y, count, dispersion, mean_x, var_x, width_s, one)
                if in_burst < 1.0:  # the requests that arrive alone have no companions
                    total += w * (1.0 - in_burst) * _arrival_tokens_tail(y, count, dispersion, mean_x, var_x, 0.0, one)
            return total

        return _bisect_percentile(over, decode_s, full_s, tail, against_s)

    def zero_load(self, percentile: float) -> LoadPoint:
        return self.at_rate(0.0, 1, percentile)

    def worst_step_s(self, max_batch: int) -> float:
        """The longest step a running request can sit through: the whole token budget, the
        running decodes (the request itself and up to `max_batch` - 1 others) and a prefill
        chunk of the longest prompt in the mix filling the rest. A backlog of waiting prompts
        fills it: the scheduler packs every waiting prompt the budget holds (vLLM v1's
        scheduler: decodes first, then prefill tokens up to --max-num-batched-tokens).

        With the step's tokens fixed, moving a token from the chunk to a decode changes only
        the attention term (the GEMMs, all-reduces and overheads see the same token count),
        which is a max of terms linear in the decode count: convex, so the longest such step
        has one decode or `max_batch` of them."""
        longest = self.workload.inputs.max
        return max(
            self.length_chunk_s(n, self.chunk_room(n), longest) for n in {1, max(1, min(max_batch, self.budget - 1))}
        )

    def itl_percentile_s(self, point: LoadPoint, percentile: float = ITL_PERCENTILE) -> float:
        """The per-token gap at `percentile` at a load point: what a streaming user sees stall.

        A share `chunk_share` of the steps carries a prefill chunk (every running request
        waits for it), the rest are decode steps. A prompt of t tokens runs as t // room full
        chunks of the room beside the running decodes and a last chunk of the rest, which it
        shares with the prompts that arrived during the same step as it did (the scheduler
        admits every waiting prompt the budget holds at the next step). A prompt arrives
        during a chunk step for the share of time chunk steps take, else during a decode
        step; the others arriving in that step are Poisson at the rate x the step's length (a
        chunk step at the load model's packed length, `LoadPoint.mixed`). A step shared by
        k + 1 prompts is one step for all of them (weight 1 / (k + 1)). The percentile is read
        off the mixture of step times: each step is one gap for every running request, so
        token- and step-weighted shares agree.

        Against the simulator (tests/unit/test_itl.py) it is within 10% while chunk steps are
        a few percent of the steps, as at a planned load; with chunk steps at ~30% of the
        steps the backlog packs longer chunks than one step's arrivals and it reads ~20% low.
        `worst_step_s` bounds it either way."""
        dec_s = point.decode.seconds
        share = min(1.0, max(0.0, point.chunk_share))
        if share <= 0.0 or point.rate_per_s <= 0.0:
            return dec_s
        n = running_bucket(point.concurrency)
        room = self.chunk_room(n)
        inputs = self.workload.inputs
        in_chunk = min(1.0, share * point.mixed.seconds / point.tpot_mean_s) if point.tpot_mean_s > 0 else 1.0
        others = [(in_chunk, point.rate_per_s * point.mixed.seconds), (1.0 - in_chunk, point.rate_per_s * dec_s)]
        steps: list[tuple[float, float]] = []  # (step time, weight before normalising)
        for t, w in inputs.points:
            full, rest = divmod(t, room)
            if full:
                steps.append((self.length_chunk_s(n, room, t), w * full))
            if not rest:
                continue
            k, seen = 0, 0.0
            while seen < 1.0 - 1e-9:
                p_k = sum(u * math.exp(-m) * m**k / math.factorial(k) for u, m in others if u > 0.0)
                tokens = min(room, math.ceil((rest + k * inputs.mean) / _CHUNK_GRAIN_TOKENS) * _CHUNK_GRAIN_TOKENS)
                last = tokens >= room or k >= _MAX_PACKED_PROMPTS
                weight = (1.0 - seen) if last else p_k
                steps.append((self.length_chunk_s(n, tokens, t), w * weight / (k + 1)))
                if last:
                    break
                seen += p_k
                k += 1
        total = sum(w for _, w in steps)
        mixture = sorted([(dec_s, 1.0 - share), *((s, share * w / total) for s, w in steps)])
        seen, want = 0.0, percentile / 100.0 - 1e-12
        for seconds, w in mixture:
            seen += w
            if seen >= want:
                return seconds
        return mixture[-1][0]

    def limited_by(self, point: LoadPoint, slo: Slo) -> str:
        """What keeps this replica from carrying more than `point` (its highest rate within
        the SLO): the term that a little more load breaks first.

        ttft-tail: the TTFT percentile (waiting behind other prompts' chunks, bursts
        included); tpot-tail: the per-request TPOT percentile (decode steps stretched by
        chunks); kv-capacity / batch-slots: every slot busy (the KV cache, or max-num-seqs,
        sets the limit) so arrivals queue for a slot; prefill-compute: the TTFT tail with chunk
        steps filling most of the time (or prefill alone saturating the GPU). `explain` says why the hardware is not busier.
        """
        above = self.at_rate(point.rate_per_s * 1.02 + 1e-6, point.max_batch, slo.percentile)
        slots = "kv-capacity" if point.max_batch >= self.kv_max_batch else "batch-slots"
        if not above.stable:
            return "prefill-compute" if above.chunk_share >= 1.0 else slots
        ttft_excess = above.ttft_p_s / slo.ttft_s
        tpot_excess = above.tpot_p_s / slo.tpot_s
        if ttft_excess >= tpot_excess:
            if above.slot_wait_p_s > above.prefill_wait_p_s:
                return slots
            prefill_busy = point.chunk_share * point.mixed.seconds / point.tpot_mean_s if point.tpot_mean_s else 0.0
            return "prefill-compute" if prefill_busy >= PREFILL_BUSY_SHARE else "ttft-tail"
        return "tpot-tail"

    def explain(self, point: LoadPoint, slo: Slo, limit: str) -> str:
        """One sentence on what binds at `point` and why MFU/MBU stay where they are."""
        pct = f"p{slo.percentile:g}"
        busy = f"MFU {point.mfu:.0%}, MBU {point.mbu:.0%}"
        if limit == "ttft-tail" or (limit == "prefill-compute" and point.stable and point.chunk_share < 1.0):
            return (
                f"{pct} TTFT {point.ttft_p_s:.2f}s of {slo.ttft_s:.2f}s: own prefill {point.prefill_s:.2f}s + "
                f"{point.prefill_wait_p_s:.2f}s waiting behind other prompts' chunks (steps carrying chunks "
                f"{point.chunk_share * point.mixed.seconds / point.tpot_mean_s:.0%} of the time); more load lengthens "
                f"that queue before the GPU is busy ({busy})"
            )
        if limit == "tpot-tail":
            return (
                f"{pct} TPOT {point.tpot_p_s * 1e3:.1f}ms of {slo.tpot_s * 1e3:.0f}ms: decode step "
                f"{point.decode.seconds * 1e3:.1f}ms at {point.concurrency:.0f} running ({point.decode.limited_by}-bound), "
                f"stretched by prefill chunks in {point.chunk_share:.0%} of steps; a larger batch or more chunks would "
                f"break TPOT ({busy})"
            )
        if limit in ("kv-capacity", "batch-slots"):
            what = "the KV cache" if limit == "kv-capacity" else "max-num-seqs"
            return (
                f"{what} allows {point.max_batch} running requests; at {point.concurrency:.0f} running, arrivals queue "
                f"for a slot ({busy})"
            )
        return f"prefill work fills the GPU: chunk steps in {point.chunk_share:.0%} of steps ({busy})"

    def meets(self, slo: Slo, max_batch: int, rate_per_s: float) -> bool:
        """Whether p-TTFT and p-TPOT both meet the SLO at this arrival rate."""
        point = self.at_rate(rate_per_s, max_batch, slo.percentile, against=(slo.ttft_s, slo.tpot_s))
        return point.ttft_p_s <= slo.ttft_s and point.tpot_p_s <= slo.tpot_s

    def max_rate_meeting(
        self, slo: Slo, max_batch: int, at_least_per_s: float = 0.0, below_per_s: float | None = None
    ) -> float:
        """Highest arrival rate at which p-TTFT and p-TPOT both meet the SLO (0 when none),
        to 2^-10 of the replica's capacity.

        `at_least_per_s`: only a rate above this is of interest (another configuration
        already carries it); when this one misses the SLO there, -1 comes back at once.
        `below_per_s`: a rate known to miss, which narrows the search."""

        def meets(rate: float) -> bool:
            return self.meets(slo, max_batch, rate)

        top = self.capacity_rate_per_s(max_batch)
        lo, hi = at_least_per_s, min(top, below_per_s) if below_per_s is not None else top
        if not meets(lo):
            return -1.0 if at_least_per_s > 0 else 0.0
        grain = top / (1 << _BISECTION_STEPS)
        steps = max(1, math.ceil(math.log2(max(hi - lo, grain) / grain)))
        for _ in range(min(steps, _BISECTION_STEPS)):
            mid = (lo + hi) / 2.0
            if meets(mid):
                lo = mid
            else:
                hi = mid
        return lo


def _bisect_percentile(
    over: Callable[[float, float], float], lo: float, hi: float, tail: float, against: float | None = None
) -> float:
    """The smallest x in [lo, hi] with over(x) <= tail, for a non-increasing tail function
    (a mass exactly at the tail, as at a bin edge, counts as within it). With `against`, only
    the side of it the answer lies on: a value at most `against` when within, above it when
    not (`hi` and `lo` bound the answer, so outside them no tail is evaluated).

    `over(x, stop_above)` sums non-negative terms and may return as soon as its partial sum
    exceeds `stop_above` (the threshold here): a sum of non-negative floats never decreases,
    so the comparison comes out as it would with every term added."""
    tail += 1e-9
    if against is not None:
        if against >= hi or against < lo:
            return hi if against >= hi else lo
        return against if over(against, tail) <= tail else hi
    if over(lo, tail) <= tail:
        return lo
    if over(hi, tail) > tail:
        return hi
    for _ in range(_PERCENTILE_BISECTION_STEPS):
        mid = (lo + hi) / 2.0
        if over(mid, tail) <= tail:
            hi = mid
        else:
            lo = mid
    return hi


def _mg1_tail_scale_s(services: list[tuple[float, float]], utilization: float) -> float:
    """1 / theta, where P(wait > t) ~ rho exp(-theta t) in an M/G/1 queue: theta > 0 solves
    lambda (E[exp(theta S)] - 1) = theta (Cramer-Lundberg). Exact for exponential service;
    for constant service (M/D/1) it is about 30% below the conditional mean wait that a plain
    exponential fit would use, which over-states the tail of long, regular prefills."""
    mean_s = sum(s * w for s, w in services)
    if utilization <= 0.0 or mean_s <= 0.0:
        return 0.0
    if utilization >= 1.0:
        return math.inf
    if len(services) == 1:  # one service time: theta S depends on rho alone
        key = round(utilization, 5)
        if key <= 0.0:  # a utilization below 5e-6 (--rps 1e-300): no queue to wait in
            return 0.0
        if key >= 1.0:  # within 5e-6 of saturation: its own decay, not the saturated key's (none)
            return mean_s * _mg1_tail_scale_s([(1.0, 1.0), (1.0, 0.0)], utilization)
        known = _MD1_DECAY.get(key)
        if known is None:
            known = _MD1_DECAY[key] = 1.0 / _mg1_tail_scale_s([(1.0, 1.0), (1.0, 0.0)], key)
        return mean_s / known
    rate = utilization / mean_s
    spread = [(s, w) for s, w in services if w > 0.0]
    exp = math.exp

    def slope_and_gap(theta: float) -> tuple[float, float]:
        """f(theta) = log E[exp(theta S)] - log(1 + theta / rate) and its derivative, the first
        term by log-sum-exp (a long prefill's exp(theta S) would overflow)."""
        top = max(theta * s for s, _ in spread)
        total = weighted = 0.0  # sums in the order (and so to the bit) of sum() over the terms
        for s, w in spread:
            t = w * exp(theta * s - top)
            total += t
            weighted += s * t
        gap = top + math.log(total) - math.log1p(theta / rate)
        return weighted / total - 1.0 / (rate + theta), gap

    # f is convex (a cumulant generating function less a concave log), zero at 0 and negative
    # just above it: Newton from a point where it is positive descends monotonically onto the
    # root, and in this log form it grows about linearly, so a few steps converge (on
    # rate (E[exp(theta S)] - 1) = theta itself Newton crawls down the exponential of the
    # longest prefill, about 1/S_max a step).
    theta = 2.0 * (1.0 - utilization) / (utilization * mean_s) + 1.0 / mean_s
    while slope_and_gap(theta)[1] <= 0.0:
        theta *= 2.0
    for _ in range(_NEWTON_STEPS):
        slope, gap = slope_and_gap(theta)
        step = gap / slope
        theta -= step
        if step < 1e-9 * theta:
            break
    return 1.0 / theta


def _poisson_at_least(mean: float, count: float) -> float:
    """P(X >= count) for X Poisson with `mean`, `count` >= 0 taken up to the next whole
    number (a fleet of fractional replicas counts its last one whole)."""
    k = math.ceil(count - 1e-9)
    if k <= 0:
        return 1.0
    if mean <= 0.0:
        return 0.0
    if mean > 400.0:  # normal, with continuity correction
        return _normal_tail((k - 0.5 - mean) / math.sqrt(mean))
    term = math.exp(-mean)
    below = 0.0
    for i in range(k):
        below += term
        term *= mean / (i + 1)
    return min(1.0, max(0.0, 1.0 - below))


_COUNT_SUM_LIMIT = 30.0  # arrivals expected in a life above which their count is taken as normal


# What one arrival adds to a request's life: mean, variance, and the mixture itself (added
# seconds, weight), one point per prompt length.
_Extras = tuple[float, float, tuple[tuple[float, float], ...]]


def _arrival_tokens_tail(
    y: float,
    mean_count: float,
    dispersion: float,
    mean_in: float,
    var_in: float,
    width: float,
    one: tuple[tuple[float, float], ...] | None = None,
) -> float:
    """P(companions + S_N > y): N arrivals over a life (mean `mean_count`, variance dispersion
    x mean: Poisson or negative binomial), S_N the sum of N prompt lengths (mean `mean_in`,
    variance `var_in`, normal given N), companions uniform on [0, width] tokens.

    `one`: the length mixture itself (value, weight), used for N = 1 instead of the normal.
    One budget of misses is shared by the whole mixture: when a single arrival is what a
    request meets (a replica at a low rate), its tail is the share of prompts long enough to
    break the target, not a normal whose spread the longest 1% of prompts set. With a heavy
    tail (sd several times the mean) that normal put ~15% of single arrivals beyond the mean
    plus one sd where the mixture has a few percent, and the TPOT tail then held a replica's
    rate near zero (issue 26: 307 replicas where the simulator needs ~55)."""
    if mean_count <= 0.0:
        return _uniform_plus_normal_tail(y, 0.0, 0.0, width)
    if mean_count > _COUNT_SUM_LIMIT:
        sd = math.sqrt(mean_count * var_in + dispersion * mean_count * mean_in * mean_in)
        return _uniform_plus_normal_tail(y, mean_count * mean_in, sd, width)
    if dispersion > 1.0 + 1e-9:  # negative binomial: r = m / (D - 1), success probability 1 / D
        r, q = mean_count / (dispersion - 1.0), 1.0 / dispersion
        p = math.exp(r * math.log(q))
        grow = 1.0 - q
    else:
        r, p, grow = 0.0, math.exp(-mean_count), 0.0
    total, seen, n = 0.0, 0.0, 0
    # The planner's innermost loop: `_uniform_plus_normal_tail` inlined (the same arithmetic,
    # so the same answers), with the math functions bound locally.
    erfc, exp, sqrt, root2, root2pi = math.erfc, math.exp, math.sqrt, _SQRT_2, _SQRT_2PI
    sds, end = _TAIL_SDS, 1.0 - 1e-7
    while seen < end and n < 400:
        mean = n * mean_in
        sd = sqrt(n * var_in)
        spread = sds * sd
        if n == 1 and one is not None:  # the mixture's own points reach past any normal's spread
            total += p * sum(w * _uniform_plus_normal_tail(y, x, 0.0, width) for x, w in one)
        # The tail grows with n (each arrival adds non-negative tokens): a term far below y
        # adds nothing, and once one is certain every later one is (their mass at once).
        elif mean - spread > y:
            return min(1.0, total + max(0.0, 1.0 - seen))
        elif mean + width + spread >= y:
            if sd <= 0.0:
                total += p * _uniform_plus_normal_tail(y, mean, sd, width)
            elif width <= _NARROW * sd:  # (see _uniform_plus_normal_tail)
                total += p * 0.5 * erfc((y - mean - width / 2.0) / sd / root2)
            else:
                z0 = (y - mean) / sd
                z1 = (y - width - mean) / sd
                i0 = z0 * (0.5 * erfc(z0 / root2)) - exp(-0.5 * z0 * z0) / root2pi
                i1 = z1 * (0.5 * erfc(z1 / root2)) - exp(-0.5 * z1 * z1) / root2pi
                share = sd / width * (i0 - i1)  # clamped to [0, 1] (NaN to 0) as min(1, max(0, .))
                total += p * (1.0 if share > 1.0 else share if share > 0.0 else 0.0)
        seen += p
        p *= ((n + r) * grow if grow else mean_count) / (n + 1)
        n += 1
    return min(1.0, total + max(0.0, 1.0 - seen))


_SQRT_2, _SQRT_2PI = math.sqrt(2.0), math.sqrt(2.0 * math.pi)
_NARROW = 1e-6  # a uniform this narrow against the normal's deviation adds only its mean


_TAIL_SDS = 9.0  # a normal beyond this many standard deviations is certain (its tail < 1e-18)


def _normal_tail(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _normal_tail_integral(z: float) -> float:
    """An antiderivative of the normal tail Q: z Q(z) - phi(z)."""
    return z * _normal_tail(z) - math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _uniform_plus_normal_tail(y: float, mean: float, sd: float, width: float) -> float:
    """P(U + N > y) for U uniform on [0, width] and N normal(mean, sd)."""
    if sd <= 0.0:
        if width <= 0.0:
            return 1.0 if mean > y else 0.0
        return min(1.0, max(0.0, (width - (y - mean)) / width))
    if width <= _NARROW * sd:  # the difference below would cancel to noise: the normal, shifted
        return _normal_tail((y - mean - width / 2.0) / sd)
    z0, z1 = (y - mean) / sd, (y - width - mean) / sd
    return min(1.0, max(0.0, sd / width * (_normal_tail_integral(z0) - _normal_tail_integral(z1))))


def _queue_tail(t: float, width: float, busy: float, mean_wait: float) -> float:
    """P(U + W > t) for U uniform on [0, width] and a queueing wait W: 0 with probability
    1 - busy, else exponential with mean `mean_wait`."""
    if t < 0.0:
        return 1.0

    def background(x: float) -> float:
        return 1.0 if x < 0 else (busy * math.exp(-x / mean_wait) if mean_wait > 0 else 0.0)

    if width <= 0.0:
        return background(t)
    sure = max(0.0, width - t) / width  # the companions alone exceed t
    inner = min(t, width)
    # exp(-(t - inner)/m) - exp(-t/m), written so that a tiny width (a dispersion a rounding
    # error above 1) does not cancel to noise that the division by the width then magnifies.
    queued = (
        busy * mean_wait * math.exp(-(t - inner) / mean_wait) * -math.expm1(-inner / mean_wait)
        if mean_wait > 0
        else 0.0
    )
    return min(1.0, sure + queued / width)


def chunk_budget_for(
    cfg: ServingConfig,
    workload: Workload,
    tpot_target_s: float,
    replica: ReplicaModel | None = None,
    max_step_s: float | None = None,
) -> int:
    """The largest `--max-num-batched-tokens` whose full mixed step keeps the TPOT target
    (and, with `max_step_s`, an inter-token latency bound: a full chunk beside one decode
    within it; the planner checks the step with the whole batch once the batch limit is known).

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
        if max_step_s is not None and mixed_s > max_step_s:
            return False
        return decode_s + REFERENCE_CHUNK_SHARE * (mixed_s - decode_s) <= tpot_target_s

    # The step time grows with the budget: walk the ladder from the engine's default for this
    # GPU (usually a step or two from the answer). That default is what a plan departs from:
    # `vllm serve` 0.11.0 sets --max-num-batched-tokens to 8192 on GPUs of >= 70 GiB whose name
    # lacks "a100" and to 2048 on the rest (vllm/engine/arg_utils.py, EngineArgs._set_default_args,
    # UsageContext.OPENAI_API_SERVER); a plan passes its own, up to 16384, and every token gap
    # of a running request may be one such step: PlanRequest.max_itl_s (--itl) bounds it.
    default = default_chunk_budget_tokens(cfg.engine, cfg.gpu)
    i = min(range(len(CHUNK_BUDGETS)), key=lambda k: abs(CHUNK_BUDGETS[k] - default))
    if keeps(CHUNK_BUDGETS[i]):
        while i + 1 < len(CHUNK_BUDGETS) and keeps(CHUNK_BUDGETS[i + 1]):
            i += 1
        return CHUNK_BUDGETS[i]
    while i > 0 and not keeps(CHUNK_BUDGETS[i - 1]):
        i -= 1
    return CHUNK_BUDGETS[max(i - 1, 0)]
