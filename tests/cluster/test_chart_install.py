"""README's Helm install, as written, on the test cluster: without the Prometheus Operator's API
the chart skips its monitors and rules and says so; with the operator's CRDs (from its Go
module) it creates them: the operator's ServiceMonitor with honorLabels (issue 20, defects 2 and 3), the
engines' PodMonitor without, its target labels winning over a tenant's series (issue 28)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.cluster.harness import Cluster, find_prometheus_operator_crds
from tests.cluster.test_chart import CHART, KUBE_VERSION, helm

ROOT = Path(__file__).resolve().parents[2]
MONITORING = "monitoring.coreos.com"
MONITOR_APIS = [f"{MONITORING}/v1/{kind}" for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule")]


def readme_install() -> list[str]:
    """README's `helm install` command, its continuation lines joined, as arguments."""
    readme = (ROOT / "README.md").read_text()
    for block in re.findall(r"```sh\n(.*?)```", readme, re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            if line.startswith("helm install kvscale charts/kvscale") and "monitoring.enabled=true" in line:
                return shlex.split(line.split("#")[0])
    raise AssertionError("README has no `helm install kvscale charts/kvscale ... monitoring.enabled=true` command")


def test_readme_install_sets_the_image_and_every_observability_option() -> None:
    args = readme_install()
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    keys = {s.split("=", 1)[0] for s in sets}
    assert {"image.repository", "monitoring.enabled", "rules.enabled", "dashboards.enabled"} <= keys
    assert not any(s.startswith("image.repository=ghcr.io/kvscale/") for s in sets)  # not published


def test_monitors_render_only_where_the_api_exists(cluster: Cluster) -> None:
    base = ["template", "kvscale", str(CHART), "--kube-version", KUBE_VERSION, "--namespace", "kvscale-system"]
    base += ["--set", "monitoring.enabled=true", "--set", "rules.enabled=true"]
    without = [d for d in yaml.safe_load_all(helm(cluster, *base).stdout) if d]
    assert not {"PodMonitor", "ServiceMonitor", "PrometheusRule"} & {d["kind"] for d in without}
    apis = [arg for api in MONITOR_APIS for arg in ("--api-versions", api)]
    with_api = [d for d in yaml.safe_load_all(helm(cluster, *base, *apis).stdout) if d]
    monitors = {d["kind"]: d for d in with_api if d["kind"] in ("PodMonitor", "ServiceMonitor", "PrometheusRule")}
    assert set(monitors) == {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    # The operator's series carry the InferenceService's `namespace`: without honorLabels
    # Prometheus renames it exported_namespace and the dashboard is empty.
    assert monitors["ServiceMonitor"]["spec"]["endpoints"][0]["honorLabels"] is True
    assert "namespaceSelector" not in monitors["ServiceMonitor"]["spec"]  # its own namespace only
    # The engines' pods are any tenant's: their target labels win, so a series cannot claim
    # another namespace's pod (issue 28); the forged identity and gateway signals are dropped.
    engines = monitors["PodMonitor"]["spec"]["podMetricsEndpoints"][0]
    assert engines["honorLabels"] is False
    drops = {r.get("action"): r for r in engines["metricRelabelings"]}
    assert re.fullmatch(drops["labeldrop"]["regex"], "exported_namespace")
    assert re.fullmatch(drops["labeldrop"]["regex"], "exported_pod")
    assert not re.fullmatch(drops["labeldrop"]["regex"], "model_name")
    for gateway_metric in ("inference_extension_flow_control_queue_size", "interceptor_pending_request_count"):
        assert re.fullmatch(drops["drop"]["regex"], gateway_metric)
    assert not re.fullmatch(drops["drop"]["regex"], "vllm:num_requests_waiting")


@pytest.mark.parametrize("with_crds", [False, True], ids=["no-prometheus-operator", "prometheus-operator-crds"])
def test_readme_install_works_as_written(
    cluster: Cluster, api: client.ApiClient, namespace: str, with_crds: bool
) -> None:
    args = readme_install()
    assert args[:3] == ["helm", "install", "kvscale"]
    at = args.index("-n") + 1 if "-n" in args else args.index("--namespace") + 1
    release_ns = f"{namespace}-sys"
    args[at] = release_ns  # the README's namespace, made unique for the test
    crds = find_prometheus_operator_crds()
    if with_crds:
        cluster.kubectl("apply", "--server-side", "-f", str(crds))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds))
    try:
        out = helm(cluster, *args[1:])
        custom = client.CustomObjectsApi(api)
        assert client.AppsV1Api(api).read_namespaced_deployment("kvscale", release_ns)
        if with_crds:
            assert "NOT created" not in out.stdout
            pods = custom.list_namespaced_custom_object(MONITORING, "v1", release_ns, "podmonitors")["items"]
            services = custom.list_namespaced_custom_object(MONITORING, "v1", release_ns, "servicemonitors")["items"]
            rules = custom.list_namespaced_custom_object(MONITORING, "v1", release_ns, "prometheusrules")["items"]
            assert len(pods) == len(services) == len(rules) == 1
            assert services[0]["spec"]["endpoints"][0]["honorLabels"] is True  # kept by the CRD's schema
            engines = pods[0]["spec"]["podMetricsEndpoints"][0]
            assert engines["honorLabels"] is False and len(engines["metricRelabelings"]) == 2
        else:
            assert "the PodMonitor and ServiceMonitor were NOT created" in out.stdout
            assert "the alert\nrules were NOT created" in out.stdout
        dashboards = client.CoreV1Api(api).list_namespaced_config_map(release_ns, label_selector="grafana_dashboard=1")
        assert len(dashboards.items) == 1
    finally:
        helm(cluster, "uninstall", "kvscale", "--namespace", release_ns, check=False)
        if with_crds:
            cluster.kubectl("delete", "--ignore-not-found", "--wait=true", "-f", str(crds))
        client.CoreV1Api(api).delete_namespace(release_ns)
