"""Pure builders of the objects an InferenceService owns: Deployment, Service, PodDisruptionBudget.

The label keys and the selector are kvscale.api's (re-exported here for the builders' callers)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvscale.api import LABEL_OWNER_UID, MANAGED_BY, labels, selector
from kvscale.api.models import InferenceServiceSpec
from kvscale.operator.inventory import GpuPool
from kvscale.operator.labels import serving_labels
from kvscale.sizing.catalog import EngineProfile, GpuSpec, ModelArch
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.engine_args import PlannedLaunch, plan_launch, requested_source
from kvscale.sizing.planner import Feasible

SHM_BYTES_PER_TP = 2 * 1024**3  # NCCL shared memory for tensor parallelism
# Host resources the engine pod requests (kvscale's sizing rule, not an engine fact): the API
# server and engine-core processes, plus one worker process per GPU. Weights load through the
# page cache (safetensors are memory-mapped), which the kernel can reclaim, so the checkpoint's
# size is not requested as memory. Requests only: no limits, so loading is never CPU-throttled
# or OOM-killed at a guessed ceiling.
ENGINE_CPU_BASE, ENGINE_CPU_PER_GPU = 2, 1
ENGINE_MEMORY_BASE_BYTES, ENGINE_MEMORY_PER_GPU_BYTES = 4 * 1024**3, 2 * 1024**3
# An emptyDir model cache holds one checkpoint download; a quarter more for the hub's
# temporary files and the tokenizer and config, plus 1 GiB.
CACHE_SIZE_MARGIN, CACHE_SIZE_EXTRA_BYTES = 1.25, 1024**3
CACHE_VOLUME = "model-cache"
STARTUP_PROBE_PERIOD_S = 10


def pod_labels(name: str, owner_uid: str, cfg: ServingConfig) -> dict[str, str]:
    """The engine pods' labels: the Deployment's selector, the owner (when known: `kvscale
    manifests` has no uid, and an empty label would only confuse GitOps diffs), and model, GPU
    type and variant."""
    return {
        **labels(name),
        **({LABEL_OWNER_UID: owner_uid} if owner_uid else {}),
        **serving_labels(cfg.model.name, cfg.gpu.name, cfg.tensor_parallel, cfg.precision.name),
    }


def _gib_quantity(nbytes: float) -> str:
    return f"{math.ceil(nbytes / 1024**3)}Gi"


def host_requests(gpus: int) -> dict[str, str]:
    """CPU and memory an engine pod holding `gpus` GPUs requests beside them (see ENGINE_CPU_BASE)."""
    return {
        "cpu": str(ENGINE_CPU_BASE + ENGINE_CPU_PER_GPU * gpus),
        "memory": _gib_quantity(ENGINE_MEMORY_BASE_BYTES + ENGINE_MEMORY_PER_GPU_BYTES * gpus),
    }


def cache_size_limit(checkpoint_bytes: float) -> str:
    """The sizeLimit of an emptyDir model cache: room for one download of the checkpoint."""
    return _gib_quantity(checkpoint_bytes * CACHE_SIZE_MARGIN + CACHE_SIZE_EXTRA_BYTES)


class EngineImageError(ValueError):
    """No container image for the engine on the chosen accelerator; the message names the field."""


def engine_image(spec: InferenceServiceSpec, engine: EngineProfile, gpu: GpuSpec) -> str:
    """spec.engine.rocmImage / image when given, else the catalog's image for the engine and vendor."""
    if gpu.vendor == "amd":
        image = spec.engine.rocm_image or engine.rocm_image
        if image is None:
            raise EngineImageError(
                f"engine {engine.name} has no ROCm image in kvscale's catalog for {gpu.name}: set "
                "spec.engine.rocmImage, or leave AMD GPUs out with spec.hardware.gpuTypes"
            )
        return image
    image = spec.engine.image or engine.image
    if image is None:
        raise EngineImageError(f"engine {engine.name} has no image in kvscale's catalog: set spec.engine.image")
    return image


def planned_launch(
    spec: InferenceServiceSpec, cfg: ServingConfig, max_batch: int, kv_capacity_tokens: int, port: int
) -> PlannedLaunch:
    """The engine launch for a planned candidate (CheckpointError / ContextLimitError on bad specs)."""
    w = spec.workload
    return plan_launch(
        cfg,
        requested_source(spec.model.name, spec.model.source, cfg.precision.name),
        w.max_context_tokens,
        w.input_tokens + w.output_tokens,
        max_batch,
        kv_capacity_tokens,
        port,
        cached=spec.model.cache is not None,
    )


def _cache_volume(spec: InferenceServiceSpec, checkpoint_bytes: float | None) -> dict[str, Any]:
    cache = spec.model.cache
    if cache is None:
        # The pod's own scratch: a restarted container reuses it; a new pod downloads again.
        # Bounded (when the checkpoint's size is known), so a runaway download evicts this pod
        # rather than filling the node's disk.
        if checkpoint_bytes is None:
            return {"name": CACHE_VOLUME, "emptyDir": {}}
        return {"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": cache_size_limit(checkpoint_bytes)}}
    if cache.persistent_volume_claim is not None:
        return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.persistent_volume_claim}}
    return {"name": CACHE_VOLUME, "hostPath": {"path": cache.host_path, "type": "DirectoryOrCreate"}}


def _probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s, "failureThreshold": failures}


def engine_container(
    spec: InferenceServiceSpec,
    cfg: ServingConfig,
    planned: PlannedLaunch,
    pool: GpuPool,
    gpus: int,
    port: int,
    command: list[str],
    args: list[str],
    serves: bool = True,
) -> dict[str, Any]:
    """The engine container holding `gpus` GPUs. `serves`: it answers HTTP on the port (ports and
    probes); a multi-node worker that only joins the leader's engine does not."""
    engine = cfg.engine
    env: list[dict[str, Any]] = [
        {"name": engine.cache_env, "value": engine.cache_dir},
        *({"name": e.name, "value": e.value} for e in spec.engine.env),
    ]
    resource = pool.resource_name
    container: dict[str, Any] = {
        "name": "engine",
        "image": engine_image(spec, engine, cfg.gpu),
        "command": command,
        "args": args,
    }
    if serves:
        container["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    container |= {
        "env": env,
        "resources": {"limits": {resource: str(gpus)}, "requests": {**host_requests(gpus), resource: str(gpus)}},
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": CACHE_VOLUME, "mountPath": engine.cache_dir},
        ],
    }
    if serves:
        startup_failures = math.ceil(planned.startup_probe_budget_s / STARTUP_PROBE_PERIOD_S)
        container |= {
            # The port answers only once weights are loaded: the startup probe allows twice the
            # modelled first start (download into an empty cache + load + engine start).
            "startupProbe": _probe(engine.health_path, STARTUP_PROBE_PERIOD_S, startup_failures),
            # Readiness gates traffic and rollouts on the engine's health (503 once the engine died).
            "readinessProbe": _probe(engine.health_path, 5, 3),
            "livenessProbe": _probe(engine.health_path, 15, 4),
        }
    if spec.model.credentials_secret:
        container["envFrom"] = [{"secretRef": {"name": spec.model.credentials_secret}}]
    return container


def scrape_annotations(cfg: ServingConfig, planned: PlannedLaunch, port: int) -> dict[str, str]:
    """Prometheus scrapes the engine's metrics on its port; the engine and checkpoint for people."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
        "kvscale.io/engine": cfg.engine.name,
        "kvscale.io/checkpoint": planned.checkpoint.source,
    }


def pod_template(
    spec: InferenceServiceSpec,
    cfg: ServingConfig,
    pool: GpuPool,
    container: dict[str, Any],
    gpus: int,
    template_labels: Mapping[str, str],
    annotations: Mapping[str, str],
    extra_tolerations: tuple[dict[str, str], ...] = (),
    checkpoint_bytes: float | None = None,
) -> dict[str, Any]:
    """A pod template for engine pods holding `gpus` GPUs each, on nodes of the planned GPU product.
    `checkpoint_bytes` sizes an emptyDir model cache."""
    metadata: dict[str, Any] = {"labels": dict(template_labels)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "metadata": metadata,
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
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": str(SHM_BYTES_PER_TP * gpus)}},
                _cache_volume(spec, checkpoint_bytes),
            ],
            "terminationGracePeriodSeconds": 60,
        },
    }


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
    planned = planned_launch(spec, cfg, chosen.prediction.max_batch, chosen.prediction.kv_cache_tokens, port)
    command, engine_args = planned.command
    gpus = cfg.gpus  # tensor x pipeline parallel, all on one node
    container = engine_container(spec, cfg, planned, pool, gpus, port, command, [*engine_args, *spec.engine.args])
    template_labels = {**pod_labels(name, owner_uid, cfg), **(pool_labels or {})}
    template = pod_template(
        spec,
        cfg,
        pool,
        container,
        gpus,
        template_labels,
        scrape_annotations(cfg, planned, port),
        extra_tolerations,
        checkpoint_bytes=planned.checkpoint.size_bytes(cfg.model),
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels(name)},
            # Surge one new pod and retire an old one only once it is ready: a one-replica
            # service keeps serving through a spec change (for one model load's time, one
            # extra replica's GPUs are needed).
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": template,
        },
    }


def service(name: str, port: int, pod_selector: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`pod_selector`: the pods behind it (default: every engine pod of the service; a multi-node
    plan's leaders only, the pods that serve HTTP)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": {
            "selector": dict(pod_selector) if pod_selector is not None else labels(name),
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


__all__ = ["MANAGED_BY", "deployment", "engine_image", "labels", "pod_disruption_budget", "selector", "service"]
