"""One replica as a continuous-batching engine, scheduled the way vLLM schedules.

A waiting queue; admission limited by max-num-seqs and by free KV tokens; prefill in
chunks of the token budget, each chunk also advancing the running decodes; decode steps
whose durations come from kvscale.sizing; preemption (recompute) of the newest request
when the KV cache runs out. Decode steps are advanced in bulk between events: the replica
keeps one step counter, and each request knows the step at which it finishes.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache

from kvscale.sizing.config import ServingConfig
from kvscale.sizing.roofline import decode_step, prefill

_BUCKET_TOKENS = 64  # step times are cached per 64 tokens of context or prompt
KV_WATERMARK = 0.01  # vLLM keeps 1% of blocks free at admission


@dataclass(eq=False)
class SimRequest:
    id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    first_token_s: float = math.nan
    finish_s: float = math.nan
    generated: int = 0  # tokens generated before the latest admission (preemption keeps them)
    start_step: int = 0  # replica step at which this admission's decode began
    preemptions: int = 0
    replica: int = -1
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
    def done(self) -> bool:
        return not math.isnan(self.finish_s)


class StepTimes:
    """Engine step durations from the sizing model, cached."""

    def __init__(self, cfg: ServingConfig) -> None:
        self.cfg = cfg
        self._decode = lru_cache(maxsize=65536)(self._decode_uncached)
        self._prefill = lru_cache(maxsize=4096)(self._prefill_uncached)

    def _decode_uncached(self, batch: int, context_bucket: int) -> float:
        return decode_step(self.cfg, batch, context_bucket * _BUCKET_TOKENS + _BUCKET_TOKENS / 2).seconds

    def _prefill_uncached(self, tokens_bucket: int, with_decode: bool) -> float:
        step = prefill(self.cfg, 1, max(1, tokens_bucket * _BUCKET_TOKENS))
        return step.compute_s if with_decode else step.seconds

    def decode(self, batch: int, mean_context: float) -> float:
        return self._decode(batch, int(mean_context // _BUCKET_TOKENS))

    def mixed(self, batch: int, mean_context: float, prompt_tokens: int) -> float:
        """A step that prefills `prompt_tokens` while decoding `batch` running requests."""
        bucket = math.ceil(prompt_tokens / _BUCKET_TOKENS)
        if batch == 0:
            return self._prefill(bucket, False)
        return self.decode(batch, mean_context) + self._prefill(bucket, True)


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
        self.stopped_s: float | None = None
        self.draining = False
        self.clock = ready_s
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []  # admission order; preemption takes the newest
        self._finish_heap: list[tuple[int, int, int, SimRequest]] = []
        self.step = 0
        self._held_base = 0  # sum over running of tokens held at their start step
        self._start_sum = 0  # sum over running of start_step
        self.preemptions = 0
        self.peak_kv_tokens = 0

    # -- state -------------------------------------------------------------------------

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
            if need > free:
                break
            if admitted and tokens + need > self.token_budget:
                break
            self.waiting.popleft()
            admitted.append(request)
            free -= need
            tokens += need
        return admitted

    # -- time --------------------------------------------------------------------------

    def advance_to(self, until_s: float, finished: list[SimRequest]) -> None:
        """Runs engine steps until the clock reaches `until_s` (the last step may overshoot)."""
        if self.stopped_s is not None:
            return
        while self.clock < until_s:
            if self.idle:
                self.clock = until_s
                return
            admitted = self._admit() if self.waiting else []
            if admitted:
                self._prefill(admitted, finished)
                continue
            if not self.running:
                # Waiting requests that cannot fit even in an empty cache: serve them alone.
                self._prefill([self.waiting.popleft()], finished)
                continue
            self._decode_bulk(until_s, finished)

    def _prefill(self, admitted: list[SimRequest], finished: list[SimRequest]) -> None:
        prompt = sum(r.input_tokens + r.generated for r in admitted)
        chunks = max(1, math.ceil(prompt / self.token_budget))
        n = len(self.running)
        mean_context = self.kv_used / n if n else 0.0
        self.clock += chunks * self.steps.mixed(n, mean_context, min(prompt, self.token_budget))
        if n:
            self.step += chunks
        for request in admitted:
            self._start_decoding(request)
        self._pop_finished(finished)
        self._relieve_kv_pressure()

    def _relieve_kv_pressure(self) -> None:
        while self.running and self.kv_used > self.kv_capacity:
            self._preempt_newest()

    def _decode_bulk(self, until_s: float, finished: list[SimRequest]) -> None:
        n = len(self.running)
        dt = self.steps.decode(n, self.kv_used / n)
        heap = self._finish_heap
        while heap and heap[0][2] != heap[0][3]._version:
            heapq.heappop(heap)
        k_finish = max(1, heap[0][0] - self.step) if heap else 1
        k_kv = (self.kv_capacity - self.kv_used) // n
        if k_kv < 1:
            self._preempt_newest()
            return
        k_time = max(1, math.ceil((until_s - self.clock) / dt))
        # Nothing the scheduler decides changes before a finish, a full cache or the next event.
        k = min(k_finish, k_kv, k_time)
        self.clock += k * dt
        self.step += k
        self.peak_kv_tokens = max(self.peak_kv_tokens, self.kv_used)
        self._pop_finished(finished)
