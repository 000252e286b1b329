"""Issue 21 on the real API server: a child deleted or edited while the operator runs comes
back (Deployment, Service, PodDisruptionBudget, InferencePool) and status says so; an object
of a child's name that kvscale does not own (another team's Service or Deployment) is never
applied to, adopted or garbage-collected."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.control import inference_pool as ip
from kvscale.operator.k8s import Foreign, Kube
from tests.cluster.harness import Cluster, holds_for, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_inference_pool import install_crd, pools, read_pool, routed, wait_condition
from tests.cluster.test_operator import SAMPLES, condition, create, events, get, objects, wait_phase


def named(name: str) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(SAMPLES["custom-architecture"])
    body["metadata"]["name"] = name
    return body


def readers(api: client.ApiClient, namespace: str) -> dict[str, Callable[[str], Any]]:
    apps, core, pol = client.AppsV1Api(api), client.CoreV1Api(api), client.PolicyV1Api(api)
    return {
        "Deployment": lambda n: apps.read_namespaced_deployment(n, namespace),
        "Service": lambda n: core.read_namespaced_service(n, namespace),
        "PodDisruptionBudget": lambda n: pol.read_namespaced_pod_disruption_budget(n, namespace),
    }


def deleters(api: client.ApiClient, namespace: str) -> dict[str, Callable[[str], Any]]:
    apps, core, pol = client.AppsV1Api(api), client.CoreV1Api(api), client.PolicyV1Api(api)
    return {
        "Deployment": lambda n: apps.delete_namespaced_deployment(n, namespace),
        "Service": lambda n: core.delete_namespaced_service(n, namespace),
        "PodDisruptionBudget": lambda n: pol.delete_namespaced_pod_disruption_budget(n, namespace),
    }


def uid_of(read: Callable[[str], Any], name: str) -> str | None:
    try:
        return str(read(name).metadata.uid)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def owner_uids(obj: Any) -> list[str]:
    return [r.uid for r in obj.metadata.owner_references or []]


@pytest.mark.parametrize("kind", ["Service", "PodDisruptionBudget", "Deployment"])
def test_a_deleted_child_is_recreated_and_status_says_so(
    operator: Operator, api: client.ApiClient, namespace: str, kind: str
) -> None:
    name = "chat"
    create(api, namespace, named(name))
    owner = wait_phase(api, namespace, name, "Ready", operator)["metadata"]["uid"]
    read = readers(api, namespace)[kind]
    before = uid_of(read, name)
    assert before is not None
    deleters(api, namespace)[kind](name)
    try:
        wait_until(lambda: uid_of(read, name) not in (None, before), 30, f"the {kind} re-created")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{operator.tail()}") from exc
    assert owner_uids(read(name)) == [owner]
    # The status is written after the child (a create, then its fields made kvscale's): polled.
    said = f"{kind} {namespace}/{name} (deleted outside kvscale)"
    wait_until(lambda: said in condition(get(api, namespace, name), "Children").get("message", ""), 30, said)
    wait_until(lambda: any(r == "ChildrenRestored" for r, _ in events(api, namespace, name)), 30, "an Event")
    wait_phase(api, namespace, name, "Ready", operator)


def test_a_deleted_deployment_turns_ready_false_until_it_is_back(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    name = "gone"
    create(api, namespace, named(name))
    wait_phase(api, namespace, name, "Ready", operator)
    deleters(api, namespace)["Deployment"](name)
    wait_until(
        lambda: (
            condition(get(api, namespace, name), "Ready").get("reason") in ("DeploymentMissing", "ReplicasNotReady")
        ),
        30,
        "Ready=False while the Deployment is re-created",
    )
    wait_phase(api, namespace, name, "Ready", operator)


def test_an_edited_service_selector_is_reverted(operator: Operator, api: client.ApiClient, namespace: str) -> None:
    name = "edited"
    create(api, namespace, named(name))
    wait_phase(api, namespace, name, "Ready", operator)
    core = client.CoreV1Api(api)
    wanted = dict(core.read_namespaced_service(name, namespace).spec.selector)
    core.patch_namespaced_service(
        name, namespace, [{"op": "replace", "path": "/spec/selector", "value": {"app": "elsewhere"}}]
    )
    wait_until(lambda: core.read_namespaced_service(name, namespace).spec.selector == wanted, 30, "the selector back")
    assert "(edited outside kvscale)" in condition(get(api, namespace, name), "Children")["message"]


def test_a_deleted_owned_inference_pool_is_recreated(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    install_crd(cluster)
    create(api, namespace, routed("routed"))
    wait_condition(api, namespace, "routed", "Owned", operator)
    wait_until(lambda: read_pool(api, namespace, "routed") is not None, 30, "the owned pool")
    first = read_pool(api, namespace, "routed")
    assert first is not None
    pools(api).delete_namespaced_custom_object(ip.GROUP, ip.VERSION, namespace, ip.PLURAL, "routed")

    def back() -> bool:
        pool = read_pool(api, namespace, "routed")
        return pool is not None and pool["metadata"]["uid"] != first["metadata"]["uid"]

    wait_until(back, 30, "the InferencePool re-created")
    assert "InferencePool" in condition(get(api, namespace, "routed"), "Children")["message"]


def foreign_service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"team": "payments"}},
        "spec": {"selector": {"app": "payments"}, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]},
    }


def foreign_deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"team": "ledger"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "ledger:1.0"}]},
            },
        },
    }


def assert_left_alone(
    operator: Operator, api: client.ApiClient, namespace: str, name: str, kind: str, read: Callable[[], Any]
) -> None:
    """The conflict is named in status, one Event, the object never written by kvscale (no
    owner reference, no field kvscale manages); deleting the InferenceService leaves it in place."""
    before = read()
    try:
        wait_until(
            lambda: condition(get(api, namespace, name), "NameConflict").get("status") == "True", 30, "NameConflict"
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{get(api, namespace, name).get('status')}\n{operator.tail()}") from exc
    assert f"{kind} {namespace}/{name}" in condition(get(api, namespace, name), "NameConflict")["message"]
    assert condition(get(api, namespace, name), "Ready")["reason"] == "NameConflict"

    def conflicts() -> int:
        return sum(1 for r, _ in events(api, namespace, name) if r == "NameConflict")

    wait_until(lambda: conflicts() == 1, 30, "a NameConflict Event")
    # The operator retries every KVSCALE_RETRY_BACKOFF (2 s here): a few retries, still one Event.
    holds_for(lambda: conflicts() == 1 and not owner_uids(read()), 7, "one Event, no owner reference")
    assert not [e for e in read().metadata.managed_fields or [] if e.manager == "kvscale-operator"]
    objects(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    wait_until(
        lambda: not objects(api).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
        30,
        "the InferenceService deleted",
    )
    holds_for(lambda: read().metadata.uid == before.metadata.uid, 3, f"the {kind} still there")


def test_a_foreign_service_of_the_same_name_is_left_alone(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_service(namespace, foreign_service("payments"))
    create(api, namespace, named("payments"))
    assert_left_alone(
        operator, api, namespace, "payments", "Service", lambda: core.read_namespaced_service("payments", namespace)
    )
    assert core.read_namespaced_service("payments", namespace).spec.selector == {"app": "payments"}
    assert client.AppsV1Api(api).list_namespaced_deployment(namespace).items == []  # nothing deployed


def test_a_foreign_deployment_of_the_same_name_is_left_alone(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(namespace, foreign_deployment("ledger"))
    create(api, namespace, named("ledger"))
    assert_left_alone(
        operator, api, namespace, "ledger", "Deployment", lambda: apps.read_namespaced_deployment("ledger", namespace)
    )
    dep = apps.read_namespaced_deployment("ledger", namespace)
    assert dep.spec.replicas == 2 and dep.spec.template.spec.containers[0].image == "ledger:1.0"


def test_a_conflict_clears_when_the_foreign_object_goes(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_service(namespace, foreign_service("later"))
    create(api, namespace, named("later"))
    wait_until(lambda: condition(get(api, namespace, "later"), "NameConflict").get("status") == "True", 30, "conflict")
    core.delete_namespaced_service("later", namespace)
    wait_phase(api, namespace, "later", "Ready", operator)
    assert condition(get(api, namespace, "later"), "NameConflict") == {}


def test_a_foreign_service_created_beside_the_inference_service_is_never_taken_over(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    """Issue 28, finding 4: an InferenceService and a foreign Service of its name created at the
    same moment. The operator checked ownership in its informer cache, which had not seen the
    Service yet, then force-applied: 3 of 10 Services were taken over (selector replaced, owner
    reference added) and garbage-collected with the InferenceService. Now a child not yet owned
    is created, never force-applied, and a conflict is a condition."""
    core = client.CoreV1Api(api)
    names = [f"race-{i}" for i in range(10)]
    foreign: list[str] = []
    for name in names:
        create(api, namespace, named(name))
        try:
            core.create_namespaced_service(namespace, foreign_service(name))
            foreign.append(name)
        except ApiException as exc:  # kvscale created its Service first: nothing foreign to take
            assert exc.status == 409, exc
    assert foreign, "every foreign Service lost the race: the test raced nothing"

    def conflicted(name: str) -> bool:
        return bool(condition(get(api, namespace, name), "NameConflict").get("status") == "True")

    def gone(name: str) -> bool:
        try:
            get(api, namespace, name)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    for name in foreign:
        try:
            wait_until(functools.partial(conflicted, name), 60, f"NameConflict on {name}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{get(api, namespace, name).get('status')}\n{operator.tail()}") from exc
    for name in foreign:
        svc = core.read_namespaced_service(name, namespace)
        assert not owner_uids(svc), f"{name}: taken over ({svc.metadata.owner_references})"
        assert svc.spec.selector == {"app": "payments"}, f"{name}: selector replaced ({svc.spec.selector})"
    for name in names:
        objects(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    for name in names:
        wait_until(functools.partial(gone, name), 60, f"{name} deleted")
    # Garbage collection took none of them with the InferenceServices.
    holds_for(
        lambda: all(uid_of(lambda n: core.read_namespaced_service(n, namespace), n) for n in foreign),
        3,
        "the foreign Services still there",
    )


def test_an_env_variable_removed_from_the_spec_leaves_the_deployment(
    operator: Operator, api: client.ApiClient, namespace: str
) -> None:
    """A created child's fields are kvscale's applied fields (its create's managedFields entry
    becomes its apply's, as kubectl's csaupgrade does): a later apply that leaves a field out
    removes it."""
    apps = client.AppsV1Api(api)
    body = named("envs")
    body["spec"]["engine"] = {**body["spec"].get("engine", {}), "env": [{"name": "EXTRA", "value": "1"}]}
    create(api, namespace, body)

    def env() -> list[str]:
        try:
            dep = apps.read_namespaced_deployment("envs", namespace)
        except ApiException:
            return []
        return [e.name for e in dep.spec.template.spec.containers[0].env or []]

    wait_until(lambda: "EXTRA" in env(), 60, "the Deployment with EXTRA")
    objects(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "envs", {"spec": {"engine": {"env": []}}}
    )
    wait_until(lambda: bool(env()) and "EXTRA" not in env(), 60, "EXTRA gone from the Deployment")
    # Made applied right after the create, or (a controller kept writing the status meanwhile,
    # as under a loaded CI) before the next apply at the latest: never left as a create's.
    managers = {
        (e.manager, e.operation) for e in apps.read_namespaced_deployment("envs", namespace).metadata.managed_fields
    }
    assert ("kvscale-operator", "Update") not in managers, managers


def test_an_apply_never_takes_over_an_object_it_does_not_own(api: client.ApiClient, namespace: str) -> None:
    """The write itself, without the operator's earlier checks (as when its cache had not seen
    the object yet): kvscale's apply of a child whose name another's Service holds raises
    Foreign and leaves the Service as it was; the force-apply it replaced took the Service over
    (selector replaced, owner reference added: garbage-collected with the InferenceService)."""
    core = client.CoreV1Api(api)
    core.create_namespaced_service(namespace, foreign_service("taken"))
    # The owner must exist: the garbage collector deletes a dependent whose owner is gone, and
    # a made-up uid had it delete "mine" below while the test read it (issue 39). A ConfigMap,
    # which no operator acts on, stands in for the InferenceService: kvscale's write tells its
    # own object from another's by the controller owner's uid alone (Kube._claim).
    holder = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner-of-mine"))
    )
    uid = holder.metadata.uid
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner-of-mine", "uid": uid}
    child: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "taken",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "kvscale"},
            "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"selector": {"kvscale": "taken"}, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
    }
    kube = Kube(api, backoff_s=1.0)
    with pytest.raises(Foreign) as exc:
        kube.apply(child)
    assert exc.value.view.name == "taken"
    svc = core.read_namespaced_service("taken", namespace)
    assert not owner_uids(svc) and svc.spec.selector == {"app": "payments"}
    assert not [e for e in svc.metadata.managed_fields or [] if e.manager == "kvscale-operator"]
    # Its own child: created when absent, then applied (owned), without a Foreign.
    mine = {**child, "metadata": {**child["metadata"], "name": "mine"}}
    kube.apply(mine)
    kube.apply(mine)
    assert owner_uids(core.read_namespaced_service("mine", namespace)) == [uid]
