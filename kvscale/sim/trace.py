"""Request traces: Azure LLM inference CSV and Mooncake JSONL, with rate and time scaling.

Every value is checked as it is read: timestamps finite, token counts whole numbers in
[0, MAX_TOKENS] (a negative count is an error, not clamped), the span and the number of
requests bounded so that a typo (one 1970 timestamp, a time scale of 1e-300, ten million
rows) ends in a clear error in seconds instead of minutes of simulation at GBs of memory.
The file is read as UTF-8 (a byte-order mark is accepted); binary or UTF-16 bytes are refused.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

# A simulated month is the longest replay that makes sense for capacity planning (and
# already minutes of simulation); anything longer is almost always a stray timestamp.
MAX_SPAN_S = 31 * 86400.0
# The most requests one run takes (after --rate-scale); about 1 GB and a few minutes.
MAX_REQUESTS = 2_000_000
# A prompt or output longer than this is not a request any model serves.
MAX_TOKENS = 10_000_000


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
        value = float(text)
    except ValueError:
        # Azure timestamps carry 7 fractional digits; datetime takes at most 6.
        if "." in text:
            head, frac = text.split(".", 1)
            text = f"{head}.{frac[:6]}"
        value = datetime.fromisoformat(text).timestamp()
    if not math.isfinite(value):
        raise ValueError(f"timestamp {text!r} is not a finite number")
    return value


def _tokens(value: object, field: str) -> int:
    """A whole, non-negative token count; '12', 12 and 12.0 read, '-3', 1e400, 'x' and 1.5 do not."""
    if isinstance(value, bool):
        raise ValueError(f"{field} must be a whole number of tokens, got {value!r}")
    if isinstance(value, int):
        count = value
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError(f"{field} must be a whole number of tokens, got {value!r}")
        count = int(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            count = int(text)
        except ValueError:
            number = float(text)  # raises ValueError for words
            if not math.isfinite(number) or not number.is_integer():
                raise ValueError(f"{field} must be a whole number of tokens, got {text!r}") from None
            count = int(number)
    else:
        raise ValueError(f"{field} must be a whole number of tokens, got {value!r}")
    if count < 0:
        raise ValueError(f"{field} cannot be negative, got {count}")
    if count > MAX_TOKENS:
        raise ValueError(f"{field} {count:,} is above {MAX_TOKENS:,} tokens")
    return count


def _lines(path: Path) -> Iterator[str]:
    """The file's lines as UTF-8 text, a leading byte-order mark dropped; a clear error for
    binary, UTF-16 or otherwise undecodable bytes."""
    with path.open("rb") as raw:
        head = raw.read(4)
        if head.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise TraceError(f"{path}: the file is UTF-16; convert it to UTF-8 (iconv -f UTF-16 -t UTF-8)")
        raw.seek(0)
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        line = 0
        try:
            for line, content in enumerate(text, start=1):
                if "\x00" in content:
                    raise TraceError(
                        f"{path}:{line}: binary data (NUL bytes); expected an Azure CSV or Mooncake JSONL text file"
                    )
                yield content
        except UnicodeDecodeError as exc:
            raise TraceError(
                f"{path}:{line + 1}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                "expected an Azure CSV or Mooncake JSONL text file"
            ) from exc


def _check_count(path: Path, count: int) -> None:
    if count > MAX_REQUESTS:
        raise TraceError(
            f"{path}: more than {MAX_REQUESTS:,} requests; replay a slice of it (head -n), "
            "or sample it with --rate-scale below 1 on a shorter slice"
        )


def read_azure_csv(path: Path) -> list[TraceRequest]:
    """Azure LLM inference trace: TIMESTAMP,ContextTokens,GeneratedTokens."""
    rows: list[tuple[float, int, int]] = []
    reader = csv.DictReader(_lines(path))
    try:
        fields = reader.fieldnames
    except csv.Error as exc:
        raise TraceError(f"{path}: not a CSV file: {exc}") from exc
    needed = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
    if fields is None or not needed <= {f.strip() for f in fields}:
        raise TraceError(f"{path}: expected the columns {', '.join(sorted(needed))}, found {fields}")
    strip = {f: f.strip() for f in fields}
    try:
        for line, raw in enumerate(reader, start=2):
            row = {strip.get(k, k): v for k, v in raw.items() if k is not None}
            try:
                rows.append(
                    (
                        _parse_time(row["TIMESTAMP"]),
                        _tokens(row["ContextTokens"], "ContextTokens"),
                        _tokens(row["GeneratedTokens"], "GeneratedTokens"),
                    )
                )
            except (ValueError, TypeError, AttributeError, OverflowError) as exc:
                raise TraceError(f"{path}:{line}: cannot read {_short(raw)}: {exc}") from exc
            _check_count(path, len(rows))
    except csv.Error as exc:
        raise TraceError(f"{path}: not a readable CSV file: {exc}") from exc
    return _normalize(rows, path)


def _short(row: object, limit: int = 200) -> str:
    text = repr(row)
    return text if len(text) <= limit else text[:limit] + "..."


def read_mooncake_jsonl(path: Path) -> list[TraceRequest]:
    """Mooncake trace: one JSON object a line with timestamp (ms), input_length, output_length."""
    rows: list[tuple[float, int, int]] = []
    for line, text in enumerate(_lines(path), start=1):
        if not text.strip():
            continue
        try:
            item = json.loads(text)
            if not isinstance(item, dict):
                raise ValueError(f"expected an object, got {type(item).__name__}")
            stamp = item["timestamp"]
            if isinstance(stamp, bool) or not isinstance(stamp, int | float | str):
                raise ValueError(f"timestamp must be a number of milliseconds, got {stamp!r}")
            ms = float(stamp)
            if not math.isfinite(ms):
                raise ValueError(f"timestamp must be a finite number of milliseconds, got {stamp!r}")
            rows.append(
                (
                    ms / 1000.0,
                    _tokens(item["input_length"], "input_length"),
                    _tokens(item["output_length"], "output_length"),
                )
            )
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            raise TraceError(
                f"{path}:{line}: expected {{'timestamp': ms, 'input_length': n, 'output_length': n}}: {exc}"
            ) from exc
        _check_count(path, len(rows))
    return _normalize(rows, path)


def _normalize(rows: list[tuple[float, int, int]], path: Path) -> list[TraceRequest]:
    """Sorted by arrival, from the first request; lengths of 0 served as 1 token (an empty
    prompt still has a BOS token, an aborted request still produced one step)."""
    if not rows:
        raise TraceError(f"{path}: no requests")
    rows.sort(key=lambda r: r[0])
    start = rows[0][0]
    span = rows[-1][0] - start
    if span > MAX_SPAN_S:
        raise TraceError(
            f"{path}: the trace spans {span / 86400:,.0f} days (from {rows[0][0]:.0f} s to {rows[-1][0]:.0f} s), more "
            f"than {MAX_SPAN_S / 86400:g}; a stray timestamp (0 or 1970?) or mixed units (s and ms) is the usual cause"
        )
    return [TraceRequest(t - start, max(1, i), max(1, o)) for t, i, o in rows]


def read_trace(path: Path) -> list[TraceRequest]:
    """Reads either format, by content rather than by name."""
    if not path.is_file():
        raise TraceError(f"trace {path} does not exist or is not a file")
    first = ""
    try:
        for content in _lines(path):
            first = content.strip()
            if first:
                break
    except OSError as exc:
        raise TraceError(f"trace {path}: cannot read: {exc}") from exc
    try:
        if first.startswith("{"):
            return read_mooncake_jsonl(path)
        if "TIMESTAMP" in first:
            return read_azure_csv(path)
    except OSError as exc:
        raise TraceError(f"trace {path}: cannot read: {exc}") from exc
    raise TraceError(
        f"{path}: unknown trace format; expected an Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) "
        'or Mooncake JSONL ({"timestamp": ms, "input_length": n, "output_length": n})'
    )


def time_scale(trace: list[TraceRequest], factor: float) -> list[TraceRequest]:
    """Plays the trace `factor` times faster (same requests, compressed in time)."""
    if not (math.isfinite(factor) and factor > 0):
        raise TraceError(f"--time-scale must be a finite positive number, got {factor}")
    if duration_s(trace) / factor > MAX_SPAN_S:
        raise TraceError(
            f"--time-scale {factor:g} stretches the trace to {duration_s(trace) / factor / 86400:,.0f} days, "
            f"more than {MAX_SPAN_S / 86400:g}; use a factor of at least {duration_s(trace) / MAX_SPAN_S:.3g}"
        )
    return [TraceRequest(r.arrival_s / factor, r.input_tokens, r.output_tokens) for r in trace]


def rate_scale(trace: list[TraceRequest], factor: float, seed: int = 0) -> list[TraceRequest]:
    """`factor` times the requests over the same duration and shape: each request is kept
    floor(factor) times plus once more with the fractional probability, the copies spread
    at random within the gap to the next arrival."""
    if not (math.isfinite(factor) and factor > 0):
        raise TraceError(f"--rate-scale must be a finite positive number, got {factor}")
    if len(trace) * factor > MAX_REQUESTS * 1.01:
        raise TraceError(
            f"--rate-scale {factor:g} makes about {len(trace) * factor:,.0f} requests, more than {MAX_REQUESTS:,}; "
            f"use at most {MAX_REQUESTS / len(trace):.3g} or a shorter slice of the trace"
        )
    rng = random.Random(seed)
    whole, frac = math.floor(factor), factor - math.floor(factor)
    out: list[TraceRequest] = []
    for index, r in enumerate(trace):
        gap = trace[index + 1].arrival_s - r.arrival_s if index + 1 < len(trace) else 0.0
        copies = whole + (1 if rng.random() < frac else 0)
        for copy in range(copies):
            offset = 0.0 if copy == 0 else rng.random() * gap
            out.append(TraceRequest(r.arrival_s + offset, r.input_tokens, r.output_tokens))
    if not out:
        raise TraceError(f"--rate-scale {factor:g} kept none of the {len(trace)} requests; use a larger factor")
    out.sort(key=lambda r: r.arrival_s)
    return out


def duration_s(trace: list[TraceRequest]) -> float:
    return trace[-1].arrival_s if trace else 0.0
