"""Every relative link and picture in README and docs/ points at a file of the repository (the
README was split into docs/, where paths are relative to docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_readme_opens_with_a_quickstart_of_one_screen() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("## Quickstart")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    assert start < 12 and end <= 50, (start, end)
