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


# The stages of the one tick (kvscale.autoscaling.tick): policy, idle rule, budget allocator.
# Only the tick calls them; the operator's adapter and the simulators call the tick.
STAGES = {
    "kvscale.autoscaling.policy": {"decide"},
    "kvscale.autoscaling.idle": {"idle_replicas", "wake_replicas"},
    "kvscale.autoscaling.budget": {"allocate"},
}
# The operator's budget book (one owner of every governed service's want) runs the allocator
# over the wants it holds: the tick reaches it through its budget view (kvscale.control.autoscale).
BOOK = ROOT / "kvscale" / "control" / "budget.py"


def _stage_uses(path: Path) -> list[str]:
    """Each import of a stage function, or attribute use of one through its module."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    modules: dict[str, str] = {}  # local name -> a stage module
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in STAGES:
            found += [f"{node.module}.{a.name}" for a in node.names if a.name in STAGES[node.module]]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            for a in node.names:
                if f"{node.module}.{a.name}" in STAGES:
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in STAGES:
                    modules[a.asname or a.name] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = ast.unparse(node.value)
            module = modules.get(base, base)
            if module in STAGES and node.attr in STAGES[module]:
                found.append(f"{module}.{node.attr}")
    return found


def test_the_simulator_and_the_operator_call_the_tick_not_its_stages() -> None:
    offenders = {
        str(path.relative_to(ROOT)): uses
        for package in ("sim", "control")
        for path in sorted((ROOT / "kvscale" / package).rglob("*.py"))
        if path != BOOK and (uses := _stage_uses(path))
    }
    assert offenders == {}, f"compose the stages through kvscale.autoscaling.tick, not by hand: {offenders}"
    # And they do call it: the operator's adapter, the fleet simulator and the single-service policy.
    for name in ("control/autoscale.py", "control/scaling.py", "sim/budget_run.py", "sim/policies.py"):
        assert "kvscale.autoscaling.tick" in (ROOT / "kvscale" / name).read_text(), name


def test_the_stage_check_sees_a_hand_composed_tick(tmp_path: Path) -> None:
    composed = tmp_path / "composed.py"
    composed.write_text(
        "from kvscale.autoscaling.idle import idle_replicas\n"
        "from kvscale.autoscaling import policy\n"
        "import kvscale.autoscaling.budget as b\n"
        "def tick(obs, state, cap, cfg, budget, demands):\n"
        "    d, _ = policy.decide(obs, state, cap, cfg)\n"
        "    return idle_replicas(d.replicas, 0, None, 60.0, None), b.allocate(budget, demands, {})\n"
    )
    assert sorted(_stage_uses(composed)) == [
        "kvscale.autoscaling.budget.allocate",
        "kvscale.autoscaling.idle.idle_replicas",
        "kvscale.autoscaling.policy.decide",
    ]
