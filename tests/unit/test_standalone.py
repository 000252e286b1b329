"""The repository stands alone: nothing it runs, tests or documents reads a path beside the
checkout (the project's shared data set is copied into benchmarks/data/ with its licenses)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data"
# `../shared/...`, `parents[2] / "shared"` from benchmarks/, `parents[3]` from tests/unit/
OUTSIDE = re.compile(r"\.\./shared|/work/shared|/ \"shared\" /|parents\[3\]")


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.splitlines()]


def test_no_file_reads_or_shows_a_path_outside_the_checkout() -> None:
    files = tracked("*.py", "*.md", "*.sh", "Makefile", "*.yaml", "*.toml")
    assert len(files) > 50
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        if path.exists() and path.name != "RESULTS.md"  # RESULTS records past runs as they were made
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line) and path != Path(__file__).resolve()
    ]
    assert offenders == []


def test_bundled_data_carries_its_license_and_citation() -> None:
    traces = (DATA / "traces" / "README.md").read_text(encoding="utf-8")
    for name, license_, cite in (
        ("azure-llm-conv-2023.csv", "CC-BY", "Splitwise"),
        ("mooncake-synthetic.jsonl", "Apache License 2.0", "Mooncake: A KVCache-centric"),
    ):
        assert (DATA / "traces" / name).stat().st_size > 100_000
        assert name in traces and license_ in traces and cite in traces
    reference = (DATA / "reference" / "README.md").read_text(encoding="utf-8")
    for name in (
        "trtllm-0.9.0-static.csv",
        "nim-genai-perf-sweeps.csv",
        "gpustack-perf-lab.csv",
        "published-figures.md",
    ):
        assert (DATA / "reference" / name).is_file() and name in reference
    assert "Apache License 2.0" in reference and "wbing520/ai-performance-engineering" in reference
