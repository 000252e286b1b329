"""`make conformance`: the engine arguments kvscale emits for every sample and every catalog
model (each precision with a checkpoint, on each GPU type it fits) against the engines' own
argument definitions, read from their wheels.

Importing vLLM's parser needs torch and CUDA libraries (gigabytes), so this reads the parser's
definitions from the wheel's source instead, the way the parser builds them:
- vLLM 0.11.0: every "--flag" string EngineArgs.add_cli_args / AsyncEngineArgs.add_cli_args pass
  to add_argument (vllm/engine/arg_utils.py), plus `vllm serve`'s FrontendArgs dataclass fields
  (vllm/entrypoints/openai/cli_args.py, added as --field-name); the choices of --dtype
  (ModelDType, vllm/config/model.py), --kv-cache-dtype (CacheDType, vllm/config/cache.py) and
  --quantization (QuantizationMethods, vllm/model_executor/layers/quantization/__init__.py).
- SGLang 0.5.23 (when its wheel is given): the fields of the dataclasses in
  sglang/srt/arg_groups/fields/*.py (flags are the field names with dashes, plus their
  `aliases`), the --quantization choices (sglang/srt/arg_groups/choices.py) and the
  --kv-cache-dtype choices.
Usage: python hack/engine_conformance.py VLLM_WHEEL [SGLANG_WHEEL]
"""

from __future__ import annotations

import ast
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from kvscale.api.models import parse_spec  # noqa: E402
from kvscale.cli.manifests import gpu_pools  # noqa: E402
from kvscale.control.planning import plan_service  # noqa: E402
from kvscale.control.resources import planned_launch  # noqa: E402
from kvscale.engines.args import engine_command, plan_launch  # noqa: E402
from kvscale.planner.search import PlanRequest, plan  # noqa: E402
from kvscale.sizing.catalog import default_catalog  # noqa: E402
from kvscale.sizing.checkpoints import CheckpointError  # noqa: E402
from kvscale.sizing.context_limit import ContextLimitError  # noqa: E402
from kvscale.sizing.workload import Slo, Workload  # noqa: E402


@dataclass
class Cli:
    engine: str
    flags: set[str] = field(default_factory=set)
    choices: dict[str, set[str]] = field(default_factory=dict)
    booleans: set[str] = field(default_factory=set)


def _source(wheel: zipfile.ZipFile, path: str) -> ast.Module:
    return ast.parse(wheel.read(path).decode())


def _literal_values(tree: ast.Module, name: str) -> set[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    raise SystemExit(f"{name} not found in the wheel: the engine's source changed shape")


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)
    if found is None:
        raise SystemExit(f"class {name} not found in the wheel")
    return found


def vllm_cli(path: Path) -> Cli:
    cli = Cli("vllm")
    with zipfile.ZipFile(path) as wheel:
        args = _source(wheel, "vllm/engine/arg_utils.py")
        for cls in ("EngineArgs", "AsyncEngineArgs"):
            for fn in _class(args, cls).body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "add_cli_args":
                    for call in ast.walk(fn):
                        if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument":
                            cli.flags |= {
                                a.value
                                for a in call.args
                                if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                            }
        frontend = _class(_source(wheel, "vllm/entrypoints/openai/cli_args.py"), "FrontendArgs")
        cli.flags |= {
            "--" + n.target.id.replace("_", "-")
            for n in frontend.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        cli.choices["--dtype"] = _literal_values(_source(wheel, "vllm/config/model.py"), "ModelDType")
        cli.choices["--kv-cache-dtype"] = _literal_values(_source(wheel, "vllm/config/cache.py"), "CacheDType")
        cli.choices["--quantization"] = _literal_values(
            _source(wheel, "vllm/model_executor/layers/quantization/__init__.py"), "QuantizationMethods"
        )
    return cli


def sglang_cli(path: Path) -> Cli:
    cli = Cli("sglang")
    with zipfile.ZipFile(path) as wheel:
        for name in wheel.namelist():
            if not (name.startswith("sglang/srt/arg_groups/fields/") and name.endswith(".py")):
                continue
            for node in ast.walk(_source(wheel, name)):
                if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                    continue
                flag = "--" + node.target.id.replace("_", "-")
                cli.flags.add(flag)
                text = ast.unparse(node.annotation)
                if text.startswith("A[bool") or text.startswith("Annotated[bool"):
                    cli.booleans.add(flag)
                for kw in (k for c in ast.walk(node.annotation) if isinstance(c, ast.Call) for k in c.keywords):
                    if kw.arg == "aliases" and isinstance(kw.value, ast.List):
                        cli.flags |= {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
                    if kw.arg == "choices" and isinstance(kw.value, ast.List) and flag == "--kv-cache-dtype":
                        cli.choices[flag] = {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
        cli.choices["--quantization"] = _literal_values(
            _source(wheel, "sglang/srt/arg_groups/choices.py"), "QUANTIZATION_CHOICES"
        )
    return cli


def problems(cli: Cli, argv: list[str]) -> list[str]:
    """Flags the parser does not define, and values outside a flag's choices."""
    out = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            i += 1  # the positional model (vllm serve MODEL)
            continue
        if token not in cli.flags:
            out.append(f"{token}: not a {cli.engine} flag")
        if token in cli.booleans:
            i += 1
            continue
        value = argv[i + 1] if i + 1 < len(argv) else None
        if value is None or value.startswith("--"):
            out.append(f"{token}: needs a value")
        elif token in cli.choices and value not in cli.choices[token]:
            out.append(f"{token} {value}: not one of {sorted(cli.choices[token])}")
        i += 2
    return out


def argument_lists(engine: str) -> Iterator[tuple[str, list[str]]]:
    """(what, argv) for every sample and every catalog model x precision x GPU type that plans."""
    cat = default_catalog()
    for path in sorted((ROOT / "deploy" / "samples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        raw = {**doc["spec"], "engine": {**doc["spec"].get("engine", {}), "type": engine}}
        spec = parse_spec(raw)
        result = plan_service(spec, cat, gpu_pools(cat, None, spec.scaling.max_replicas))
        if result.chosen is None:
            raise SystemExit(f"sample {path.name} does not plan: {result.message}")
        c = result.chosen
        launch = planned_launch(spec, c.config, c.prediction.max_batch, c.prediction.kv_cache_tokens, 8000)
        yield f"sample {path.stem} ({engine})", engine_command(launch.launch)[1]
    slo = Slo(5.0, 0.2, 95.0)
    for model in cat.models.values():
        workload = Workload(1024, 256, 1.0)
        for precision in ("bf16", "fp16", "fp8", "int8", "int4"):
            for gpu in cat.gpus.values():
                request = PlanRequest(
                    model=model, workload=workload, slo=slo, gpus=(gpu.name,), precisions=(precision,), engine=engine
                )
                if engine == "sglang" and gpu.vendor == "amd":
                    continue  # no ROCm image for SGLang in the catalog: never planned there
                chosen = plan(cat, request).chosen
                if chosen is None:
                    continue
                try:
                    launch = plan_launch(
                        chosen.config,
                        None,
                        None,
                        workload.context_tokens,
                        chosen.prediction.max_batch,
                        chosen.prediction.kv_cache_tokens,
                        8000,
                        cached=False,
                    )
                except (CheckpointError, ContextLimitError):
                    continue  # refused before deploying: no argument list to check
                yield (
                    f"{model.name} {precision} on {gpu.name} x{chosen.tensor_parallel} ({engine})",
                    engine_command(launch.launch)[1],
                )


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__)
        return 2
    clis = [vllm_cli(Path(argv[0]))] + ([sglang_cli(Path(argv[1]))] if len(argv) == 2 else [])
    total_failed = 0
    for cli in clis:
        checked = failed = 0
        for what, args in argument_lists(cli.engine):
            checked += 1
            found = problems(cli, args)
            if found:
                failed += 1
                print(f"FAIL {what}: {'; '.join(found)}\n     {' '.join(args)}")
        choices = ", ".join(f"{k} {len(v)} choices" for k, v in sorted(cli.choices.items()))
        print(
            f"{cli.engine}: {checked} argument lists checked against {len(cli.flags)} flags ({choices}): "
            f"{checked - failed} without problems, {failed} with"
        )
        total_failed += failed
    return 1 if total_failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
