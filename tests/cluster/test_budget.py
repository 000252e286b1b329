"""A GPUBudget on the real cluster: three services of different priorities on a budget
smaller than their sum; the top one keeps its replicas, the others' status says why, and the
budget's status says what is allocated, to whom and what is wanted."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from kvscale.api import GROUP, LABEL_GPU_TYPE, PLURAL, VERSION
from tests.cluster.harness import Cluster, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_operator import condition, create, engine_pods, events, get

ROOT = Path(__file__).resolve().parents[2]
BUDGET = "a100-reservation"


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    for crd in (PLURAL, "gpubudgets"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.{GROUP}", "--timeout=60s")
    op = Operator(cluster, tmp_path_factory.mktemp("operator"), {"KVSCALE_SCALE_INTERVAL": "1s"})
    op.start()
    yield op
    op.stop()


def service(name: str, priority: int) -> dict[str, Any]:
    """An A100 service at 30 req/s (one GPU a replica, five of them on the default vLLM profile), minReplicas 1."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name, "labels": {"tier": "budgeted"}},
        "spec": {
            "model": {"name": "llama-3.1-8b"},
            "workload": {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": 30},
            "slo": {"timeToFirstToken": "1s", "timePerOutputToken": "60ms"},
            "hardware": {"gpuTypes": ["A100-80GB"], "maxTensorParallel": 1},
            "scaling": {"minReplicas": 1, "maxReplicas": 6, "priority": priority},
        },
    }


def budget_body(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUBudget",
        "metadata": {"name": BUDGET},
        "spec": {
            "limits": {"A100-80GB": 5},
            "selector": {"namespaces": [namespace], "matchLabels": {"tier": "budgeted"}},
        },
    }


def ticks(operator: Operator, namespace: str) -> dict[str, float]:
    """Autoscaling ticks the operator has completed, by InferenceService in `namespace`: each
    one counts one decision (kvscale_decisions_total, summed over its kinds) on /metrics."""
    text = httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kvscale_decisions_total" and sample.labels.get("namespace") == namespace:
                name = sample.labels["inferenceservice"]
                out[name] = out.get(name, 0.0) + sample.value
    return out


def ticked(operator: Operator, namespace: str, names: Iterable[str], count: int) -> None:
    """Waits until each of `names` has completed `count` more ticks, however long the machine
    takes for them."""
    start = ticks(operator, namespace)

    def done() -> bool:
        now = ticks(operator, namespace)
        return all(now.get(n, 0.0) >= start.get(n, 0.0) + count for n in names)

    try:
        wait_until(done, 30 + 10 * count, f"{count} ticks of each of {sorted(names)}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {start} -> {ticks(operator, namespace)}\n{operator.tail()}") from exc


def _ticked_held(held: dict[str, Any], is_held: bool) -> bool:
    """HeldByBudget as a tick's allocation wrote it ("wanted N, got M"), not the admission's
    ("wanted N, starts with M"), which a loaded machine can leave in place past the scale."""
    return held.get("status") == ("True" if is_held else "False") and ", got " in held.get("message", "")


def deployed(api: client.ApiClient, namespace: str, name: str) -> bool:
    return deployment_replicas(api, namespace, name) is not None


def deployment_replicas(api: client.ApiClient, namespace: str, name: str) -> int | None:
    try:
        return int(client.AppsV1Api(api).read_namespaced_deployment(name, namespace).spec.replicas)
    except client.ApiException:
        return None


def test_three_priorities_on_a_budget_smaller_than_their_sum(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    objects = client.CustomObjectsApi(api)
    objects.create_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget_body(namespace))
    try:
        # The operator knows the budget once its timer has written the budget's status.
        wait_until(
            lambda: (
                "allocated" in objects.get_cluster_custom_object(GROUP, VERSION, "gpubudgets", BUDGET).get("status", {})
            ),
            30,
            "the budget's first status",
        )
        peak = [0]

        def in_use() -> int:  # A100s the three Deployments ask for (one each per replica)
            total = sum(deployment_replicas(api, namespace, n) or 0 for n in ("chat", "rag", "batch"))
            peak[0] = max(peak[0], total)
            return total

        for name, priority in (("chat", 100), ("rag", 50), ("batch", 1)):
            body = service(name, priority)
            # 18 req/s: a plan of three A100 replicas each (kvscale plan, default vllm-0.11 profile; 16-20 req/s do)
            body["spec"]["workload"]["requestsPerSecond"] = 18
            create(api, namespace, body)
            # A new service's Deployment starts within what the budget has free (not its plan's 3).
            wait_until(functools.partial(deployed, api, namespace, name), 60, f"{name}'s Deployment")
            in_use()
        want = {"chat": 3, "rag": 1, "batch": 1}  # floors first (1 each), then chat's 2 more: 5 GPUs

        def settled() -> bool:  # the status is written just after the scale: both
            in_use()
            return all(
                deployment_replicas(api, namespace, n) == r
                and _ticked_held(condition(get(api, namespace, n), "HeldByBudget"), r < 3)
                for n, r in want.items()
            )

        try:
            wait_until(settled, 90, "replicas within the budget by priority")
        except TimeoutError as exc:
            seen = {n: deployment_replicas(api, namespace, n) for n in want}
            said = {n: get(api, namespace, n).get("status", {}).get("conditions") for n in want}
            raise AssertionError(f"{exc}: {seen}\n{said}\n{operator.tail()}") from exc
        assert peak[0] <= 5, f"the Deployments asked for {peak[0]} A100s on a budget of 5"
        chat, rag, batch = (get(api, namespace, n) for n in ("chat", "rag", "batch"))
        for pod in engine_pods(api, namespace, "chat"):  # what an llm-d router or WVA selects on
            labels = pod.metadata.labels
            assert labels["llm-d.ai/inference-serving"] == "true" and labels["llm-d.ai/model"] == "llama-3.1-8b"
            assert labels["llm-d.ai/variant"] == "a100-80gb-tp1-bf16"
        assert chat["status"]["plan"]["replicas"] == 3
        top = condition(chat, "HeldByBudget")
        assert (top["status"], top["reason"]) == ("False", "WithinBudget")
        assert top["message"] == f"budget {BUDGET}: wanted 3, got 3 on A100-80GB x1"
        for obj in (rag, batch):
            held = condition(obj, "HeldByBudget")
            assert (held["status"], held["reason"]) == ("True", "BudgetLimit")
            assert held["message"].startswith(f"budget {BUDGET}: wanted 3, got 1 on A100-80GB x1: ")
            assert "in priority order: " in held["message"] and "chat (priority 100) 3" in held["message"]
            assert obj["status"]["replicas"] == 1
        wait_until(
            lambda: any(r == "HeldByBudget" for r, _ in events(api, namespace, "batch")), 30, "a HeldByBudget Event"
        )

        def budget_status() -> dict[str, Any]:
            status: dict[str, Any] = dict(objects.get_cluster_custom_object(GROUP, VERSION, "gpubudgets", BUDGET)).get(
                "status", {}
            )
            return status

        def budget_says() -> tuple[Any, ...]:
            status = budget_status()
            services = [(s["name"], s["replicas"], s["wanted"]) for s in status.get("services", [])]
            return status.get("allocated"), status.get("wanted"), services

        expected = ({"A100-80GB": 5}, {"A100-80GB": 9}, [("chat", 3, 3), ("rag", 1, 3), ("batch", 1, 3)])
        try:
            wait_until(lambda: budget_says() == expected, 30, "the budget's status: allocated, wanted, to whom")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {budget_says()}") from exc

        # Settled, it stays: no flapping grants, no repeated Events (one per change).
        def held_events() -> dict[str, int]:
            return {n: [r for r, _ in events(api, namespace, n)].count("HeldByBudget") for n in want}

        counted, before = held_events(), {n: deployment_replicas(api, namespace, n) for n in want}
        ticked(operator, namespace, want, 8)  # eight ticks of each service
        assert {n: deployment_replicas(api, namespace, n) for n in want} == before
        said = {n: [m for r, m in events(api, namespace, n) if r == "HeldByBudget"] for n in want}
        assert held_events() == counted, f"{counted} -> {held_events()}: {said}"
        # The budget grows: rag gets its replicas, batch keeps its floor.
        objects.patch_cluster_custom_object(
            GROUP, VERSION, "gpubudgets", BUDGET, {"spec": {"limits": {"A100-80GB": 7}}}
        )
        want = {"chat": 3, "rag": 3, "batch": 1}
        wait_until(settled, 90, "rag scaled up when the budget grew")
        assert condition(get(api, namespace, "batch"), "HeldByBudget")["status"] == "True"
    finally:
        objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", BUDGET)


def pods_by_gpu(api: client.ApiClient, namespace: str, name: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for pod in engine_pods(api, namespace, name):
        if pod.metadata.deletion_timestamp is None:
            gpu = (pod.metadata.labels or {}).get(LABEL_GPU_TYPE, "?")
            out[gpu] = out.get(gpu, 0) + 1
    return out


def test_a_lower_priority_moves_to_another_gpu_type_it_accepts(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    """chat (priority 100) wants two H100s; batch (priority 1) accepts H100 and A100: on a budget
    of two H100 and four A100, batch moves to A100 rather than sit at its floor on H100."""
    objects = client.CustomObjectsApi(api)
    body = budget_body(namespace)
    body["metadata"]["name"] = "mixed"
    body["spec"]["limits"] = {"H100-SXM": 2, "A100-80GB": 4}
    objects.create_cluster_custom_object(GROUP, VERSION, "gpubudgets", body)
    try:
        wait_until(
            lambda: (
                "allocated"
                in objects.get_cluster_custom_object(GROUP, VERSION, "gpubudgets", "mixed").get("status", {})
            ),
            30,
            "the budget's first status",
        )
        for name, priority, rps in (("chat", 100, 80), ("batch", 1, 30)):
            svc = service(name, priority)
            svc["spec"]["hardware"]["gpuTypes"] = ["H100-SXM", "A100-80GB"]
            svc["spec"]["workload"]["requestsPerSecond"] = rps
            create(api, namespace, svc)

        def moved() -> bool:
            plan = get(api, namespace, "batch").get("status", {}).get("plan", {})
            return plan.get("gpuType") == "A100-80GB" and set(pods_by_gpu(api, namespace, "batch")) == {"A100-80GB"}

        try:
            wait_until(moved, 90, "batch moved to A100")
            wait_until(lambda: pods_by_gpu(api, namespace, "chat") == {"H100-SXM": 2}, 60, "chat on two H100s")
        except TimeoutError as exc:
            seen = {
                n: (
                    get(api, namespace, n).get("status", {}).get("plan", {}).get("gpuType"),
                    pods_by_gpu(api, namespace, n),
                )
                for n in ("chat", "batch")
            }
            raise AssertionError(f"{exc}: {seen}\n{operator.tail()}") from exc
        batch = get(api, namespace, "batch")
        assert batch["status"]["plan"]["budgetMovedFrom"] == "H100-SXM"
        assert 1 <= deployment_replicas(api, namespace, "batch") <= 4  # type: ignore[operator]
        # kopf posts events from a queue of its own, after the patch that moved the plan.
        wait_until(
            lambda: any(r == "MovedByBudget" for r, _ in events(api, namespace, "batch")), 30, "the MovedByBudget event"
        )
        reasons = [(r, m) for r, m in events(api, namespace, "batch") if r == "MovedByBudget"]
        assert reasons and "moved from H100-SXM TP1 to A100-80GB TP1" in reasons[0][1]
        ticked(operator, namespace, ("chat", "batch"), 5)  # it stays where it moved (no move back and forth)
        assert [r for r, _ in events(api, namespace, "batch")].count("MovedByBudget") == len(reasons) == 1
        assert get(api, namespace, "batch")["status"]["plan"]["gpuType"] == "A100-80GB"
        # Read after the ticks: the snapshot above can predate the first tick after the move, whose
        # allocation replaces the admission's "starts with 0" message.
        held = condition(get(api, namespace, "batch"), "HeldByBudget")
        assert "next-cheapest feasible plan" in held["message"], held
        status = objects.get_cluster_custom_object(GROUP, VERSION, "gpubudgets", "mixed")["status"]
        assert status["allocated"]["H100-SXM"] <= 2 and status["allocated"]["A100-80GB"] <= 4
    finally:
        objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", "mixed")
