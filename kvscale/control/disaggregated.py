"""The children and the status of a disaggregated plan (spec.serving.disaggregation): a prefill
pool and a decode pool, each a Deployment of its own, built with the aggregated Deployment's
builders (kvscale.control.resources). Pure.

- Names: `<service>-prefill` and `<service>-decode`. Both carry the service's labels (instance,
  managed-by: the informers, the PodDisruptionBudget and an owned InferencePool select them) and
  their pods `llm-d.ai/role: prefill|decode` (DESIGN.md; llm-d's P/D scheduler picks each role by
  it); each Deployment selects its own role only, so the two never count each other's pods.
- Engine arguments: the pool's planned launch (its GPU type, TP, batch limit, chunk budget) and
  vLLM 0.11.0's KV connector, `--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":
  "kv_both"}'` on both sides (kvscale.planner.disaggregated.kv_transfer_config: the flag is
  vllm/engine/arg_utils.py's, the fields vllm/config/kv_transfer.py's KVTransferConfig, where
  kv_role must be set once kv_connector is; NixlConnector reads no kv_role: each request's
  kv_transfer_params say which side it is, do_remote_decode on prefill and do_remote_prefill on
  decode, vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py).
- NixlConnector's handshake side channel listens on VLLM_NIXL_SIDE_CHANNEL_HOST (vllm/envs.py,
  default "localhost") at VLLM_NIXL_SIDE_CHANNEL_PORT (5557) + the TP rank, and a finished prefill
  hands the decode side that host as `remote_host` (NixlConnectorScheduler.request_finished):
  at "localhost" no other pod can reach it, so each pool pod sets it to its own IP (the downward
  API's status.podIP), unless spec.engine.env sets it.
- Routing: the plain Service selects the decode pods. A decode pod with kv_both serves a request
  that comes without kv_transfer_params on its own (it prefills locally), so the Service works
  without a P/D-aware router; the prefill pool takes work only behind one, which is why an
  owned InferencePool selects both roles, as llm-d's P/D guides do.
- Behind an InferencePool (spec.routing.inferencePool) each decode pod runs llm-d's routing
  sidecar, as llm-d-inference-scheduler v0.4.0 lays out a P/D pod
  (deploy/components/vllm-sim-pd/deployments.yaml): the endpoint picker's P/D profile picks a
  decode pod and a prefill pod and names the prefill pod in the `x-prefiller-host-port` header
  (pkg/common); the sidecar, on the port the pool targets, sends the prompt to that prefill pod
  with do_remote_decode, then the request with the returned kv_transfer_params to the vLLM beside
  it (pkg/sidecar/proxy, connector `nixlv2` for NixlConnector). So vLLM moves to the port + 200
  (8000 -> 8200, the example's), keeping the port name `http`: the probes, Prometheus'
  PodMonitor and the plain Service reach vLLM itself (the sidecar answers its own /health 200
  whatever vLLM's state, cmd/pd-sidecar and proxy.go createRoutes), the InferencePool's
  targetPorts the sidecar. `--secure-proxy=false`: the sidecar defaults to serving TLS with a
  self-signed certificate, where vLLM and the pool speak plain HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from kvscale.api import LLMD_ROLE, labels
from kvscale.api.models import InferenceServiceSpec, PlannedWorkloadStatus, PlanStatus, PoolPlanStatus
from kvscale.control.inventory import GpuPool
from kvscale.control.pod_policy import DEFAULT_POLICY, PodPolicy
from kvscale.control.resources import container_security, deployment
from kvscale.engines.args import PlannedLaunch, requested_source
from kvscale.planner.disaggregated import DisaggregatedPlan, Pool, Role, kv_transfer_config, pool_launch
from kvscale.sizing.units import format_duration

ROLES: tuple[Role, ...] = ("prefill", "decode")
SERVING_ROLE: Role = "decode"  # the pods the plain Service sends requests to
SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
KV_TRANSFER_FLAG = "--kv-transfer-config"
MAX_REASON = 500
# llm-d's routing sidecar (llm-d-inference-scheduler v0.4.0: cmd/pd-sidecar, image name from its
# Makefile's SIDECAR_IMAGE, ghcr.io/llm-d/llm-d-routing-sidecar; KVSCALE_ROUTING_SIDECAR_IMAGE).
ROUTING_SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-routing-sidecar:v0.4.0"
SIDECAR_ENGINE_PORT_OFFSET = 200  # vLLM's port behind the sidecar: the example's 8000 -> 8200
SIDECAR_CONNECTOR = "nixlv2"  # the sidecar's protocol for vLLM's NixlConnector (proxy.ConnectorNIXLV2)


def pool_name(name: str, role: Role) -> str:
    """The Deployment of the service's `role` pool."""
    return f"{name}-{role}"


def role_labels(name: str, role: Role) -> dict[str, str]:
    """The selector of one pool's pods: the service's labels and the role."""
    return {**labels(name), LLMD_ROLE: role}


def pools_of(plan: DisaggregatedPlan) -> dict[Role, Pool]:
    return {"prefill": plan.prefill, "decode": plan.decode}


def routed(spec: InferenceServiceSpec) -> bool:
    """Whether a P/D-aware router sends the requests (spec.routing.inferencePool): then each decode
    pod runs the routing sidecar on the port and vLLM behind it (module doc)."""
    return spec.routing is not None and spec.routing.inference_pool is not None


def engine_port(spec: InferenceServiceSpec, role: Role, port: int) -> int:
    """The port a pool's vLLM listens on: behind the routing sidecar, the port + 200."""
    return port + SIDECAR_ENGINE_PORT_OFFSET if role == "decode" and routed(spec) else port


def launches(spec: InferenceServiceSpec, plan: DisaggregatedPlan, port: int) -> dict[Role, PlannedLaunch]:
    """Each pool's engine launch, as the aggregated one is made (kvscale.control.resources.
    planned_launch): CheckpointError or ContextLimitError on a spec that cannot be deployed."""
    w = spec.workload
    return {
        role: pool_launch(
            pool,
            requested_source(spec.model.name, spec.model.source, pool.cfg.precision.name),
            w.max_context_tokens,
            w.input_tokens + w.output_tokens,
            engine_port(spec, role, port),
            cached=spec.model.cache is not None,
        )
        for role, pool in pools_of(plan).items()
    }


# llm-d-inference-scheduler v0.4.0's deploy/config/pd-epp-config.yaml, as data: the P/D profile
# handler runs the decode profile, then the prefill profile (threshold 0: every request; plugin
# types from pkg/plugins: prefill-header-handler sets x-prefiller-host-port, prefill-filter and
# decode-filter select pods by llm-d.ai/role, decode also taking role "both").
PICKER_CONFIG: dict[str, Any] = {
    "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [
        {"type": "prefill-header-handler"},
        {"type": "prefix-cache-scorer"},
        {"type": "prefill-filter"},
        {"type": "decode-filter"},
        {"type": "max-score-picker"},
        {"type": "pd-profile-handler"},
    ],
    "schedulingProfiles": [
        {
            "name": role,
            "plugins": [
                {"pluginRef": f"{role}-filter"},
                {"pluginRef": "max-score-picker"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2},
            ],
        }
        for role in ("prefill", "decode")
    ],
}
PICKER_CONFIG_KEY = "pd-epp-config.yaml"


def picker_config_map(name: str) -> dict[str, Any]:
    """The endpoint picker's P/D configuration as a ConfigMap `<name>-epp-pd`, for the picker the
    user runs (`kvscale manifests`; mounted and passed as its `--config-file`): kvscale owns the
    pool, not the picker (docs/gateway.md)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-epp-pd", "labels": labels(name)},
        "data": {PICKER_CONFIG_KEY: yaml.safe_dump(PICKER_CONFIG, sort_keys=False)},
    }


def routing_sidecar(image: str, port: int, vllm_port: int) -> dict[str, Any]:
    """llm-d's routing sidecar as a native sidecar (an init container that keeps running, as the
    llm-d example runs it), serving `port` in front of vLLM's `vllm_port`."""
    return {
        "name": "routing-sidecar",
        "image": image,
        "args": [
            f"--port={port}",
            f"--vllm-port={vllm_port}",
            f"--connector={SIDECAR_CONNECTOR}",
            "--secure-proxy=false",
        ],
        "ports": [{"name": "pd-http", "containerPort": port, "protocol": "TCP"}],
        "restartPolicy": "Always",
        "readinessProbe": {"httpGet": {"path": "/health", "port": "pd-http"}, "periodSeconds": 5},
        # A small Go proxy; requests only, so it never holds back the GPU pod's scheduling much.
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": container_security(port),
    }


def engine_args_problem(spec: InferenceServiceSpec) -> str | None:
    """spec.engine.args may not set the KV connector of a disaggregated service: vLLM takes the
    last one given, which would override the pools' connector."""
    for i, arg in enumerate(spec.engine.args):
        if arg.split("=", 1)[0] == KV_TRANSFER_FLAG:
            return (
                f"spec.engine.args[{i}]: {KV_TRANSFER_FLAG} sets the KV connector, which kvscale sets for the prefill "
                "and decode pools of a disaggregated service (NixlConnector): remove it, or set "
                "spec.serving.disaggregation to off"
            )
    return None


def pool_args(spec: InferenceServiceSpec, launch: PlannedLaunch, role: Role) -> list[str]:
    """The pool's container args: the planned launch's, the KV connector, then spec.engine.args."""
    _, args = launch.command
    return [*args, KV_TRANSFER_FLAG, kv_transfer_config(role), *spec.engine.args]


def _side_channel_env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    if any(e.name == SIDE_CHANNEL_HOST for e in spec.engine.env):
        return []
    return [{"name": SIDE_CHANNEL_HOST, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def pool_deployment(
    name: str,
    owner_uid: str,
    spec: InferenceServiceSpec,
    plan: DisaggregatedPlan,
    role: Role,
    launch: PlannedLaunch,
    gpu_pool: GpuPool,
    replicas: int,
    port: int,
    extra_tolerations: tuple[dict[str, str], ...] = (),
    pool_labels: Mapping[str, str] | None = None,
    policy: PodPolicy = DEFAULT_POLICY,
    sidecar_image: str = ROUTING_SIDECAR_IMAGE,
) -> dict[str, Any]:
    """One pool's Deployment: the aggregated Deployment's body (kvscale.control.resources.
    deployment: image, probes, volumes, security, node affinity to the pool's GPU product) under
    the pool's name, selecting and labelling its role, with the KV connector's args and env
    (EngineImageError, NotAllowed as the aggregated one); a decode pod behind an InferencePool
    with the routing sidecar on `port` and vLLM behind it (module doc)."""
    pool = pools_of(plan)[role]
    vllm_port = engine_port(spec, role, port)
    body = deployment(
        name,
        owner_uid,
        spec,
        pool.cfg.model,
        pool.cfg,
        None,
        gpu_pool,
        replicas,
        vllm_port,
        extra_tolerations,
        pool_labels=pool_labels,
        policy=policy,
        launch=launch,
    )
    selected = role_labels(name, role)
    template = body["spec"]["template"]
    template["metadata"]["labels"] = {**template["metadata"]["labels"], LLMD_ROLE: role}
    container = template["spec"]["containers"][0]
    container["args"] = pool_args(spec, launch, role)
    container["env"] = [*container["env"], *_side_channel_env(spec)]
    if vllm_port != port:
        pod = template["spec"]
        pod["initContainers"] = [*pod.get("initContainers", []), routing_sidecar(sidecar_image, port, vllm_port)]
    body["metadata"] = {**body["metadata"], "name": pool_name(name, role)}
    body["spec"] = {**body["spec"], "selector": {"matchLabels": selected}}
    return body


def pool_deployments(
    name: str,
    owner_uid: str,
    spec: InferenceServiceSpec,
    plan: DisaggregatedPlan,
    gpu_pools: Mapping[Role, GpuPool],
    launched: Mapping[Role, PlannedLaunch],
    replicas: Mapping[Role, int],
    port: int,
    extra_tolerations: tuple[dict[str, str], ...] = (),
    pool_labels: Mapping[str, str] | None = None,
    policy: PodPolicy = DEFAULT_POLICY,
    sidecar_image: str = ROUTING_SIDECAR_IMAGE,
) -> tuple[dict[str, Any], ...]:
    """Both pools' Deployments, prefill first (the operator's and `kvscale manifests`')."""
    return tuple(
        pool_deployment(
            name,
            owner_uid,
            spec,
            plan,
            role,
            launched[role],
            gpu_pools[role],
            replicas[role],
            port,
            extra_tolerations,
            pool_labels,
            policy,
            sidecar_image,
        )
        for role in ROLES
    )


def pool_replicas(plan: DisaggregatedPlan, bounded: Any, pinned: int | None) -> dict[Role, int]:
    """Each pool's workers: spec.scaling.replicas when pinned (each pool runs that many), else the
    plan's within spec.scaling's bounds (`bounded`: ScalingIntent.bounded)."""
    return {role: pinned if pinned is not None else int(bounded(pool.workers)) for role, pool in pools_of(plan).items()}


def _pool_status(
    name: str, role: Role, plan: DisaggregatedPlan, gpu_pool: GpuPool, replicas: int, launch: PlannedLaunch
) -> PoolPlanStatus:
    _, args = launch.command
    pool = pools_of(plan)[role]
    target = plan.prefill_ttft_target_s if role == "prefill" else plan.decode_ttft_target_s
    return PoolPlanStatus(
        gpu_type=pool.cfg.gpu.name,
        gpu_product=gpu_pool.product_label,
        tensor_parallel=pool.cfg.tensor_parallel,
        precision=pool.cfg.precision.name,
        workers=pool.workers,
        replicas=replicas,
        gpus=pool.gpus,
        max_batch=pool.max_batch,
        max_num_batched_tokens=pool.max_num_batched_tokens,
        rate_per_worker=round(pool.rate_per_worker_max, 4),
        cost_per_hour=round(pool.cost_usd_per_hour, 4),
        deployment=pool_name(name, role),
        engine_args=[*args[1:], KV_TRANSFER_FLAG, kv_transfer_config(role)],  # after `vllm serve MODEL`
        ttft_target_seconds=round(target, 6),
    )


def plan_status(
    name: str,
    plan: DisaggregatedPlan,
    gpu_pools: Mapping[Role, GpuPool],
    launched: Mapping[Role, PlannedLaunch],
    replicas: Mapping[Role, int],
    excluded: tuple[str, ...],
    workload: PlannedWorkloadStatus | None,
) -> PlanStatus:
    """status.plan of a disaggregated plan: `prefill` and `decode`, each pool's; the top-level
    configuration fields are the decode pool's (the pods the Service serves from), the
    predictions, the cost and the reason the whole service's."""
    d = plan.decode
    w = plan.request.workload
    return PlanStatus(
        mode="disaggregated",
        gpu_type=d.cfg.gpu.name,
        gpu_product=gpu_pools["decode"].product_label,
        tensor_parallel=d.cfg.tensor_parallel,
        precision=d.cfg.precision.name,
        max_batch=d.max_batch,
        max_context_tokens=launched["decode"].context.max_model_len_tokens,
        max_num_batched_tokens=d.max_num_batched_tokens,
        replicas=d.workers,
        predicted_ttft=format_duration(plan.ttft_p_s),
        predicted_tpot=format_duration(plan.tpot_p_s),
        predicted_ttft_seconds=plan.ttft_p_s,
        predicted_tpot_seconds=plan.tpot_p_s,
        throughput_tokens_per_second=round(d.rate_per_worker_max * w.outputs.mean, 1),
        rate_per_replica=round(d.rate_per_worker_max, 4),
        limited_by="tpot-tail",
        mbu=0.0,
        mfu=0.0,
        cost_per_hour=round(plan.cost_usd_per_hour, 4),
        reason=plan.reason[:MAX_REASON],
        excluded_gpu_types=list(excluded),
        workload=workload,
        prefill=_pool_status(name, "prefill", plan, gpu_pools["prefill"], replicas["prefill"], launched["prefill"]),
        decode=_pool_status(name, "decode", plan, gpu_pools["decode"], replicas["decode"], launched["decode"]),
        kv_transfer_ms=round(plan.kv_transfer_s * 1e3, 3),
        gpus_total=plan.gpus_total,
    )


def summary(plan: DisaggregatedPlan, replicas: Mapping[Role, int]) -> str:
    """The pools as deployed, for the Planned Event."""
    p, d = plan.prefill, plan.decode
    return (
        f"{replicas['prefill']} prefill x {p.cfg.gpus} {p.cfg.gpu.name} (TP{p.cfg.tensor_parallel}, chunk budget "
        f"{p.max_num_batched_tokens}) + {replicas['decode']} decode x {d.cfg.gpus} {d.cfg.gpu.name} "
        f"(TP{d.cfg.tensor_parallel}, max batch {d.max_batch}), {p.cfg.precision.name}, "
        f"${plan.cost_usd_per_hour:.2f}/h at the plan's counts"
    )


SCALING_CONDITION = "PoolsAutoscaled"
SCALING_REASON = "FixedAtPlan"  # pinned by spec.scaling.replicas
AUTOSCALED_REASON = "EachOnItsSignal"  # kvscale.control.pool_scaling ticks them


def scaling_message(plan: DisaggregatedPlan, replicas: Mapping[Role, int], pinned: int | None) -> str:
    """What the pools run at, and who moves them (the PoolsAutoscaled condition)."""
    if pinned is not None:
        return (
            f"prefill {replicas['prefill']}, decode {replicas['decode']} workers: spec.scaling.replicas pins {pinned} "
            "workers in each pool; remove it to scale each pool on its own signal"
        )
    return (
        f"prefill {replicas['prefill']}, decode {replicas['decode']} workers to start (the plan's "
        f"{plan.prefill.workers} and {plan.decode.workers} within minReplicas..maxReplicas, or the running counts); "
        "each pool then scales on its own signal through the scale tick: prefill on its queue, prompt tokens/s and "
        "the TTFT its pods report against its share of the target, decode on running sequences, KV use, "
        "inter-token latency and TPOT"
    )
