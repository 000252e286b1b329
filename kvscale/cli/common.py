"""What every command shares: the consoles, option types, and input checks that exit 2 naming
the option and the fix (never a traceback)."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from kvscale.planner.search import TENSOR_PARALLEL_DEGREES
from kvscale.sizing.catalog import Catalog, CatalogError, EngineProfile, ModelArch, load_catalog, load_yaml
from kvscale.sizing.units import UnitError, parse_duration_s
from kvscale.sizing.workload import Slo

if TYPE_CHECKING:  # --engine-command and config.json models import these when given
    from kvscale.engines.command import CommandConfig, EngineCommand

# Wide enough for the plan and policy tables when output goes to a pipe or a file.
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 1

# Token counts above this are typos (the longest context any catalog model takes is 128 Ki-1 Mi).
MAX_TOKENS = 10_000_000
# The image formats a --png option may name (matplotlib writes each by extension).
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")
ITL_HELP = (
    "Bound on the p99 gap between two tokens of one request, e.g. 150ms (spec.slo.maxInterTokenLatency): "
    "limits the chunk budget (--max-num-batched-tokens) so that no step, a full chunk beside the running "
    "decodes, takes longer."
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON instead of a table.")]
CatalogOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--catalog", help="YAML file laid over the built-in catalog (extra GPUs, models, prices). Repeatable."
    ),
]
OptionalModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Catalog name, alias, Hugging Face config.json or architecture file (default with --engine-command: "
        "the model the command serves).",
    ),
]
EngineCommandOpt = Annotated[
    str | None,
    typer.Option(
        "--engine-command",
        help='An engine launch command to evaluate, e.g. "vllm serve Qwen/Qwen3-32B -tp 2 --max-num-seqs 128" or '
        '"python -m sglang.launch_server --model-path ... --tp-size 4"; flags it leaves out take the engine\'s '
        "defaults for --gpu.",
    ),
]
EngineVersionOpt = Annotated[
    str | None,
    typer.Option(
        "--engine-version",
        help="The engine release (e.g. 0.11.0, an image such as vllm/vllm-openai:v0.11.0, or a catalog release such "
        "as tensorrt-llm-0.9): picks the profile of --engine (or of the engine --engine-command runs) covering it "
        "(default: an image named in the command, else the newest).",
    ),
]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Catalog name, alias (e.g. a Hugging Face id), a Hugging Face config.json (or a checkpoint directory "
        "holding one), or a YAML file with a custom architecture.",
    ),
]


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    # The message may hold user input: escape it so '[/x]' prints as text instead of raising.
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def fmt(value: Any, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def load(paths: list[Path] | None) -> Catalog:
    try:
        return load_catalog(*(paths or []))
    except CatalogError as exc:
        cause = exc.__cause__
        fail(f"--catalog: {_one_line(exc)}" if isinstance(cause, ValidationError) else str(exc))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValidationError, ValueError) as exc:
        fail(f"--catalog: cannot read {', '.join(map(str, paths or []))}: {_one_line(exc)}")
    except (AttributeError, TypeError, KeyError) as exc:  # a section that is not a mapping
        fail(
            f"--catalog {', '.join(map(str, paths or []))}: expected sections (gpus:, models:, ...) each mapping "
            f"a name to its fields, e.g. 'gpus: {{H100-SXM: {{price_usd_per_gpu_hour: 2.1}}}}' ({_one_line(exc)})"
        )


def yaml_error(exc: yaml.YAMLError) -> str:
    """A YAML error in one line with where it is: `line 5, column 12: expected ',' or ']', but got
    '<stream end>' (while parsing a flow sequence that started at line 5, column 12)`."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return " ".join(str(exc).split())
    mark = exc.problem_mark
    said = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or 'malformed'}"
    if exc.context:
        began = exc.context_mark
        at = f" that started at line {began.line + 1}, column {began.column + 1}" if began is not None else ""
        said += f" ({exc.context}{at})"
    return said


def _one_line(exc: BaseException) -> str:
    """An exception as one line; pydantic's errors as `field: message` pairs (no URLs, no
    input dumps), also when wrapped in another error."""
    cause = exc if isinstance(exc, ValidationError) else exc.__cause__
    if isinstance(cause, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in cause.errors())
    return " ".join(str(exc).split())


# Whole-number fields of a custom architecture file, and the one real-valued field.
_ARCH_INTS = ("layers", "hidden_size", "heads", "kv_heads", "head_dim", "intermediate_size", "vocab_size")
_ARCH_OPTIONAL_INTS = ("experts", "active_experts", "max_context_tokens")


def _check_architecture(name: str, fields: dict[str, Any], option: str = "--model") -> None:
    for key in _ARCH_INTS + _ARCH_OPTIONAL_INTS:
        if key not in fields:
            continue
        value = fields[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            fail(f"{option} {name}: invalid architecture: {key} must be a whole number >= 1, got {value!r}")
    params = fields.get("params")
    if params is not None and (
        isinstance(params, bool) or not isinstance(params, int | float) or not math.isfinite(params) or params <= 0
    ):
        fail(f"{option} {name}: invalid architecture: params must be a positive number (e.g. 8.03e9), got {params!r}")


def _hf_model(name: str, path: Path, option: str = "--model") -> ModelArch:
    """A Hugging Face config.json (a file, or a checkpoint directory holding one)."""
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        fail(f"{option}: file {file} does not exist")
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"{option} {name}: not a readable config.json: {_one_line(exc)}")
    if not isinstance(raw, dict):
        fail(f"{option} {name}: a config.json is a JSON object with model_type, num_hidden_layers, ...")
    label = file.parent.name if file.name == "config.json" and file.parent.name else file.stem
    from kvscale.sizing.hf_config import arch_from_hf_config, assumed_defaults

    try:
        arch = arch_from_hf_config(raw, str(raw.get("_name_or_path") or label), f"config.json: {file}")
    except ValueError as exc:
        fail(f"{option} {name}: {_one_line(exc)}")
    for line in assumed_defaults(raw):  # on stderr: --json output stays one document
        err.print(f"Warning: {option} {name}: {line}", highlight=False, soft_wrap=True)
    return arch


def model(cat: Catalog, name: str, option: str = "--model") -> ModelArch:
    """The model `name` names (a catalog name or alias, a config.json, an architecture file);
    exit 2 naming `option` (the option, or a field of a file: `--fleet F: services.0.model`)."""
    path = Path(name)
    if name.endswith(".json") or (path.is_dir() and (path / "config.json").is_file()):
        return _hf_model(name, path, option)
    if name.endswith((".yaml", ".yml")):
        if not path.is_file():
            fail(f"{option}: file {name} does not exist")
        try:
            fields: Any = load_yaml(path.read_text())
            if not isinstance(fields, dict):
                fail(f"{option} {name}: expected a mapping of architecture fields (layers, hidden_size, heads, ...)")
            from kvscale.sizing.hf_config import arch_from_hf_config, is_hf_config

            if is_hf_config(fields):
                return arch_from_hf_config(fields, str(fields.get("name", path.stem)), f"config fields: {path}")
            model_name = str(fields.pop("name", path.stem))
            _check_architecture(name, fields, option)
            return ModelArch.from_architecture(model_name, **fields)
        except (yaml.YAMLError, ValidationError, ValueError, TypeError, OSError, UnicodeDecodeError) as exc:
            fail(f"{option} {name}: invalid architecture: {_one_line(exc)}")
    try:
        return cat.model(name)
    except CatalogError as exc:
        fail(f"{option}: {exc}")


MAX_GPUS_PER_TYPE = 1_000_000
MAX_GPUS_PER_NODE = 64
GPUS_SYNTAX = (
    "TYPE=COUNT (COUNT GPUs on nodes of the catalog's size) or TYPE=NODESxGPUS (NODES nodes of GPUS GPUs each; "
    "shapes of one type joined by +), e.g. --gpus H100-SXM=16,L4=8x1 or --gpus L4=2x4+8x1"
)
_SHAPE = re.compile(r"^(\d+)\s*[xX]\s*(\d+)$")


@dataclass(frozen=True)
class GpuNodes:
    """One GPU type of --gpus: its free GPUs on each node, largest first; `shaped`: the nodes
    were described (NODESxGPUS), not assumed to be the catalog's size."""

    by_node: tuple[int, ...]
    shaped: bool

    @property
    def count(self) -> int:
        return sum(self.by_node)

    @property
    def max_per_node(self) -> int:
        return max(self.by_node)


def _nodes(cat: Catalog, name: str, item: str, value: str) -> GpuNodes:
    """One TYPE='s value: COUNT, or NODESxGPUS[+NODESxGPUS...]; exit 2 naming --gpus and the syntax."""
    value = value.strip()
    if value.isdigit():
        count = int(value)
        if not 0 < count <= MAX_GPUS_PER_TYPE:
            fail(f"--gpus {item!r}: the count must be in [1, {MAX_GPUS_PER_TYPE:,}]; write {GPUS_SYNTAX}")
        # COUNT GPUs as full nodes of the catalog's size (and one partial node)
        per_node = min(count, cat.gpu(name).max_gpus_per_node)
        whole, rest = divmod(count, per_node)
        return GpuNodes((per_node,) * whole + ((rest,) if rest else ()), shaped=False)
    by_node: list[int] = []
    for shape in value.split("+"):
        m = _SHAPE.match(shape.strip())
        if m is None:
            fail(f"--gpus {item!r}: {shape.strip()!r} is not a count or a node shape; write {GPUS_SYNTAX}")
        nodes, per_node = int(m.group(1)), int(m.group(2))
        if not 0 < nodes <= MAX_GPUS_PER_TYPE or not 0 < per_node <= MAX_GPUS_PER_NODE:
            fail(
                f"--gpus {item!r}: {shape.strip()}: NODES must be in [1, {MAX_GPUS_PER_TYPE:,}] and GPUS per node "
                f"in [1, {MAX_GPUS_PER_NODE}]; write {GPUS_SYNTAX}"
            )
        if sum(by_node) + nodes * per_node > MAX_GPUS_PER_TYPE:
            fail(f"--gpus {item!r}: more than {MAX_GPUS_PER_TYPE:,} GPUs of one type; write {GPUS_SYNTAX}")
        by_node += [per_node] * nodes
    return GpuNodes(tuple(sorted(by_node, reverse=True)), shaped=True)


def gpu_nodes(cat: Catalog, text: str) -> dict[str, GpuNodes]:
    """--gpus TYPE=COUNT or TYPE=NODESxGPUS,...: the cluster's free GPUs per catalog type and
    node (plan and manifests): a replica's tensor-parallel group never spans more GPUs than
    a node of its type holds."""
    out: dict[str, GpuNodes] = {}
    for item in split(text):
        kind, sep, value = item.partition("=")
        if not sep or not kind.strip() or not value.strip():
            fail(f"--gpus {item!r}: write {GPUS_SYNTAX}")
        try:
            name = cat.gpu(kind.strip()).name
        except CatalogError as exc:
            fail(f"--gpus: {exc}")
        say_alias(cat, kind, name, "--gpus")
        if name in out:
            fail(f"--gpus names {name} twice; join its node shapes with + (e.g. {name}=2x4+8x1)")
        out[name] = _nodes(cat, name, item, value)
    if not out:
        fail("--gpus: give at least one TYPE=COUNT or TYPE=NODESxGPUS, e.g. --gpus H100-SXM=16,L4=8x1")
    return out


def sized_to_nodes(cat: Catalog, nodes: dict[str, GpuNodes]) -> Catalog:
    """The catalog with each described type's node size the largest --gpus node's (as the
    operator sizes it to the cluster's nodes): no tensor-parallel degree beyond it."""
    gpus = dict(cat.gpus)
    for name, n in nodes.items():
        if n.shaped:
            gpus[name] = gpus[name].model_copy(update={"gpus_per_node": (n.max_per_node,)})
    return cat.model_copy(update={"gpus": gpus})


def split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


_BARE_NUMBER = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


def duration(value: str, option: str) -> float:
    """A positive, finite duration with a unit: '500ms', '1.5s', '2m'. A bare number is refused
    (is `--ttft 500` half a second or eight minutes?)."""
    if _BARE_NUMBER.match(value):
        number = value.strip()
        fail(f"{option} {number}: add a unit: {number}ms or {number}s")
    try:
        seconds = parse_duration_s(value, field=option)
    except UnitError as exc:
        fail(str(exc))
    if not math.isfinite(seconds):
        fail(f"{option}: {value!r} is not a finite duration; write e.g. '500ms' or '1.5s'")
    return seconds


def http_url(url: str, option: str, example: str) -> str:
    """A base URL, checked before anything is read: http(s) with a host and a valid port;
    exit 2 naming the option otherwise (not a connection error, exit 1, after the work)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fail(f"{option} {url!r}: give an http:// or https:// URL with a host, e.g. {example}")
    try:
        parts.port  # noqa: B018  (raises on a port out of range or not a number)
    except ValueError as exc:
        fail(f"{option} {url!r}: {exc}")
    return url.strip()


def positive(value: int, option: str, maximum: int | None = None) -> int:
    if value < 1:
        fail(f"{option} must be a positive whole number, got {value}")
    if maximum is not None and value > maximum:
        fail(f"{option} must be at most {maximum:,}, got {value:,}")
    return value


def tokens(value: int, option: str) -> int:
    return positive(value, option, MAX_TOKENS)


def number(value: float, option: str, *, low: float, high: float, what: str, high_inclusive: bool = False) -> float:
    """A finite number in [low, high) (or [low, high]); NaN and infinities are refused by name."""
    if not math.isfinite(value):
        fail(f"{option} must be a finite number ({what}), got {value}")
    if value < low or value > high or (value == high and not high_inclusive):
        bracket = "]" if high_inclusive else ")"
        fail(f"{option} must be in [{low:g}, {high:g}{bracket} ({what}), got {value:g}")
    return value


def positive_number(value: float, option: str, *, high: float, what: str) -> float:
    """A finite number in (0, high]."""
    if not math.isfinite(value) or not 0 < value <= high:
        fail(f"{option} must be a finite number in (0, {high:g}] ({what}), got {value:g}")
    return value


def tp_values(tp: int | None) -> tuple[int, ...]:
    if tp is None:
        return TENSOR_PARALLEL_DEGREES
    if tp not in TENSOR_PARALLEL_DEGREES:
        fail(f"--tp must be one of {', '.join(map(str, TENSOR_PARALLEL_DEGREES))}, got {tp}")
    return (tp,)


def say_alias(cat: Catalog, given: str, resolved: str, option: str = "--gpu") -> None:
    """A name that stands for one of several catalog types (`H100`: H100-SXM, beside H100-PCIE
    and H100-NVL) is said on stderr, not taken silently."""
    typed = given.strip().lower()
    others = sorted(k for k in cat.gpus if k.lower().startswith(typed) and k != resolved)
    if typed != resolved.lower() and others:
        err.print(
            f"note: {option} {given.strip()} means {resolved}; {', '.join(others)} "
            f"{'is another type' if len(others) == 1 else 'are other types'}: name one to use it",
            highlight=False,
            soft_wrap=True,
        )


def check_names(cat: Catalog, gpus: tuple[str, ...], precisions: tuple[str, ...], kv: str) -> tuple[str, ...]:
    try:
        resolved = tuple(cat.gpu(g).name for g in gpus)
        for given, name in zip(gpus, resolved, strict=True):
            say_alias(cat, given, name)
        for p in precisions:
            cat.precision(p)
        cat.kv_precision(kv)
    except CatalogError as exc:
        fail(str(exc))
    return resolved


def slo(ttft: str, tpot: str, percentile: float) -> Slo:
    if not 50 <= percentile < 100:
        fail(f"--percentile must be in [50, 100), got {percentile:g}")
    return Slo(duration(ttft, "--ttft"), duration(tpot, "--tpot"), percentile)


def image_path(path: Path | None, option: str = "--png") -> Path | None:
    """Checks an output picture's path before any work is done: a known image extension and
    a writable directory that exists."""
    if path is None:
        return None
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        fail(
            f"{option} {path}: the file name must end in one of {', '.join(IMAGE_SUFFIXES)} "
            f"(the format is taken from it), e.g. {path.with_suffix('.png').name}"
        )
    if path.is_dir():
        fail(f"{option} {path} is a directory; give a file name inside it, e.g. {path / 'plot.png'}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        fail(f"{option} {path}: directory {parent} does not exist; create it first (mkdir -p {parent})")
    if not os.access(parent, os.W_OK):
        fail(f"{option} {path}: directory {parent} is not writable")
    return path


def write_picture(path: Path, draw: Any, option: str = "--png") -> None:
    """Draws, turning a failure to write into an error that names the option (the results have
    been printed already)."""
    try:
        draw()
    except (OSError, ValueError) as exc:
        fail(f"{option} {path}: could not write the picture: {_one_line(exc)}")


EngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help="Engine profile to size with: an engine (vllm, sglang, tgi, tensorrt-llm: its newest release) or a "
        "release in the catalog (e.g. vllm-0.2, tensorrt-llm-0.9); default vllm.",
    ),
]
DEFAULT_ENGINE = "vllm"


def _known_engines(cat: Catalog) -> str:
    engines = sorted({p.name for p in cat.engines.values()})
    return f"engines {', '.join(engines)}; releases {', '.join(sorted(cat.engines))}"


def _profile_key(cat: Catalog, name: str) -> str | None:
    """The catalog key of a release named `name` (any case), or None."""
    wanted = name.strip().lower()
    return next((key for key in cat.engines if key.lower() == wanted), None)


def engine_selection(cat: Catalog, engine: str | None, version: str | None) -> tuple[str, EngineProfile]:
    """--engine and --engine-version without --engine-command: what to size with.

    Returns the name the planner takes (an engine, whose profile then follows the image each
    GPU type runs, or a release key when one was named) and the profile it resolves to. A
    version is honoured (the engine's profile covering that release) or refused with exit 2,
    never ignored; unknown names exit 2 listing the known ones."""
    from kvscale.sizing.engine_profiles import profile_for, release_of

    family = DEFAULT_ENGINE
    key = None
    if engine is not None:
        key = _profile_key(cat, engine)
        if key is None:
            family = engine.strip().lower()
            if not cat.engine_profiles(family):
                fail(f"--engine {engine!r}: unknown; known {_known_engines(cat)}")
        elif version is not None:
            fail(
                f"--engine {engine} names a release already: drop --engine-version, or give the engine "
                f"(--engine {cat.engines[key].name} --engine-version {version})"
            )
    if key is None and version is not None:
        key = _profile_key(cat, version)
        if key is not None and engine is not None and cat.engines[key].name != family:
            fail(f"--engine-version {version} is a {cat.engines[key].name} release, not {family}'s: drop one of them")
        if key is None:
            if release_of(version) is None:
                fail(
                    f"--engine-version {version!r}: no release in it; give e.g. 0.11.0, an image such as "
                    f"vllm/vllm-openai:v0.11.0, or a catalog release ({', '.join(sorted(cat.engines))})"
                )
            key = profile_for(cat, family, version).profile
    if key is not None:
        return key, cat.engines[key]
    return family, cat.engine(family)


def command_engine_version(cat: Catalog, engine: str | None, version: str | None, command_engine: str) -> str | None:
    """--engine (and --engine-version) beside --engine-command: each must name the command's
    engine or one of its releases, which then picks the profile as a version would."""
    named = _profile_key(cat, version) if version is not None else None
    if named is not None:
        if cat.engines[named].name != command_engine:
            fail(
                f"--engine-version {version} is a {cat.engines[named].name} release; --engine-command runs "
                f"{command_engine}: give one of its releases ({', '.join(p.profile for p in cat.engine_profiles(command_engine))})"
            )
        version = cat.engines[named].version or cat.engines[named].covers_from
    if engine is None:
        return version
    key = _profile_key(cat, engine)
    family = cat.engines[key].name if key is not None else engine.strip().lower()
    if key is None and not cat.engine_profiles(family):
        fail(f"--engine {engine!r}: unknown; known {_known_engines(cat)}")
    if family != command_engine:
        fail(f"--engine {engine} does not match the {command_engine} command --engine-command runs: drop --engine")
    if key is None:
        return version
    if version is not None:
        fail(f"--engine {engine} names a release already: drop --engine-version")
    return cat.engines[key].version or cat.engines[key].covers_from


def parse_command(
    text: str,
    gpu: str | None,
    tp: int | None,
    precision: str | None,
    version: str | None = None,
    cat: Catalog | None = None,
    engine: str | None = None,
) -> EngineCommand:
    """--engine-command parsed; it sets parallelism and precision, so --tp/--precision cannot also be given.
    `engine` (--engine, with the catalog `cat`) must name the command's engine or one of its releases."""
    if not gpu or len(split(gpu)) != 1:
        fail("--engine-command needs --gpu with one GPU type (the engine's defaults depend on it)")
    if tp is not None or precision is not None:
        fail("--engine-command sets the parallelism and precision: leave out --tp and --precision")
    from kvscale.engines.command import EngineCommandError, parse_engine_command
    from kvscale.sizing.engine_profiles import release_of

    if version is not None and release_of(version) is None and version.strip().lower() != "latest":
        fail(f"--engine-version {version!r}: no release in it; give e.g. 0.11.0 or vllm/vllm-openai:v0.11.0")
    try:
        command = parse_engine_command(text, version)
    except EngineCommandError as exc:
        fail(str(exc))
    if cat is None:
        return command
    return replace(command, version=command_engine_version(cat, engine, version, command.engine))


def command_model(cat: Catalog, command: EngineCommand | None) -> ModelArch:
    """The catalog model an engine command serves (an -FP8 checkpoint name resolves to its base)."""
    assert command is not None
    from kvscale.engines.command import resolve_command_model

    try:
        return resolve_command_model(cat, command.model)[0]
    except CatalogError as exc:
        fail(f"--engine-command: {exc}; or give --model (a catalog name or the model's config.json)")


def command_config_or_fail(cat: Catalog, command: EngineCommand, gpu: str, arch: ModelArch) -> CommandConfig:
    from kvscale.engines.command import command_config

    try:
        cc = command_config(cat, command, cat.gpu(gpu), arch)
    except (CatalogError, ValueError) as exc:
        fail(f"--engine-command: {exc}")
    reason = cc.config.unsupported_reason()
    if reason:
        fail(f"--engine-command: {reason}")
    return cc
