#!/usr/bin/env python3
"""Check (or regenerate) every quoted command output and figure in README.md and docs/*.md.

A quoted output is marked with an HTML comment naming the command that printed it, directly
above its fenced block:

    <!-- docs-check: kvscale plan --model llama-3.1-8b --ttft 500ms --tpot 50ms --rps 10 --input 512 --output 256
         lines: 3-10
         width: 148
    -->
    ```
    ...the output...
    ```

Figures quoted in prose are tied to a command by a marker directly above the paragraph (or
table) that quotes them; each line `FIGURE = TEMPLATE` says how the figure is printed from the
command's output:

    <!-- docs-check figures: kvscale simulate --fleet deploy/budget/fleet.yaml --json
         99.09% = {services[name=chat].slo_attainment:.2%}
         0 of 125 = {services[name=chat].held_ticks} of {services[name=chat].ticks}
         2026-11-25 = date
    -->

Figures that no command here reruns in minutes (a benchmark's, a cluster test's, a past
comparison) are marked as such, saying where they come from, so that leaving them out is explicit:

    <!-- docs-check skip: benchmarks/autoscaling.py (9 minutes), RESULTS.md 2026-11-26 -->

Markdown that a command prints whole (a table no CLI command prints, from hack/docs_tables.py)
sits under a text marker; the paragraph below it is the command's output:

    <!-- docs-check text: python hack/docs_tables.py cold-starts -->
    | model, precision, TP | checkpoint | ... |

A picture the docs show is redrawn by `--update` (never compared: check mode does not run it):

    <!-- docs-check picture: kvscale simulate --fleet deploy/budget/fleet.yaml --png docs/fleet-budget.png -->

A template holds `{PATH}` or `{PATH:SPEC}` fields. PATH reads the command's JSON output: `a.b`,
`[0]`, `[key=value]` or `[k1=v1,k2=v2]` (the first list item whose keys have those values);
`PATH/REGEX/` reads a string in it, and `/REGEX/` alone the command's whole output (group 1 when
the pattern has one, else the whole match; no braces inside). `|floor(N)`, `|round(N)`, `|x(N)`
transform a number before SPEC (Python's format spec: `.2%`, `,`, `.0f`) prints it. The figures
must occur in the paragraph in the marker's order (a figure's words may be split over two
lines). `DATE = date` is the date of the last `--update` that changed something in the file.

Options, one `key: value` line each in either marker:

- `exit: N`      the exit status the command must end with (default 0);
- `columns: N`   COLUMNS for the command (default 160; kvscale's own tables are 160 wide
                 whenever stdout is not a terminal, so widths do not vary with the terminal);
- `stderr: merge` quote stderr after stdout (default: stdout only);
- figures only: `paragraphs: N`, the figures are in the N paragraphs below the marker (default 1);
- blocks only: `grep: REGEX` (only the lines it matches), `lines: 1-8,12,...` (the lines
  quoted; `...` quotes a literal `...` line), `width: N` (longer lines are cut to N characters and end with ` ...`), `prompt: yes` (the
  block opens with `$ COMMAND`);
- `mask: REGEX`  (repeatable) what varies from run to run (a timing, a date): text it matches is
  compared as equal, and `--update` writes what the command printed.

`hack/docs_check.py` runs each distinct command once (in parallel, `--jobs`), in the repository
root with `.venv/bin` first on PATH, TZ=UTC and no colour, and fails naming the file, the line
and the lines or figures that differ (exit 1; 2 for a marker it cannot read).
`hack/docs_check.py --update` rewrites them (`make docs-update`); `--list` lists the markers.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import difflib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_COLUMNS = 160
COMMAND_TIMEOUT_S = 600.0
MASKED = "\x00masked\x00"

_OPEN = re.compile(r"^<!-- docs-check( figures| text| skip| picture)?:(.*)$")
_OPTION = re.compile(r"^([a-z][a-z-]*):\s?(.*)$")
_FIELD = re.compile(r"\{([^{}:|/]*)(/(?:[^/\\]|\\.)*/)?((?:\|[a-z]+\([-\d.]+\))*)(?::([^{}]*))?\}")
_DATE = re.compile(r"\d{4}-\d\d-\d\d")


class MarkerError(Exception):
    """A marker that cannot be read (exit 2)."""


@dataclass
class Figure:
    text: str  # as quoted in the prose (and in the marker)
    template: str  # how the command's output prints it, or "date"
    line: int  # 0-based line of the marker's figure line


@dataclass
class Marker:
    path: Path
    kind: str  # "block" | "figures"
    command: str
    start: int  # 0-based line of `<!-- docs-check`
    end: int  # 0-based line of `-->`
    options: dict[str, list[str]] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    # block: the 0-based lines of the fences; figures: the paragraph's lines [region_start, region_end)
    region_start: int = 0
    region_end: int = 0

    def option(self, key: str, default: str = "") -> str:
        values = self.options.get(key)
        return values[-1] if values else default

    @property
    def columns(self) -> int:
        return int(self.option("columns", str(DEFAULT_COLUMNS)))

    @property
    def run_key(self) -> tuple[str, int, bool]:
        return (self.command, self.columns, self.option("stderr") == "merge")

    def where(self, line: int | None = None) -> str:
        return f"{_rel(self.path)}:{(self.start if line is None else line) + 1}"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# --- reading markers -------------------------------------------------------------------------


def parse(path: Path, lines: list[str]) -> list[Marker]:
    markers: list[Marker] = []
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("```"):  # markers quoted inside a fenced block are examples
            ticks = lines[i].lstrip()[: len(lines[i].lstrip()) - len(lines[i].lstrip().lstrip("`"))]
            i += 1
            while i < len(lines) and lines[i].strip() != ticks:
                i += 1
            i += 1
            continue
        match = _OPEN.match(lines[i].strip())
        if not match:
            i += 1
            continue
        start = i
        body: list[str] = [match.group(2)]
        while "-->" not in body[-1]:
            i += 1
            if i >= len(lines):
                raise MarkerError(f"{_rel(path)}:{start + 1}: docs-check marker is never closed with -->")
            body.append(lines[i])
        body[-1] = body[-1].split("-->", 1)[0]
        end = i
        kind = (match.group(1) or " block").strip()
        if kind in (
            "skip",
            "picture",
        ):  # figures below are measurements no command here reruns: the marker says where from
            markers.append(
                Marker(path=path, kind=kind, command=" ".join(b.strip() for b in body).strip(), start=start, end=end)
            )
            i += 1
            continue
        marker = _read_marker(path, kind, start, end, body)
        if marker.kind == "block":
            fence = end + 1
            if fence >= len(lines) or not lines[fence].lstrip().startswith("```"):
                raise MarkerError(f"{marker.where()}: a docs-check block marker must sit right above a ``` fence")
            close = next((j for j in range(fence + 1, len(lines)) if lines[j].strip() == "```"), None)
            if close is None:
                raise MarkerError(f"{marker.where(fence)}: the fenced block is never closed")
            marker.region_start, marker.region_end = fence, close
        else:  # figures, text: the paragraph(s) below
            region_start = end + 1
            while region_start < len(lines) and _OPEN.match(lines[region_start].strip()):
                region_start = _skip_marker(lines, region_start) + 1
            region_end = region_start
            for paragraph in range(int(marker.option("paragraphs", "1"))):
                if paragraph:  # the blank lines between two paragraphs
                    while region_end < len(lines) and not lines[region_end].strip():
                        region_end += 1
                while (
                    region_end < len(lines) and lines[region_end].strip() and not _OPEN.match(lines[region_end].strip())
                ):
                    region_end += 1
            if region_end == region_start:
                raise MarkerError(f"{marker.where()}: a {kind} marker must sit right above the paragraph it checks")
            marker.region_start, marker.region_end = region_start, region_end
        markers.append(marker)
        i += 1
    return markers


def _skip_marker(lines: list[str], i: int) -> int:
    while "-->" not in lines[i]:
        i += 1
    return i


def _read_marker(path: Path, kind: str, start: int, end: int, body: list[str]) -> Marker:
    command_lines = [body[0].strip()]
    k = 1
    while command_lines[-1].endswith("\\") and k < len(body):
        command_lines[-1] = command_lines[-1][:-1].rstrip()
        command_lines.append(body[k].strip())
        k += 1
    command = " ".join(part for part in command_lines if part)
    marker = Marker(path=path, kind=kind, command=command, start=start, end=end)
    if not command:
        raise MarkerError(f"{marker.where()}: docs-check marker names no command")
    for offset, raw in enumerate(body[k:], start=k):
        text = raw.strip()
        if not text:
            continue
        line = start + offset
        if kind == "figures" and " = " in text:
            figure, template = text.split(" = ", 1)
            marker.figures.append(Figure(figure.strip(), template.strip(), line))
            continue
        option = _OPTION.match(text)
        if not option:
            raise MarkerError(f"{marker.where(line)}: cannot read {text!r} (want `key: value` or `FIGURE = TEMPLATE`)")
        key, value = option.group(1), option.group(2).strip()
        allowed = {"exit", "columns", "stderr", "mask"} | (
            {"lines", "grep", "width", "prompt"} if kind == "block" else {"paragraphs"}
        )
        if key not in allowed:
            raise MarkerError(f"{marker.where(line)}: unknown option {key!r} (known: {', '.join(sorted(allowed))})")
        if key in ("mask", "grep"):
            try:
                re.compile(value)
            except re.error as exc:
                raise MarkerError(f"{marker.where(line)}: {key} {value!r} is not a regular expression: {exc}") from None
        marker.options.setdefault(key, []).append(value)
    for key in ("exit", "columns", "width", "paragraphs"):
        if marker.option(key) and not marker.option(key).lstrip("-").isdigit():
            raise MarkerError(f"{marker.where()}: {key} must be a whole number, not {marker.option(key)!r}")
    if kind == "figures" and not marker.figures:
        raise MarkerError(f"{marker.where()}: a figures marker lists no `FIGURE = TEMPLATE` line")
    return marker


# --- running commands ------------------------------------------------------------------------


def run_command(command: str, columns: int, merge_stderr: bool) -> Run:
    env = dict(os.environ)
    env.update(
        PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        COLUMNS=str(columns),
        LINES="50",
        TERM="dumb",
        NO_COLOR="1",
        TZ="UTC",
        PYTHONHASHSEED="0",
    )
    env.pop("FORCE_COLOR", None)
    began = time.monotonic()
    try:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return Run(124, "", f"timed out after {COMMAND_TIMEOUT_S:.0f} s", time.monotonic() - began)
    return Run(done.returncode, done.stdout, done.stderr or "", time.monotonic() - began)


# --- blocks ----------------------------------------------------------------------------------


def select_lines(spec: str, lines: list[str]) -> list[str]:
    if not spec:
        return lines
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if part == "...":
            out.append("...")
            continue
        low, _, high = part.partition("-")
        first = int(low)
        last = len(lines) if part.endswith("-") else int(high or low)
        out.extend(lines[first - 1 : last])
    return out


def render_block(marker: Marker, run: Run) -> list[str]:
    text = run.stdout
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if marker.option("grep"):
        lines = [line for line in lines if re.search(marker.option("grep"), line)]
    lines = select_lines(marker.option("lines"), lines)
    width = int(marker.option("width", "0"))
    if width:
        lines = [line if len(line) <= width else line[:width].rstrip() + " ..." for line in lines]
    if marker.option("prompt") in ("yes", "true"):
        lines.insert(0, f"$ {marker.command}")
    return lines


def masked(marker: Marker, lines: Iterable[str]) -> list[str]:
    out = []
    for line in lines:
        for pattern in marker.options.get("mask", []):
            line = re.sub(pattern, MASKED, line)
        out.append(line)
    return out


# --- figures ---------------------------------------------------------------------------------


def _lookup(data: Any, path: str, where: str) -> Any:
    value = data
    for token in re.findall(r"\[[^\]]*\]|[^.\[\]]+", path.strip()):
        try:
            if token.startswith("["):
                inner = token[1:-1]
                if "=" in inner:
                    wants = [condition.split("=", 1) for condition in inner.split(",")]
                    value = next(item for item in value if all(str(item.get(k)) == w for k, w in wants))
                else:
                    value = value[int(inner)]
            else:
                value = value[token]
        except (KeyError, IndexError, TypeError, StopIteration, ValueError, AttributeError):
            raise MarkerError(f"{where}: {path!r} is not in the command's output (at {token!r})") from None
    return value


def _transform(value: Any, transforms: str, where: str) -> Any:
    for name, arg in re.findall(r"\|([a-z]+)\(([-\d.]+)\)", transforms):
        number = float(value)
        n = float(arg)
        if name == "floor":
            value = int(number // n * n)
        elif name == "round":
            value = round(number, int(n))
            value = int(value) if n <= 0 else value
        elif name == "x":
            value = number * n
        else:
            raise MarkerError(f"{where}: unknown transform {name!r} (floor, round, x)")
    return value


def render_figure(template: str, output: str, data: Any, where: str) -> str:
    def field_value(match: re.Match[str]) -> str:
        path, pattern, transforms, spec = match.group(1).strip(), match.group(2), match.group(3), match.group(4)
        value: Any = output
        if path:
            if data is None:
                raise MarkerError(f"{where}: {path!r} reads JSON but the command printed none (add --json?)")
            value = _lookup(data, path, where)
        if pattern:
            found = re.search(pattern[1:-1], str(value), re.MULTILINE)
            if not found:
                raise MarkerError(f"{where}: {pattern} matches nothing in {path or 'the output'!r}")
            value = found.group(1) if found.re.groups else found.group(0)
        elif not path:
            raise MarkerError(f"{where}: an empty field {{}} (want a JSON path or /REGEX/)")
        value = _transform(value, transforms, where)
        if spec:
            if isinstance(value, str):
                with contextlib.suppress(ValueError):
                    number = float(value.replace(",", ""))
                    value = int(number) if number.is_integer() and "." not in value else number
            try:
                return format(value, spec)
            except (ValueError, TypeError) as exc:
                raise MarkerError(f"{where}: cannot format {value!r} with {spec!r}: {exc}") from None
        return str(value)

    return _FIELD.sub(field_value, template)


def _json_of(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def find_figure(text: str, figure: str, start: int) -> int:
    """Where `figure` occurs in `text` at or after `start`, not inside a longer number or word."""
    found = _figure_pattern(figure).search(text, start)
    return -1 if found is None else found.start()


def _figure_pattern(figure: str) -> re.Pattern[str]:
    """A figure's words may be split over two lines of the paragraph."""
    words = r"\s+".join(re.escape(word) for word in figure.split())
    return re.compile(r"(?<![\w.])" + words + r"(?![\w]|\.\d)")


# --- the check -------------------------------------------------------------------------------


@dataclass
class Outcome:
    problems: list[str] = field(default_factory=list)
    changed_files: list[str] = field(default_factory=list)
    runs: dict[tuple[str, int, bool], Run] = field(default_factory=dict)


def check(
    paths: list[Path], update: bool = False, jobs: int = 2, today: str | None = None, progress: bool = False
) -> Outcome:
    outcome = Outcome()
    docs: dict[Path, list[Marker]] = {}
    pictures: list[Marker] = []
    for path in paths:
        markers = parse(path, path.read_text(encoding="utf-8").splitlines())
        docs[path] = [m for m in markers if m.kind in ("block", "figures", "text")]
        pictures += [m for m in markers if m.kind == "picture" and update]
    keys = sorted(
        {m.run_key for markers in docs.values() for m in markers} | {m.run_key for m in pictures}, key=_slow_first
    )
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_command, *key): key for key in keys}
        for done, future in enumerate(as_completed(futures), start=1):
            key, run = futures[future], future.result()
            outcome.runs[key] = run
            if progress:
                print(f"docs-check: {done}/{len(keys)} {run.seconds:.0f} s `{key[0][:90]}`", file=sys.stderr)
    for picture in pictures:
        run = outcome.runs[picture.run_key]
        if run.returncode != 0:
            tail = "\n".join((run.stderr or run.stdout).strip().splitlines()[-8:])
            outcome.problems.append(f"{picture.where()}: `{picture.command}` exited {run.returncode}\n{tail}")
    today = today or dt.datetime.now(dt.UTC).date().isoformat()
    for path in docs:
        # Read again: the commands took minutes, and someone may have edited the page meanwhile.
        lines = path.read_text(encoding="utf-8").splitlines()
        markers = [m for m in parse(path, lines) if m.kind in ("block", "figures", "text")]
        for marker in markers:
            if marker.run_key not in outcome.runs:  # a marker added while the commands ran
                outcome.runs[marker.run_key] = run_command(*marker.run_key)
        new = list(lines)
        changed = False
        # Bottom-up, so a rewritten block does not move the lines of the markers above it.
        for marker in sorted(markers, key=lambda m: m.start, reverse=True):
            run = outcome.runs[marker.run_key]
            want_exit = int(marker.option("exit", "0"))
            if run.returncode != want_exit:
                tail = "\n".join((run.stderr or run.stdout).strip().splitlines()[-8:])
                outcome.problems.append(
                    f"{marker.where()}: `{marker.command}` exited {run.returncode}, the docs say {want_exit}\n{tail}"
                )
                continue
            if marker.kind == "figures":
                changed |= _check_figures(marker, run, new, update, outcome)
            else:
                changed |= _check_block(marker, run, new, update, outcome)
        if update and changed:  # the dates beside the figures: this --update's
            for marker in parse(path, new):
                for figure in marker.figures:
                    if figure.template == "date":
                        _replace_figure(marker, figure, today, new)
        if update and new != lines:
            path.write_text("\n".join(new) + "\n", encoding="utf-8")
            outcome.changed_files.append(_rel(path))
    outcome.problems.sort(key=_place)
    return outcome


def _slow_first(key: tuple[str, int, bool]) -> tuple[int, str]:
    """Simulations first (tens of seconds each), so the quick plans fill in around them."""
    command = key[0]
    slow = ("simulate", "--trace", "pytest")
    return (next((i for i, word in enumerate(slow) if word in command), len(slow)), command)


def _place(problem: str) -> tuple[str, int]:
    file, _, rest = problem.partition(":")
    line = rest.split(":", 1)[0]
    return (file, int(line) if line.isdigit() else 0)


def _check_block(marker: Marker, run: Run, lines: list[str], update: bool, outcome: Outcome) -> bool:
    # A block: the lines inside the fence; a text: the paragraph(s) below the marker, whole.
    begin = marker.region_start + 1 if marker.kind == "block" else marker.region_start
    quoted = lines[begin : marker.region_end]
    printed = render_block(marker, run)
    if masked(marker, quoted) == masked(marker, printed):
        return False
    if update:
        lines[begin : marker.region_end] = printed
        return True
    first = begin + 1  # 1-based line of the quoted text's first line
    report = []
    matcher = difflib.SequenceMatcher(None, masked(marker, quoted), masked(marker, printed), autojunk=False)
    for tag, q1, q2, p1, p2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        report.append(f"@@ {_rel(marker.path)}:{first + q1} @@")
        report.extend(f"-{line}" for line in quoted[q1:q2])
        report.extend(f"+{line}" for line in printed[p1:p2])
    outcome.problems.append(
        f"{marker.where()}: the quoted output differs from `{marker.command}` (-quoted, +printed):\n"
        + "\n".join(report)
    )
    return False


def _check_figures(marker: Marker, run: Run, lines: list[str], update: bool, outcome: Outcome) -> bool:
    data = _json_of(run.stdout)
    changed = False
    region = "\n".join(lines[marker.region_start : marker.region_end])
    cursor = 0
    for figure in marker.figures:
        at = find_figure(region, figure.text, cursor)
        if at < 0:
            outcome.problems.append(
                f"{marker.where(figure.line)}: figure {figure.text!r} is not in the paragraph below the marker"
                " (after the figures before it)"
            )
            continue
        cursor = _figure_pattern(figure.text).match(region, at).end()  # type: ignore[union-attr]
        if figure.template == "date":
            if not _DATE.fullmatch(figure.text):
                outcome.problems.append(f"{marker.where(figure.line)}: {figure.text!r} = date is not a YYYY-MM-DD date")
            continue
        try:
            printed = render_figure(figure.template, run.stdout, data, marker.where(figure.line))
        except MarkerError as exc:
            outcome.problems.append(str(exc))
            continue
        if masked(marker, [printed]) == masked(marker, [figure.text]):
            continue
        if update:
            _replace_figure(marker, figure, printed, lines)
            region = "\n".join(lines[marker.region_start : marker.region_end])
            cursor = _figure_pattern(printed).match(region, at).end()  # type: ignore[union-attr]
            changed = True
        else:
            row = marker.region_start + region[:at].count("\n")
            outcome.problems.append(
                f"{_rel(marker.path)}:{row + 1}: figure {figure.text!r} is now {printed!r}"
                f" ({figure.template} from `{marker.command}`, marker at line {marker.start + 1})"
            )
    return changed


def _replace_figure(marker: Marker, figure: Figure, printed: str, lines: list[str]) -> None:
    """Rewrites one figure in the paragraph and in the marker's line (the paragraph's lines keep their count)."""
    if printed == figure.text:
        return
    region = "\n".join(lines[marker.region_start : marker.region_end])
    cursor = 0
    for earlier in marker.figures:
        at = find_figure(region, earlier.text, cursor)
        end = _figure_pattern(earlier.text).match(region, at).end()  # type: ignore[union-attr]
        if earlier is figure:
            region = region[:at] + _keep_breaks(region[at:end], printed) + region[end:]
            break
        cursor = end
    lines[marker.region_start : marker.region_end] = region.split("\n")
    marker_line = lines[figure.line]
    head, sep, tail = marker_line.partition(" = ")
    lines[figure.line] = head.replace(figure.text, printed, 1) + sep + tail
    figure.text = printed


def _keep_breaks(quoted: str, printed: str) -> str:
    """`printed` with the line breaks `quoted` had between its words, so a paragraph keeps its line count."""
    separators = re.findall(r"\s+", quoted)
    words = printed.split(" ")
    if "\n" not in quoted:
        return printed
    if len(words) != len(separators) + 1:
        head, space, tail = printed.rpartition(" ")
        return f"{head}\n{tail}" if space else printed  # one break still, where it fits
    return "".join(word + sep for word, sep in zip(words, [*separators, ""], strict=True))


def default_paths() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("files", nargs="*", type=Path, help="markdown files (default: README.md and docs/*.md)")
    parser.add_argument("--update", action="store_true", help="rerun each command and rewrite what it quotes")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="commands run at once")
    parser.add_argument("--list", action="store_true", help="list the markers and their commands, run nothing")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.files] or default_paths()
    began = time.monotonic()
    try:
        if args.list:
            for path in paths:
                for marker in parse(path, path.read_text(encoding="utf-8").splitlines()):
                    print(f"{marker.where()}: {marker.kind}: {marker.command}")
            return 0
        outcome = check(paths, update=args.update, jobs=args.jobs, progress=True)
    except MarkerError as exc:
        print(f"docs-check: {exc}", file=sys.stderr)
        return 2
    slowest = sorted(outcome.runs.items(), key=lambda kv: -kv[1].seconds)[:3]
    timing = ", ".join(f"{run.seconds:.0f} s `{key[0][:60]}`" for key, run in slowest)
    for problem in outcome.problems:
        print(problem, file=sys.stderr)
    for changed in outcome.changed_files:
        print(f"docs-check: rewrote {changed}")
    summary = (
        f"docs-check: {len(outcome.runs)} commands, {len(paths)} files, {time.monotonic() - began:.0f} s"
        f" (slowest: {timing})"
    )
    if outcome.problems:
        print(f"{summary}; {len(outcome.problems)} difference(s): run `hack/docs_check.py --update`", file=sys.stderr)
        return 1
    print(f"{summary}; every quoted output and figure matches" if not args.update else summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
