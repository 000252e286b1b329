"""Trace readers refuse bad input with a TraceError naming the file, the line and the fix,
whatever the bytes: never a traceback, never minutes of work on a typo."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscale.sim import trace as trace_module
from kvscale.sim.trace import MAX_SPAN_S, TraceError, TraceRequest, rate_scale, read_trace, time_scale

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def azure(tmp_path: Path, rows: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + rows)
    return path


def mooncake(tmp_path: Path, items: list[object], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("nan,10,10\n1,10,10\n", r"t.csv:2: .*finite"),
        ("1,10,10\ninf,10,10\n", r"t.csv:3: .*finite"),
        ("1,-5,10\n", r"t.csv:2: .*ContextTokens cannot be negative, got -5"),
        ("1,10,-1\n", r"GeneratedTokens cannot be negative"),
        ("1,1e400,10\n", r"ContextTokens must be a whole number"),
        ("1,10,99999999999\n", r"GeneratedTokens 99,999,999,999 is above"),
        ("1,10.5,10\n", r"whole number"),
        ("1,ten,10\n", r"t.csv:2"),
        ("1,10\n", r"t.csv:2"),
    ],
)
def test_bad_azure_rows_name_the_line(tmp_path: Path, rows: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(azure(tmp_path, rows))


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"timestamp": "NaN", "input_length": 1, "output_length": 1}, "finite"),
        ({"timestamp": 1e400, "input_length": 1, "output_length": 1}, "finite"),  # json.dumps writes Infinity
        ({"timestamp": 1, "input_length": -3, "output_length": 1}, "input_length cannot be negative"),
        ({"timestamp": 1, "input_length": 1, "output_length": 1e300}, "output_length .* is above"),
        ({"timestamp": True, "input_length": 1, "output_length": 1}, "timestamp must be a number"),
        ({"timestamp": 1, "input_length": [1], "output_length": 1}, "whole number"),
        ({"timestamp": 1, "input_length": 1}, "output_length"),
        ([1, 2, 3], "expected an object"),
    ],
)
def test_bad_mooncake_lines_name_the_line(tmp_path: Path, item: object, message: str) -> None:
    good = {"timestamp": 0, "input_length": 1, "output_length": 1}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(item) + "\n")
    with pytest.raises(TraceError, match=r"t.jsonl:2: .*" + message):
        read_trace(path)


def test_a_1e400_count_in_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1e400, "output_length": 1}\n')
    with pytest.raises(TraceError, match="input_length must be a whole number"):
        read_trace(path)


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (HEADER + "2023-11-16 18:15:46.6805900,374,44\n").encode())
    assert read_trace(path) == [TraceRequest(0.0, 374, 44)]
    path.write_bytes(b"\xef\xbb\xbf" + b'{"timestamp": 5, "input_length": 3, "output_length": 4}\n')
    assert read_trace(path) == [TraceRequest(0.0, 3, 4)]


def test_utf16_and_binary_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "u16.csv"
    path.write_bytes((HEADER + "1,2,3\n").encode("utf-16"))
    with pytest.raises(TraceError, match="UTF-16; convert it to UTF-8"):
        read_trace(path)
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    with pytest.raises(TraceError, match=r"not UTF-8 text|binary data"):
        read_trace(path)
    path.write_bytes(HEADER.encode() + b"1,2,\x003\n")
    with pytest.raises(TraceError, match="binary data"):
        read_trace(path)


def test_a_trace_spanning_decades_is_refused_fast(tmp_path: Path) -> None:
    """One 1970 timestamp among 2026 ones; timestamps 0 and 1e9 s."""
    rows = "".join(f"2026-11-23 12:00:{i % 60:02d},100,10\n" for i in range(1000)) + "1970-01-01 00:00:01,100,10\n"
    started = time.monotonic()
    with pytest.raises(TraceError, match=r"spans .* days.*stray timestamp"):
        read_trace(azure(tmp_path, rows))
    path = mooncake(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1, "output_length": 1},
            {"timestamp": 1e12, "input_length": 1, "output_length": 1},
        ],
    )
    with pytest.raises(TraceError, match="spans 11,574 days"):
        read_trace(path)
    assert time.monotonic() - started < 2.0


def test_time_and_rate_scale_bounds() -> None:
    trace = [TraceRequest(float(i), 10, 10) for i in range(100)]
    with pytest.raises(TraceError, match=r"--time-scale 1e-300 stretches the trace"):
        time_scale(trace, 1e-300)
    with pytest.raises(TraceError, match="finite positive"):
        time_scale(trace, float("nan"))
    with pytest.raises(TraceError, match="finite positive"):
        rate_scale(trace, float("inf"))
    with pytest.raises(TraceError, match="kept none"):
        rate_scale(trace[:1], 1e-9)
    assert time_scale(trace, 2 * 99 / MAX_SPAN_S)[-1].arrival_s == pytest.approx(MAX_SPAN_S / 2)


def test_too_many_rows_stop_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_module, "MAX_REQUESTS", 50)
    path = azure(tmp_path, "".join(f"{i},1,1\n" for i in range(51)))
    with pytest.raises(TraceError, match="more than 50 requests; replay a slice"):
        read_trace(path)
    trace = read_trace(azure(tmp_path, "".join(f"{i},1,1\n" for i in range(50)), "ok.csv"))
    with pytest.raises(TraceError, match="--rate-scale 2 makes about 100 requests"):
        rate_scale(trace, 2.0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300), prefix=st.sampled_from([b"", HEADER.encode(), b'{"timestamp": ']))
def test_any_bytes_read_or_raise_trace_error(tmp_path: Path, data: bytes, prefix: bytes) -> None:
    path = tmp_path / "fuzz"
    path.write_bytes(prefix + data)
    try:
        requests = read_trace(path)
    except TraceError as exc:
        assert str(path) in str(exc)
        return
    assert requests and requests[0].arrival_s == 0.0
    assert all(0 <= a.arrival_s <= b.arrival_s <= MAX_SPAN_S for a, b in itertools.pairwise(requests))
    assert all(r.input_tokens >= 1 and r.output_tokens >= 1 for r in requests)


cells = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "nan", "inf", "-inf", "1e400", "1_000", "0x10", "١٢", "2023-11-16 18:15:46.68059"]),
    st.text(max_size=8),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(cells, cells, cells), min_size=1, max_size=5))
def test_any_csv_cells_read_or_raise_trace_error(tmp_path: Path, rows: list[tuple[str, str, str]]) -> None:
    path = tmp_path / "fuzz.csv"
    path.write_text(HEADER + "".join(",".join(c.replace(",", ";").replace("\n", " ") for c in r) + "\n" for r in rows))
    try:
        requests = read_trace(path)
    except TraceError as exc:
        assert "fuzz.csv" in str(exc)
        return
    assert all(r.input_tokens >= 1 for r in requests)
