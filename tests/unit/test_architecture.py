"""The dependency direction of DESIGN.md, checked by import-linter."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint_imports, "import-linter is a dev dependency; install with `make venv`"
    result = subprocess.run(
        [lint_imports, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower().replace("0 broken", "")
