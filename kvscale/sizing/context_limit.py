"""The engine's context limit (vLLM --max-model-len, SGLang --context-length, TGI --max-total-tokens).

Two engine facts fix the rules (vLLM 0.11.0):
- vllm/config/model.py `_get_and_verify_max_len`: a max_model_len above the model's own limit
  (max_position_embeddings in config.json) is refused at start-up.
- vllm/v1/core/kv_cache_utils.py `check_enough_kv_cache_memory`: the KV cache must hold one
  sequence of max_model_len, else the engine refuses to start.
And a request whose prompt plus max_tokens exceeds the limit gets HTTP 400, so the limit is
the longest request served: never the typical length the plan sizes the KV cache for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscale.sizing.catalog import ModelArch

# The plan's KV capacity is an estimate of what the engine will find after profiling. A
# default limit is lowered to this share of it, so an estimate a little high still starts.
KV_CAPACITY_MARGIN = 0.90


class ContextLimitError(ValueError):
    """A requested context longer than the model accepts; the message names both numbers."""

    def __init__(self, model: str, requested_tokens: int, limit_tokens: int, field: str) -> None:
        self.model = model
        self.requested_tokens = requested_tokens
        self.limit_tokens = limit_tokens
        self.field = field
        super().__init__(
            f"{field} {requested_tokens} exceeds {model}'s context limit of {limit_tokens} tokens "
            f"(max_position_embeddings; vLLM refuses a longer --max-model-len): lower {field} to at most {limit_tokens}"
        )


@dataclass(frozen=True)
class ContextLimit:
    """The engine's limit for one planned configuration, and why it is that number."""

    max_model_len_tokens: int
    model_limit_tokens: int
    requested_tokens: int | None
    reason: str

    @property
    def lowered(self) -> bool:
        return self.requested_tokens is None and self.max_model_len_tokens < self.model_limit_tokens


def check_requested_context(
    model: ModelArch,
    requested_tokens: int | None,
    field: str,
    typical_tokens: int = 0,
    typical_field: str = "input + output tokens",
) -> None:
    """Refuse a requested context, or a typical request, above the model's limit (vLLM would
    not start, or would answer every such request with HTTP 400)."""
    if requested_tokens is not None and requested_tokens > model.max_context_tokens:
        raise ContextLimitError(model.name, requested_tokens, model.max_context_tokens, field)
    if typical_tokens > model.max_context_tokens:
        raise ContextLimitError(model.name, typical_tokens, model.max_context_tokens, typical_field)


def context_limit(
    model: ModelArch,
    requested_tokens: int | None,
    kv_capacity_tokens: int,
    block_tokens: int,
    typical_tokens: int = 1,
    field: str = "max context",
) -> ContextLimit:
    """The longest request the engine serves.

    Given: the request (never above the model's limit; the planner already refused
    candidates whose KV cache cannot hold one such sequence). Not given: the model's limit,
    lowered only to what one sequence can hold in the planned KV cache (KV_CAPACITY_MARGIN of
    it, in whole blocks of block_tokens), and never below the typical request the plan sized
    the cache for (typical_tokens).
    """
    check_requested_context(model, requested_tokens, field, typical_tokens)
    limit = model.max_context_tokens
    if requested_tokens is not None:
        return ContextLimit(requested_tokens, limit, requested_tokens, f"{field} {requested_tokens}")
    block = max(block_tokens, 1)
    holds = max(math.floor(kv_capacity_tokens * KV_CAPACITY_MARGIN / block) * block, typical_tokens)
    if holds >= limit:
        if model.max_context_assumed:
            return ContextLimit(
                limit,
                limit,
                None,
                f"a default of {limit} tokens: {model.name}'s architecture gives no max_context_tokens "
                f"(set it to the model's max_position_embeddings, or set {field})",
            )
        return ContextLimit(limit, limit, None, f"{model.name}'s context limit")
    return ContextLimit(
        holds,
        limit,
        None,
        f"lowered from {model.name}'s {'default ' if model.max_context_assumed else ''}limit {limit}: one sequence fits in {holds} of the "
        f"{kv_capacity_tokens} KV-cache tokens planned per replica",
    )
