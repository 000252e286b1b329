"""Unit constants and the only place where human strings become SI quantities."""

from __future__ import annotations

import re

GB = 1e9
GIB = 1024**3
MS = 1e-3
US = 1e-6
TERA = 1e12
SECONDS_PER_HOUR = 3600.0

_DURATION = re.compile(r"^\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>us|µs|ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class UnitError(ValueError):
    """A quantity a person typed that cannot be read; the message says what is allowed."""


def parse_duration_s(text: str | float | int, *, field: str = "duration") -> float:
    """Reads '500ms', '0.2s', '2m' or a bare number of seconds; returns seconds (> 0)."""
    if isinstance(text, bool):
        raise UnitError(f"{field}: expected a duration like '500ms' or '1.5s', got {text!r}")
    if isinstance(text, int | float):
        value_s = float(text)
    else:
        match = _DURATION.match(text)
        if match is None:
            raise UnitError(
                f"{field}: cannot read {text!r} as a duration; write a positive number with a "
                "unit of us, ms, s, m or h, e.g. '500ms' or '1.5s'"
            )
        value_s = float(match["value"]) * _UNIT_SECONDS[match["unit"] or "s"]
    if not value_s > 0 or value_s != value_s:
        raise UnitError(f"{field}: must be a positive duration, got {text!r}")
    return value_s


def format_duration(seconds: float) -> str:
    """Shortest readable form: '850ms', '1.2s'."""
    if seconds != seconds or seconds == float("inf"):
        return "inf"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.0f}ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f}ms"
    return f"{seconds:.2f}s"
