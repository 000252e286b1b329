"""The Dockerfile installs `.[operator]`: every third-party package `kvscale operator` imports
must be a base dependency or in the `operator` extra (not only in `dev`).

Two checks, both cheap: a static one (every import in the modules `kvscale operator` reaches,
mapped to its distribution) and a live one (a fresh interpreter that refuses to import any
distribution outside base + operator, then imports the operator's entry points)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY_MODULES = ("kvscale.cli", "kvscale.operator.run", "kvscale.operator.handlers")


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _allowed_distributions() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    allowed = {_name(r) for r in project["dependencies"]}
    allowed |= {_name(r) for r in project["optional-dependencies"]["operator"]}
    # What those pull in themselves (transitively) is theirs to declare.
    todo = list(allowed)
    while todo:
        try:
            requires = md.requires(todo.pop()) or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            dep = _name(req)
            if "extra ==" not in req and dep not in allowed:
                allowed.add(dep)
                todo.append(dep)
    return allowed


def _module_file(module: str) -> Path | None:
    path = ROOT / Path(*module.split("."))
    if (path / "__init__.py").exists():
        return path / "__init__.py"
    if path.with_suffix(".py").exists():
        return path.with_suffix(".py")
    return None


def _reachable_imports() -> tuple[set[str], set[str]]:
    """kvscale modules reachable from the entry points, and the top-level third-party names they import."""
    seen: set[str] = set()
    third_party: set[str] = set()
    todo = list(ENTRY_MODULES)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        file = _module_file(module)
        if file is None:
            continue
        seen.add(module)
        for node in ast.walk(ast.parse(file.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                top = name.split(".")[0]
                if top == "kvscale":
                    todo.append(name)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    third_party.add(top)
    return seen, third_party


def test_operator_imports_only_base_and_operator_distributions() -> None:
    modules, imported = _reachable_imports()
    assert "kvscale.operator.telemetry" in modules and "prometheus_client" in imported
    providers = md.packages_distributions()
    allowed = _allowed_distributions()
    dists = {top: providers.get(top, [top]) for top in imported}
    missing = {top: ds for top, ds in dists.items() if not any(_name(d) in allowed for d in ds)}
    assert not missing, (
        f"`kvscale operator` imports {sorted(missing)} from distributions {missing} that are neither base "
        "dependencies nor in the `operator` extra: add them to [project.optional-dependencies] operator"
    )


BLOCKER = """
import importlib.abc, importlib.metadata as md, sys
allowed = set(sys.argv[1].split(","))
providers = md.packages_distributions()
norm = lambda d: d.lower().replace("_", "-")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        dists = providers.get(top)
        if dists and top != "kvscale" and not any(norm(d) in allowed for d in dists):
            raise ImportError(f"{top} (from {dists}) is not installed by .[operator]")
        return None
sys.meta_path.insert(0, Block())
import kvscale.cli, kvscale.operator.run, kvscale.operator.handlers
from typer.testing import CliRunner
result = CliRunner().invoke(kvscale.cli.app, ["operator", "--help"])
assert result.exit_code == 0, result.output
print("ok")
"""


def test_operator_starts_without_dev_only_packages() -> None:
    allowed = _allowed_distributions() | {"kvscale"}
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER, ",".join(sorted(allowed))],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_the_license_is_an_spdx_string_and_its_files_ship_in_the_image() -> None:
    """PEP 639 (setuptools >= 77): `project.license` an SPDX expression, not the deprecated table;
    each `license-files` pattern matches a file (setuptools refuses a build otherwise), and the
    Dockerfile's build stage copies it (else the image's `pip wheel` fails)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    backend = next(r for r in pyproject["build-system"]["requires"] if _name(r) == "setuptools")
    assert re.fullmatch(r"setuptools>=(\d+)[\d.]*", backend) and int(backend.split(">=")[1].split(".")[0]) >= 77
    copies = [line.split()[1:-1] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")]
    for pattern in project["license-files"]:
        assert list(ROOT.glob(pattern)), f"license-files {pattern!r} matches no file"
        assert any(pattern in files for files in copies), f"the Dockerfile does not COPY {pattern}"
