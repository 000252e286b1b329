"""The stand-in on a disaggregated plan, without a cluster: prefill pods and decode pods run the
simulator's two pools (kvscale.standin.pools), each pod's engine counted as vLLM counts it on
its side of the KV transfer, under the aggregated stand-in's metric names."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from kvscale.api.intent import parse_intent
from kvscale.api.models import PlanStatus, status_dict
from kvscale.metrics.engines import ENGINES
from kvscale.sim.load_profile import load_arrivals
from kvscale.standin.exposition import EngineCollector
from kvscale.standin.fleet import PodFleet
from kvscale.standin.pools import PoolsPodFleet, Role, pools_setup
from kvscale.standin.serve import pod_fleet
from tests.unit.test_disaggregated_deploy import CAT, deployed, spec
from tests.unit.test_standin import PLAN, SPEC, Clock

SERVICE = spec("on")  # 4000-token prompts, 300 output tokens: the operator plans two pools
STATUS = deployed(SERVICE).status
WIRE: dict[str, Any] = status_dict(STATUS)["plan"]
PLAN_STATUS = PlanStatus.model_validate(WIRE)
COLD_START_S = 5.0
PREFILL = {"chat-prefill-5d9c8-a1b2c": "prefill", "chat-prefill-5d9c8-d3e4f": "prefill"}
DECODE = {"chat-decode-7f6b5-g5h6i": "decode", "chat-decode-7f6b5-j7k8l": "decode"}
VLLM = ENGINES["vllm"]


def pools(clock: Clock, load: str = "constant:4") -> PoolsPodFleet:
    setup = pools_setup(CAT, parse_intent(SERVICE), PLAN_STATUS, COLD_START_S, 0)
    return PoolsPodFleet(setup, load_arrivals(load, 4000, 300, 1), clock)


def run(fleet: PoolsPodFleet, clock: Clock, seconds: float) -> None:
    for _ in range(round(seconds / 0.1)):
        clock.t += 0.1
        fleet.tick()


def of_role(fleet: PoolsPodFleet, role: str) -> list[Any]:
    return [s for pod, s in fleet.pods.items() if fleet.roles[pod] == role]


def ahead(fleet: PoolsPodFleet, role: Role, replica: int) -> list[Any]:
    """Requests a replica finishes in the step it is computing (past now)."""
    return [r for _, _, r in fleet._ahead[role] if r.replica == replica]


def balanced(fleet: PoolsPodFleet) -> None:
    """Every request is counted once: arrived = prefill's finished + held + lost there, and
    prefill's finished = decode's finished + in transfer + held by the decode pool + lost there."""
    assert fleet._ids == fleet.finished("prefill") + fleet.held("prefill") + fleet.lost["prefill"]
    assert fleet.finished("prefill") == (
        fleet.finished("decode") + len(fleet.in_transfer) + fleet.held("decode") + fleet.lost["decode"]
    )


def test_each_pool_is_configured_from_its_status_and_the_transfer_is_the_planned_one() -> None:
    assert PLAN_STATUS.mode == "disaggregated" and PLAN_STATUS.prefill and PLAN_STATUS.decode
    setup = pools_setup(CAT, parse_intent(SERVICE), PLAN_STATUS, COLD_START_S, 0)
    for pool, status in ((setup.prefill, PLAN_STATUS.prefill), (setup.decode, PLAN_STATUS.decode)):
        assert pool.cfg.gpu.name == status.gpu_type
        assert pool.cfg.tensor_parallel == status.tensor_parallel
        assert pool.cfg.precision.name == status.precision
        assert pool.cfg.max_num_batched_tokens == status.max_num_batched_tokens
        assert pool.max_batch == status.max_batch and pool.routing == "gateway" and pool.initial_replicas == 0
    # the two pools differ here (TP, batch limit, chunk budget): each pod must get its own pool's
    assert (setup.prefill.cfg.tensor_parallel, setup.prefill.max_batch) != (
        setup.decode.cfg.tensor_parallel,
        setup.decode.max_batch,
    )
    # the operator's figure at the mean prompt (status.plan.kvTransferMs, rounded to the microsecond)
    assert setup.transfer_s(4000) * 1e3 == pytest.approx(PLAN_STATUS.kv_transfer_ms, abs=1e-3)
    with pytest.raises(ValueError, match="not a disaggregated plan"):
        pools_setup(CAT, parse_intent(SPEC), PlanStatus.model_validate(PLAN), COLD_START_S, 0)


def test_serve_picks_the_pools_for_a_disaggregated_plan_and_the_one_fleet_otherwise() -> None:
    fleet, model = pod_fleet(CAT, {"spec": SERVICE, "status": {"plan": WIRE}}, "constant:1", 0.0, 0)
    assert isinstance(fleet, PoolsPodFleet) and model == "llama-3.1-8b"
    aggregated, _ = pod_fleet(CAT, {"spec": SPEC, "status": {"plan": PLAN}}, "constant:1", 0.0, 0)
    assert type(aggregated) is PodFleet


def test_prefill_pods_count_one_token_copies_and_decode_pods_what_they_decoded() -> None:
    clock = Clock()
    fleet = pools(clock, "steps:4@0,0@120")  # two minutes of load, then none
    fleet.sync_pods({**PREFILL, **DECODE, "chat-5d9c8-old1": None})  # a pod of neither role: no engine
    assert set(fleet.pods) == set(PREFILL) | set(DECODE)
    run(fleet, clock, 90.0)
    balanced(fleet)
    in_between = len(fleet.in_transfer) + fleet.held("decode")
    assert in_between > 0, "at 4 req/s some requests are being decoded"
    assert fleet.finished("decode") == fleet.finished("prefill") - in_between
    prefills, decodes = of_role(fleet, "prefill"), of_role(fleet, "decode")
    assert all(s.success > 0 for s in prefills + decodes), "the gateways use every pod of each pool"
    for s in prefills:
        # a copy with max_tokens 1: one generation token each, its prompt, no TPOT, no token gaps
        assert s.generation.count == s.success and s.generation.total == s.success
        assert s.prompt.total == s.prompt_tokens == 4000 * s.success
        assert s.tpot.count == 0 and fleet.inter_token_latency(s).count == 0
        assert s.decode_time.total == 0.0 and s.e2e.total == pytest.approx(s.ttft.total)
        # its TTFT is its wait and its prefill: a 4000-token prompt takes real time
        assert s.ttft.total / s.ttft.count > 0.05
        # the engine counts a token when its step is computed (a step in flight: finished ahead)
        assert s.replica.generated_tokens == s.success + len(ahead(fleet, "prefill", s.replica.id))
    transfer_s = fleet.setup.transfer_s(4000)
    for s in decodes:
        assert s.tpot.count == s.success and fleet.inter_token_latency(s).count > 0
        assert s.generation.total == 300 * s.success and s.prompt_tokens == 4000 * s.success
        # its TTFT starts when the prefill ended: the transfer, the wait for a slot, one step
        assert s.ttft.total / s.ttft.count > transfer_s
        assert s.ttft.total / s.ttft.count < min(p.ttft.total / p.ttft.count for p in prefills)
    run(fleet, clock, 90.0)  # the load ended at 120 s: everything drains
    balanced(fleet)
    assert fleet.held("prefill") == fleet.held("decode") == len(fleet.in_transfer) == 0
    assert fleet.finished("decode") == fleet.finished("prefill") == fleet._ids > 300
    for s in of_role(fleet, "decode"):
        # vllm:generation_tokens_total counts every token, the first steps' too
        assert s.replica.generated_tokens == 300 * s.success
        assert s.replica.kv_usage == 0.0 and not s.replica.running


def test_each_pod_exposes_the_aggregated_stand_ins_families_for_its_side() -> None:
    clock = Clock()
    fleet = pools(clock)
    fleet.sync_pods({**PREFILL, **DECODE})
    run(fleet, clock, 40.0)
    collector = EngineCollector(fleet, "ns", "llama-3.1-8b")

    def scraped(pod: str) -> dict[str, float]:
        registry = CollectorRegistry()
        registry.register(collector.of_pod(pod))
        samples: dict[str, float] = {}
        for line in generate_latest(registry).decode().splitlines():
            if line and not line.startswith("#") and 'le="' not in line:
                name, value = line.rsplit(" ", 1)
                samples[name.split("{")[0]] = float(value)
        return samples

    prefill_pod, decode_pod = sorted(PREFILL)[0], sorted(DECODE)[0]
    p, d = scraped(prefill_pod), scraped(decode_pod)
    assert set(p) == set(d)  # the same families and names on both sides
    success = VLLM.success_counter[0].removesuffix("_total") + "_total"
    generation = VLLM.generation_tokens_counter[0].removesuffix("_total") + "_total"
    assert p[success] > 0 and p[generation] == pytest.approx(p[success], abs=2)  # in flight: counted per step
    assert p[VLLM.tpot_histogram[0] + "_count"] == 0 and p[VLLM.itl_histogram[0] + "_count"] == 0
    assert d[VLLM.tpot_histogram[0] + "_count"] == d[success] > 0
    assert d[VLLM.itl_histogram[0] + "_count"] > 299 * d[success]
    assert d[VLLM.kv_usage_gauge[0]] > 0.0 and d[VLLM.running_gauge[0]] > 0
    # the whole /metrics and /sd carry every pod of both roles
    text = generate_latest(_registry(collector)).decode()
    assert all(f'pod="{pod}"' in text for pod in [*PREFILL, *DECODE])
    assert sorted(t["labels"]["__meta_kubernetes_pod_name"] for t in collector.targets("x:1")) == sorted(
        [*PREFILL, *DECODE]
    )


def _registry(collector: EngineCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def test_a_pod_removed_loses_its_in_flight_requests() -> None:
    clock = Clock()
    fleet = pools(clock)
    fleet.sync_pods({**PREFILL, **DECODE})
    run(fleet, clock, 40.0)
    gone_decode = sorted(DECODE)[0]
    replica = fleet.pods[gone_decode].replica
    holding = replica.load
    assert holding > 0
    decoded_there = fleet.pods[gone_decode].success
    fleet.sync_pods({**PREFILL, sorted(DECODE)[1]: "decode"})
    assert gone_decode not in fleet.pods and replica.stopped_s is not None and replica.idle
    assert fleet.lost["decode"] >= holding
    run(fleet, clock, 20.0)
    balanced(fleet)
    assert fleet._stats[("decode", replica.id)].success == decoded_there  # nothing more finishes there
    assert fleet.lost["prefill"] == 0
    gone_prefill = sorted(PREFILL)[0]
    replica = fleet.pods[gone_prefill].replica
    for _ in range(600):  # to a moment the pod is prefilling
        if replica.load or ahead(fleet, "prefill", replica.id):
            break
        run(fleet, clock, 0.1)
    holding = replica.load + len(ahead(fleet, "prefill", replica.id))
    assert holding > 0
    prefilled_there = fleet.pods[gone_prefill].success
    fleet.sync_pods({sorted(PREFILL)[1]: "prefill", sorted(DECODE)[1]: "decode"})
    run(fleet, clock, 20.0)
    balanced(fleet)
    assert fleet.lost["prefill"] == holding  # its prompts in flight never reach the decode pool
    assert fleet._stats[("prefill", replica.id)].success == prefilled_there
    assert gone_prefill not in fleet.pods
    assert all(s.success > 0 for s in fleet.pods.values())  # the others keep serving


def test_a_decode_pool_without_pods_holds_the_prefilled_requests_until_one_serves() -> None:
    clock = Clock()
    fleet = pools(clock, "steps:4@0,0@60")
    fleet.sync_pods(PREFILL)
    run(fleet, clock, 60.0)
    balanced(fleet)
    assert fleet.finished("prefill") > 100 and fleet.finished("decode") == 0
    waiting = fleet.pools["decode"].unrouted
    assert len(waiting) == fleet.held("decode") == fleet.finished("prefill") - len(fleet.in_transfer)
    assert fleet.lost["decode"] == 0
    fleet.sync_pods({**PREFILL, **DECODE})
    run(fleet, clock, COLD_START_S - 0.5)
    assert fleet.finished("decode") == 0  # still starting
    run(fleet, clock, 120.0)
    balanced(fleet)
    assert fleet.finished("decode") == fleet.finished("prefill") == fleet._ids  # none vanished
    assert fleet.lost["decode"] == 0 and not waiting
