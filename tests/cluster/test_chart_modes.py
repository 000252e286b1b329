"""The chart's RBAC in each mode, rendered and run: the operator under the chart's ServiceAccount
stays up past the point where a refused watch used to end it (kopf's nine attempts in 54 s) and
enforces a GPUBudget; under RBAC without GPUBudgets it keeps running and says what is missing.
Also: the hand-run operator's Lease is the chart's, and the chart's NetworkPolicy."""

from __future__ import annotations

import contextlib
import copy
import functools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvscale.api import GROUP, PLURAL, VERSION
from tests.cluster.harness import Cluster, holds_for, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_chart import CHART, KUBE_VERSION, helm, render
from tests.cluster.test_operator import condition, create, events, get
from tests.cluster.test_operator_rbac import service_account_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
USED_TO_EXIT_S = 54 + 10  # kopf's backoffs (1+1+2+3+5+8+13+21 s) and some: past the old exit


def budgeted(name: str, tier: str) -> dict[str, Any]:
    """Several A100 replicas at 30 req/s, one GPU each (3 on the 2023 vLLM profile, 5 on
    vllm-0.11): more than the budget's one."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name, "labels": {"tier": tier}},
        "spec": {
            "model": {"name": "llama-3.1-8b"},
            "workload": {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": 30},
            "slo": {"timeToFirstToken": "1s", "timePerOutputToken": "60ms"},
            "hardware": {"gpuTypes": ["A100-80GB"], "maxTensorParallel": 1},
            "scaling": {"minReplicas": 1, "maxReplicas": 6},
        },
    }


def budget(name: str, namespace: str, tier: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUBudget",
        "metadata": {"name": name},
        "spec": {"limits": {"A100-80GB": 1}, "selector": {"namespaces": [namespace], "matchLabels": {"tier": tier}}},
    }


def rendered(cluster: Cluster, *sets: str) -> list[Any]:
    return list(render(cluster, *sets))


def replicas(api: client.ApiClient, namespace: str, name: str) -> int | None:
    try:
        return int(client.AppsV1Api(api).read_namespaced_deployment(name, namespace).spec.replicas)
    except ApiException:
        return None


def budget_status(api: client.ApiClient, name: str) -> dict[str, Any]:
    found = client.CustomObjectsApi(api).get_cluster_custom_object(GROUP, VERSION, "gpubudgets", name)
    return dict(found.get("status") or {})


def cluster_scoped(cluster: Cluster) -> set[str]:
    """resource.group of every cluster-scoped kind the API server serves (its discovery)."""
    names = cluster.kubectl("api-resources", "--namespaced=false", "-o", "name").split()
    return {n if "." in n else f"{n}." for n in names}


def alive(operator: Operator) -> bool:
    return operator.process is not None and operator.process.poll() is None


@pytest.fixture
def crds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    for crd in (PLURAL, "gpubudgets"):  # polled: a CRD just created has no conditions for `kubectl wait` yet
        established = functools.partial(
            cluster.kubectl_ok, "wait", "--for=condition=Established", f"crd/{crd}.{GROUP}", "--timeout=5s"
        )
        wait_until(established, 60, f"CRD {crd} established")


@pytest.fixture
def second_namespace(api: client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


@pytest.mark.parametrize(
    ("watched", "pools"),
    [
        pytest.param(0, True, id="all-namespaces"),
        pytest.param(1, False, id="one-namespace-without-inferencepools"),
        pytest.param(2, True, id="two-namespaces"),
    ],
)
def test_each_rbac_mode_runs_the_operator_and_enforces_a_budget(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    second_namespace: str,
    crds: None,
    tmp_path: Path,
    watched: int,
    pools: bool,
) -> None:
    namespaces = [namespace, second_namespace][:watched]
    release, release_ns, account = f"m{uuid.uuid4().hex[:6]}", f"{namespace}-sys", "kvscale-modes"
    sets = ["crds.install=false", f"serviceAccount.name={account}", f"inferencePool.enabled={str(pools).lower()}"]
    if namespaces:
        sets.append(f"operator.watchNamespaces={{{','.join(namespaces)}}}")
    # Rendered: cluster-scoped kinds only in the ClusterRole, GPUBudgets there in every mode.
    docs = rendered(cluster, *sets)
    scoped = cluster_scoped(cluster)
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    granted = {(r, v) for rule in cluster_role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert {
        ("gpubudgets", "list"),
        ("gpubudgets", "watch"),
        ("gpubudgets", "patch"),
        ("gpubudgets/status", "patch"),
    } <= granted
    for role in (d for d in docs if d["kind"] == "Role"):
        for rule in role["rules"]:
            for resource in rule["resources"]:
                kind = f"{resource.split('/')[0]}.{rule['apiGroups'][0]}"
                assert kind not in scoped, f"Role {role['metadata']['name']} grants cluster-scoped {kind}"
    # Run: installed, the operator under the chart's account, as many namespaces as the mode watches.
    helm(
        cluster,
        "install",
        release,
        str(CHART),
        "--namespace",
        release_ns,
        "--create-namespace",
        *(a for s in sets for a in ("--set", s)),
    )
    name = f"cap-{release}"
    tier = f"modes-{release}"
    objects = client.CustomObjectsApi(api)
    try:
        kubeconfig = service_account_kubeconfig(cluster, api, tmp_path / "sa.kubeconfig", release_ns, account)
        restricted = Cluster(workdir=tmp_path, bins=cluster.bins, external_kubeconfig=kubeconfig)
        env = {"KVSCALE_LEASE_NAMESPACE": release_ns, "KVSCALE_NAMESPACES": ",".join(namespaces)}
        operator = Operator(restricted, tmp_path, env)
        started = time.monotonic()
        operator.start()
        try:
            objects.create_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget(name, namespace, tier))
            try:  # the operator knows the budget once its timer wrote the budget's status
                wait_until(lambda: "allocated" in budget_status(api, name), 60, "the budget's first status")
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{operator.tail()}") from exc
            create(api, namespace, budgeted(name, tier))
            try:  # wanted 3 replicas, the budget has one A100
                wait_until(lambda: replicas(api, namespace, name) == 1, 60, "the Deployment within the budget")
                wait_until(
                    lambda: condition(get(api, namespace, name), "HeldByBudget").get("status") == "True",
                    30,
                    "HeldByBudget",
                )
            except TimeoutError as exc:
                raise AssertionError(f"{exc}: {get(api, namespace, name).get('status')}\n{operator.tail()}") from exc
            left = USED_TO_EXIT_S - (time.monotonic() - started)
            holds_for(lambda: alive(operator) and replicas(api, namespace, name) == 1, max(left, 1), "running, capped")
            assert "cannot list resource" not in operator.tail(400), operator.tail()
            assert condition(get(api, namespace, name), "BudgetsWatched") == {}
        finally:
            operator.stop()
    finally:
        try:
            objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", name)
        finally:
            helm(cluster, "uninstall", release, "--namespace", release_ns, "--wait")


def test_a_refused_budget_watch_is_a_condition_and_an_event_never_an_exit(
    cluster: Cluster, api: client.ApiClient, namespace: str, crds: None, tmp_path: Path
) -> None:
    """Under the written RBAC without its GPUBudget rules: the operator keeps running past the old
    exit, each InferenceService says what is missing, and once granted the budget applies."""
    account, system = f"nobudget-{uuid.uuid4().hex[:6]}", f"{namespace}-sys"
    written = list(yaml.safe_load_all((ROOT / "deploy" / "rbac" / "operator.yaml").read_text()))
    role = copy.deepcopy(next(d for d in written if d["kind"] == "ClusterRole"))
    budget_rules = [r for r in role["rules"] if any(x.startswith("gpubudgets") for x in r["resources"])]
    assert budget_rules, "the written ClusterRole grants GPUBudgets"
    role["rules"] = [r for r in role["rules"] if r not in budget_rules]
    role["metadata"] = {"name": account}
    rbac = client.RbacAuthorizationV1Api(api)
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=system)))
    core.create_namespaced_service_account(system, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account)))
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": system}]
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": account},
            "subjects": subject,
        }
    )
    lease_role = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    rbac.create_namespaced_role(system, {"metadata": {"name": account}, "rules": [lease_role]})
    rbac.create_namespaced_role_binding(
        system,
        {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": subject,
        },
    )
    name, tier = f"refused-{account}", f"refused-{account}"
    objects = client.CustomObjectsApi(api)
    objects.create_cluster_custom_object(GROUP, VERSION, "gpubudgets", budget(name, namespace, tier))
    try:
        kubeconfig = service_account_kubeconfig(cluster, api, tmp_path / "sa.kubeconfig", system, account)
        restricted = Cluster(workdir=tmp_path, bins=cluster.bins, external_kubeconfig=kubeconfig)
        operator = Operator(restricted, tmp_path, {"KVSCALE_LEASE_NAMESPACE": system})
        started = time.monotonic()
        operator.start()
        try:
            create(api, namespace, budgeted(name, tier))

            def said() -> dict[str, Any]:
                return condition(get(api, namespace, name), "BudgetsWatched")

            try:
                wait_until(lambda: said().get("reason") == "Forbidden", 60, "BudgetsWatched=False")
            except TimeoutError as exc:
                raise AssertionError(f"{exc}: {get(api, namespace, name).get('status')}\n{operator.tail()}") from exc
            message = said()["message"]
            assert said()["status"] == "False"
            assert message.startswith("the operator may not list, watch, patch gpubudgets.kvscale.io cluster-wide")
            assert "GPUBudgets are not enforced" in message and "rbac-cluster-rules.yaml" in message
            wait_until(lambda: ("Forbidden", message) in events(api, namespace, name), 30, "a Forbidden Event")
            assert "Access refused, retrying with backoff: the operator may not list, watch, patch gpubudgets" in (
                operator.tail(400)
            )
            left = USED_TO_EXIT_S - (time.monotonic() - started)
            holds_for(lambda: alive(operator), max(left, 1), "the operator running past the old exit")
            # no budget known: not capped (and now said so): the plan's count, above the limit of 1
            planned = get(api, namespace, name)["status"]["plan"]["replicas"]
            assert replicas(api, namespace, name) == planned > 1
            # Granted: the watch, retried, lists the budget; the condition goes with a Normal Event.
            role["rules"] = role["rules"] + budget_rules
            rbac.replace_cluster_role(account, role)
            try:
                wait_until(lambda: said() == {}, 150, "BudgetsWatched gone")
                wait_until(lambda: "allocated" in budget_status(api, name), 150, "the budget's status")
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{operator.tail()}") from exc
            assert any(r == "BudgetsWatched" for r, _ in events(api, namespace, name))
            assert alive(operator), operator.tail()
        finally:
            operator.stop()
    finally:
        objects.delete_cluster_custom_object(GROUP, VERSION, "gpubudgets", name)
        rbac.delete_cluster_role_binding(account)
        rbac.delete_cluster_role(account)
        core.delete_namespace(system)


def test_a_hand_run_operator_stands_by_for_the_charts_lease(
    cluster: Cluster, api: client.ApiClient, crds: None, tmp_path: Path
) -> None:
    """The README's install (`helm install kvscale charts/kvscale -n kvscale-system`) names its
    Lease in the Deployment; an operator started by hand with no Lease settings takes the same
    one, so one leads and the other stands by."""
    deployment = next(d for d in rendered(cluster) if d["kind"] == "Deployment")
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    release_ns = "kvscale-system"  # render()'s --namespace, the README's
    if not cluster.kubectl_ok("get", "namespace", release_ns):
        cluster.kubectl("create", "namespace", release_ns)
    charts = Operator(cluster, tmp_path / "chart", {"KVSCALE_LEASE_NAME": env["KVSCALE_LEASE_NAME"]})
    charts.env["KVSCALE_LEASE_NAMESPACE"] = release_ns  # in its pod: the release namespace
    by_hand = Operator(cluster, tmp_path / "hand")
    del by_hand.env["KVSCALE_LEASE_NAME"], by_hand.env["KVSCALE_LEASE_NAMESPACE"]  # the defaults
    for op in (charts, by_hand):
        op.log.parent.mkdir()
    coordination = client.CoordinationV1Api(api)

    def holder() -> str:
        try:
            lease = coordination.read_namespaced_lease(env["KVSCALE_LEASE_NAME"], release_ns)
        except ApiException:
            return ""
        return str(lease.spec.holder_identity or "")

    charts.start()
    try:
        wait_until(lambda: holder() != "", 60, "the chart's operator to take its Lease")
        leader_id = holder()
        by_hand.start()
        try:
            lease = f"{release_ns}/{env['KVSCALE_LEASE_NAME']}"
            wait_until(lambda: f"Standing by: Lease {lease} is held by" in by_hand.tail(), 60, "the hand-run standby")
            holds_for(lambda: holder() == leader_id and "Leading" not in by_hand.tail(), 5, "one leader")
        finally:
            by_hand.stop()
    finally:
        charts.stop()
        with contextlib.suppress(ApiException):
            coordination.delete_namespaced_lease(env["KVSCALE_LEASE_NAME"], release_ns)


def test_network_policy_renders_only_when_asked_and_the_api_server_accepts_it(cluster: Cluster, tmp_path: Path) -> None:
    assert not [d for d in rendered(cluster) if d["kind"] == "NetworkPolicy"]
    deployment = next(d for d in rendered(cluster) if d["kind"] == "Deployment")
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KVSCALE_METRICS_ADDRESS"] == "0.0.0.0"  # Prometheus scrapes the pod IP
    prometheus = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"networkPolicy": {"enabled": True, "metricsFrom": [prometheus]}}))
    docs = rendered(cluster, "networkPolicy.enabled=true")  # nobody may scrape: only the health rule
    (closed,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert closed["spec"]["ingress"] == [{"ports": [{"port": "health", "protocol": "TCP"}]}]
    args = ["template", "kvscale", str(CHART), "--namespace", "kvscale-system", "--kube-version", KUBE_VERSION]
    args += ["-f", str(values)]
    (policy,) = [d for d in yaml.safe_load_all(helm(cluster, *args).stdout) if d and d["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert spec["policyTypes"] == ["Ingress"]  # egress (API server, Prometheus) is not limited
    assert spec["ingress"] == [
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [prometheus]},
        {"ports": [{"port": "health", "protocol": "TCP"}]},  # the kubelet's probes, from the node
    ]
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {"metrics", "health"} <= ports  # the policy's named ports exist on the pod
    if not cluster.kubectl_ok("get", "namespace", "kvscale-system"):
        cluster.kubectl("create", "namespace", "kvscale-system")
    manifest = tmp_path / "policy.yaml"
    manifest.write_text(yaml.safe_dump(policy))
    assert "(server dry run)" in cluster.kubectl("apply", "--dry-run=server", "-f", str(manifest))
    out = helm(
        cluster,
        "template",
        "k",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "networkPolicy.metricsFrom[0]=",
        check=False,
    )
    assert out.returncode != 0 and "networkPolicy" in out.stderr  # a peer must say who
