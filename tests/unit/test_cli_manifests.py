"""`kvscale manifests -f FILE [--gpus TYPE=COUNT,...]`: the operator's objects as YAML, from
the same planner and builders; bad specs exit 2 naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kvscale.api.intent import parse_intent
from kvscale.cli import app
from kvscale.control.planning import Planned, plan_service
from kvscale.control.resources import deployment
from kvscale.sizing.catalog import default_catalog

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "deploy" / "samples"
runner = CliRunner()


def write(tmp_path: Path, body: dict[str, Any] | list[dict[str, Any]]) -> Path:
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump_all(body if isinstance(body, list) else [body]))
    return path


def sample(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((SAMPLES / f"{name}.yaml").read_text()))


def manifests(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    result = runner.invoke(app, ["manifests", *args])
    docs = [d for d in yaml.safe_load_all(result.stdout) if d] if result.exit_code == 0 else []
    return result.exit_code, docs, result.output


def test_sample_prints_what_the_operator_builds() -> None:
    code, docs, out = manifests("-f", str(SAMPLES / "llama-3.1-8b-chat.yaml"), "--gpus", "A10G=16,L4=16")
    assert code == 0, out
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "PodDisruptionBudget"]
    assert out.startswith("# llama-8b-chat: ")
    # The same builder, called directly on the same plan, gives the same Deployment.
    cat = default_catalog()
    body = sample("llama-3.1-8b-chat")
    intent = parse_intent(body["spec"])
    spec = intent.spec
    from kvscale.cli.manifests import gpu_pools

    pools = gpu_pools(cat, "A10G=16,L4=16", spec.scaling.max_replicas)
    result = plan_service(intent, cat, pools)
    assert isinstance(result, Planned)
    chosen = result.chosen
    replicas = min(chosen.prediction.replicas, spec.scaling.max_replicas)
    direct = deployment(
        "llama-8b-chat", "", spec, result.model, chosen.config, chosen, pools[chosen.gpu], replicas, 8000
    )
    assert docs[0] == yaml.safe_load(yaml.safe_dump(direct))
    assert docs[0]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_every_sample_renders(tmp_path: Path) -> None:
    everything = [sample(p.stem) for p in sorted(SAMPLES.glob("*.yaml"))]
    for doc in everything:
        doc["metadata"]["namespace"] = "team-a"
    code, docs, out = manifests("-f", str(write(tmp_path, everything)))
    assert code == 0, out
    assert "mode recommend: the operator creates nothing" in out  # mistral-7b-recommend
    assert {d["metadata"]["namespace"] for d in docs} == {"team-a"}
    assert sum(d["kind"] == "Deployment" for d in docs) == len(everything) - 1


def test_inference_pool_routing_adds_the_pool(tmp_path: Path) -> None:
    body = sample("llama-3.1-8b-chat")
    body["spec"]["routing"] = {"inferencePool": {"endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}
    code, docs, out = manifests("-f", str(write(tmp_path, body)))
    assert code == 0, out
    pool = docs[-1]
    assert pool["kind"] == "InferencePool" and pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["selector"]["matchLabels"] == docs[0]["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"slo": {"timeToFirstToken": "soon", "timePerOutputToken": "50ms"}}, "spec.slo.timeToFirstToken"),
        ({"model": {"name": "mistral-7b", "precision": "int4"}}, "spec.model.source"),
        ({"model": {"name": "gpt-17"}}, "spec.model.name"),
        ({"engine": {"type": "vllm", "image": ""}}, "spec.engine.image"),
        (
            {"workload": {"inputTokens": 512, "outputTokens": 256, "maxContextTokens": 200000}},
            "spec.workload.maxContextTokens 200000 exceeds llama-3.1-8b's context limit of 131072",
        ),
    ],
)
def test_bad_specs_exit_2_naming_the_field(tmp_path: Path, patch: dict[str, Any], needle: str) -> None:
    body = copy.deepcopy(sample("llama-3.1-8b-chat"))
    body["spec"].update(patch)
    code, _, out = manifests("-f", str(write(tmp_path, body)))
    assert code == 2 and needle in " ".join(out.split()), out


@pytest.mark.parametrize(
    ("gpus", "needle"),
    [("H100=0", "--gpus"), ("V100=8", "unknown GPU type"), ("L4", "TYPE=COUNT"), ("L4=1,L4=2", "twice")],
)
def test_bad_gpus_exit_2(gpus: str, needle: str) -> None:
    code, _, out = manifests("-f", str(SAMPLES / "llama-3.1-8b-chat.yaml"), "--gpus", gpus)
    assert code == 2 and needle in out, out


def test_no_capacity_and_unreadable_files(tmp_path: Path) -> None:
    code, _, out = manifests("-f", str(SAMPLES / "llama-3.1-70b-rag.yaml"), "--gpus", "L4=1")
    assert code == 1 and "no plan fits" in out
    missing = manifests("-f", str(tmp_path / "nope.yaml"))
    assert missing[0] == 2 and "cannot read" in missing[2]
    (tmp_path / "other.yaml").write_text("kind: ConfigMap\nmetadata: {name: x}\n")
    assert manifests("-f", str(tmp_path / "other.yaml"))[0] == 2
