"""The operator runs under deploy/rbac/operator.yaml alone: the verbs written down are enough."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from kubernetes import client

from tests.cluster.harness import Cluster, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_operator import SAMPLES, create, events, wait_phase

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
    operator = Operator(restricted, tmp_path)
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
        # Leftovers in namespaces other tests are deleting may be refused too; RBAC refusals name the account.
        refusal = re.search(r'kvscale-system:kvscale-operator\\?" cannot \w+ resource', operator.tail())
        assert refusal is None, operator.tail()
    finally:
        operator.stop()
