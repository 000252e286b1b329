"""Issue 14's operator probes against the real control plane, with a fake Prometheus on
127.0.0.1 whose delay and answer each test sets: a slow Prometheus does not delay another
resource's Deployment; malformed answers mark MetricsAvailable=False and hold the size;
drift in the Deployment's replicas and args is reverted (a `kubectl scale kvis` pin holds);
a plan needing more replicas scales the Deployment and the Event says what was applied; a
deleted resource's series leave /metrics; a child the API server refuses gives a condition
and one Event, not a retry loop."""

from __future__ import annotations

import asyncio
import copy
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.api.intent import parse_intent, plan_request, resolve_model
from kvscale.metrics.client import AsyncPrometheusClient, Missing
from kvscale.planner.search import plan
from kvscale.sizing.catalog import default_catalog
from tests.cluster.harness import Cluster, holds_for, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_reliability import FakePrometheus, vector

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "deploy" / "samples").glob("*.yaml"))}
MALFORMED = vector("oops")


@pytest.fixture(scope="module")
def prometheus() -> Iterator[FakePrometheus]:
    with FakePrometheus(0.0, MALFORMED) as fake:
        yield fake


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, prometheus: FakePrometheus, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
    op = Operator(
        cluster,
        tmp_path_factory.mktemp("operator"),
        {"KVSCALE_PROMETHEUS_URL": prometheus.url, "KVSCALE_SCALE_INTERVAL": "2s"},
    )
    op.start()
    yield op
    op.stop()


@pytest.fixture
def fake(prometheus: FakePrometheus) -> Iterator[FakePrometheus]:
    """The module's fake Prometheus, answering malformed samples at once unless a test says otherwise."""
    prometheus.delay_s, prometheus.answer, prometheus.status = 0.0, MALFORMED, 200
    yield prometheus
    prometheus.delay_s, prometheus.answer = 0.0, MALFORMED


def objects(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def create(api: client.ApiClient, namespace: str, body: dict[str, Any], name: str | None = None) -> None:
    body = copy.deepcopy(body)
    body["metadata"] = {"name": name or body["metadata"]["name"], "namespace": namespace}
    objects(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(objects(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))


def condition(api: client.ApiClient, namespace: str, name: str, kind: str) -> dict[str, Any]:
    conditions = get(api, namespace, name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == kind), {})


def events(api: client.ApiClient, namespace: str, name: str, reason: str) -> list[str]:
    items = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return [e.message for e in items if e.involved_object.name == name and e.reason == reason]


def deployment(api: client.ApiClient, namespace: str, name: str) -> Any:
    """The Deployment, or None when there is none."""
    try:
        return client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def replicas(api: client.ApiClient, namespace: str, name: str) -> int | None:
    dep = deployment(api, namespace, name)
    return None if dep is None else int(dep.spec.replicas)


def wait_ready(api: client.ApiClient, namespace: str, name: str, op: Operator, timeout_s: float = 90) -> None:
    try:
        wait_until(lambda: get(api, namespace, name).get("status", {}).get("phase") == "Ready", timeout_s, "Ready")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {get(api, namespace, name).get('status')}\n{op.tail()}") from exc


def a100(name: str, rps: float) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(SAMPLES["llama-3.1-8b-chat"])
    body["metadata"]["name"] = name
    body["spec"]["workload"] = {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": rps}
    body["spec"]["slo"] = {"timeToFirstToken": "1s", "timePerOutputToken": "100ms"}
    body["spec"]["hardware"] = {"gpuTypes": ["A100-80GB"], "maxTensorParallel": 1}
    body["spec"]["scaling"] = {"minReplicas": 1, "maxReplicas": 8}
    return body


def scrape(op: Operator) -> str:
    return httpx.get(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=10).text


def test_a_slow_prometheus_does_not_delay_another_resources_deployment(
    operator: Operator, fake: FakePrometheus, api: client.ApiClient, namespace: str
) -> None:
    fake.delay_s, fake.answer = 10.0, vector("1")
    for i in range(20):  # recommend mode: planned and ticking against the slow Prometheus
        create(api, namespace, SAMPLES["mistral-7b-recommend"], f"ticking-{i}")
    # Every one of them, not only the last created: each object's first tick is offset by its
    # uid within the interval, so creation order says nothing about which ticks first.
    wait_until(
        lambda: all(
            condition(api, namespace, f"ticking-{i}", "MetricsAvailable").get("reason") == "MetricsMissing"
            for i in range(20)
        ),
        90,
        "every ticking service to time out on Prometheus",
    )
    asked = fake.requests
    wait_until(lambda: fake.requests > asked, 30, "ticks waiting on the slow Prometheus")
    started = time.monotonic()
    create(api, namespace, SAMPLES["custom-architecture"])
    name = SAMPLES["custom-architecture"]["metadata"]["name"]
    wait_until(lambda: deployment(api, namespace, name) is not None, 30, "the new resource's Deployment", 0.05)
    took = time.monotonic() - started
    # Before the async operator: 115-124 s with 57 services. The bound leaves room for a busy CI machine.
    assert took < 5.0, f"create -> Deployment took {took:.2f}s behind a 10 s Prometheus"
    message = condition(api, namespace, "ticking-0", "MetricsAvailable")["message"]
    assert "did not answer" in message


def test_malformed_answers_mark_metrics_missing_and_hold_the_size(
    operator: Operator, fake: FakePrometheus, api: client.ApiClient, namespace: str
) -> None:
    create(api, namespace, a100("held", 40))  # the plan needs 3 replicas
    wait_ready(api, namespace, "held", operator)
    planned = get(api, namespace, "held")["status"]["plan"]["replicas"]
    assert planned >= 2 and replicas(api, namespace, "held") == planned

    def missing() -> bool:
        c = condition(api, namespace, "held", "MetricsAvailable")
        return c.get("status") == "False" and "not a number" in c.get("message", "")

    wait_until(missing, 30, "MetricsAvailable=False naming the unreadable value")
    assert condition(api, namespace, "held", "MetricsAvailable")["reason"] == "MetricsMissing"
    holds_for(lambda: replicas(api, namespace, "held") == planned, 6, "the size held on unreadable metrics")
    errors = re.search(r'kvscale_prometheus_errors_total\{kind="malformed"\} (\S+)', scrape(operator))
    assert errors is not None and float(errors.group(1)) > 0


def test_drift_in_replicas_and_args_is_reverted(
    operator: Operator, fake: FakePrometheus, api: client.ApiClient, cluster: Cluster, namespace: str
) -> None:
    body = SAMPLES["custom-architecture"]
    name = body["metadata"]["name"]
    create(api, namespace, body)
    wait_ready(api, namespace, name, operator)
    apps = client.AppsV1Api(api)
    applied_args = list(deployment(api, namespace, name).spec.template.spec.containers[0].args)
    apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 3}})
    wait_until(lambda: replicas(api, namespace, name) == 1, 30, "the hand-made scale reverted to 1")
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": ["--edited"]}]
    apps.patch_namespaced_deployment(name, namespace, patch)
    wait_until(
        lambda: list(deployment(api, namespace, name).spec.template.spec.containers[0].args) == applied_args,
        30,
        "the edited args reverted",
    )
    wait_until(lambda: len(events(api, namespace, name, "DriftReverted")) >= 2, 30, "two DriftReverted Events")
    # A pin through the InferenceService's scale subresource holds; drift from it is reverted too.
    cluster.kubectl("scale", "kvis", name, "--replicas=2", "-n", namespace)
    wait_until(lambda: replicas(api, namespace, name) == 2, 30, "the pinned 2 replicas")
    apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 1}})
    wait_until(lambda: replicas(api, namespace, name) == 2, 30, "the pin restored after a hand-made scale")
    holds_for(lambda: replicas(api, namespace, name) == 2, 4, "the pin")
    pinned = condition(api, namespace, name, "MetricsAvailable")
    assert (pinned["status"], pinned["reason"]) == ("Unknown", "Pinned")


def test_a_plan_needing_more_replicas_scales_and_the_event_says_so(
    operator: Operator, fake: FakePrometheus, api: client.ApiClient, namespace: str
) -> None:
    # 20 then 50 req/s: 3 then 7 A100 on the vllm-0.11 profile, within maxReplicas 8
    create(api, namespace, a100("grows", 20))
    wait_ready(api, namespace, "grows", operator)
    first = get(api, namespace, "grows")["status"]["plan"]["replicas"]  # the plan's count at 20 req/s
    assert replicas(api, namespace, "grows") == first
    objects(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "grows", {"spec": {"workload": {"requestsPerSecond": 50}}}
    )
    wait_until(lambda: get(api, namespace, "grows")["status"].get("observedGeneration") == 2, 30, "the re-plan")
    needed = get(api, namespace, "grows")["status"]["plan"]["replicas"]
    # The planner's own answer for the new spec (the cluster's 32 free A100s do not bind it).
    catalog = default_catalog()
    intent = parse_intent(a100("grows", 50)["spec"])
    expected = plan(catalog, plan_request(intent, resolve_model(intent, catalog), ("A100-80GB",), None)).chosen
    assert expected is not None and needed == expected.prediction.replicas > first
    wait_until(lambda: replicas(api, namespace, "grows") == needed, 30, f"the Deployment at {needed}")
    wait_until(
        lambda: any(m.startswith(f"Deployed {needed} x") for m in events(api, namespace, "grows", "Planned")),
        30,
        "a Planned Event saying what was applied",
    )
    wait_ready(api, namespace, "grows", operator)
    assert get(api, namespace, "grows")["status"]["replicas"] == needed


def test_a_deleted_resources_series_leave_metrics(
    operator: Operator, fake: FakePrometheus, api: client.ApiClient, namespace: str
) -> None:
    body = SAMPLES["mistral-7b-recommend"]
    name = body["metadata"]["name"]
    create(api, namespace, body)
    label = f'inferenceservice="{name}",namespace="{namespace}"'
    alt = f'namespace="{namespace}",inferenceservice="{name}"'

    def series() -> list[str]:
        return [line for line in scrape(operator).splitlines() if label in line or alt in line]

    wait_until(lambda: any(s.startswith("kvscale_desired_replicas") for s in series()), 30, "the service's series")
    # Recommend mode runs nothing: no current replicas, no running cost.
    assert not [s for s in series() if s.startswith(("kvscale_current_replicas", "kvscale_cost_per_hour_usd"))]
    objects(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    wait_until(lambda: not series(), 30, "every series of the deleted service gone")
    holds_for(lambda: not series(), 4, "no series coming back from a tick in flight")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        # kvscale sets HF_HOME (the weights cache); a second entry was an HTTP 500 retried forever.
        # The CRD refuses both now (issue 21); the operator's own check stays for older CRDs.
        ([{"name": "HF_HOME", "value": "/elsewhere"}], "must not set the weights cache variable"),
        ([{"name": "HF_TOKEN", "value": "a"}, {"name": "HF_TOKEN", "value": "b"}], "Duplicate value"),
    ],
)
def test_an_env_the_children_cannot_carry_is_refused_by_the_api_server(
    operator: Operator, api: client.ApiClient, namespace: str, env: list[dict[str, str]], message: str
) -> None:
    body = copy.deepcopy(SAMPLES["custom-architecture"])
    body["spec"]["engine"]["env"] = env
    with pytest.raises(ApiException) as refused:
        create(api, namespace, body)
    assert refused.value.status == 422 and message in str(refused.value.body)
    assert deployment(api, namespace, body["metadata"]["name"]) is None


def test_the_async_client_recovers_after_many_timed_out_queries() -> None:
    """Staggered queries against a 10 s Prometheus, each given up after 0.5 s, then Prometheus
    answers at once again: queries reach it and read values. (With the connection pool capped
    at the in-flight limit, given-up connections stayed CONNECTING and no query was sent again.)"""

    async def run(fake: FakePrometheus) -> tuple[int, float | Missing]:
        prometheus = AsyncPrometheusClient(fake.url, timeout_s=0.5, retries=1, max_in_flight=4)

        async def service(i: int) -> None:
            await asyncio.sleep(i * 0.01)
            while True:
                await prometheus.scalar(f"up{i}")
                await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(service(i)) for i in range(50)]
        await asyncio.sleep(4.0)  # the slow period being replayed
        for task in tasks:
            task.cancel()
        asked = fake.requests
        fake.delay_s = 0.0
        reading = await prometheus.scalar("up")
        await prometheus.aclose()
        return fake.requests - asked, reading

    with FakePrometheus(10.0, vector("1")) as fake:
        sent, reading = asyncio.run(run(fake))
    assert sent >= 1 and reading == 1.0, reading
