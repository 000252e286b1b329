"""`--gpus` describes node shapes (issue 39): `kvscale manifests --gpus L4=16` planned TP4 on what
were one-GPU L4 nodes, with no way to say so. TYPE=NODESxGPUS (shapes of one type joined by +)
gives each node's GPUs; a replica's tensor-parallel group never spans nodes (the operator's
inventory: the type's node sized to the largest), and bad syntax exits 2 naming --gpus and the
syntax."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kvscale.cli import app

runner = CliRunner()
SYNTAX = "TYPE=NODESxGPUS"
# Qwen3-32B in bf16 (66 GB) on L4 (24 GB): TP4 is the cheapest replica at this load.
SERVICE = {
    "apiVersion": "kvscale.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "qwen-32b"},
    "spec": {
        "model": {"name": "Qwen/Qwen3-32B"},
        "workload": {"inputTokens": 512, "outputTokens": 256, "requestsPerSecond": 0.5},
        "slo": {"timeToFirstToken": "2s", "timePerOutputToken": "100ms", "percentile": 95},
        "hardware": {"gpuTypes": ["L4"]},
        "scaling": {"minReplicas": 1, "maxReplicas": 8},
    },
}


def manifests(tmp_path: Path, gpus: str) -> tuple[int, list[dict[str, Any]], str]:
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump(SERVICE))
    result = runner.invoke(app, ["manifests", "-f", str(path), "--gpus", gpus])
    docs = [d for d in yaml.safe_load_all(result.stdout) if d] if result.exit_code == 0 else []
    return result.exit_code, docs, " ".join(result.output.split())


def tensor_parallel(docs: list[dict[str, Any]]) -> int:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return int(args[args.index("--tensor-parallel-size") + 1])


def test_a_count_plans_on_nodes_of_the_catalogs_size(tmp_path: Path) -> None:
    code, docs, _ = manifests(tmp_path, "L4=16")
    assert code == 0 and tensor_parallel(docs) == 4


def test_one_gpu_nodes_never_get_a_tensor_parallel_replica(tmp_path: Path) -> None:
    code, _, out = manifests(tmp_path, "L4=16x1")
    assert code == 1, out  # no replica of this model fits one L4: nothing planned across nodes
    assert "no plan fits the cluster's free GPUs (16 free L4)" in out


def test_mixed_shapes_place_the_group_on_the_nodes_that_hold_it(tmp_path: Path) -> None:
    code, docs, out = manifests(tmp_path, "L4=2x4+8x1")
    assert code == 0, out
    assert tensor_parallel(docs) == 4
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] <= 2  # two nodes of four hold two TP4 replicas
    assert "# inventory assumed: L4=2x4+8x1 free (--gpus)" in out


@pytest.mark.parametrize(
    ("gpus", "said"),
    [
        ("L4=8y1", "'L4=8y1': '8y1' is not a count or a node shape; write TYPE=COUNT"),
        ("L4=x4", "is not a count or a node shape"),
        ("L4=2x4+", "'' is not a count or a node shape"),
        ("L4=0x4", "NODES must be in [1,"),
        ("L4=2x0", "GPUS per node in [1, 64]"),
        ("L4=2x100", "GPUS per node in [1, 64]"),
        ("L4=0", "the count must be in [1,"),
        ("L4=", SYNTAX),
        ("L4", SYNTAX),
        ("L4=2x4,L4=1x1", "names L4 twice; join its node shapes with +"),
    ],
)
def test_bad_node_shapes_exit_2_naming_the_option_and_the_syntax(tmp_path: Path, gpus: str, said: str) -> None:
    code, _, out = manifests(tmp_path, gpus)
    assert code == 2 and "--gpus" in out and said in out, out


def test_plan_takes_the_same_shapes() -> None:
    args = ["plan", "-m", "Qwen/Qwen3-32B", "--ttft", "2s", "--tpot", "100ms", "--rps", "0.5", "--input", "512"]
    args += ["--output", "256", "--disaggregation", "off", "--json"]
    four = runner.invoke(app, [*args, "--gpus", "L4=2x4+8x1"])
    assert four.exit_code == 0, four.output
    assert json.loads(four.stdout)["chosen"]["tensor_parallel"] == 4
    ones = runner.invoke(app, [*args, "--gpus", "L4=16x1"])
    assert ones.exit_code == 1, ones.output
    data = json.loads(ones.stdout)
    assert data["chosen"] is None
    grouped = [r for r in data["rejected"] if r["tensor_parallel"] > 1]
    assert grouped and all("exceeds the 1 L4 GPUs a node holds" in r["reason"] for r in grouped)
    bad = runner.invoke(app, [*args, "--gpus", "L4=8y1"])
    assert bad.exit_code == 2 and SYNTAX in bad.output
