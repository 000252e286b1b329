"""The chart's PodMonitor and ServiceMonitor as the Prometheus Operator turns them into scrape
configs, for a Prometheus on loopback: the tests scrape through the chart's monitor objects,
not through a hand-written job.

Mirrors prometheus-operator v0.85.0 pkg/prometheus/promcfg.go (generatePodMonitorConfig,
generateServiceMonitorConfig) for the fields the chart sets: `honorLabels` -> honor_labels
(default false), `path`, `interval`, the port filter, the target labels the operator adds
(namespace, container, pod, service, job, endpoint) and then the endpoint's `relabelings`;
`metricRelabelings` -> metric_relabel_configs. Kubernetes service discovery is replaced by a
static target carrying the `__meta_kubernetes_*` labels discovery would set (`Discovered`), or
by Prometheus's HTTP service discovery of `kvscale sim serve`'s `/sd`, which lists each pod it
plays as a target of its own with those labels (`scrape_config_sd`): either way the same
relabelling runs on them, per pod. Which pods a monitor selects is the test's to choose.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Discovered:
    """What Kubernetes service discovery would say about one target."""

    address: str  # host:port actually scraped
    namespace: str
    pod: str
    container: str
    port_name: str
    service: str = ""


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    return {_snake(k): v for k, v in rule.items()}


def scrape_config(monitor: dict[str, Any], target: Discovered, *more: Discovered) -> dict[str, Any]:
    """The monitor's job, each target as discovery would describe it."""
    job, port_label = _job(monitor)

    def discovered(t: Discovered) -> dict[str, Any]:
        labels = {
            "__meta_kubernetes_namespace": t.namespace,
            "__meta_kubernetes_pod_name": t.pod,
            "__meta_kubernetes_pod_container_name": t.container,
            port_label: t.port_name,
        }
        if monitor["kind"] == "ServiceMonitor":
            labels |= {
                "__meta_kubernetes_service_name": t.service,
                "__meta_kubernetes_endpointslice_address_target_kind": "Pod",
                "__meta_kubernetes_endpointslice_address_target_name": t.pod,
            }
        return {"targets": [t.address], "labels": labels}

    return {**job, "static_configs": [discovered(t) for t in (target, *more)]}


def scrape_config_sd(monitor: dict[str, Any], sd_url: str, refresh_interval: str = "1s") -> dict[str, Any]:
    """The monitor's job over the targets an HTTP service discovery endpoint lists (each with
    the `__meta_kubernetes_*` labels of a pod, as `kvscale sim serve`'s /sd gives them)."""
    job, _ = _job(monitor)
    return {**job, "http_sd_configs": [{"url": sd_url, "refresh_interval": refresh_interval}]}


def _job(monitor: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The scrape config less its targets, and the discovery label that names a target's port."""
    kind, meta, spec = monitor["kind"], monitor["metadata"], monitor["spec"]
    if kind == "PodMonitor":
        endpoint = spec["podMetricsEndpoints"][0]
        port_label = "__meta_kubernetes_pod_container_port_name"
        relabel: list[dict[str, Any]] = [
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": endpoint["port"],
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        ]
        job = f"podMonitor/{meta['namespace']}/{meta['name']}/0"
    elif kind == "ServiceMonitor":
        endpoint = spec["endpoints"][0]
        port_label = "__meta_kubernetes_endpointslice_port_name"
        relabel = [
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
                "regex": endpoint["port"],
            },
            {
                "source_labels": [
                    "__meta_kubernetes_endpointslice_address_target_kind",
                    "__meta_kubernetes_endpointslice_address_target_name",
                ],
                "separator": ";",
                "regex": "Pod;(.*)",
                "replacement": "${1}",
                "target_label": "pod",
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
        ]
        job = f"serviceMonitor/{meta['namespace']}/{meta['name']}/0"
    else:
        raise ValueError(f"not a monitor: {kind}")
    relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    relabel += [_relabel(r) for r in endpoint.get("relabelings", [])]
    out = {
        "job_name": job,
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": endpoint.get("interval", "30s"),
        "relabel_configs": relabel,
    }
    if endpoint.get("metricRelabelings"):
        out["metric_relabel_configs"] = [_relabel(r) for r in endpoint["metricRelabelings"]]
    return out, port_label


MONITOR_APIS = ("monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/ServiceMonitor")


def chart_monitors(helm: Path, chart: Path, release_namespace: str, kube_version: str) -> dict[str, dict[str, Any]]:
    """The chart's PodMonitor and ServiceMonitor, rendered as a user installs them (monitoring
    on, 1 s scrapes, on a cluster that has the Prometheus Operator's API)."""
    args = ["template", "kvscale", str(chart), "--namespace", release_namespace, "--kube-version", kube_version]
    args += ["--set", "monitoring.enabled=true", "--set", "monitoring.interval=1s"]
    for api_version in MONITOR_APIS:
        args += ["--api-versions", api_version]
    out = subprocess.run([str(helm), *args], capture_output=True, text=True, check=True)
    return {d["kind"]: d for d in yaml.safe_load_all(out.stdout) if d and d["kind"].endswith("Monitor")}
