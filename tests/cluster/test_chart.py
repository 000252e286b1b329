"""The Helm chart: lint, schema-checked values, manifests the API server accepts, rules promtool
accepts, and an install whose ServiceAccount runs the operator."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.harness import Cluster, find_bins, wait_until
from tests.cluster.processes import Operator
from tests.cluster.test_inference_pool import routed, wait_condition
from tests.cluster.test_operator import SAMPLES, create, wait_phase
from tests.cluster.test_operator_rbac import exercise_inference_pools, service_account_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kvscale"
KUBE_VERSION = "1.34.4"


def helm(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [str(cluster.helm), f"--kubeconfig={cluster.kubeconfig}", *args], capture_output=True, text=True, timeout=180
    )
    if check:
        assert out.returncode == 0, out.stderr
    return out


# The Prometheus Operator's kinds, as a cluster that has them announces them to helm.
MONITORING_APIS = tuple(f"monitoring.coreos.com/v1/{k}" for k in ("PodMonitor", "ServiceMonitor", "PrometheusRule"))


def render(cluster: Cluster, *sets: str, apis: tuple[str, ...] = ()) -> list[dict[str, object]]:
    args = ["template", "kvscale", str(CHART), "--namespace", "kvscale-system", "--kube-version", KUBE_VERSION]
    for api in apis:
        args += ["--api-versions", api]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(cluster, *args).stdout) if d]


def test_chart_files_match_the_sources() -> None:
    files = CHART / "files"
    assert (files / "crd.yaml").read_text() == (ROOT / "crds" / "inferenceservices.kvscale.io.yaml").read_text()
    assert (files / "gpubudget-crd.yaml").read_text() == (ROOT / "crds" / "gpubudgets.kvscale.io.yaml").read_text()
    assert json.loads((files / "dashboard.json").read_text()) == json.loads(
        (ROOT / "deploy" / "grafana" / "kvscale.json").read_text()
    )
    assert yaml.safe_load((files / "rules.yaml").read_text()) == yaml.safe_load(
        (ROOT / "deploy" / "prometheus" / "rules.yaml").read_text()
    )
    role = next(
        d
        for d in yaml.safe_load_all((ROOT / "deploy" / "rbac" / "operator.yaml").read_text())
        if d["kind"] == "ClusterRole"
    )
    chart_rules = yaml.safe_load((files / "rbac-rules.yaml").read_text())
    cluster_rules = yaml.safe_load((files / "rbac-cluster-rules.yaml").read_text())
    pool_rules = yaml.safe_load((files / "rbac-inferencepool-rules.yaml").read_text())
    assert chart_rules + cluster_rules + pool_rules == role["rules"]


def test_inference_pool_rbac_follows_its_value(cluster: Cluster) -> None:
    def pool_rules(*sets: str) -> list[dict[str, Any]]:
        role: dict[str, Any] = next(d for d in render(cluster, *sets) if d["kind"] == "ClusterRole")
        return [r for r in role["rules"] if "inferencepools" in r["resources"]]

    on = pool_rules()
    assert on == [
        {
            "apiGroups": ["inference.networking.k8s.io"],
            "resources": ["inferencepools"],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"],
        }
    ]
    assert pool_rules("inferencePool.enabled=false") == []


def test_helm_lint(cluster: Cluster) -> None:
    out = helm(
        cluster,
        "lint",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "rules.enabled=true,dashboards.enabled=true,monitoring.enabled=true",
    )
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("operator.logLevel=loud", "logLevel"),
        ("operator.prometheusUrl=ftp://x", "prometheusUrl"),
        ("replicaCount=-1", "replicaCount"),
        ("nonsense=1", "nonsense"),
        ("inferencePool.enabled=maybe", "inferencePool"),
    ],
)
def test_schema_rejects_invalid_values(cluster: Cluster, value: str, message: str) -> None:
    out = helm(cluster, "template", "k", str(CHART), "--kube-version", KUBE_VERSION, "--set", value, check=False)
    assert out.returncode != 0 and message in out.stderr


def test_operator_pod_is_locked_down(cluster: Cluster) -> None:
    deployment = next(d for d in render(cluster) if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]  # type: ignore[index]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["limits"] and container["livenessProbe"] and container["readinessProbe"]


def test_observability_objects_are_off_by_default(cluster: Cluster) -> None:
    kinds = {d["kind"] for d in render(cluster)}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap"}
    on = render(
        cluster,
        "rules.enabled=true",
        "dashboards.enabled=true",
        "monitoring.enabled=true",
        "dashboards.label=my_dash",
        apis=MONITORING_APIS,
    )
    assert {"PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap"} <= {d["kind"] for d in on}
    config_map = next(d for d in on if d["kind"] == "ConfigMap")
    assert config_map["metadata"]["labels"]["my_dash"] == "1"  # type: ignore[index]


def test_rendered_rules_pass_promtool(cluster: Cluster, tmp_path: Path) -> None:
    rule = next(d for d in render(cluster, "rules.enabled=true", apis=MONITORING_APIS) if d["kind"] == "PrometheusRule")
    groups = tmp_path / "rules.yaml"
    groups.write_text(yaml.safe_dump(rule["spec"]))
    out = subprocess.run([str(find_bins() / "promtool"), "check", "rules", str(groups)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 rules found" in out.stdout


def test_rendered_manifests_pass_server_side_dry_run(cluster: Cluster, tmp_path: Path) -> None:
    # The Prometheus Operator's kinds are not installed here; everything else goes to the API server.
    docs = [d for d in render(cluster, "dashboards.enabled=true") if d["kind"] not in ("Pod",)]
    if not cluster.kubectl_ok("get", "namespace", "kvscale-system"):
        cluster.kubectl("create", "namespace", "kvscale-system")
    manifest = tmp_path / "all.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    out = cluster.kubectl("apply", "--dry-run=server", "-f", str(manifest))
    assert "(server dry run)" in out


def test_install_runs_the_operator_under_the_charts_account(
    cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    release_ns = f"{namespace}-sys"
    helm(
        cluster,
        "install",
        "kvscale",
        str(CHART),
        "--namespace",
        release_ns,
        "--create-namespace",
        "--set",
        "crds.install=false",
        "--set",
        "serviceAccount.name=kvscale-operator",
    )
    try:
        core = client.CoreV1Api(api)
        assert core.read_namespaced_service_account("kvscale-operator", release_ns)
        # kwok runs no containers, so the operator runs here, with the chart's ServiceAccount token.
        kubeconfig = service_account_kubeconfig(cluster, api, tmp_path / "chart-sa.kubeconfig", namespace=release_ns)
        restricted = Cluster(workdir=tmp_path, bins=cluster.bins, external_kubeconfig=kubeconfig)
        operator = Operator(restricted, tmp_path, {"KVSCALE_LEASE_NAMESPACE": release_ns})
        operator.start()
        try:
            body = SAMPLES["custom-architecture"]
            create(api, namespace, body)
            wait_phase(api, namespace, body["metadata"]["name"], "Ready", operator)
            exercise_inference_pools(cluster, api, namespace, operator)
            # Without the value the role has no inferencepools rule: the pool is refused, the engines deploy.
            helm(
                cluster,
                "upgrade",
                "kvscale",
                str(CHART),
                "--namespace",
                release_ns,
                "--reuse-values",
                "--set",
                "inferencePool.enabled=false",
            )
            create(api, namespace, routed("unrouted"))
            forbidden = wait_condition(api, namespace, "unrouted", "Forbidden", operator)
            assert forbidden["status"] == "False" and "inferencePool.enabled" in forbidden["message"]
            wait_phase(api, namespace, "unrouted", "Ready", operator)
        finally:
            operator.stop()
    finally:
        helm(cluster, "uninstall", "kvscale", "--namespace", release_ns, "--wait")


def test_watched_namespaces_get_roles_and_nothing_else_is_writable(
    cluster: Cluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """With operator.watchNamespaces the chart's ServiceAccount can write children only there
    (checked by impersonation: `kubectl auth can-i --as`), still reads Nodes and pods
    cluster-wide, and the operator runs under it watching that namespace alone."""
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    release_ns = f"{namespace}-rbac"
    helm(
        cluster,
        "install",
        "scoped",
        str(CHART),
        "--namespace",
        release_ns,
        "--create-namespace",
        "--set",
        "crds.install=false",
        "--set",
        "serviceAccount.name=kvscale-scoped",
        "--set",
        f"operator.watchNamespaces={{{namespace}}}",
    )
    try:
        account = f"system:serviceaccount:{release_ns}:kvscale-scoped"

        def can(*args: str) -> bool:
            return cluster.kubectl_ok("auth", "can-i", f"--as={account}", *args)

        for verb, what in [("patch", "services"), ("patch", "deployments"), ("delete", "poddisruptionbudgets")]:
            assert can(verb, what, "-n", namespace), f"{verb} {what} in the watched namespace"
            assert not can(verb, what, "-n", "kube-system"), f"{verb} {what} in kube-system"
            assert not can(verb, what, "-n", release_ns), f"{verb} {what} in the release namespace"
        assert not can("create", "events", "-n", "kube-system")
        assert not can("patch", "inferenceservices.kvscale.io", "-n", "default")
        assert can("list", "nodes") and can("watch", "pods", "--all-namespaces")
        assert can("update", "leases.coordination.k8s.io", "-n", release_ns)
        kubeconfig = service_account_kubeconfig(
            cluster, api, tmp_path / "scoped.kubeconfig", namespace=release_ns, name="kvscale-scoped"
        )
        restricted = Cluster(workdir=tmp_path, bins=cluster.bins, external_kubeconfig=kubeconfig)
        operator = Operator(
            restricted, tmp_path, {"KVSCALE_LEASE_NAMESPACE": release_ns, "KVSCALE_NAMESPACES": namespace}
        )
        operator.start()
        try:
            body = SAMPLES["custom-architecture"]
            name = body["metadata"]["name"]
            create(api, namespace, body)
            wait_phase(api, namespace, name, "Ready", operator)
            core = client.CoreV1Api(api)
            first = core.read_namespaced_service(name, namespace).metadata.uid
            core.delete_namespaced_service(name, namespace)  # the namespaced watch sees it go

            def recreated() -> bool:
                try:
                    return bool(core.read_namespaced_service(name, namespace).metadata.uid != first)
                except ApiException:
                    return False

            wait_until(recreated, 30, "the Service re-created under the namespaced Role")
        finally:
            operator.stop()
    finally:
        helm(cluster, "uninstall", "scoped", "--namespace", release_ns, "--wait")
