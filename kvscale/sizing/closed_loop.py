"""A closed loop in closed form: N users on one replica, each sending its next request (I
tokens in, O out) the moment its last one finishes, as `simulate --concurrency N` and
genai-perf's concurrency mode run them.

What a new request waits for, in the engine's own scheduler (engines.yaml says which):

- a slot: at most `running` requests are in the engine (max-num-seqs, or the KV cache holding
  I + O tokens for each); with more users the engine is a closed system at saturation, so
  X = running / cycle and, by Little's law, the wait is (N / running - 1) x cycle;
- the prompts admitted before it (FCFS), in groups of whole prompts that the step's token
  budget holds, each group's prompt chunked over budget-sized steps when the engine chunks;
- the running decodes: where a prefill step also advances them (vLLM), groups admitted in
  successive steps stay a step apart and each request waits only for its own group; where
  prefill steps run alone (SGLang, TensorRT-LLM), every running request waits them out, so the
  requests of one round finish together, come back together and queue behind each other's
  prompts every round: the mean TTFT is the mean completion time of the whole round's prefill.

The simulator (kvscale.sim.engine) runs the same rules step by step; tests hold the two together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscale.sizing.config import ServingConfig
from kvscale.sizing.roofline import decode_step, step

KV_WATERMARK = 0.01  # as kvscale.sim.engine: vLLM keeps 1% of the blocks free at admission


@dataclass(frozen=True)
class ClosedLoop:
    users: int
    output_tokens: int
    running: int  # requests in the engine at once
    slot_wait_s: float  # mean wait for a slot, before admission
    prefill_s: float  # mean time from admission to the first token
    itl_s: float  # mean (finish - first token) / (O - 1)

    @property
    def ttft_s(self) -> float:
        return self.slot_wait_s + self.prefill_s

    @property
    def cycle_s(self) -> float:
        """A request's time in the engine: admission to its last token."""
        return self.prefill_s + max(self.output_tokens - 1, 0) * self.itl_s

    @property
    def throughput_tokens_per_s(self) -> float:
        return self.running * self.output_tokens / self.cycle_s


def _group_prefill_s(cfg: ServingConfig, prompts: int, input_tokens: int, decodes: int, context: float) -> float:
    """One group of whole prompts admitted together: chunked over budget-sized steps (beside
    `decodes` running requests) or, without chunked prefill, all in one step."""
    tokens = prompts * input_tokens
    room = max(1, cfg.max_num_batched_tokens - decodes) if cfg.engine.chunked_prefill else tokens
    full, rest = divmod(tokens, room)

    def one(chunk: int) -> float:
        return step(cfg, decodes, context, chunk, input_tokens / 2.0, max(chunk / input_tokens, 1.0)).seconds

    return (full * one(room) if full else 0.0) + (one(rest) if rest else 0.0)


def running_limit(cfg: ServingConfig, users: int, input_tokens: int, output_tokens: int, max_batch: int) -> int:
    """Requests in the engine at once: the users, max-num-seqs, or as many as the KV cache holds
    at their full length (requests that start together grow together)."""
    kv = int(cfg.memory.kv_capacity_tokens * (1 - KV_WATERMARK)) // (input_tokens + output_tokens)
    return max(1, min(users, max_batch, kv))


def closed_loop(cfg: ServingConfig, users: int, input_tokens: int, output_tokens: int, max_batch: int) -> ClosedLoop:
    if users < 1 or input_tokens < 1 or output_tokens < 1:
        raise ValueError("users, input and output tokens must each be at least 1")
    running = running_limit(cfg, users, input_tokens, output_tokens, max_batch)
    context = input_tokens + output_tokens / 2.0
    decode_s = decode_step(cfg, running, context).seconds
    # Whole prompts per admission: the token budget, at least one (the simulator's _admit).
    group = max(1, min(running, cfg.max_num_batched_tokens // (input_tokens + 1)))
    groups = math.ceil(running / group)
    gaps = max(output_tokens - 1, 1)
    if cfg.engine.decodes_during_prefill:
        # Groups stay one prefill apart: each waits for its own prompts beside the others' decodes.
        others = running - group
        own_s = _group_prefill_s(cfg, group, input_tokens, others, context)
        alone_s = _group_prefill_s(cfg, group, input_tokens, 0, context)
        chunks = math.ceil(group * input_tokens / max(1, cfg.max_num_batched_tokens - others))
        if not cfg.engine.chunked_prefill:
            chunks = 1
        # Each of the other groups' prefills puts `chunks` long steps among this request's gaps.
        long_gaps = min(gaps, (groups - 1) * chunks)
        long_s = own_s / chunks
        itl_s = (long_gaps * long_s + (gaps - long_gaps) * decode_s) / gaps
        prefill_s = own_s if others else alone_s
    else:
        # One round: the groups' prefills one after another, nobody decoding meanwhile.
        done_s, total = 0.0, 0.0
        for g in range(groups):
            size = min(group, running - g * group)
            done_s += _group_prefill_s(cfg, size, input_tokens, 0, 0.0)
            total += size * done_s
        prefill_s = total / running
        # A request's first token comes at its group's end; the round's last prompt holds every decode.
        itl_s = decode_s + (done_s - prefill_s) / gaps
    cycle_s = prefill_s + (output_tokens - 1) * itl_s
    slot_wait_s = (users / running - 1.0) * cycle_s if users > running else 0.0
    return ClosedLoop(users, output_tokens, running, slot_wait_s, prefill_s, itl_s)
