"""Pure builders of the objects an InferenceService owns: Deployment, Service, PodDisruptionBudget."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvscale.api.models import InferenceServiceSpec
from kvscale.operator.inventory import GpuPool
from kvscale.operator.labels import serving_labels
from kvscale.sizing.catalog import ModelArch
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.engine_args import vllm_args
from kvscale.sizing.planner import Feasible

MANAGED_BY = "kvscale"
SHM_BYTES_PER_TP = 2 * 1024**3  # NCCL shared memory for tensor parallelism
FIELD_MANAGER = "kvscale-operator"


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "inferenceservice",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def selector(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in labels(name).items())


def pod_labels(name: str, owner_uid: str, cfg: ServingConfig) -> dict[str, str]:
    """The engine pods' labels: the Deployment's selector, the owner, and model, GPU type and variant."""
    return {
        **labels(name),
        "kvscale.io/owner-uid": owner_uid,
        **serving_labels(cfg.model.name, cfg.gpu.name, cfg.tensor_parallel, cfg.precision.name),
    }


def model_source(spec: InferenceServiceSpec, model: ModelArch) -> str:
    """What `vllm serve` loads: spec.model.source without its hf:// scheme, else the name the
    user gave when it is a Hugging Face id, else the catalog's Hugging Face id."""
    name = spec.model.name or ""
    source = spec.model.source or (name if "/" in name else model.hf_id)
    return source.removeprefix("hf://")


def deployment(
    name: str,
    owner_uid: str,
    spec: InferenceServiceSpec,
    model: ModelArch,
    cfg: ServingConfig,
    chosen: Feasible,
    pool: GpuPool,
    replicas: int,
    port: int,
    extra_tolerations: tuple[dict[str, str], ...] = (),
    pool_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`pool_labels`: a foreign InferencePool's selector labels, so the pods join it."""
    max_len = spec.workload.max_context_tokens or spec.workload.input_tokens + spec.workload.output_tokens
    args = [model_source(spec, model), *vllm_args(cfg, chosen.prediction.max_batch, max_len, port), *spec.engine.args]
    env: list[dict[str, Any]] = [{"name": e.name, "value": e.value} for e in spec.engine.env]
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.engine.image,
        "command": ["vllm", "serve"],
        "args": args,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": env,
        "resources": {
            "limits": {pool.resource_name: str(cfg.tensor_parallel)},
            "requests": {pool.resource_name: str(cfg.tensor_parallel)},
        },
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
        # Weight loading takes minutes: the startup probe allows up to 20 of them.
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 120},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 15, "failureThreshold": 4},
    }
    if spec.model.credentials_secret:
        container["envFrom"] = [{"secretRef": {"name": spec.model.credentials_secret}}]
    template_labels = {**pod_labels(name, owner_uid, cfg), **(pool_labels or {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels(name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": template_labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {"key": pool.label_key, "operator": "In", "values": [pool.product_label]}
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "tolerations": [
                        {"key": pool.resource_name, "operator": "Exists", "effect": "NoSchedule"},
                        *extra_tolerations,
                    ],
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "shm",
                            "emptyDir": {"medium": "Memory", "sizeLimit": str(SHM_BYTES_PER_TP * cfg.tensor_parallel)},
                        }
                    ],
                    "terminationGracePeriodSeconds": 60,
                },
            },
        },
    }


def service(name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": {
            "selector": labels(name),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def pod_disruption_budget(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(name)}},
    }
