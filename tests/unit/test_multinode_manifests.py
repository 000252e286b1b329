"""`kvscale manifests` for a model larger than a node, from the planner's own choice (no
hand-made plan): Llama 3.1 405B in bf16 does not fit one 8-GPU H100 node."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from kvscale.cli import app


def test_manifests_render_405b_in_bf16_on_h100_as_a_leader_worker_set(tmp_path: Path) -> None:
    """The planner's own choice (no hand-made plan): 405B in bf16 does not fit one 8-GPU H100
    node, so it plans TP 8 x PP 2 and the manifests are a LeaderWorkerSet of two-node groups."""
    body = {
        "apiVersion": "kvscale.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llama-405b"},
        "spec": {
            "model": {"name": "llama-3.1-405b", "precision": "bf16"},
            "workload": {"inputTokens": 1024, "outputTokens": 256, "requestsPerSecond": 0.5},
            "slo": {"timeToFirstToken": "5s", "timePerOutputToken": "150ms"},
            "hardware": {"gpuTypes": ["H100-SXM"]},
        },
    }
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(body))
    result = CliRunner().invoke(app, ["manifests", "-f", str(path), "--gpus", "H100-SXM=32"])
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [d["kind"] for d in docs] == ["LeaderWorkerSet", "Service", "PodDisruptionBudget"]
    group = docs[0]
    template = group["spec"]["leaderWorkerTemplate"]
    assert group["metadata"]["name"] == "llama-405b-lws" and template["size"] == 2
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in leader["args"][0]
    assert "group(s) of 2 nodes x 8 H100-SXM (TP8 x PP2, bf16" in result.output.splitlines()[0]
