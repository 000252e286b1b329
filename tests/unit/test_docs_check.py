"""hack/docs_check.py (`make docs-check`): a quoted figure or output that drifts from what its
command prints fails the check, naming the file and line; a matching one passes; --update
rewrites it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_check", ROOT / "hack" / "docs_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_check"] = module
    spec.loader.exec_module(module)
    return module


docs_check = _load()

FLEET = """\"import json; print(json.dumps({'services': [{'name': 'rag', 'slo_attainment': 0.291}, \
{'name': 'chat', 'slo_attainment': 0.99093, 'held_ticks': 0}], 'ticks': 125}))\""""

PAGE = r"""# A page

Some prose.

<!-- docs-check figures: python -c @fleet@
     @chat@ = {services[name=chat].slo_attainment:.2%}
     @held@ = {services[name=chat].held_ticks} of {ticks}
     @rag@ = {services[name=rag].slo_attainment|x(100):.1f}%
     2026-11-25 = date
     paragraphs: 2
-->
| service | SLO met | held |
|---|---|---|
| chat | @chat@ | @held@ |
| rag | @rag@ | - |

Run here on 2026-11-25.

<!-- docs-check: printf 'plan: 3 x H100\ntook 1.7 s\nthird line that is long\n'
     lines: 1-2,...
     mask: took [\d.]+ s
-->
```
plan: @replicas@ x H100
took 9.9 s
...
```
"""


def _fill(**figures: str) -> str:
    text = PAGE.replace("@fleet@", FLEET)
    for name, value in figures.items():
        text = text.replace(f"@{name}@", value)
    return text


def _page(
    tmp_path: Path, chat: str = "99.09%", held: str = "0 of 125", rag: str = "29.1%", replicas: str = "3"
) -> Path:
    path = tmp_path / "page.md"
    path.write_text(_fill(chat=chat, held=held, rag=rag, replicas=replicas))
    return path


def test_matching_figures_and_output_pass(tmp_path: Path) -> None:
    outcome = docs_check.check([_page(tmp_path)], jobs=1)
    assert outcome.problems == []


def test_a_drifted_figure_fails_naming_file_line_and_value(tmp_path: Path) -> None:
    path = _page(tmp_path, chat="13.57%")
    outcome = docs_check.check([path], jobs=1)
    assert len(outcome.problems) == 1
    line = path.read_text().splitlines().index("| chat | 13.57% | 0 of 125 |") + 1
    assert outcome.problems[0].startswith(f"{path}:{line}: figure '13.57%' is now '99.09%'")
    assert docs_check.main([str(path), "--jobs", "1"]) == 1


def test_a_figure_missing_from_its_paragraph_fails(tmp_path: Path) -> None:
    path = _page(tmp_path)
    path.write_text(path.read_text().replace("| chat | 99.09% |", "| chat | 99.1% |"))
    (problem,) = docs_check.check([path], jobs=1).problems
    assert "figure '99.09%' is not in the paragraph below the marker" in problem


def test_a_drifted_block_fails_with_the_differing_lines(tmp_path: Path) -> None:
    path = _page(tmp_path, replicas="4")
    (problem,) = docs_check.check([path], jobs=1).problems
    line = path.read_text().splitlines().index("plan: 4 x H100") + 1
    assert "the quoted output differs" in problem
    assert f"@@ {path}:{line} @@" in problem
    assert "-plan: 4 x H100" in problem and "+plan: 3 x H100" in problem
    assert "-took" not in problem and "+took" not in problem  # masked: the timing varies run to run


def test_update_rewrites_figures_outputs_and_the_date(tmp_path: Path) -> None:
    path = _page(tmp_path, chat="13.57%", held="3 of 125", rag="2.0%", replicas="4")
    outcome = docs_check.check([path], update=True, jobs=1, today="2026-11-29")
    assert outcome.problems == []
    assert path.read_text() == _fill(chat="99.09%", held="0 of 125", rag="29.1%", replicas="3").replace(
        "2026-11-25", "2026-11-29"
    ).replace("took 9.9 s", "took 1.7 s")
    assert docs_check.check([path], jobs=1).problems == []


def test_a_command_that_exits_otherwise_fails(tmp_path: Path) -> None:
    path = tmp_path / "page.md"
    path.write_text("<!-- docs-check: echo hi; exit 3 -->\n```\nhi\n```\n")
    (problem,) = docs_check.check([path], jobs=1).problems
    assert problem.startswith(f"{path}:1: `echo hi; exit 3` exited 3, the docs say 0")
    path.write_text("<!-- docs-check: echo hi; exit 3\n     exit: 3\n-->\n```\nhi\n```\n")
    assert docs_check.check([path], jobs=1).problems == []


@pytest.mark.parametrize(
    "text",
    [
        "<!-- docs-check: echo hi -->\nno fence\n",
        "<!-- docs-check figures: echo 1\n     badly written\n-->\npara 1\n",
        "<!-- docs-check: echo hi\n     colour: red\n-->\n```\nhi\n```\n",
        "<!-- docs-check: echo hi\n",
    ],
)
def test_unreadable_markers_exit_2(tmp_path: Path, text: str) -> None:
    path = tmp_path / "page.md"
    path.write_text(text)
    assert docs_check.main([str(path)]) == 2


def test_the_docs_markers_all_parse() -> None:
    """Cheap: reads every marker of README and docs/ (running them is `make docs-check`)."""
    markers = [m for p in docs_check.default_paths() for m in docs_check.parse(p, p.read_text().splitlines())]
    assert markers


def test_templates_read_json_paths_strings_and_text() -> None:
    data = {"services": [{"name": "rag", "load": "poisson:rate=20,input=3000", "gpu": 1, "tp": 8}]}
    render = docs_check.render_figure
    assert render("{services[name=rag].load/input=(\\d+)/:,}-token", "", data, "x") == "3,000-token"
    assert render("{services[name=rag,tp=8].gpu}", "", data, "x") == "1"
    assert render("{/(\\d+) tests collected/|floor(100):,} tests", "1549 tests collected in 9s", None, "x") == (
        "1,500 tests"
    )
    with pytest.raises(docs_check.MarkerError, match="not in the command's output"):
        render("{services[name=chat].gpu}", "", data, "x")


def test_pictures_are_redrawn_by_update_only(tmp_path: Path) -> None:
    picture = tmp_path / "picture.png"
    path = tmp_path / "page.md"
    path.write_text(f"<!-- docs-check picture: echo drawn > {picture} -->\n![a picture](picture.png)\n")
    assert docs_check.check([path], jobs=1).problems == [] and not picture.exists()
    assert docs_check.check([path], update=True, jobs=1).problems == []
    assert picture.read_text() == "drawn\n"


def test_a_text_marker_checks_and_rewrites_the_paragraph_below_whole(tmp_path: Path) -> None:
    path = tmp_path / "page.md"
    path.write_text("<!-- docs-check text: printf '| a |\\n|---|\\n| 2 |\\n' -->\n| a |\n|---|\n| 1 |\n\nAfter.\n")
    (problem,) = docs_check.check([path], jobs=1).problems
    assert "@@" in problem and "-| 1 |" in problem and "+| 2 |" in problem
    assert docs_check.check([path], update=True, jobs=1).problems == []
    assert path.read_text().endswith("| a |\n|---|\n| 2 |\n\nAfter.\n")


def test_update_keeps_markers_right_when_a_block_above_grows(tmp_path: Path) -> None:
    path = tmp_path / "page.md"
    path.write_text(
        "<!-- docs-check: printf 'a\\nb\\nc\\n' -->\n```\na\n```\n\n"
        "<!-- docs-check figures: echo 7\n     6 = {/(\\d+)/}\n     2026-11-25 = date\n-->\n"
        "Six is 6 (2026-11-25).\n"
    )
    assert docs_check.check([path], update=True, jobs=1, today="2026-11-29").problems == []
    text = path.read_text()
    assert "```\na\nb\nc\n```" in text and "     7 = {/(\\d+)/}\n     2026-11-29 = date" in text
    assert "Six is 7 (2026-11-29)." in text
    assert docs_check.check([path], jobs=1).problems == []
