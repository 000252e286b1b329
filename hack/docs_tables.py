#!/usr/bin/env python3
"""Tables the docs quote that no CLI command prints, printed as markdown from the same code the
operator runs (hack/docs_check.py reruns them: `<!-- docs-check text: ... -->`).

    python hack/docs_tables.py cold-starts   # docs/operator.md: first start, warm cache, startup probe
"""

from __future__ import annotations

import sys

from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.checkpoints import replica_cold_start, resolve_checkpoint, startup_probe_budget_s

# (model, precision, tensor parallel, how the table names the precision, spec.model.source)
COLD_STARTS = [
    ("llama-3.1-8b", "bf16", 1, "bf16", None),
    ("llama-3.1-70b", "bf16", 4, "bf16", None),
    ("llama-3.1-70b", "int4", 2, "int4 (AWQ)", "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"),
    ("llama-3.1-405b", "fp8", 8, "fp8 (Meta's FP8 Instruct)", "meta-llama/Llama-3.1-405B-Instruct-FP8"),
    ("llama-3.1-405b", "bf16", 8, "bf16", None),
]


def cold_starts() -> list[str]:
    cat = default_catalog()
    engine = cat.engine("vllm")
    rows = [
        "| model, precision, TP | checkpoint | first start (download) | with a warm cache | startup probe |",
        "|---|---|---|---|---|",
    ]
    for name, precision_name, tp, label, source in COLD_STARTS:
        model, precision = cat.model(name), cat.precision(precision_name)
        size_gb = resolve_checkpoint(model, precision, source).size_bytes(model) / 1e9
        first = replica_cold_start(model, precision, tp, engine, source, cached=False)
        warm = replica_cold_start(model, precision, tp, engine, source, cached=True)
        probe = startup_probe_budget_s(first)
        rows.append(
            f"| {name} {label}, {tp} | {size_gb:.0f} GB | {first.total_s:.0f} s ({first.download_s:.0f} s) "
            f"| {warm.total_s:.0f} s | {probe:.0f} s |"
        )
    return rows


TABLES = {"cold-starts": cold_starts}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in TABLES:
        print(f"usage: docs_tables.py {{{','.join(TABLES)}}}", file=sys.stderr)
        return 2
    print("\n".join(TABLES[argv[0]]()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
