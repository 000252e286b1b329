"""Predicted vs published figures (shared/reference/published-figures.md).

Prints one row per figure, then the median and 90th-percentile absolute relative error,
overall and for the figures the sources measured ("model" basis).
Run: PYTHONPATH=. .venv/bin/python benchmarks/accuracy.py
"""

from __future__ import annotations

import statistics

from rich.console import Console
from rich.table import Table

from benchmarks.data.published import FIGURES, NOT_COMPARED, bounds_hold


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def main() -> None:
    console = Console(width=160)
    table = Table(title="kvscale sizing model vs published figures")
    for col in ("group", "figure", "source", "basis", "published", "predicted", "error", "tolerance", "ok"):
        table.add_column(col)
    errors: dict[str, list[float]] = {"all": [], "model": [], "arithmetic": []}
    for f in FIGURES:
        err = f.error()
        errors["all"].append(abs(err))
        errors[f.basis].append(abs(err))
        ok = abs(err) <= f.tolerance + 1e-12
        table.add_row(
            f.group,
            f.what,
            f.source,
            f.basis,
            f"{f.published:g} {f.unit}",
            f"{f.predicted():.4g} {f.unit}",
            f"{err:+.1%}",
            f"±{f.tolerance:.0%}",
            "yes" if ok else "NO",
        )
    console.print(table)
    summary = Table(title="Absolute relative error")
    for col in ("figures", "count", "median", "p90"):
        summary.add_column(col)
    for name, values in errors.items():
        summary.add_row(name, str(len(values)), f"{statistics.median(values):.1%}", f"{_quantile(values, 0.9):.1%}")
    console.print(summary)
    for claim, holds in bounds_hold().items():
        console.print(f"{'holds' if holds else 'FAILS'}: {claim}")
    console.print("\nNot compared:")
    for figure, why in NOT_COMPARED:
        console.print(f"  - {figure}: {why}")


if __name__ == "__main__":
    main()
