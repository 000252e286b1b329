"""What the user asks for: a workload and a latency objective, in SI units."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    input_tokens: int
    output_tokens: int
    requests_per_s: float
    max_context_tokens: int | None = None  # default: input + output, at least what the model needs

    def __post_init__(self) -> None:
        if self.input_tokens < 1:
            raise ValueError(f"input tokens must be at least 1, got {self.input_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"output tokens must be at least 1, got {self.output_tokens}")
        if self.requests_per_s < 0:
            raise ValueError(f"requests per second cannot be negative, got {self.requests_per_s}")
        if self.max_context_tokens is not None and self.max_context_tokens < self.input_tokens + self.output_tokens:
            raise ValueError(
                f"max context {self.max_context_tokens} is shorter than input + output "
                f"({self.input_tokens + self.output_tokens}); raise it or shorten the request"
            )

    @property
    def context_tokens(self) -> int:
        """KV one typical request holds when it finishes."""
        return self.input_tokens + self.output_tokens

    @property
    def mean_decode_context_tokens(self) -> float:
        """Mean KV a decoding request reads over its life: input plus half the output."""
        return self.input_tokens + self.output_tokens / 2.0

    @property
    def engine_max_context_tokens(self) -> int:
        return self.max_context_tokens or self.context_tokens


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float
    percentile: float = 95.0

    def __post_init__(self) -> None:
        if not self.ttft_s > 0:
            raise ValueError(f"TTFT target must be positive, got {self.ttft_s}")
        if not self.tpot_s > 0:
            raise ValueError(f"TPOT target must be positive, got {self.tpot_s}")
        if not 50.0 <= self.percentile < 100.0:
            raise ValueError(f"percentile must be in [50, 100), got {self.percentile}")
