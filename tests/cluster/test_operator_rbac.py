"""The operator runs under deploy/rbac/operator.yaml alone: the verbs written down are enough."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from kubernetes import client

from kvscale.api import GROUP, PLURAL, VERSION
from kvscale.control import inference_pool as ip
from tests.cluster.harness import Cluster, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_inference_pool import foreign_pool, install_crd, pools, read_pool, routed, wait_condition
from tests.cluster.test_operator import SAMPLES, create, events, objects, wait_phase

ROOT = Path(__file__).resolve().parents[2]


def service_account_kubeconfig(
    cluster: Cluster,
    api: client.ApiClient,
    path: Path,
    namespace: str = "kvscale-system",
    name: str = "kvscale-operator",
) -> Path:
    core = client.CoreV1Api(api)
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "kvscale-operator", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": admin["clusters"][0]["name"], "user": "kvscale-operator"}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def exercise_inference_pools(cluster: Cluster, api: client.ApiClient, namespace: str, operator: Operator) -> None:
    """Every inferencepools verb the role grants: get (adopt check), create and patch (apply the
    owned pool), list and delete (the owned pool removed with spec.routing.inferencePool)."""
    install_crd(cluster)
    create(api, namespace, routed("routed"))
    assert wait_condition(api, namespace, "routed", "Owned", operator)["status"] == "True"
    wait_until(lambda: read_pool(api, namespace, "routed") is not None, 30, "the owned pool")
    shared = foreign_pool(namespace, "shared", {"pool": "shared"})
    pools(api).create_namespaced_custom_object(ip.GROUP, ip.VERSION, namespace, ip.PLURAL, shared)
    create(api, namespace, routed("joiner", name="shared"))
    assert wait_condition(api, namespace, "joiner", "Joined", operator)["status"] == "True"
    objects(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "routed", {"spec": {"routing": {"inferencePool": None}}}
    )
    wait_until(lambda: read_pool(api, namespace, "routed") is None, 60, "the owned pool deleted")


def test_operator_works_under_its_written_rbac(
    cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl("create", "namespace", "kvscale-system", "--dry-run=client", "-o", "yaml")
    if not cluster.kubectl_ok("get", "namespace", "kvscale-system"):
        cluster.kubectl("create", "namespace", "kvscale-system")
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac" / "operator.yaml"))
    kubeconfig = service_account_kubeconfig(cluster, api, tmp_path / "sa.kubeconfig")
    restricted = Cluster(workdir=tmp_path, bins=cluster.bins, external_kubeconfig=kubeconfig)
    operator = Operator(restricted, tmp_path, {"KVSCALE_LEASE_NAMESPACE": "kvscale-system"})
    operator.start()
    try:
        body = SAMPLES["custom-architecture"]
        create(api, namespace, body)
        wait_phase(api, namespace, body["metadata"]["name"], "Ready", operator)
        wait_until(
            lambda: any(r == "Planned" for r, _ in events(api, namespace, body["metadata"]["name"])), 30, "an Event"
        )
        recommend = SAMPLES["mistral-7b-recommend"]
        create(api, namespace, recommend)
        wait_phase(api, namespace, recommend["metadata"]["name"], "Recommended", operator)
        exercise_inference_pools(cluster, api, namespace, operator)
        # Leftovers in namespaces other tests are deleting may be refused too; RBAC refusals name the account.
        refusal = re.search(r'kvscale-system:kvscale-operator\\?" cannot \w+ resource', operator.tail())
        assert refusal is None, operator.tail()
    finally:
        operator.stop()
