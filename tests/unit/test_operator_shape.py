"""The operator's shape, held by tests: short handlers, nothing at import, no asserts."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "kvscale" / "operator"
MAX_HANDLER_LINES = 40


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_no_handler_is_longer_than_40_lines() -> None:
    long = [
        f"{f.name}: {(f.end_lineno or f.lineno) - f.lineno + 1} lines"
        for f in _functions(OPERATOR / "handlers.py")
        if (f.end_lineno or f.lineno) - f.lineno + 1 > MAX_HANDLER_LINES
    ]
    assert long == []


def test_no_asserts_in_the_operator() -> None:
    found = [
        f"{path.name}:{node.lineno}"
        for path in sorted(OPERATOR.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert found == []


def test_importing_the_operator_reads_no_environment_and_opens_no_client() -> None:
    code = (
        "import os, sys\n"
        "os.environ['KVSCALE_STATUS_INTERVAL'] = 'not a duration'\n"  # would raise if read at import
        "os.environ['KUBECONFIG'] = '/nonexistent'\n"
        "import kvscale.operator.handlers, kvscale.operator.run\n"
        "import kopf\n"
        "assert not list(kopf.get_default_registry()._changing.get_all_handlers())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
