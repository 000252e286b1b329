"""Scale to zero: with minReplicas 0, the last replica goes after an idle window without
requests, and comes back when requests wait for one. Pure: the simulator and the operator
call it on the policy's answer."""

from __future__ import annotations

import math


def wake_replicas(
    waiting: float,
    rate_per_s: float | None,
    per_replica_per_s: float,
    drain_s: float,
    max_replicas: int,
) -> int:
    """Replicas a wake from zero starts: what the arrival rate needs plus what drains the
    queue within `drain_s` (the cold start plus the TTFT target: the policy's backlog term,
    kvscale.autoscaling.policy._backlog_target, for a queue the gateway hands to any replica),
    over what one replica carries; at least one, at most `max_replicas`. Unknown capacity
    (per_replica_per_s <= 0): one."""
    if per_replica_per_s <= 0 or drain_s <= 0:
        return 1
    rate = max(rate_per_s or 0.0, 0.0)
    need = math.ceil((rate + max(waiting, 0.0) / drain_s) / per_replica_per_s - 1e-9)
    return max(1, min(max_replicas, need))


def idle_replicas(
    replicas: int,
    min_replicas: int,
    idle_s: float | None,
    idle_window_s: float,
    waiting: float | None,
    wake: int = 1,
    ready: int | None = None,
) -> tuple[int, str | None]:
    """The replica count after the idle rule, and why it changed (None: unchanged).

    `idle_s`: seconds since the last request arrived (None: unknown); `waiting`: requests
    waiting for a replica (at the gateway while none runs; None: unknown). The policy keeps
    a burst reserve for a while after traffic stops; only the idle window releases the last
    replica, and unknown figures never do. `wake`: replicas a wake starts (wake_replicas);
    `ready`: replicas ready now - while none is, requests still waiting at the gateway keep
    the wake's size (the policy sees no engine queue until a replica runs)."""
    if min_replicas > 0:
        return replicas, None
    if waiting is not None and waiting > 0 and (replicas == 0 or (ready == 0 and replicas < wake)):
        target = max(replicas, wake)
        return target, f"{waiting:.0f} requests wait for a replica: scaling back from zero to {target}"
    if idle_s is None or waiting is None:
        return (max(replicas, 1), "idle time unknown: keeping one replica") if replicas == 0 else (replicas, None)
    if idle_s >= idle_window_s and waiting == 0:
        if replicas == 0:
            return 0, None
        return 0, f"no request for {idle_s:.0f}s (idle window {idle_window_s:.0f}s): releasing every replica"
    if replicas == 0:
        return 1, f"a request {idle_s:.0f}s ago, within the {idle_window_s:.0f}s idle window: keeping one replica"
    return replicas, None
