"""Every CLI input path, fuzzed: bad input exits 2 with a message naming the option, never a
traceback; good input exits 0 (or 1 when no plan meets the SLO). The budget per test is
small (CI runs each in about a second); KVSCALE_FUZZ_EXAMPLES=2000 runs many more."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from kvscale.cli import app

# Examples per test: small for CI; KVSCALE_FUZZ_EXAMPLES=2000 for a deep run.
fuzz = settings(
    max_examples=int(os.environ.get("KVSCALE_FUZZ_EXAMPLES", "15")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

runner = CliRunner()

PLAN = {
    "--model": "llama-3.1-8b",
    "--ttft": "500ms",
    "--tpot": "50ms",
    "--rps": "10",
    "--input": "512",
    "--output": "256",
}
SIMULATE = {
    "--model": "llama-3.1-8b",
    "--ttft": "1s",
    "--tpot": "60ms",
    "--concurrency": "2",
    "--input": "100",
    "--output": "10",
    "--duration": "5s",
    "--policy": "static",
}
PREDICT = {"--model": "llama-2-7b", "--gpu": "A100-80GB", "--batch": "8", "--input": "512", "--output": "128"}
ROOFLINE = {"--model": "llama-3.1-8b", "--gpu": "H100-SXM"}


def invoke(command: list[str], options: dict[str, str], **changes: str) -> Result:
    merged = {**options, **{k: v for k, v in changes.items()}}
    args = [*command]
    for key, value in merged.items():
        args += [key, value]
    return runner.invoke(app, [*args, "--json"])


def clean(result: Result) -> None:
    """Exited on purpose (0, 1 or 2), with no traceback anywhere."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback instead of an error message: {result.exception!r}\n{result.output}")
    assert result.exit_code in (0, 1, 2), result.output
    assert "Traceback" not in result.output


def refused(result: Result, option: str) -> None:
    """Exit 2 and a message on stderr that names the option."""
    clean(result)
    assert result.exit_code == 2, f"{option} accepted: {result.output}"
    assert option in " ".join(result.stderr.split()), result.stderr


# Anything a shell can pass: numbers of every kind, words, empty, unicode, control characters.
anything = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.sampled_from(["", " ", "nan", "inf", "-inf", "1e400", "-0", "0", "0x10", "1_0", "١", "[/x]", "[bold]"]),
    st.text(max_size=12).filter(lambda s: "\x00" not in s),
)


def as_float(text: str) -> float | None:
    """What click reads from the text for a float option (None when it refuses it)."""
    try:
        return float(text)
    except ValueError:
        return None


def as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def integral_float(text: str) -> bool:
    """'1.0': typer reads it as 1 for an optional int option and refuses it for a required one."""
    value = as_float(text)
    return as_int(text) is None and value is not None and math.isfinite(value) and value.is_integer()


def _id(value: object) -> str:
    return value if isinstance(value, str) else value[0] if isinstance(value, list) else "-"


# (command, base options, option, rule): the rule says whether a value is valid.
FLOAT_OPTIONS: list[tuple[list[str], dict[str, str], str, Callable[[float], bool]]] = [
    (["plan"], PLAN, "--rps", lambda v: math.isfinite(v) and 0 <= v <= 1e6),
    (["plan"], PLAN, "--headroom", lambda v: math.isfinite(v) and 0 <= v < 10),
    (["plan"], PLAN, "--percentile", lambda v: 50 <= v < 100),
    (["simulate"], SIMULATE, "--headroom", lambda v: math.isfinite(v) and 0 <= v < 10),
    (["simulate"], SIMULATE, "--percentile", lambda v: 50 <= v < 100),
    (["simulate"], SIMULATE, "--rate-scale", lambda v: math.isfinite(v) and 0 < v <= 1000),
    (["simulate"], SIMULATE, "--time-scale", lambda v: 1e-3 <= v <= 1e6),
]
INT_OPTIONS: list[tuple[list[str], dict[str, str], str, Callable[[int], bool]]] = [
    (["plan"], PLAN, "--input", lambda v: 1 <= v <= 10_000_000),
    (["plan"], PLAN, "--output", lambda v: 1 <= v <= 10_000_000),
    (["plan"], PLAN, "--max-context", lambda v: 1 <= v <= 10_000_000),
    (["plan"], PLAN, "--max-replicas", lambda v: 1 <= v <= 100_000),
    (["plan"], PLAN, "--tp", lambda v: v in (1, 2, 4, 8)),
    (["predict"], PREDICT, "--batch", lambda v: 1 <= v <= 10_000_000),
    (["predict"], PREDICT, "--input", lambda v: 1 <= v <= 10_000_000),
    (["predict"], PREDICT, "--tp", lambda v: v in (1, 2, 4, 8)),
    (["roofline"], ROOFLINE, "--input", lambda v: 1 <= v <= 10_000_000),
    (["simulate"], SIMULATE, "--replicas", lambda v: 1 <= v <= 10_000),
    (["simulate"], SIMULATE, "--max-replicas", lambda v: 1 <= v <= 10_000),
    (["simulate"], SIMULATE, "--concurrency", lambda v: 1 <= v <= 100_000),
    (["simulate"], SIMULATE, "--output", lambda v: 1 <= v <= 10_000_000),
]
DURATION_OPTIONS = [
    (["plan"], PLAN, "--ttft"),
    (["plan"], PLAN, "--tpot"),
    (["simulate"], SIMULATE, "--tpot"),
    (["simulate"], SIMULATE, "--cold-start"),
    (["simulate"], SIMULATE, "--duration"),
]
NAME_OPTIONS = [
    (["plan"], PLAN, "--model"),
    (["plan"], PLAN, "--gpu"),
    (["plan"], PLAN, "--precision"),
    (["plan"], PLAN, "--objective"),
    (["plan"], PLAN, "--kv-cache-precision"),
    (["predict"], PREDICT, "--gpu"),
    (["predict"], PREDICT, "--precision"),
    (["roofline"], ROOFLINE, "--model"),
    (["simulate"], SIMULATE, "--policy"),
    (["simulate"], SIMULATE, "--gpu"),
    (["crd"], {}, "--kind"),
]


@pytest.mark.parametrize(("command", "base", "option", "valid"), FLOAT_OPTIONS, ids=_id)
@fuzz
@given(text=anything)
def test_float_options(
    command: list[str], base: dict[str, str], option: str, valid: Callable[[float], bool], text: str
) -> None:
    # Large duration-bound runs (a slow time scale) are valid but not what this test measures.
    result = invoke(command, base, **{option: text})
    value = as_float(text)
    if value is None or not valid(value):
        refused(result, option)
    else:
        clean(result)


@pytest.mark.parametrize(("command", "base", "option", "valid"), INT_OPTIONS, ids=_id)
@fuzz
@given(text=st.one_of(anything, st.integers(min_value=-3, max_value=20).map(str)))
def test_int_options(
    command: list[str], base: dict[str, str], option: str, valid: Callable[[int], bool], text: str
) -> None:
    if option in ("--replicas", "--max-replicas", "--concurrency") and (as_int(text) or 0) > 50:
        text = str(-abs(as_int(text) or 0))  # keep the valid runs small; big values are checked below
    result = invoke(command, base, **{option: text})
    value = as_int(text)
    if integral_float(text):
        clean(result)
    elif value is None or not valid(value):
        refused(result, option)
    else:
        clean(result)


@pytest.mark.parametrize(("command", "base", "option"), DURATION_OPTIONS, ids=_id)
@fuzz
@given(
    text=st.one_of(
        anything,
        st.builds(
            lambda n, unit: f"{n}{unit}",
            st.floats(allow_nan=True, allow_infinity=True).map(repr),
            st.sampled_from(["", "us", "ms", "s", "m", "h", "d", "sec"]),
        ),
    )
)
def test_duration_options(command: list[str], base: dict[str, str], option: str, text: str) -> None:
    if option == "--duration":
        text = text if not text.endswith(("m", "h")) else text[:-1] + "ms"  # keep closed loops short
    result = invoke(command, base, **{option: text})
    clean(result)
    # Exit 1 with "no plan meets the SLO": a valid target no GPU can serve (e.g. --tpot 1us
    # in simulate), not an unreadable option.
    infeasible = result.exit_code == 1 and "no plan meets the SLO" in result.stderr
    if result.exit_code == 0 or (result.exit_code == 1 and "error:" not in result.stderr) or infeasible:
        assert text.strip()[-1:].isalpha(), f"{option} {text!r} accepted without a unit"
    else:
        refused(result, option)


@pytest.mark.parametrize(("command", "base", "option"), NAME_OPTIONS, ids=_id)
@fuzz
@given(text=anything)
def test_name_options(command: list[str], base: dict[str, str], option: str, text: str) -> None:
    result = invoke(command, base, **{option: text})
    clean(result)
    if result.exit_code == 2:
        assert result.stderr.strip(), "exit 2 without a message"


@fuzz
@given(name=st.text(max_size=20).filter(lambda s: "\x00" not in s and "/" not in s), suffix=anything)
def test_png_path_checked_before_work(tmp_path: Path, name: str, suffix: str) -> None:
    target = tmp_path / "missing-dir" / f"{name}{suffix}"
    result = invoke(["roofline"], ROOFLINE, **{"--png": str(target)})
    refused(result, "--png")


@fuzz
@given(data=st.binary(max_size=200))
def test_trace_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n" + data)
    base = {k: v for k, v in SIMULATE.items() if k not in ("--concurrency", "--input", "--output", "--duration")}
    result = invoke(["simulate"], base, **{"--trace": str(path)})
    clean(result)
    if result.exit_code == 2:
        assert "t.csv" in result.stderr


def test_catalog_file_of_any_shape_is_refused_by_name(tmp_path: Path) -> None:
    for content in (b"\xff\xfe\x00", b"[1, 2", b"- a\n- b\n", b"gpus: 3\n", b"\x00\x01"):
        path = tmp_path / "cat.yaml"
        path.write_bytes(content)
        result = invoke(["plan"], PLAN, **{"--catalog": str(path)})
        clean(result)
        assert result.exit_code == 2 and "cat.yaml" in " ".join(result.stderr.split()), result.output


ARCH_FIELDS = ["layers", "hidden_size", "heads", "kv_heads", "head_dim", "intermediate_size", "vocab_size"]
arch_values = st.one_of(
    st.integers(min_value=-5, max_value=70_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)


@fuzz
@given(
    fields=st.dictionaries(
        st.sampled_from([*ARCH_FIELDS, "params", "experts", "active_experts", "name", "bogus"]), arch_values
    ),
    base=st.booleans(),
)
def test_architecture_files(tmp_path: Path, fields: dict[str, object], base: bool) -> None:
    """A custom architecture file of any content: planned, or refused naming --model."""
    valid = {"layers": 4, "hidden_size": 512, "heads": 8, "kv_heads": 2, "head_dim": 64}
    valid |= {"intermediate_size": 1024, "vocab_size": 1000}
    path = tmp_path / "arch.yaml"
    path.write_text(yaml.safe_dump({**(valid if base else {}), **fields}))
    result = invoke(["plan"], PLAN, **{"--model": str(path)})
    clean(result)
    if result.exit_code == 2:
        assert "--model" in result.stderr


load_specs = st.one_of(
    anything,
    st.builds(
        lambda kind, pairs: kind + ":" + ",".join(f"{k}={v}" for k, v in pairs),
        st.sampled_from(["poisson", "bursty", "diurnal", "step", "flash", "nope", ""]),
        st.lists(
            st.tuples(
                st.sampled_from(["rate", "duration", "input", "output", "peak", "period", "lengths", "x", ""]),
                anything,
            ),
            max_size=4,
        ),
    ),
)


@fuzz
@given(spec=load_specs, routing=st.one_of(st.sampled_from(["service", "round-robin", "gateway"]), anything))
def test_simulate_load_and_routing(spec: str, routing: str) -> None:
    base = {k: v for k, v in SIMULATE.items() if k not in ("--concurrency", "--input", "--output", "--duration")}
    result = invoke(["simulate"], base, **{"--load": spec, "--routing": routing, "--time-scale": "1000"})
    clean(result)
    if result.exit_code == 2:
        assert result.stderr.strip(), "exit 2 without a message"


@fuzz
@given(engine=anything, source=anything)
def test_plan_engine_and_source(engine: str, source: str) -> None:
    clean(invoke(["plan"], PLAN, **{"--engine": engine}))
    clean(invoke(["plan"], PLAN, **{"--source": source}))


manifest_docs = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2, max_value=10**6) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)


@fuzz
@given(
    spec=st.one_of(
        manifest_docs,
        st.fixed_dictionaries(
            {"apiVersion": st.just("kvscale.io/v1alpha1"), "kind": st.just("InferenceService")},
            optional={"metadata": manifest_docs, "spec": manifest_docs},
        ),
    ),
    gpus=st.one_of(st.none(), anything, st.sampled_from(["H100-SXM=16", "L4=0", "L4=-1", "X=1", "L4=1e9"])),
)
def test_manifests_any_document(tmp_path: Path, spec: object, gpus: str | None) -> None:
    path = tmp_path / "kvis.yaml"
    path.write_text(yaml.safe_dump(spec))
    args = {"--file": str(path)} | ({"--gpus": gpus} if gpus is not None else {})
    result = runner.invoke(app, ["manifests", *(x for pair in args.items() for x in pair)])
    clean(result)


@fuzz
@given(load=anything, cold_start=anything, port=st.integers(min_value=-5, max_value=70_000).map(str))
def test_sim_serve_options(tmp_path: Path, load: str, cold_start: str, port: str) -> None:
    """Options checked before the cluster; no cluster (a missing kubeconfig) is an error too."""
    env = {"KUBECONFIG": str(tmp_path / "missing"), "KUBERNETES_SERVICE_HOST": ""}
    args = ["sim", "serve", "--name", "x", "--load", load, "--cold-start", cold_start, "--port", port]
    result = runner.invoke(app, args, env=env)
    clean(result)
    assert result.exit_code in (1, 2) and result.stderr.strip()
