"""Pure builders of the objects an InferenceService owns: Deployment, Service, PodDisruptionBudget.

The label keys and the selector are kvscale.api's (re-exported here for the builders' callers)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvscale.api import LABEL_OWNER_UID, MANAGED_BY, labels, selector
from kvscale.api.models import InferenceServiceSpec
from kvscale.control.inventory import GpuPool
from kvscale.control.labels import serving_labels
from kvscale.control.pod_policy import DEFAULT_POLICY, NotAllowed, PodPolicy, host_path_problem, normal_path
from kvscale.control.pod_policy import check as policy_check
from kvscale.engines.args import PlannedLaunch, plan_launch, requested_source
from kvscale.planner.search import Feasible
from kvscale.sizing.catalog import EngineProfile, GpuSpec, ModelArch
from kvscale.sizing.config import ServingConfig

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
TERMINATION_GRACE_PERIOD_S = 60
# Before the engine gets SIGTERM, the pod stays up while its removal from the endpoints reaches
# every reader: the EndpointSlice controller, kube-proxy on every node and a gateway's endpoint
# picker each learn of the terminating pod through a watch (typically within a few seconds), so
# requests routed in that window still find the engine. The rest of the grace period is the
# engine's own shutdown. Kubernetes' native sleep action needs no `sleep` binary in the image:
# PodLifecycleSleepAction is beta (on) since 1.30 and GA, locked on, in 1.34
# (k8s.io/kubernetes v1.34.4 pkg/features/kube_features.go), and validation requires
# 0 < seconds <= terminationGracePeriodSeconds (pkg/apis/core/validation/validation.go,
# validateSleepAction).
# It is also the drain's bound: a pod a scale-down deletes (the least loaded, kvscale.control.drain)
# has left routing and keeps serving its in-flight requests until the sleep ends; then SIGTERM,
# on which vLLM 0.11 stops at once rather than finishing them (vllm/entrypoints/launcher.py,
# serve_http: the handler cancels the HTTP server task; api_server.py, run_server_worker, shuts
# the engine down before it awaits the server). 30 s covers a chat answer (200 tokens at a
# 50 ms TPOT is 10 s) and leaves half the grace period for the engine's exit. The simulator
# drains as long (kvscale.sim.fleet.DRAIN_BOUND_S; tests/unit/test_drain.py holds them equal).
PRE_STOP_SLEEP_S = 30  # tests/unit/test_pod_security.py checks it against the grace period

# Engine pods run whatever image and arguments a tenant with InferenceService rights wrote, so
# they get no more than an engine needs (issue 28). The vLLM, SGLang and TGI images run as root
# and write under /root/.cache (HF_HOME and compile caches), so runAsNonRoot is not set (those
# images would refuse to start) and the root filesystem stays writable; root inside the container
# keeps only what the container runtime grants after `drop: [ALL]`, cannot gain privileges
# (no_new_privs: setuid binaries do nothing) and runs under the runtime's default seccomp filter.
# GPUs need none of this: the device plugin hands the container its device nodes.
ENGINE_POD_SECURITY: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
PRIVILEGED_PORTS_BELOW = 1024


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


def container_security(port: int) -> dict[str, Any]:
    """The engine container's securityContext. Without capabilities root may not bind a port
    below 1024 (CAP_NET_BIND_SERVICE), so a KVSCALE_ENGINE_PORT there keeps that one (Pod Security's
    restricted profile allows adding it)."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if 0 < port < PRIVILEGED_PORTS_BELOW:
        capabilities["add"] = ["NET_BIND_SERVICE"]
    return {"allowPrivilegeEscalation": False, "capabilities": capabilities}


def image_field(spec: InferenceServiceSpec, engine: EngineProfile, gpu: GpuSpec) -> str:
    """Where the engine's image comes from, as a condition names it."""
    amd = gpu.vendor == "amd"
    field = "spec.engine.rocmImage" if amd else "spec.engine.image"
    written = spec.engine.rocm_image if amd else spec.engine.image
    return field if written is not None else f"{field} (unset: the catalog's image for engine {engine.name})"


def check_policy(spec: InferenceServiceSpec, cfg: ServingConfig, policy: PodPolicy) -> None:
    """NotAllowed, naming every field and the setting that would allow it, when the spec asks for
    a node path or an image `policy` does not allow (EngineImageError first when there is no
    image at all)."""
    image = engine_image(spec, cfg.engine, cfg.gpu)
    host_path = spec.model.cache.host_path if spec.model.cache is not None else None
    problem = policy_check(host_path, image, image_field(spec, cfg.engine, cfg.gpu), policy)
    if problem is not None:
        raise NotAllowed(problem)


def _cache_read_only(spec: InferenceServiceSpec, policy: PodPolicy) -> bool:
    """spec.model.cache.readOnly (a cache filled in advance), or a node path the policy keeps read-only."""
    cache = spec.model.cache
    if cache is None:
        return False
    return cache.read_only or (cache.host_path is not None and not policy.host_path_writable)


def _cache_volume(spec: InferenceServiceSpec, checkpoint_bytes: float | None, policy: PodPolicy) -> dict[str, Any]:
    cache = spec.model.cache
    if cache is None:
        # The pod's own scratch: a restarted container reuses it; a new pod downloads again.
        # Bounded (when the checkpoint's size is known), so a runaway download evicts this pod
        # rather than filling the node's disk.
        if checkpoint_bytes is None:
            return {"name": CACHE_VOLUME, "emptyDir": {}}
        return {"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": cache_size_limit(checkpoint_bytes)}}
    if cache.persistent_volume_claim is not None:
        claim: dict[str, Any] = {"claimName": cache.persistent_volume_claim}
        if cache.read_only:  # the claim itself read-only too, not only this container's mount
            claim["readOnly"] = True
        return {"name": CACHE_VOLUME, "persistentVolumeClaim": claim}
    path = cache.host_path or ""
    problem = host_path_problem(path, policy)  # check_policy refused it first; no builder mounts it either
    if problem is not None:
        raise NotAllowed(problem)
    host_path = normal_path(path)
    # The normalised path, so what was checked is what the kubelet mounts (the API server would
    # refuse `..` anyway: validatePathNoBacksteps). Read-only, the directory must exist (type
    # Directory: an empty directory made for a read-only mount could never be filled through it);
    # writable, the engine downloads into it and the kubelet creates it (DirectoryOrCreate).
    kind = "DirectoryOrCreate" if policy.host_path_writable and not cache.read_only else "Directory"
    return {"name": CACHE_VOLUME, "hostPath": {"path": host_path, "type": kind}}


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
    policy: PodPolicy = DEFAULT_POLICY,
) -> dict[str, Any]:
    """The engine container holding `gpus` GPUs. `serves`: it answers HTTP on the port (ports and
    probes); a multi-node worker that only joins the leader's engine does not. `policy`: whether
    a hostPath cache is mounted read-only."""
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
            {
                "name": CACHE_VOLUME,
                "mountPath": engine.cache_dir,
                **({"readOnly": True} if _cache_read_only(spec, policy) else {}),
            },
        ],
        # Every pod of a multi-node group too: a worker that left first would break the leader's
        # engine while requests still reach it.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_S}}},
        "securityContext": container_security(port),
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
    policy: PodPolicy = DEFAULT_POLICY,
) -> dict[str, Any]:
    """A pod template for engine pods holding `gpus` GPUs each, on nodes of the planned GPU product.
    `checkpoint_bytes` sizes an emptyDir model cache; `policy` says which node path it may be
    (NotAllowed otherwise)."""
    metadata: dict[str, Any] = {"labels": dict(template_labels)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "metadata": metadata,
        "spec": {
            # The engine never talks to the API server: no token for a tenant's image to read.
            "automountServiceAccountToken": False,
            "securityContext": ENGINE_POD_SECURITY,
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
                _cache_volume(spec, checkpoint_bytes, policy),
            ],
            "terminationGracePeriodSeconds": TERMINATION_GRACE_PERIOD_S,
        },
    }


def deployment(
    name: str,
    owner_uid: str,
    spec: InferenceServiceSpec,
    model: ModelArch,
    cfg: ServingConfig,
    chosen: Feasible | None,
    pool: GpuPool,
    replicas: int,
    port: int,
    extra_tolerations: tuple[dict[str, str], ...] = (),
    pool_labels: Mapping[str, str] | None = None,
    policy: PodPolicy = DEFAULT_POLICY,
    launch: PlannedLaunch | None = None,
) -> dict[str, Any]:
    """`pool_labels`: a foreign InferencePool's selector labels, so the pods join it. `policy`: the
    node paths and images the operator allows (NotAllowed, naming the fields, when the spec asks
    for others). `launch`: the planned launch where the caller made it already (one per plan; a
    disaggregated plan's pools have no `chosen` candidate, only their launch)."""
    check_policy(spec, cfg, policy)
    if launch is None:
        if chosen is None:
            raise ValueError("deployment() needs the planned candidate or its launch")
        launch = planned_launch(spec, cfg, chosen.prediction.max_batch, chosen.prediction.kv_cache_tokens, port)
    planned = launch
    command, engine_args = planned.command
    gpus = cfg.gpus  # tensor x pipeline parallel, all on one node
    container = engine_container(
        spec, cfg, planned, pool, gpus, port, command, [*engine_args, *spec.engine.args], policy=policy
    )
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
        policy=policy,
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


def min_available_percent(pods_per_replica: int) -> int:
    """The PodDisruptionBudget's minAvailable, in percent of the engine pods, for replicas of
    `pods_per_replica` pods each (a LeaderWorkerSet group: one lost pod takes its whole group
    down). The disruption controller scales a percentage by the pods' controllers' current scale
    and rounds up (k8s.io/kubernetes v1.34.4 pkg/controller/disruption/disruption.go,
    getExpectedPodCount; apimachinery intstr.GetScaledValueFromIntOrPercent), so with s pods per
    replica and g replicas, p% lets g*s - ceil(p*g*s/100) pods go at once. p = floor(100(2s-1)/2s)
    (50% for a Deployment, 75% for groups of 2) keeps a lone replica or group whole
    (p > 100(s-1)/s) and lets one pod go from two replicas (p <= 100(1-1/2s)); past that, about
    half the replicas at most. Groups of 100 pods or more find no such whole percentage: 100%."""
    s = pods_per_replica
    percent = 100 * (2 * s - 1) // (2 * s)
    return percent if percent * s > 100 * (s - 1) else 100


def pod_disruption_budget(name: str, pods_per_replica: int = 1) -> dict[str, Any]:
    """Voluntary evictions (drains, node upgrades, autoscaler consolidation) never take the only
    replica (or group), and take at most about half of several. A percentage, not a count, because
    the PDB is applied by reconcile only, while the autoscaler moves replicas between 1 and 2 and
    beyond through the scale subresource: the disruption controller re-reads that scale, so one
    body holds at every size. A lone replica thus blocks a drain until it is scaled up or deleted
    by hand: losing the only replica of a model is an outage of minutes (weights load again), which
    a drain should not cause silently. Pods not ready (crash-looping, loading) may always be
    evicted (unhealthyPodEvictionPolicy AlwaysAllow, honoured without a feature gate in 1.34:
    pkg/registry/core/pod/storage/eviction.go), so a broken pod never blocks a drain: it serves
    nothing."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": {
            "minAvailable": f"{min_available_percent(pods_per_replica)}%",
            "selector": {"matchLabels": labels(name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


__all__ = [
    "MANAGED_BY",
    "NotAllowed",
    "check_policy",
    "deployment",
    "engine_image",
    "labels",
    "pod_disruption_budget",
    "selector",
    "service",
]
