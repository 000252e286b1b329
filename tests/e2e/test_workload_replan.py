"""The observed workload and the re-plan on drift, on the test cluster: the stand-in serves
simulated engines whose length mix changes mid-run, a real Prometheus scrapes their token
counters and length histograms, and the operator shows the workload in status and re-plans
for it once the drift has lasted, with an Event that says why."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.harness import Cluster, free_port, wait_until
from tests.cluster.processes import Operator, serving_since, standin
from tests.cluster.prometheus import Prometheus
from tests.cluster.test_operator import SAMPLES, create, get
from tests.unit.profiles import VLLM_0_2_AS_VLLM

ROOT = Path(__file__).resolve().parents[2]
SWITCH_S = 40.0  # the prompts grow 8x from here, at the same request rate
LOAD = f"constant:4;lengths:2048/128@{SWITCH_S:.0f}"
HOLD_S = 15.0  # one workload window: the re-plan reads a window of the new prompts only


def replanned_events(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    items = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return [e for e in items if e.involved_object.name == name and e.reason in ("Replanned", "ReplanFailed")]


@pytest.fixture
def drifting(cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    established = ("wait", "--for=condition=Established", "crd/inferenceservices.kvscale.io", "--timeout=10s")
    # Right after the apply the CRD may have no conditions yet, which kubectl wait refuses.
    wait_until(lambda: cluster.kubectl_ok(*established), 60, "the CRD established")
    body = copy.deepcopy(SAMPLES["custom-architecture"])
    body["metadata"]["name"] = "drifting"
    body["spec"]["workload"] = {"inputTokens": 256, "outputTokens": 128, "requestsPerSecond": 4}
    body["spec"]["slo"] = {"timeToFirstToken": "2s", "timePerOutputToken": "80ms"}
    body["spec"]["scaling"] = {"minReplicas": 1, "maxReplicas": 4}
    metrics_port = free_port()
    # sized on the 2023 vLLM profile, as the test's loads were (tests/unit/profiles.py): the
    # operator and the stand-in both on it
    op = Operator(cluster, tmp_path, {"KVSCALE_CATALOG": str(VLLM_0_2_AS_VLLM)})
    prom = Prometheus(tmp_path / "prom", targets=[f"127.0.0.1:{metrics_port}"]).start()
    op.env.update(
        {
            "KVSCALE_PROMETHEUS_URL": prom.url,
            "KVSCALE_SCALE_INTERVAL": "2s",
            "KVSCALE_METRICS_WINDOW": "15s",
            "KVSCALE_METRICS_STALE_AFTER": "10s",
            "KVSCALE_WORKLOAD_INTERVAL": "3s",
            "KVSCALE_WORKLOAD_WINDOW": "15s",
            "KVSCALE_REPLAN_DRIFT": "1.5",
            "KVSCALE_REPLAN_AFTER": f"{HOLD_S:.0f}s",
        }
    )
    op.start()
    create(api, namespace, body)
    wait_until(lambda: get(api, namespace, "drifting").get("status", {}).get("phase") == "Ready", 60, "Ready")
    serving = standin(
        cluster, "drifting", namespace, metrics_port, LOAD, "1s", tmp_path / "standin.log", VLLM_0_2_AS_VLLM
    )
    started = serving_since(serving, metrics_port)  # the load's clock starts as it serves
    try:
        yield {"namespace": namespace, "operator": op, "started": started}
    finally:
        serving.stop()
        op.stop()
        prom.stop()


def _workload(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    return dict(get(api, namespace, "drifting").get("status", {}).get("observedWorkload") or {})


def test_the_operator_replans_when_the_length_mix_changes(drifting: dict[str, Any], api: client.ApiClient) -> None:
    ns, op = drifting["namespace"], drifting["operator"]

    def mean_prompt() -> float:
        return float((_workload(api, ns).get("inputTokens") or {}).get("mean") or 0.0)

    def steady(prompt: float) -> bool:  # a full window of the load: the mean prompt and the rate
        return near(mean_prompt(), prompt, 0.05) and near(_workload(api, ns).get("requestsPerSecond") or 0, 4, 0.25)

    def near(value: float, target: float, within: float) -> bool:
        return abs(value - target) <= within * target

    # Before the switch: the workload in status is the spec's, nothing drifts.
    try:
        wait_until(lambda: steady(256), SWITCH_S - 5, "the observed prompts at 256 tokens, 4 req/s")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {_workload(api, ns)}\noperator log:\n{op.tail()}") from exc
    shown = _workload(api, ns)
    assert shown["window"] == "15s" and shown["outputTokens"]["mean"] == 128
    assert shown["decodeTokensPerSecond"] > 0 and shown["prefillTokensPerSecond"] > 0
    assert shown["prefixCacheHitRatio"] == 0  # the stand-in's engines have no prefix cache
    assert 200 <= shown["inputTokens"]["p50"] <= 500 and "drift" not in shown  # vLLM's bucket (200, 500]
    before = get(api, ns, "drifting")["status"]["plan"]
    assert before["workload"]["source"] == "spec" and before["workload"]["inputTokens"] == 256
    assert replanned_events(api, ns, "drifting") == []
    assert time.monotonic() - drifting["started"] < SWITCH_S, "the check before the switch ran late"

    # After the switch: drift shows, then the re-plan follows the hold, for the observed prompts.
    try:
        wait_until(lambda: bool(replanned_events(api, ns, "drifting")), 90, "a Replanned event")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {_workload(api, ns)}\noperator log:\n{op.tail()}") from exc
    [event] = replanned_events(api, ns, "drifting")
    assert event.reason == "Replanned" and "mean prompt" in event.message and "planned" in event.message
    assert time.monotonic() - drifting["started"] >= SWITCH_S + HOLD_S
    status = get(api, ns, "drifting")["status"]
    planned_for = status["plan"]["workload"]
    assert planned_for["source"] == "observed" and planned_for["inputTokens"] > 1.5 * 256, planned_for
    assert status["phase"] in ("Ready", "Deploying")
    # Settled: the workload planned for is the one observed; no second re-plan follows.
    try:
        wait_until(lambda: steady(2048), 40, "the observed prompts at 2048 tokens, 4 req/s")
        wait_until(lambda: "drift" not in _workload(api, ns), 40, "no drift from the new plan")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {get(api, ns, 'drifting')['status']}\nlog:\n{op.tail()}") from exc
    assert len(replanned_events(api, ns, "drifting")) == 1

    # The peaks: 15s request and prompt-token rates, the highest over the hour, sampled every
    # 30s (aligned to the clock, so a minute of history holds few samples, some taken while the
    # re-plan rolled the pods): of the order of the rate, and above the short prompts' work
    # once a sample of the long prompts' steady state is in (the first after the re-plan may
    # be taken mid-rollout).
    def peaks() -> bool:
        now = _workload(api, ns)
        return bool(
            now["peakRequestsPerSecondLastHour"] >= 0.5 * now["requestsPerSecond"]
            and now["peakPrefillTokensPerSecondLastHour"] >= 1.2 * shown["prefillTokensPerSecond"]
        )

    try:
        wait_until(peaks, 45, "the hour's peaks above the short prompts' work")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nnow: {_workload(api, ns)}\nbefore: {shown}") from exc
