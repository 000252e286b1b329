"""Engine pods on the real control plane (issue 28): the hostile spec of the finding (the node's
root, busybox, LD_PRELOAD) gets no Deployment and a condition naming the fields; a cache under the
allowed prefix deploys read-only and locked down, with a preStop the API server accepts; a later
refused edit leaves the running Deployment as it was; the PodDisruptionBudget keeps a lone
replica under the real disruption controller and lets one of two go; the chart passes the
settings to the operator."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.control.pod_policy import PodPolicy
from kvscale.control.resources import PRE_STOP_SLEEP_S
from kvscale.control.settings import Settings
from tests.cluster.harness import Cluster, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_chart import render
from tests.cluster.test_operator import condition, create, engine_pods, events, get, wait_phase

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = yaml.safe_load((ROOT / "deploy" / "samples" / "custom-architecture.yaml").read_text())  # one L4 GPU
MODELS = "/var/lib/kvscale-models"
SETTINGS = {"KVSCALE_HOST_PATH_PREFIXES": MODELS, "KVSCALE_ALLOWED_IMAGES": "vllm/vllm-openai"}


@pytest.fixture(scope="module")
def operator(cluster: Cluster, api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
    op = Operator(cluster, tmp_path_factory.mktemp("operator-podsec"), SETTINGS)
    op.start()
    yield op
    op.stop()


def service(name: str, cache: str, **engine: Any) -> dict[str, Any]:
    body = copy.deepcopy(SAMPLE)
    body["metadata"]["name"] = name
    body["spec"]["model"]["cache"] = {"hostPath": cache}
    body["spec"]["engine"].update(engine)
    return dict(body)


def wait_refused(api: client.ApiClient, namespace: str, name: str, generation: int, op: Operator) -> dict[str, Any]:
    def refused() -> bool:
        obj = get(api, namespace, name)
        return bool(
            obj.get("status", {}).get("observedGeneration") == generation
            and condition(obj, "Planned").get("reason") == "NotAllowed"
        )

    try:
        wait_until(refused, 60, f"{name} refused (Planned=False NotAllowed)")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {get(api, namespace, name).get('status')}\n{op.tail()}") from exc
    return get(api, namespace, name)


def host_paths(api: client.ApiClient, namespace: str) -> list[str]:
    """Every hostPath any workload or pod in the namespace mounts."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    specs = [d.spec.template.spec for d in apps.list_namespaced_deployment(namespace).items]
    specs += [p.spec for p in core.list_namespaced_pod(namespace).items]
    return [v.host_path.path for s in specs for v in s.volumes or [] if v.host_path is not None]


def test_the_hostile_spec_gets_no_deployment_and_a_condition_naming_the_fields(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    body = service("hostile", "/", image="busybox", env=[{"name": "LD_PRELOAD", "value": "/host/tmp/x.so"}])
    created = create(api, namespace, body)
    obj = wait_refused(api, namespace, "hostile", created["metadata"]["generation"], operator)
    assert obj["status"]["phase"] == "Failed"
    message = condition(obj, "Planned")["message"]
    assert "spec.model.cache.hostPath: / " in message and "KVSCALE_HOST_PATH_PREFIXES" in message
    assert "spec.engine.image: busybox " in message and "operator.allowedImages" in message
    assert condition(obj, "Ready")["status"] == "False"
    wait_until(
        lambda: any(reason == "NotAllowed" for reason, _ in events(api, namespace, "hostile")), 30, "a NotAllowed Event"
    )
    # The status is written after the children would have been applied: none were.
    assert client.AppsV1Api(api).list_namespaced_deployment(namespace).items == []
    assert host_paths(api, namespace) == []


def test_an_allowed_cache_deploys_read_only_and_a_refused_edit_changes_nothing(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    name = "cached"
    create(api, namespace, service(name, f"{MODELS}/./in-house-3b"))
    wait_phase(api, namespace, name, "Ready", operator, timeout=90)
    apps = client.AppsV1Api(api)
    dep = apps.read_namespaced_deployment(name, namespace)
    pod = dep.spec.template.spec
    [volume] = [v for v in pod.volumes if v.name == "model-cache"]
    assert (volume.host_path.path, volume.host_path.type) == (f"{MODELS}/in-house-3b", "Directory")
    [container] = pod.containers
    [mount] = [m for m in container.volume_mounts if m.name == "model-cache"]
    assert mount.read_only is True
    assert pod.automount_service_account_token is False
    assert pod.security_context.seccomp_profile.type == "RuntimeDefault"
    sc = container.security_context
    assert sc.allow_privilege_escalation is False and sc.capabilities.drop == ["ALL"]
    # The API server kept the native sleep action (its validation: within the grace period).
    assert container.lifecycle.pre_stop.sleep.seconds == PRE_STOP_SLEEP_S < pod.termination_grace_period_seconds
    [running] = engine_pods(api, namespace, name)
    assert running.status.phase == "Running" and running.spec.automount_service_account_token is False
    assert running.spec.containers[0].lifecycle.pre_stop.sleep.seconds == PRE_STOP_SLEEP_S

    # The tenant edits the spec to the node's root: refused, and the running Deployment is untouched.
    before = apps.read_namespaced_deployment(name, namespace)
    patched = client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"model": {"cache": {"hostPath": f"{MODELS}/../../.."}}}}
    )
    obj = wait_refused(api, namespace, name, patched["metadata"]["generation"], operator)
    assert "spec.model.cache.hostPath" in condition(obj, "Planned")["message"]
    after = apps.read_namespaced_deployment(name, namespace)
    assert after.metadata.generation == before.metadata.generation
    assert after.spec.template == before.spec.template
    assert host_paths(api, namespace) == [f"{MODELS}/in-house-3b"] * 2  # the Deployment's and its pod's


def _pdb(api: client.ApiClient, namespace: str, name: str) -> Any:
    return client.PolicyV1Api(api).read_namespaced_pod_disruption_budget(name, namespace)


def _evict(api: client.ApiClient, namespace: str, pod: str) -> int:
    """The eviction subresource's answer: 201 evicted, 429 refused by the budget."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    try:
        client.CoreV1Api(api).create_namespaced_pod_eviction(pod, namespace, body)
    except ApiException as exc:
        return int(exc.status)
    return 201


def test_the_budget_keeps_a_lone_replica_and_lets_one_of_two_go(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    name = "budget"
    body = copy.deepcopy(SAMPLE)
    body["metadata"]["name"] = name
    body["spec"]["scaling"] = {"replicas": 1}
    create(api, namespace, body)
    wait_phase(api, namespace, name, "Ready", operator, timeout=90)

    def budget(expected: int, allowed: int) -> bool:
        st = _pdb(api, namespace, name).status
        return bool(
            st and (st.expected_pods, st.current_healthy, st.disruptions_allowed) == (expected, expected, allowed)
        )

    wait_until(lambda: budget(1, 0), 60, "the disruption controller to count 1 pod")
    assert _pdb(api, namespace, name).status.disruptions_allowed == 0
    [lone] = engine_pods(api, namespace, name)
    assert _evict(api, namespace, lone.metadata.name) == 429  # a drain cannot take the only replica

    # Two replicas, the same budget (the autoscaler would scale without re-applying it).
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"scaling": {"replicas": 2}}}
    )
    wait_until(lambda: budget(2, 1), 90, "the disruption controller to count 2 healthy pods")
    pdb = _pdb(api, namespace, name)
    assert pdb.spec.min_available == "50%" and pdb.spec.unhealthy_pod_eviction_policy == "AlwaysAllow"
    assert pdb.status.disruptions_allowed == 1
    pods = engine_pods(api, namespace, name)
    first, second = (p.metadata.name for p in pods)
    # kwok runs a replacement pod at once, healthy within a moment, after which the disruption
    # controller allows one eviction again: hold replacements Pending (their nodes cordoned) so
    # "never both at once" is what the budget says, not a race with the Deployment controller.
    core = client.CoreV1Api(api)
    product = core.read_node(pods[0].spec.node_name).metadata.labels["nvidia.com/gpu.product"]
    nodes = [n.metadata.name for n in core.list_node(label_selector=f"nvidia.com/gpu.product={product}").items]
    for node in nodes:
        core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        assert _evict(api, namespace, first) == 201
        assert _evict(api, namespace, second) == 429  # never both at once
    finally:
        for node in nodes:
            core.patch_node(node, {"spec": {"unschedulable": None}})


def test_the_chart_passes_the_pod_policy_to_the_operator(cluster: Cluster) -> None:
    def policy(*sets: str) -> PodPolicy:
        dep = next(d for d in render(cluster, *sets) if d["kind"] == "Deployment")
        env = {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}  # type: ignore[index]
        return Settings.from_env(env).pod_policy

    assert policy() == PodPolicy()
    assert policy(
        f"operator.hostPathPrefixes={{{MODELS},/mnt/cache/}}",
        "operator.hostPathWritable=true",
        "operator.allowedImages={vllm/vllm-openai,ghcr.io/my-org/}",
    ) == PodPolicy((MODELS, "/mnt/cache"), True, ("vllm/vllm-openai", "ghcr.io/my-org/"))
