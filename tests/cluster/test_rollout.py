"""Rollouts on the real control plane: a spec change surges a new engine pod and retires the old
one only once the new one is ready (maxSurge 1, maxUnavailable 0), so a one-replica service
never has no ready replica; a model cache volume reaches the pods; SGLang and TGI services deploy."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch

from kvscale.api import GROUP, PLURAL, VERSION
from tests.cluster.harness import Cluster, wait_until
from tests.cluster.processes import Operator

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = yaml.safe_load((ROOT / "deploy" / "samples" / "custom-architecture.yaml").read_text())


@pytest.fixture(scope="module")
def operator(cluster: Cluster, api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
    # The cache below is a node path: this operator allows it (none is allowed by default).
    op = Operator(cluster, tmp_path_factory.mktemp("operator-rollout"), {"KVSCALE_HOST_PATH_PREFIXES": "/var/cache"})
    op.start()
    yield op
    op.stop()


def _status(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return dict(obj.get("status") or {})


def _ready(pod: Any) -> bool:
    if pod.metadata.deletion_timestamp is not None or pod.status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def test_spec_change_keeps_a_ready_replica(operator: Operator, api: client.ApiClient, namespace: str) -> None:
    body = copy.deepcopy(SAMPLE)
    body["metadata"]["namespace"] = namespace
    body["spec"]["model"]["cache"] = {"hostPath": "/var/cache/kvscale"}
    name = body["metadata"]["name"]
    objects, core, apps = client.CustomObjectsApi(api), client.CoreV1Api(api), client.AppsV1Api(api)
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    try:
        wait_until(lambda: _status(api, namespace, name).get("phase") == "Ready", 90, f"{name} Ready")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {_status(api, namespace, name)}\n{operator.tail()}") from exc
    dep = apps.read_namespaced_deployment(name, namespace)
    assert dep.spec.replicas == 1
    assert dep.spec.strategy.rolling_update.max_surge == 1 and dep.spec.strategy.rolling_update.max_unavailable == 0
    pod_spec = dep.spec.template.spec
    assert any(v.host_path and v.host_path.path == "/var/cache/kvscale" for v in pod_spec.volumes)
    mounts = {m.name: m.mount_path for m in pod_spec.containers[0].volume_mounts}
    assert mounts["model-cache"] == "/root/.cache/huggingface"
    before = {p.metadata.name for p in core.list_namespaced_pod(namespace).items}
    assert len(before) == 1

    # Every pod event from now on, in the API server's order: the ready set is replayed from it.
    history: list[tuple[str, str, bool]] = []
    failures: list[BaseException] = []
    listed = core.list_namespaced_pod(namespace)
    stop = threading.Event()

    def record() -> None:
        w = watch.Watch()
        try:
            for event in w.stream(
                core.list_namespaced_pod,
                namespace,
                resource_version=listed.metadata.resource_version,
                timeout_seconds=100,
            ):
                pod = event["object"]
                history.append((event["type"], pod.metadata.name, _ready(pod)))
        except Exception as exc:  # the stream ends with the test's namespace or cluster
            if not stop.is_set():
                failures.append(exc)
        if not stop.is_set() and not failures:
            failures.append(TimeoutError("the pod watch ended before the rollout did"))

    watcher = threading.Thread(target=record, daemon=True)
    watcher.start()
    objects.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"engine": {"args": ["--enable-prefix-caching", "--seed=7"]}}}
    )

    def rolled() -> bool:
        pods = core.list_namespaced_pod(namespace).items
        return bool(
            pods
            and all(p.metadata.name not in before for p in pods)
            and all(_ready(p) for p in pods)
            and any(event[1] in before and event[0] == "DELETED" for event in history)
        )

    wait_until(lambda: rolled() or bool(failures), 90, "the new pod to replace the old one")
    stop.set()
    watcher.join(timeout=30)
    assert not failures, failures
    ready = {p.metadata.name for p in listed.items if _ready(p)}
    assert ready == before
    lowest = len(ready)
    for kind, pod, is_ready in history:
        if kind == "DELETED" or not is_ready:
            ready.discard(pod)
        else:
            ready.add(pod)
        lowest = min(lowest, len(ready))
    assert lowest >= 1, f"no ready replica at some point of the rollout: {history}"
    new = apps.read_namespaced_deployment(name, namespace).spec.template.spec.containers[0].args
    assert "--seed=7" in new


@pytest.mark.parametrize(
    ("engine", "command", "tp_flag"),
    [
        ("sglang", ["python3", "-m", "sglang.launch_server"], "--tp-size"),
        ("tgi", ["text-generation-launcher"], "--num-shard"),
    ],
)
def test_sglang_and_tgi_services_deploy(
    operator: Operator, api: client.ApiClient, namespace: str, engine: str, command: list[str], tp_flag: str
) -> None:
    body = copy.deepcopy(SAMPLE)
    body["metadata"]["namespace"] = namespace
    body["metadata"]["name"] = f"on-{engine}"
    body["spec"]["engine"] = {"type": engine}
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    try:
        wait_until(lambda: _status(api, namespace, f"on-{engine}").get("phase") == "Ready", 90, f"{engine} Ready")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {_status(api, namespace, f'on-{engine}')}\n{operator.tail()}") from exc
    plan = _status(api, namespace, f"on-{engine}")["plan"]
    c = client.AppsV1Api(api).read_namespaced_deployment(f"on-{engine}", namespace).spec.template.spec.containers[0]
    assert c.command == command and c.args[c.args.index(tp_flag) + 1] == str(plan["tensorParallel"])
    limit = "--context-length" if engine == "sglang" else "--max-total-tokens"
    assert c.args[c.args.index(limit) + 1] == str(plan["maxContextTokens"])
    assert c.startup_probe.http_get.path == "/health" and c.readiness_probe.http_get.path == "/health"
