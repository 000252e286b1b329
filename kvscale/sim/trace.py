"""Request traces: Azure LLM inference CSV and Mooncake JSONL, with rate and time scaling."""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # from the trace's first request
    input_tokens: int
    output_tokens: int


def _parse_time(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    # Azure timestamps carry 7 fractional digits; datetime takes at most 6.
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text).timestamp()


def read_azure_csv(path: Path) -> list[TraceRequest]:
    """Azure LLM inference trace: TIMESTAMP,ContextTokens,GeneratedTokens."""
    rows: list[tuple[float, int, int]] = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        needed = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if reader.fieldnames is None or not needed <= set(reader.fieldnames):
            raise TraceError(f"{path}: expected the columns {', '.join(sorted(needed))}, found {reader.fieldnames}")
        for line, row in enumerate(reader, start=2):
            try:
                rows.append((_parse_time(row["TIMESTAMP"]), int(row["ContextTokens"]), int(row["GeneratedTokens"])))
            except (ValueError, TypeError) as exc:
                raise TraceError(f"{path}:{line}: cannot read {row}: {exc}") from exc
    return _normalize(rows, path)


def read_mooncake_jsonl(path: Path) -> list[TraceRequest]:
    """Mooncake trace: one JSON object a line with timestamp (ms), input_length, output_length."""
    rows: list[tuple[float, int, int]] = []
    with path.open() as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                item = json.loads(text)
                rows.append((float(item["timestamp"]) / 1000.0, int(item["input_length"]), int(item["output_length"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceError(
                    f"{path}:{line}: expected {{'timestamp': ms, 'input_length': n, 'output_length': n}}: {exc}"
                ) from exc
    return _normalize(rows, path)


def _normalize(rows: list[tuple[float, int, int]], path: Path) -> list[TraceRequest]:
    if not rows:
        raise TraceError(f"{path}: no requests")
    rows.sort(key=lambda r: r[0])
    start = rows[0][0]
    return [TraceRequest(t - start, max(1, i), max(1, o)) for t, i, o in rows]


def read_trace(path: Path) -> list[TraceRequest]:
    """Reads either format, by content rather than by name."""
    if not path.is_file():
        raise TraceError(f"trace {path} does not exist")
    with path.open() as handle:
        first = handle.readline().strip()
    if first.startswith("{"):
        return read_mooncake_jsonl(path)
    if "TIMESTAMP" in first:
        return read_azure_csv(path)
    raise TraceError(
        f"{path}: unknown trace format; expected an Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) "
        'or Mooncake JSONL ({"timestamp": ms, "input_length": n, "output_length": n})'
    )


def time_scale(trace: list[TraceRequest], factor: float) -> list[TraceRequest]:
    """Plays the trace `factor` times faster (same requests, compressed in time)."""
    if not factor > 0:
        raise TraceError(f"--time-scale must be positive, got {factor}")
    return [TraceRequest(r.arrival_s / factor, r.input_tokens, r.output_tokens) for r in trace]


def rate_scale(trace: list[TraceRequest], factor: float, seed: int = 0) -> list[TraceRequest]:
    """`factor` times the requests over the same duration and shape: each request is kept
    floor(factor) times plus once more with the fractional probability, the copies spread
    at random within the gap to the next arrival."""
    if not factor > 0:
        raise TraceError(f"--rate-scale must be positive, got {factor}")
    rng = random.Random(seed)
    whole, frac = math.floor(factor), factor - math.floor(factor)
    out: list[TraceRequest] = []
    for index, r in enumerate(trace):
        gap = trace[index + 1].arrival_s - r.arrival_s if index + 1 < len(trace) else 0.0
        copies = whole + (1 if rng.random() < frac else 0)
        for copy in range(copies):
            offset = 0.0 if copy == 0 else rng.random() * gap
            out.append(TraceRequest(r.arrival_s + offset, r.input_tokens, r.output_tokens))
    out.sort(key=lambda r: r.arrival_s)
    return out


def duration_s(trace: list[TraceRequest]) -> float:
    return trace[-1].arrival_s if trace else 0.0
