"""The LeaderWorkerSet builder for a plan larger than a node: groups, pods per group, GPUs per pod,
the engines' multi-node launch, the leader-only Service (hand-made plans: TP 8 x PP 2 on H100)."""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Any

import pytest

from kvscale.api import labels
from kvscale.api.intent import parse_intent
from kvscale.control import leader_worker_set as lws
from kvscale.control.inventory import GpuPool
from kvscale.control.resources import EngineImageError, service
from kvscale.control.settings import parse_tolerations
from kvscale.engines.args import PlannedLaunch, plan_launch
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig

CAT = default_catalog()
H100 = CAT.gpu("H100-SXM")
POOL = GpuPool("H100-SXM", H100.node_labels[0], H100.label_key, H100.resource_name, 32, 0, 8)
SPEC: dict[str, Any] = {
    "model": {"name": "llama-3.1-405b", "credentialsSecret": "hf"},
    "workload": {"inputTokens": 2048, "outputTokens": 256, "requestsPerSecond": 1},
    "slo": {"timeToFirstToken": "5s", "timePerOutputToken": "100ms"},
    "engine": {"args": ["--enable-prefix-caching"]},
}


def launch(engine: str = "vllm") -> tuple[ServingConfig, PlannedLaunch]:
    """405B in bf16 as TP 8 x PP 2 on two H100 nodes (a hand-made plan)."""
    cfg = ServingConfig.build(CAT, CAT.model("llama-3.1-405b"), H100, "bf16", 8, engine=engine, pipeline_parallel=2)
    assert (cfg.nodes, cfg.gpus_per_node) == (2, 8)
    planned = plan_launch(cfg, "meta-llama/Llama-3.1-405B", 8192, 2304, 64, 100_000, 8000, cached=False)
    return cfg, planned


def build(engine: str = "vllm", groups: int = 3, **spec: Any) -> dict[str, Any]:
    intent = parse_intent({**SPEC, "engine": {**SPEC["engine"], "type": engine}, **spec})
    cfg, planned = launch(engine)
    pod = {**labels("big"), "kvscale.io/owner-uid": "uid-1"}
    tolerations = parse_tolerations("kwok.x-k8s.io/node:NoSchedule")
    return lws.leader_worker_set("big", intent.spec, cfg, planned, POOL, groups, 8000, pod, tolerations)


def templates(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    t = obj["spec"]["leaderWorkerTemplate"]
    return t["leaderTemplate"], t["workerTemplate"]


def test_groups_of_whole_nodes() -> None:
    obj = build(groups=3)
    assert obj["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and obj["kind"] == "LeaderWorkerSet"
    # Not the Service's name: the LWS controller's headless Service takes the set's name.
    assert obj["metadata"]["name"] == "big-lws" and obj["metadata"]["labels"] == labels("big")
    assert obj["spec"]["replicas"] == 3  # groups: what the scale subresource counts
    t = obj["spec"]["leaderWorkerTemplate"]
    assert t["size"] == 2 and t["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert obj["spec"]["startupPolicy"] == "LeaderCreated"
    for template in templates(obj):
        pod = template["spec"]
        container = pod["containers"][0]
        # TP 8 x PP 2 over 2 nodes: every pod holds one node's 8 GPUs.
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
        assert container["resources"]["requests"] == {"cpu": "10", "memory": "20Gi", "nvidia.com/gpu": "8"}
        term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["nodeSelectorTerms"][0]["matchExpressions"] == [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
        ]
        assert {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert container["envFrom"] == [{"secretRef": {"name": "hf"}}]  # every node loads its own shards
        assert pod["volumes"][0]["emptyDir"]["sizeLimit"] == str(8 * 2 * 1024**3)
        assert template["metadata"]["labels"]["kvscale.io/owner-uid"] == "uid-1"


def test_vllm_runs_over_ray() -> None:
    leader, worker = templates(build("vllm"))
    lead, work = leader["spec"]["containers"][0], worker["spec"]["containers"][0]
    assert lead["command"] == work["command"] == ["/bin/sh", "-c"]
    head, serve = lead["args"][0].split(" && exec ")
    assert head == "ray start --head --port=6379"
    argv = shlex.split(serve)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-405B"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert "--enable-prefix-caching" in argv  # spec.engine.args reach the leader's vllm serve
    # Workers join the leader's Ray head by the address the LWS webhook puts in their env.
    assert "ray start --address=$(LWS_LEADER_ADDRESS):6379 --block" in work["args"][0]
    assert "vllm serve" not in work["args"][0]
    # Only the leader serves HTTP: probes, port and Prometheus annotations on it alone.
    assert lead["readinessProbe"]["httpGet"]["path"] == "/health" and lead["ports"][0]["containerPort"] == 8000
    assert not {"ports", "startupProbe", "readinessProbe", "livenessProbe"} & set(work)
    assert leader["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert "annotations" not in worker["metadata"]
    assert leader["metadata"]["labels"][lws.LABEL_ROLE] == "leader"
    assert worker["metadata"]["labels"][lws.LABEL_ROLE] == "worker"


def test_sglang_ranks_every_node() -> None:
    leader, worker = templates(build("sglang"))
    lead, work = leader["spec"]["containers"][0], worker["spec"]["containers"][0]
    assert lead["command"] == work["command"] == ["python3", "-m", "sglang.launch_server"]
    assert lead["args"] == work["args"]
    args = lead["args"]
    assert args[args.index("--tp-size") + 1] == "8"
    assert args[args.index("--pp-size") + 1] == "2"
    assert args[args.index("--nnodes") + 1] == "2"
    assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert args[args.index("--dist-init-addr") + 1] == "$(LWS_LEADER_ADDRESS):20000"
    # SGLang's other ranks answer /health on the port (a stand-in server): probed like the leader.
    assert work["readinessProbe"]["httpGet"]["path"] == "/health"


def test_tgi_and_missing_images_are_refused_naming_the_field() -> None:
    with pytest.raises(lws.MultiNodeUnsupported, match=r"spec.engine.type: tgi .* 2 nodes"):
        lws.multi_node_commands("tgi", ["text-generation-launcher"], [], 2)
    intent = parse_intent(SPEC)
    cfg, planned = launch()
    no_image = replace(cfg, engine=cfg.engine.model_copy(update={"image": None}))
    with pytest.raises(EngineImageError, match=r"spec\.engine\.image"):
        lws.leader_worker_set("big", intent.spec, no_image, planned, POOL, 1, 8000, {})


def test_service_selects_leaders_only() -> None:
    svc = service("big", 8000, lws.leader_labels("big"))
    assert svc["metadata"]["name"] == "big"
    assert svc["spec"]["selector"] == {**labels("big"), "kvscale.io/role": "leader"}
    assert service("small", 8000)["spec"]["selector"] == labels("small")


def test_set_names_stay_within_label_limits() -> None:
    assert lws.name_problem("a" * 40) is None
    problem = lws.name_problem("a" * 45)
    assert problem is not None and problem.startswith("metadata.name") and "at most 43" in problem
