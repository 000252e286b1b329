"""The CLI against a live cluster (issue 20): `kvscale status NAME` shows the plan, what is
observed, the decision, the conditions and the Events of a running InferenceService in one
screen; `kvscale manifests --diff` compares what kvscale would apply with the live objects."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from kubernetes import client
from typer.testing import CliRunner

from kvscale.cli import app
from tests.cluster.harness import Cluster, find_bins
from tests.cluster.processes import Operator
from tests.cluster.test_operator import SAMPLES, create, wait_phase

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_status_without_the_crd_says_how_to_install_it(tmp_path: Path) -> None:
    """A bare API server (no CRDs applied): not "not found", but that the CRD is missing and how to install it."""
    bare = Cluster(tmp_path, find_bins()).start(control_plane_only=True)
    try:
        out = runner.invoke(app, ["status", "chat", "--kubeconfig", str(bare.kubeconfig), "-n", "default"])
    finally:
        bare.stop()
    assert out.exit_code == 2, out.output
    assert "the InferenceService CRD (inferenceservices.kvscale.io) is not installed" in out.output
    assert "kubectl apply -f crds/" in out.output and "charts/kvscale" in out.output
    assert "not found" not in out.output


def test_status_shows_plan_observed_decision_in_one_screen(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    body = SAMPLES["llama-3.1-8b-chat"]
    name = body["metadata"]["name"]
    create(api, namespace, body)
    obj = wait_phase(api, namespace, name, "Ready", operator)
    plan = obj["status"]["plan"]
    live = ["--kubeconfig", str(cluster.kubeconfig), "-n", namespace]
    out = runner.invoke(app, ["status", name, *live])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"{name} in {namespace}: Ready, mode auto")
    plan_line = next(line for line in lines if line.startswith("Plan:"))
    assert f"{plan['replicas']} x {plan['tensorParallel']} {plan['gpuType']} ({plan['precision']})" in plan_line
    assert f"max batch {plan['maxBatch']}" in plan_line
    assert any(line.startswith("Observed: nothing yet") for line in lines)  # no Prometheus in this test
    decision = next(line for line in lines if line.startswith("Decision:"))
    assert f"replicas {obj['status']['replicas']} (ready {obj['status']['readyReplicas']})" in decision
    conditions = lines[lines.index("Conditions:") + 1 :]
    assert any(line.split()[:2] == ["Ready", "True"] for line in conditions)
    assert any("Planned" in line for line in lines if "Events" not in line)
    assert len(lines) <= 40  # one screen
    # The API server prints the plan's parallel degrees in the wide view only (priority 1 columns).
    header, row = (
        line.split() for line in cluster.kubectl("get", "kvis", name, "-n", namespace, "-o", "wide").splitlines()
    )
    assert header[:8] == ["NAME", "MODEL", "GPU", "TP", "PRECISION", "NODES", "EP", "DP"], header
    assert row[6:8] == [str(plan["expertParallel"]).lower(), str(plan["dataParallel"])] == ["false", "1"]
    assert "EP" not in cluster.kubectl("get", "kvis", name, "-n", namespace).splitlines()[0].split()
    data = json.loads(runner.invoke(app, ["status", name, *live, "--json"]).stdout)
    assert data["status"]["plan"]["gpuType"] == plan["gpuType"] and data["spec"]["slo"]
    missing = runner.invoke(app, ["status", "nope", *live])
    assert missing.exit_code == 2 and f"InferenceService {namespace}/nope not found" in missing.output


def test_manifests_diff_against_the_live_objects(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    body = SAMPLES["llama-3.1-8b-chat"]
    name = body["metadata"]["name"]
    create(api, namespace, body)
    obj = wait_phase(api, namespace, name, "Ready", operator)
    gpu = obj["status"]["plan"]["gpuType"]
    spec_file = tmp_path / "chat.yaml"
    spec_file.write_text(yaml.safe_dump(body))
    # The operator's own settings: the test operator tolerates kwok's taint.
    kwok = "--tolerations=kwok.x-k8s.io/node:NoSchedule"
    live = ["--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "--gpus", f"{gpu}=32", kwok]
    same = runner.invoke(app, ["manifests", "-f", str(spec_file), "--diff", *live])
    assert same.exit_code == 0, same.output
    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        assert f"# {kind} {namespace}/{name}: no differences" in same.stdout, same.stdout
    # Ten times the traffic: more replicas, which the autoscaler owns at runtime: named, never a
    # difference (issue 39: `--diff` reported the live count as drift).
    edited = yaml.safe_load(yaml.safe_dump(body))
    edited["spec"]["workload"]["requestsPerSecond"] = 40
    edited["spec"]["scaling"]["maxReplicas"] = 20
    spec_file.write_text(yaml.safe_dump(edited))
    changed = runner.invoke(app, ["manifests", "-f", str(spec_file), "--diff", *live])
    assert changed.exit_code == 0, changed.output
    lines = changed.stdout.splitlines()
    assert not any(line.startswith(("-  replicas: ", "+  replicas: ")) for line in lines), changed.stdout
    said = next(line for line in lines if line.startswith(f"# Deployment {namespace}/{name}: no differences"))
    live_count, planned = (int(said.split(word)[1].split(")")[0].split(",")[0]) for word in ("live ", "starts at "))
    assert "not compared: spec.replicas" in said and planned > live_count == obj["status"]["replicas"], said
    assert f"# Service {namespace}/{name}: no differences" in changed.stdout
    untolerated = runner.invoke(app, ["manifests", "-f", str(spec_file), "--diff", *live[:-1]])
    assert untolerated.exit_code == 1 and "-      - key: kwok.x-k8s.io/node" in untolerated.stdout
    bad = runner.invoke(app, ["manifests", "-f", str(spec_file), "-n", namespace])
    assert bad.exit_code == 2 and "go with --diff" in bad.output
