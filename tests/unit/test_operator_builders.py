"""Pure parts of the operator: inventory, planning outcomes, child objects."""

from pathlib import Path

from kvscale.api import labels
from kvscale.api.intent import parse_intent
from kvscale.control.inventory import gpu_inventory
from kvscale.control.planning import Planned, Unplanned, plan_service
from kvscale.control.resources import deployment, pod_disruption_budget, service
from kvscale.control.settings import SettingsError, parse_tolerations
from kvscale.sizing.catalog import default_catalog
from tests.cluster.harness import node_objects

CAT = default_catalog()
NODES = list(node_objects(Path(__file__).resolve().parents[1] / "cluster" / "nodepool.yaml"))
SPEC = {
    "model": {"name": "llama-3.1-70b"},
    "workload": {"inputTokens": 2048, "outputTokens": 256, "requestsPerSecond": 2},
    "slo": {"timeToFirstToken": "2s", "timePerOutputToken": "80ms"},
}


def pod(node: str, gpus: int, owner: str = "other", phase: str = "Running") -> dict[str, object]:
    return {
        "metadata": {"labels": {"kvscale.io/owner-uid": owner}},
        "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase},
    }


def test_inventory_counts_free_gpus_by_type() -> None:
    pools = gpu_inventory(CAT, NODES, [pod("h100-0", 8), pod("h100-1", 2), pod("h100-1", 4, phase="Succeeded")])
    assert pools["H100-SXM"].allocatable == 16 and pools["H100-SXM"].free == 6
    assert pools["A100-80GB"].free == 32 and pools["L4"].max_per_node == 1
    assert pools["A10G"].product_label == "NVIDIA-A10G"
    mine = gpu_inventory(CAT, NODES, [pod("h100-0", 8, owner="me")], exclude_owner_uid="me")
    assert mine["H100-SXM"].free == 16


def test_planning_outcomes() -> None:
    pools = gpu_inventory(CAT, NODES, [])
    planned = plan_service(parse_intent(SPEC), CAT, pools)
    assert isinstance(planned, Planned)
    assert planned.chosen.tensor_parallel <= pools[planned.chosen.gpu].max_per_node
    unknown = plan_service(parse_intent({**SPEC, "model": {"name": "gpt-17"}}), CAT, pools)
    assert isinstance(unknown, Unplanned) and not unknown.retry and unknown.message.startswith("spec.model.name")
    impossible = plan_service(
        parse_intent({**SPEC, "slo": {"timeToFirstToken": "1ms", "timePerOutputToken": "1ms"}}), CAT, pools
    )
    assert isinstance(impossible, Unplanned) and not impossible.retry
    # Issue 28 (LOW): the operator's conditions name the resource's fields, never the CLI's flags.
    assert impossible.reason == "SLOInfeasible" and "spec.slo.timePerOutputToken: " in impossible.message
    assert "--" not in impossible.message, impossible.message
    busy = {
        **SPEC,
        "scaling": {"maxReplicas": 1},
        "workload": {"inputTokens": 512, "outputTokens": 128, "requestsPerSecond": 500},
    }
    capped = plan_service(parse_intent(busy), CAT, pools)
    assert isinstance(capped, Unplanned) and "raise spec.scaling.maxReplicas to" in capped.message
    assert "--" not in capped.message, capped.message
    missing = plan_service(parse_intent({**SPEC, "hardware": {"gpuTypes": ["B200"]}}), CAT, pools)
    assert isinstance(missing, Unplanned) and missing.retry and "B200" in missing.message
    fallback = plan_service(parse_intent(SPEC), CAT, pools, excluded=(planned.chosen.gpu,))
    assert not isinstance(fallback, Planned) or fallback.chosen.gpu != planned.chosen.gpu


def test_deployment_carries_the_plan() -> None:
    pools = gpu_inventory(CAT, NODES, [])
    intent = parse_intent(
        {**SPEC, "model": {"name": "llama-3.1-70b", "credentialsSecret": "hf"}, "engine": {"args": ["--x"]}}
    )
    result = plan_service(intent, CAT, pools)
    assert isinstance(result, Planned)
    chosen, pool = result.chosen, result.pool
    assert pool == pools[chosen.gpu]
    dep = deployment(
        "svc",
        "uid-1",
        intent.spec,
        result.model,
        chosen.config,
        chosen,
        pool,
        2,
        8000,
        parse_tolerations("kwok.x-k8s.io/node:NoSchedule"),
    )
    pod_spec = dep["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert container["resources"]["limits"] == {"nvidia.com/gpu": str(chosen.tensor_parallel)}
    args = container["args"]
    assert args[0] == "meta-llama/Llama-3.1-70B"
    assert args[args.index("--tensor-parallel-size") + 1] == str(chosen.tensor_parallel)
    assert args[args.index("--max-num-seqs") + 1] == str(result.prediction.max_batch)
    # No maxContextTokens: the model's limit, lowered only to what one sequence can hold.
    served = int(args[args.index("--max-model-len") + 1])
    expected = min(131072, int(result.prediction.kv_cache_tokens * 0.9) // 16 * 16)
    assert served == max(expected, 2048 + 256)
    assert args[-1] == "--x"
    term = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][
        0
    ]
    assert term["matchExpressions"][0] == {
        "key": "nvidia.com/gpu.product",
        "operator": "In",
        "values": [pool.product_label],
    }
    assert {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"} in pod_spec["tolerations"]
    assert container["envFrom"] == [{"secretRef": {"name": "hf"}}]
    assert {
        p for p in ("startupProbe", "readinessProbe", "livenessProbe") if container[p]["httpGet"]["path"] == "/health"
    } == {"startupProbe", "readinessProbe", "livenessProbe"}
    assert pod_spec["volumes"][0]["emptyDir"]["medium"] == "Memory"
    assert dep["spec"]["selector"]["matchLabels"] == labels("svc") == service("svc", 8000)["spec"]["selector"]
    assert pod_disruption_budget("svc")["spec"]["minAvailable"] == "50%"  # tests/unit/test_pod_security.py
    # A spec change surges a new pod and keeps the old one until the new one is ready.
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_toleration_setting_errors() -> None:
    assert parse_tolerations("a=b:NoExecute,c:NoSchedule") == (
        {"key": "a", "operator": "Equal", "value": "b", "effect": "NoExecute"},
        {"key": "c", "operator": "Exists", "effect": "NoSchedule"},
    )
    try:
        parse_tolerations("broken")
    except SettingsError as exc:
        assert "KVSCALE_EXTRA_TOLERATIONS" in str(exc)
    else:
        raise AssertionError("expected a SettingsError")
