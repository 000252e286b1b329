"""The one place the autoscaling policy's settings are built.

The operator (kvscale.api.intent.policy_config), `kvscale simulate`, `simulate --fleet` and
benchmarks/autoscaling.py all call `policy_config`, so a simulated run is the deployed policy
with the same tuning; tests/unit/test_tuning.py fails if any module builds a PolicyConfig
itself. Inputs are what differs between a resource and a trace (the SLO, the lengths, the
bounds, the cold start, the tick and metrics window, the routing); everything derived from
them (the feedback cooldown) is derived here, once.
"""

from __future__ import annotations

from kvscale.autoscaling.policy import PolicyConfig

# spec.scaling.scaleDownStabilization's default (kvscale.api.models.ScalingSpec): what a
# simulated run waits when no resource says otherwise.
DEFAULT_SCALE_DOWN_STABILIZATION_S = 120.0
# PolicyConfig's own default headroom, the planner's DEFAULT_HEADROOM (0.10).
DEFAULT_HEADROOM = PolicyConfig.headroom


def policy_config(
    *,
    ttft_target_s: float,
    tpot_target_s: float,
    input_tokens: float,
    output_tokens: float,
    min_replicas: int,
    max_replicas: int,
    cold_start_s: float,
    interval_s: float,
    window_s: float,
    least_loaded_routing: bool,
    scale_down_stabilization_s: float = DEFAULT_SCALE_DOWN_STABILIZATION_S,
    headroom: float = DEFAULT_HEADROOM,
) -> PolicyConfig:
    """The policy's configuration: the SLO, the workload's lengths as defaults, the replica
    bounds, the modelled cold start and the tick. `least_loaded_routing`: behind a gateway
    (an InferencePool's endpoint picker) a backlog moves to new replicas; behind a plain
    Service it stays where it was routed."""
    return PolicyConfig(
        ttft_target_s=ttft_target_s,
        tpot_target_s=tpot_target_s,
        default_input_tokens=input_tokens,
        default_output_tokens=output_tokens,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        headroom=headroom,
        cold_start_s=cold_start_s,
        tick_s=interval_s,
        scale_down_stabilization_s=scale_down_stabilization_s,
        # After a feedback scale-up the latency window still holds the samples from before it:
        # feedback waits one full metrics window plus a tick before it adds more.
        feedback_cooldown_s=window_s + interval_s,
        rate_window_s=window_s,
        queue_moves=least_loaded_routing,
    )
