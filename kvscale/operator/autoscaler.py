"""The autoscaling tick: observe (Prometheus) -> the policy -> scale the Deployment, status, Event.

The policy is kvscale.autoscaling's, the same the simulator runs. Its state lives in the
operator's memory per object; after a restart it starts empty, which only delays
scale-downs (they need a full stabilization window of history).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kvscale.api.models import InferenceServiceSpec
from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.autoscaling.observation import Decision, Observation
from kvscale.autoscaling.policy import PolicyConfig, PolicyState, decide
from kvscale.metrics.client import PrometheusClient
from kvscale.metrics.observe import observe
from kvscale.operator.planning import serving_config_from_plan
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.units import format_duration, parse_duration_s
from kvscale.sizing.workload import Slo


@dataclass
class ScalerMemory:
    """Per-object memory of the autoscaler (kopf's memo)."""

    key: tuple[Any, ...] | None = None
    capacity: SizingCapacity | None = None
    cold_start_s: float = 60.0
    state: PolicyState = field(default_factory=PolicyState)


def _capacity(
    memory: ScalerMemory, spec: InferenceServiceSpec, plan: dict[str, Any], catalog: Catalog
) -> SizingCapacity:
    key = (
        plan["gpuType"],
        plan["tensorParallel"],
        plan["precision"],
        plan["maxBatch"],
        spec.model.model_dump_json(),
        spec.slo.model_dump_json(),
    )
    if memory.key != key or memory.capacity is None:
        cfg = serving_config_from_plan(spec, plan, catalog)
        slo_s = (parse_duration_s(spec.slo.time_to_first_token), parse_duration_s(spec.slo.time_per_output_token))
        memory.capacity = SizingCapacity(cfg, Slo(*slo_s, spec.slo.percentile), int(plan["maxBatch"]))
        memory.cold_start_s = cfg.cold_start_s
        memory.key = key
        memory.state = PolicyState()
    return memory.capacity


def policy_config(spec: InferenceServiceSpec, cold_start_s: float, interval_s: float, window_s: float) -> PolicyConfig:
    return PolicyConfig(
        ttft_target_s=parse_duration_s(spec.slo.time_to_first_token),
        tpot_target_s=parse_duration_s(spec.slo.time_per_output_token),
        default_input_tokens=spec.workload.input_tokens,
        default_output_tokens=spec.workload.output_tokens,
        min_replicas=spec.scaling.min_replicas,
        max_replicas=spec.scaling.max_replicas,
        cold_start_s=cold_start_s,
        tick_s=interval_s,
        scale_down_stabilization_s=parse_duration_s(spec.scaling.scale_down_stabilization),
        feedback_cooldown_s=window_s + interval_s,
    )


def tick(
    memory: ScalerMemory,
    spec: InferenceServiceSpec,
    plan: dict[str, Any],
    catalog: Catalog,
    prometheus: PrometheusClient | None,
    namespace: str,
    name: str,
    current: int,
    ready: int,
    interval_s: float,
    window: str,
    stale_after_s: float,
) -> tuple[Decision, Observation, str | None]:
    capacity = _capacity(memory, spec, plan, catalog)
    now = time.time()
    starting = max(0, current - ready)
    why: str | None
    if prometheus is None:
        obs, why = (
            Observation(time_s=now, ready_replicas=ready, starting_replicas=starting, stale=True),
            "KVSCALE_PROMETHEUS_URL is not set",
        )
    else:
        obs, why = observe(
            prometheus,
            spec.engine.type,
            namespace,
            name,
            spec.slo.percentile,
            ready,
            starting,
            now,
            window,
            stale_after_s,
        )
    decision, memory.state = decide(
        obs, memory.state, capacity, policy_config(spec, memory.cold_start_s, interval_s, parse_duration_s(window))
    )
    return decision, obs, why


def observed_status(obs: Observation, decision: Decision) -> dict[str, Any]:
    def dur(value: float | None) -> str | None:
        return None if value is None else format_duration(value)

    return {
        "ttft": dur(obs.ttft_p_s),
        "tpot": dur(obs.tpot_p_s),
        "requestsPerSecond": None if obs.arrival_rate_per_s is None else round(obs.arrival_rate_per_s, 4),
        "queue": obs.waiting,
        "kvCacheUsage": None if obs.kv_usage is None else round(obs.kv_usage, 4),
        "calibration": round(decision.calibration, 4),
        "tpotSource": obs.tpot_source,
        "ttftSource": obs.ttft_source,
    }
