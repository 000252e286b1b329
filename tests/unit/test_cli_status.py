"""`kvscale status` and `kvscale manifests --diff` without a cluster: the screen from a status as
the operator writes it, and the live object cut down to what kvscale sets (the cluster tests run
both against the real API server)."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from kvscale.cli.manifests import project
from kvscale.cli.status import status_lines
from kvscale.control import exclusions

OBJ = {
    "metadata": {"name": "chat", "namespace": "prod", "generation": 3},
    "spec": {
        "model": {"name": "llama-3.1-8b"},
        "slo": {"timeToFirstToken": "500ms", "timePerOutputToken": "50ms", "percentile": 99},
        "workload": {"requestsPerSecond": 4, "inputTokens": 512, "outputTokens": 256},
        "scaling": {"minReplicas": 1, "maxReplicas": 8},
    },
    "status": {
        "observedGeneration": 2,
        "phase": "Ready",
        "plan": {
            "gpuType": "H100-SXM",
            "gpuProduct": "NVIDIA-H100-80GB-HBM3",
            "tensorParallel": 8,
            "pipelineParallel": 2,
            "nodes": 2,
            "precision": "bf16",
            "maxBatch": 256,
            "maxContextTokens": 131072,
            "replicas": 1,
            "predictedTtft": "900ms",
            "predictedTpot": "80ms",
            "throughputTokensPerSecond": 900.0,
            "ratePerReplica": 0.7,
            "limitedBy": "tpot-tail",
            "mbu": 0.5,
            "mfu": 0.1,
            "costPerHour": 43.04,
            "reason": "cheapest",
            "someFieldOfANewerOperator": 1,
        },
        "observed": {"ttft": "420ms", "tpot": "61ms", "requestsPerSecond": 3.5, "queue": 2.0, "kvCacheUsage": 0.42},
        "replicas": 2,
        "readyReplicas": 1,
        "desiredReplicas": 2,
        "lastScaleTime": "2026-11-25T04:00:00Z",
        "lastScaleReason": "forecast: 3.5 req/s in 90s",
        "conditions": [{"type": "SLOMet", "status": "False", "reason": "TpotOver", "message": "p99 TPOT 61ms > 50ms"}],
    },
}


def test_status_screen() -> None:
    lines = status_lines(OBJ, [{"type": "Normal", "reason": "Scaled", "message": "1 -> 2", "lastTimestamp": "t"}])
    assert lines[0] == "chat in prod: Ready, mode auto (status of generation 2, spec at 3)"
    assert "1 x 16 H100-SXM over 2 nodes (TP 8 x PP 2) (bf16)" in lines[2] and "$43.04/h" in lines[2]
    observed = next(line for line in lines if line.startswith("Observed:"))
    assert observed.startswith("Observed: TTFT 420ms (target 500ms), TPOT 61ms (target 50ms), 3.5 req/s, queue 2,")
    assert "KV cache 42%" in observed
    decision = next(line for line in lines if line.startswith("Decision:"))
    assert decision == (
        "Decision: replicas 2 (ready 1), desired 2; last scaled 2026-11-25T04:00:00Z: forecast: 3.5 req/s in 90s"
    )
    assert "  SLOMet            False   TpotOver: p99 TPOT 61ms > 50ms" in lines
    assert lines[-1] == "  t Normal Scaled: 1 -> 2"


def test_status_screen_before_the_operator_wrote_one() -> None:
    lines = status_lines({**OBJ, "status": {}}, [])
    assert lines[0].startswith("chat in prod: no status yet")
    assert "Plan:     none yet (see the Planned condition)" in lines
    assert any(line.startswith("Observed: nothing yet (no MetricsAvailable condition") for line in lines)


def test_diff_compares_only_what_kvscale_sets() -> None:
    rendered = {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"replicas": 2, "ports": [{"port": 80}]}}
    live = {
        "metadata": {"name": "a", "labels": {"x": "1", "kvscale.io/owner-uid": "u"}, "uid": "u", "managedFields": []},
        "spec": {"replicas": 3, "ports": [{"port": 80, "protocol": "TCP"}], "sessionAffinity": "None"},
        "status": {},
    }
    assert project(live, rendered) == {
        "metadata": {"name": "a", "labels": {"x": "1"}},
        "spec": {"replicas": 3, "ports": [{"port": 80}]},
    }
    assert project({"spec": {}}, rendered) == {"spec": {}}  # a field kvscale sets that the live object lacks


def test_status_shows_the_gpu_types_left_out_and_until_when() -> None:
    since = dt.datetime(2026, 11, 25, 4, 0, tzinfo=dt.UTC)
    obj: dict[str, Any] = copy.deepcopy(OBJ)
    obj["status"]["plan"]["excludedGpuTypes"] = ["A100-80GB", "L40S"]
    left_out = exclusions.excluded(("A100-80GB", "L40S"), "their pods found no free GPUs", since, 1800, 2)
    obj["status"]["conditions"].append(left_out.model_dump(by_alias=True, mode="json"))
    lines = status_lines(obj, [], now=since + dt.timedelta(minutes=3))
    assert (
        "Excluded: A100-80GB, L40S until 2026-11-25T04:30:00Z (in 27m; pods found no free GPUs of the type), "
        "then planned with again"
    ) in lines
    assert any(line.startswith("  GPUTypesExcluded  True    GPUsShort: A100-80GB, L40S left out") for line in lines)
    due = status_lines(obj, [], now=since + dt.timedelta(minutes=31))
    assert any(line.startswith("Excluded: A100-80GB, L40S until 2026-11-25T04:30:00Z (due now") for line in due)
    # Written by an operator before expiries: no time, and the next status tick plans with them again.
    obj["status"]["conditions"] = obj["status"]["conditions"][:1]
    legacy = status_lines(obj, [])
    assert any(line.startswith("Excluded: A100-80GB, L40S (no expiry recorded") for line in legacy)
    assert not any(line.startswith("Excluded:") for line in status_lines(OBJ, []))


class _FakeLive:
    """The live objects `diff_live` reads, by kind."""

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = objects

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(kind)


def test_diff_leaves_out_the_replicas_the_autoscaler_owns() -> None:
    # Issue 39: `manifests --diff` reported the Deployment's replicas, which the autoscaler sets
    # at runtime, as a difference (exit 1 on every scaled service).
    from kvscale.cli.manifests import diff_live

    def deployment(replicas: int, image: str) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "chat", "namespace": "prod"},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"image": image}]}}},
        }

    live = _FakeLive({"Deployment": {**deployment(5, "vllm:1"), "status": {"replicas": 5}}})
    text, differs = diff_live([deployment(2, "vllm:1")], live, "prod")  # type: ignore[arg-type]
    assert not differs, text
    assert text == (
        "# Deployment prod/chat: no differences (not compared: spec.replicas (live 5, a fresh plan starts at 2): "
        "the operator's autoscaler sets it at runtime)\n"
    )
    text, differs = diff_live([deployment(2, "vllm:2")], live, "prod")  # type: ignore[arg-type]
    assert differs and "-      - image: vllm:1" in text and "+      - image: vllm:2" in text
    assert "replicas:" not in text.split("\n", 1)[1] and "not compared: spec.replicas" in text.splitlines()[0]
