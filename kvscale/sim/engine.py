"""One replica as a continuous-batching engine, scheduled the way its engine profile says.

A waiting queue (FCFS); admission limited by max-num-seqs and by free KV tokens; prefill in
chunks of the token budget (or whole prompts, for an engine without chunked prefill), each
step also advancing the running decodes (vLLM) or run alone while they wait (SGLang,
TensorRT-LLM: kvscale.sizing.catalog engines.yaml says which and why); decode steps
whose durations come from kvscale.sizing; preemption (recompute) of the newest request
when the KV cache runs out. Decode steps are advanced in bulk between events: the replica
keeps one step counter, and each request knows the step at which it finishes.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from kvscale.sizing.config import ServingConfig
from kvscale.sizing.roofline import decode_step, step

_BUCKET_TOKENS = 64  # step times are cached per 64 tokens of context or prompt
GAP_RESOLUTION_S = 1e-4  # per-token gaps are counted in 0.1 ms bins
KV_WATERMARK = 0.01  # vLLM keeps 1% of blocks free at admission


@dataclass(eq=False)
class SimRequest:
    id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    first_token_s: float = math.nan
    finish_s: float = math.nan
    scheduled_s: float = math.nan  # first admitted (vLLM's scheduled_ts: a preemption keeps it)
    generated: int = 0  # tokens generated before the latest admission (preemption keeps them)
    start_step: int = 0  # replica step at which this admission's decode began
    preemptions: int = 0
    replica: int = -1
    lost: str = ""  # "cut": on a replica when its drain bound passed; "rejected": never reached one (HTTP 429)
    _version: int = field(default=0, repr=False)
    _held_at_start: int = field(default=0, repr=False)  # KV tokens held when this admission's decode began

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        if self.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def prefill_s(self) -> float:
        """vLLM's prefill time: first token less first scheduled (vllm/v1/metrics/stats.py)."""
        return self.first_token_s - self.scheduled_s

    @property
    def done(self) -> bool:
        return not math.isnan(self.finish_s)


class StepTimes:
    """Engine step durations from the sizing model, cached."""

    def __init__(self, cfg: ServingConfig) -> None:
        self.cfg = cfg
        self._decode = lru_cache(maxsize=65536)(self._decode_uncached)
        self._mixed = lru_cache(maxsize=65536)(self._mixed_uncached)

    @staticmethod
    def _mid(bucket: int) -> float:
        return bucket * _BUCKET_TOKENS + _BUCKET_TOKENS / 2

    def _decode_uncached(self, batch: int, context_bucket: int) -> float:
        return decode_step(self.cfg, batch, self._mid(context_bucket)).seconds

    def _mixed_uncached(self, batch: int, context_bucket: int, chunk_bucket: int, prompt_bucket: int) -> float:
        chunk = max(1, chunk_bucket * _BUCKET_TOKENS)
        prompt = max(chunk, prompt_bucket * _BUCKET_TOKENS)
        context = self._mid(context_bucket) if batch else 0.0
        # A chunk of several whole prompts (packed, or an engine without chunked prefill): each
        # attends to its own prompt only, as in roofline.prefill.
        return step(self.cfg, batch, context, chunk, prompt / 2.0, max(chunk / prompt, 1.0)).seconds

    def decode(self, batch: int, mean_context: float) -> float:
        return self._decode(batch, int(mean_context // _BUCKET_TOKENS))

    def mixed(self, batch: int, mean_context: float, chunk_tokens: int, prompt_tokens: float | None = None) -> float:
        """One step that prefills `chunk_tokens` of prompts of `prompt_tokens` (mean) while
        decoding `batch` running requests (the sizing model's mixed step)."""
        return self._mixed(
            batch,
            int(mean_context // _BUCKET_TOKENS),
            math.ceil(chunk_tokens / _BUCKET_TOKENS),
            math.ceil((prompt_tokens or chunk_tokens) / _BUCKET_TOKENS),
        )


_GAP_BINS: dict[float, float] = {}  # a step time -> its 0.1 ms bin (step times come from a cache: few values)


def _gap_bin(gap_s: float) -> float:
    known = _GAP_BINS.get(gap_s)
    if known is None:
        known = _GAP_BINS[gap_s] = round(gap_s / GAP_RESOLUTION_S) * GAP_RESOLUTION_S
    return known


class Replica:
    def __init__(
        self,
        replica_id: int,
        steps: StepTimes,
        max_batch: int,
        kv_capacity_tokens: int,
        token_budget: int,
        started_s: float,
        ready_s: float,
    ) -> None:
        self.id = replica_id
        self.steps = steps
        self.max_batch = max_batch
        self.kv_capacity = kv_capacity_tokens
        self.token_budget = token_budget
        self.started_s = started_s
        self.ready_s = ready_s
        self._stopped_s: float | None = None
        self._draining = False
        # Set while a fleet has parked this replica idle (kvscale.sim.fleet.Fleet: it is not
        # stepped at each event then, its clock caught up when it is next needed): a request
        # enqueued here wakes it first.
        self.waker: Callable[[Replica], None] | None = None
        self.drain_deadline_s = math.inf  # while draining: in-flight requests left at this time are cut
        self.clock = ready_s
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []  # admission order; preemption takes the newest
        self._finish_heap: list[tuple[int, int, int, SimRequest]] = []
        self.step = 0
        self._held_base = 0  # sum over running of tokens held at their start step
        self._start_sum = 0  # sum over running of start_step
        self.preemptions = 0
        self.peak_kv_tokens = 0
        self.token_gaps: Counter[float] = Counter()  # per-token gap (s, 0.1 ms bins) -> tokens
        # As vLLM counts them per engine step (vllm:inter_token_latency_seconds' sum and
        # vllm:generation_tokens_total): the gaps' exact sum, and the tokens output so far
        # (each running decode's per step, and a new request's first at its prefill's end).
        self.gap_seconds = 0.0
        self.generated_tokens = 0
        self.iterations: Counter[int] = Counter()  # tokens an engine step carried -> steps

    def _record_gaps(self, gap_s: float, tokens: int) -> None:
        if tokens > 0:
            self.token_gaps[_gap_bin(gap_s)] += tokens
            self.gap_seconds += gap_s * tokens

    # -- state -------------------------------------------------------------------------

    # Bumped whenever any replica stops or starts or ends a drain: a fleet's cached list of the
    # replicas serving (kvscale.sim.fleet.Fleet.serving) is out of date then.
    changes = 0

    @property
    def stopped_s(self) -> float | None:
        return self._stopped_s

    @stopped_s.setter
    def stopped_s(self, value: float | None) -> None:
        self._stopped_s = value
        Replica.changes += 1

    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._draining = value
        Replica.changes += 1

    @property
    def kv_used(self) -> int:
        return self._held_base + len(self.running) * self.step - self._start_sum

    @property
    def kv_usage(self) -> float:
        return self.kv_used / self.kv_capacity if self.kv_capacity else 1.0

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def is_ready(self, now_s: float) -> bool:
        return self.stopped_s is None and self.ready_s <= now_s

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    # -- requests ----------------------------------------------------------------------

    def enqueue(self, request: SimRequest) -> None:
        if self.waker is not None:
            self.waker(self)
        request.replica = self.id
        self.waiting.append(request)

    def _start_decoding(self, request: SimRequest) -> None:
        """After its prefill the request holds input + generated tokens; its first token is out."""
        if math.isnan(request.first_token_s):
            request.first_token_s = self.clock
        request.generated = max(request.generated, 1)
        request.start_step = self.step
        request._held_at_start = request.input_tokens + request.generated
        self._held_base += request._held_at_start
        self._start_sum += self.step
        self.running.append(request)
        request._version += 1
        finish_step = self.step + request.output_tokens - request.generated
        heapq.heappush(self._finish_heap, (finish_step, request.id, request._version, request))

    def _leave(self, request: SimRequest) -> None:
        self._held_base -= request._held_at_start
        self._start_sum -= request.start_step
        self.running.remove(request)
        request._version += 1

    def _preempt_newest(self) -> None:
        victim = self.running[-1]
        victim.generated += self.step - victim.start_step
        self._leave(victim)
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _pop_finished(self, finished: list[SimRequest]) -> None:
        heap = self._finish_heap
        while heap and heap[0][0] <= self.step:
            _, _, version, request = heapq.heappop(heap)
            if version != request._version:
                continue  # preempted since it was pushed
            request.generated += self.step - request.start_step
            self._leave(request)
            request.finish_s = self.clock
            finished.append(request)

    def _admit(self) -> list[SimRequest]:
        """Requests admitted together: slots, KV (with the watermark) and the token budget allow."""
        admitted: list[SimRequest] = []
        free = self.kv_capacity * (1 - KV_WATERMARK) - self.kv_used
        tokens = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_batch:
            request = self.waiting[0]
            need = request.input_tokens + request.generated + 1
            step_tokens = self._step_tokens(request, need)
            if need > free:
                break
            if admitted and tokens + step_tokens > self.token_budget:
                break
            self.waiting.popleft()
            admitted.append(request)
            free -= need
            tokens += step_tokens
        return admitted

    def _step_tokens(self, request: SimRequest, need: int) -> int:
        """Tokens of the step's budget an admitted request takes: its whole prompt (and what it
        generated, recomputed after a preemption) here; a decode-only replica differs."""
        return need

    def release(self) -> list[SimRequest]:
        """Takes every request off the replica (running and waiting), as a pod killed at the end
        of its grace period drops them."""
        taken = [*self.running, *self.waiting]
        for request in list(self.running):
            request.generated += self.step - request.start_step
            self._leave(request)
        self.waiting.clear()
        self._finish_heap.clear()
        return taken

    # -- time --------------------------------------------------------------------------

    def advance_to(self, until_s: float, finished: list[SimRequest], stop_after_finish: bool = False) -> None:
        """Runs engine steps until the clock reaches `until_s` (the last step may overshoot).

        With stop_after_finish it returns right after the step in which a request finished,
        its clock at that step's end, so a closed loop can release the next request then.
        """
        if self._stopped_s is not None:
            return
        done_before = len(finished)
        while self.clock < until_s:
            if stop_after_finish and len(finished) > done_before:
                return
            if not self.running and not self.waiting:  # idle
                self.clock = until_s
                return
            if self.waiting:
                admitted = self._admit()
                if admitted:
                    self._prefill(admitted, finished)
                    continue
            if not self.running:
                # Waiting requests that cannot fit even in an empty cache: serve them alone.
                self._prefill([self.waiting.popleft()], finished)
                continue
            self._decode_bulk(until_s, finished)

    def _prefill(self, admitted: list[SimRequest], finished: list[SimRequest]) -> None:
        """The admitted prompts' prefill steps, as the engine profile says its scheduler runs them.

        Mixed (vLLM V1): every step carries the running decodes plus as much prompt as the rest
        of the token budget holds. Separate (SGLang, TensorRT-LLM): prefill steps carry prompt
        tokens only and the running decodes wait them out, so requests admitted in successive
        steps keep the same decode step count and finish together. Without chunked prefill the
        admitted prompts (as many whole prompts as the budget holds) go in one step.
        """
        engine = self.steps.cfg.engine
        prompt = sum(r.input_tokens + r.generated for r in admitted)
        mean_prompt = prompt / len(admitted)
        n = len(self.running) if engine.decodes_during_prefill else 0
        room = max(1, self.token_budget - n) if engine.chunked_prefill else max(1, prompt)
        full, rest = divmod(prompt, room)
        mean_context = self.kv_used / n if n else 0.0
        full_s = self.steps.mixed(n, mean_context, room, mean_prompt) if full else 0.0
        rest_s = self.steps.mixed(n, mean_context, rest, mean_prompt) if rest else 0.0
        for request in admitted:
            if math.isnan(request.scheduled_s):
                request.scheduled_s = self.clock
        if full:
            self.iterations[n + room] += full
        if rest:
            self.iterations[n + rest] += 1
        # The engine's per-request intake (EngineProfile.request_overhead_s: HTTP, tokenization,
        # admission), serial with its steps: a burst of short prompts waits on it.
        intake_s = self.steps.cfg.engine.request_overhead_s * len(admitted)
        self.clock += full * full_s + rest_s + intake_s
        chunks = full + (1 if rest else 0)
        self.generated_tokens += sum(1 for r in admitted if math.isnan(r.first_token_s))
        if n:
            # The running decodes wait out the intake too: their gaps in these steps carry it.
            self._record_gaps(full_s + intake_s / chunks, n * full)
            self._record_gaps(rest_s + intake_s / chunks, n if rest else 0)
            self.generated_tokens += n * chunks
            self.step += chunks
        elif self.running:
            # The waiting decodes' next token comes one whole prefill later: counted as one gap of
            # the prefill per running request (their next decode step counts its own gap, so the
            # histogram holds one token more per stall than were generated: a stall's share of
            # the gaps is slightly overstated, never hidden).
            self._record_gaps(full * full_s + rest_s + intake_s, len(self.running))
        for request in admitted:
            self._start_decoding(request)
        self._pop_finished(finished)
        self._relieve_kv_pressure()

    def _relieve_kv_pressure(self) -> None:
        while self.running and self.kv_used > self.kv_capacity:
            self._preempt_newest()

    def _decode_bulk(self, until_s: float, finished: list[SimRequest]) -> None:
        n = len(self.running)
        used = self._held_base + n * self.step - self._start_sum  # kv_used
        dt = self.steps._decode(n, int(used / n // _BUCKET_TOKENS))  # StepTimes.decode(n, used / n)
        heap = self._finish_heap
        while heap and heap[0][2] != heap[0][3]._version:
            heapq.heappop(heap)
        k_finish = max(1, heap[0][0] - self.step) if heap else 1
        k_kv = (self.kv_capacity - used) // n
        if k_kv < 1:
            self._preempt_newest()
            return
        k_time = max(1, math.ceil((until_s - self.clock) / dt))
        # Nothing the scheduler decides changes before a finish, a full cache or the next event.
        k = min(k_finish, k_kv, k_time)
        self.clock += k * dt
        gap_bin = _GAP_BINS.get(dt)
        self.token_gaps[_gap_bin(dt) if gap_bin is None else gap_bin] += k * n  # _record_gaps: k, n >= 1
        self.gap_seconds += k * n * dt
        self.generated_tokens += k * n
        self.step += k
        self.iterations[n] += k
        used += n * k
        if used > self.peak_kv_tokens:
            self.peak_kv_tokens = used
        if heap and heap[0][0] <= self.step:
            self._pop_finished(finished)
