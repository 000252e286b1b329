"""The LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, Go module sigs.k8s.io/lws) for a plan larger
than a node, and the engines' own multi-node launch inside it. Pure: builders of dicts.

A group is one copy of the model: `size` pods (one per node: the leader and size - 1 workers),
each holding the GPUs of one node; spec.replicas counts groups and is what the scale subresource
(.spec.replicas) scales. Names checked against sigs.k8s.io/lws v0.7.0:
- api/leaderworkerset/v1/leaderworkerset_types.go: spec.replicas, spec.leaderWorkerTemplate
  {size, restartPolicy, leaderTemplate, workerTemplate}, spec.startupPolicy, spec.rolloutStrategy;
  the env vars LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX that the LWS pod webhook puts
  first in every container's env (pkg/utils/pod/pod_utils.go), so `$(VAR)` in a command expands;
  the pod labels leaderworkerset.sigs.k8s.io/name and .../worker-index (0 on the leader).
- config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml: the scale subresource
  (specReplicasPath .spec.replicas, statusReplicasPath .status.replicas) and status.readyReplicas
  (groups whose every pod is ready).
- docs/examples/vllm/GPU/lws.yaml and docs/examples/sglang/lws.yaml: the leader/worker launch and
  a Service that selects the leaders only.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from kvscale.api import labels
from kvscale.api.models import InferenceServiceSpec
from kvscale.control.inventory import GpuPool
from kvscale.control.pod_policy import DEFAULT_POLICY, PodPolicy
from kvscale.control.resources import check_policy, engine_container, pod_template, scrape_annotations
from kvscale.engines.args import PlannedLaunch
from kvscale.sizing.config import ServingConfig

GROUP = "leaderworkerset.x-k8s.io"
VERSION = "v1"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"
API_VERSION = f"{GROUP}/{VERSION}"

# Set by the LWS controller and webhook (api/leaderworkerset/v1/leaderworkerset_types.go).
LABEL_SET_NAME = "leaderworkerset.sigs.k8s.io/name"
LABEL_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
ENV_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
ENV_GROUP_SIZE = "LWS_GROUP_SIZE"
ENV_WORKER_INDEX = "LWS_WORKER_INDEX"

# kvscale's own: which pods of a group serve HTTP (the Service and the InferencePool select them).
LABEL_ROLE = "kvscale.io/role"
LEADER, WORKER = "leader", "worker"

# vLLM over Ray: the leader starts the Ray head, workers join it, and `vllm serve` on the leader
# places its TP x PP workers on the Ray cluster (--distributed-executor-backend ray; vLLM 0.11.0
# vllm/engine/arg_utils.py). vLLM waits for the placement group up to 1800 s
# (vllm/executor/ray_utils.py, PG_WAIT_TIMEOUT), so the leader need not wait for its workers
# itself; a worker retries until the leader's Ray head answers. Ray is a dependency of the vLLM
# wheel (Requires-Dist: ray[cgraph]), so the vllm/vllm-openai image has `ray`.
RAY_PORT = 6379
RAY_RETRY_S = 5
# SGLang: every node runs sglang.launch_server with --nnodes, its --node-rank and the leader's
# --dist-init-addr (sglang 0.5.23 sglang/srt/arg_groups/fields/parallel.py; port as in LWS's
# example). With --pp-size equal to --nnodes, node r runs pipeline stage r on --tp-size GPUs
# (sglang/srt/entrypoints/engine.py, pp_size_per_node and tp_size_per_node).
SGLANG_DIST_INIT_PORT = 20000

# The LWS controller makes a headless Service named after the LeaderWorkerSet (the pods' DNS
# subdomain, which LWS_LEADER_ADDRESS resolves through) unless a Service of that name exists
# (pkg/utils/controller, CreateHeadlessServiceIfNotExists): the set must not take the name of
# kvscale's own Service.
NAME_SUFFIX = "-lws"
# Its worker StatefulSets are <set>-<group>, and a StatefulSet's pods carry the label
# controller-revision-hash=<statefulset>-<10-character hash>, at most 63 characters.
MAX_SET_NAME = 63 - len("-0000") - 11


def set_name(service_name: str) -> str:
    return f"{service_name}{NAME_SUFFIX}"


def name_problem(service_name: str) -> str | None:
    """Why a multi-node plan cannot be deployed under this name, or None."""
    name = set_name(service_name)
    if len(name) <= MAX_SET_NAME:
        return None
    longest = MAX_SET_NAME - len(NAME_SUFFIX)
    return (
        f"metadata.name: {service_name!r} is too long for a plan across nodes: its LeaderWorkerSet {name} "
        f"names StatefulSets and pod labels of at most 63 characters; use at most {longest} characters"
    )


class MultiNodeUnsupported(ValueError):
    """The engine cannot run one model across nodes; the message names the field."""


def leader_labels(name: str) -> dict[str, str]:
    """The selector of a multi-node service's leader pods (its Service and InferencePool)."""
    return {**labels(name), LABEL_ROLE: LEADER}


def multi_node_commands(
    engine: str, command: list[str], args: list[str], nodes: int, data_parallel_local: int = 0
) -> tuple[tuple[list[str], list[str]], tuple[list[str], list[str]]]:
    """(leader command, args), (worker command, args) for the engine's launch `command args` (its
    own flags with the plan's tensor and pipeline parallelism, spec.engine.args included) spread
    over `nodes` nodes. `data_parallel_local`: data-parallel attention ranks per node (vLLM's
    multi-node data parallel, no Ray: vllm/entrypoints/cli/serve.py run_headless for the
    workers; engine/arg_utils.py --data-parallel-size-local, --data-parallel-address,
    --data-parallel-start-rank, the RPC port left at ParallelConfig's default 29550)."""
    if engine == "vllm" and data_parallel_local > 0:
        where = [
            "--data-parallel-size-local",
            str(data_parallel_local),
            "--data-parallel-address",
            f"$({ENV_LEADER_ADDRESS})",
        ]
        leader_args = [*args, *where]
        # $$ is Kubernetes' escape for $: the shell computes this node's first rank
        start = f"$$(({ENV_WORKER_INDEX} * {data_parallel_local}))"
        worker = f"exec {shlex.join([*command, *args, *where, '--headless'])} --data-parallel-start-rank {start}"
        return (list(command), leader_args), (["/bin/sh", "-c"], [worker])
    if engine == "vllm":
        serve = [*command, *args, "--distributed-executor-backend", "ray"]
        leader = f"ray start --head --port={RAY_PORT} && exec {shlex.join(serve)}"
        worker = (
            f"until ray start --address=$({ENV_LEADER_ADDRESS}):{RAY_PORT} --block; "
            f"do echo waiting for the Ray head on $({ENV_LEADER_ADDRESS}); sleep {RAY_RETRY_S}; done"
        )
        return (["/bin/sh", "-c"], [leader]), (["/bin/sh", "-c"], [worker])
    if engine == "sglang":
        every = [
            *args,
            "--nnodes",
            str(nodes),
            "--node-rank",
            f"$({ENV_WORKER_INDEX})",
            "--dist-init-addr",
            f"$({ENV_LEADER_ADDRESS}):{SGLANG_DIST_INIT_PORT}",
        ]
        return (list(command), every), (list(command), list(every))
    raise MultiNodeUnsupported(
        f"spec.engine.type: {engine} runs a model within one node; this plan needs {nodes} nodes: "
        "use engine vllm or sglang, or allow GPUs whose node holds the model (spec.hardware.gpuTypes)"
    )


def leader_worker_set(
    name: str,
    spec: InferenceServiceSpec,
    cfg: ServingConfig,
    planned: PlannedLaunch,
    pool: GpuPool,
    groups: int,
    port: int,
    template_labels: Mapping[str, str],
    extra_tolerations: tuple[dict[str, str], ...] = (),
    policy: PodPolicy = DEFAULT_POLICY,
) -> dict[str, Any]:
    """`groups` copies of the model, each on cfg.nodes pods of cfg.gpus_per_node GPUs (tensor
    parallel within a node, pipeline parallel across nodes). `template_labels`: the engine pods'
    labels (selector, owner, serving labels and a foreign pool's labels when joining one); the
    role label is added per template. `policy`: the node paths and images the operator allows."""
    check_policy(spec, cfg, policy)  # EngineImageError, then NotAllowed, before anything else
    nodes, gpus = cfg.nodes, cfg.gpus_per_node
    command, engine_args = planned.command
    (lead_cmd, lead_args), (work_cmd, work_args) = multi_node_commands(
        cfg.engine.name,
        command,
        [*engine_args, *spec.engine.args],
        nodes,
        cfg.gpus_per_node if cfg.data_parallel > 1 else 0,
    )
    sglang = cfg.engine.name == "sglang"
    leader = pod_template(
        spec,
        cfg,
        pool,
        engine_container(spec, cfg, planned, pool, gpus, port, lead_cmd, lead_args, policy=policy),
        gpus,
        {**template_labels, LABEL_ROLE: LEADER},
        scrape_annotations(cfg, planned, port),
        extra_tolerations,
        policy=policy,
    )
    # SGLang's other ranks answer /health on the port too (a stand-in server); vLLM's Ray workers
    # serve nothing: a worker's readiness is its process running.
    worker = pod_template(
        spec,
        cfg,
        pool,
        engine_container(spec, cfg, planned, pool, gpus, port, work_cmd, work_args, serves=sglang, policy=policy),
        gpus,
        {**template_labels, LABEL_ROLE: WORKER},
        {},
        extra_tolerations,
        policy=policy,
    )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": set_name(name), "labels": labels(name)},
        "spec": {
            "replicas": groups,
            # Workers start with their leader, not after it is ready: a vLLM leader is ready only
            # once its workers have joined.
            "startupPolicy": "LeaderCreated",
            # Like the Deployment: one new group comes up before an old one goes.
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "leaderWorkerTemplate": {
                "size": nodes,
                # One pod lost breaks the model's collective: the whole group restarts together.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }
