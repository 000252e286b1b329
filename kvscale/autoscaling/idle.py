"""Scale to zero: with minReplicas 0, the last replica goes after an idle window without
requests, and comes back when requests wait for one. Pure: the simulator and the operator
call it on the policy's answer."""

from __future__ import annotations


def idle_replicas(
    replicas: int,
    min_replicas: int,
    idle_s: float | None,
    idle_window_s: float,
    waiting: float | None,
) -> tuple[int, str | None]:
    """The replica count after the idle rule, and why it changed (None: unchanged).

    `idle_s`: seconds since the last request arrived (None: unknown); `waiting`: requests
    waiting for a replica (at the gateway while none runs; None: unknown). The policy keeps
    a burst reserve for a while after traffic stops; only the idle window releases the last
    replica, and unknown figures never do."""
    if min_replicas > 0:
        return replicas, None
    if waiting is not None and waiting > 0 and replicas == 0:
        return 1, f"{waiting:.0f} requests wait for a replica: scaling back from zero"
    if idle_s is None or waiting is None:
        return (max(replicas, 1), "idle time unknown: keeping one replica") if replicas == 0 else (replicas, None)
    if idle_s >= idle_window_s and waiting == 0:
        if replicas == 0:
            return 0, None
        return 0, f"no request for {idle_s:.0f}s (idle window {idle_window_s:.0f}s): releasing every replica"
    if replicas == 0:
        return 1, f"a request {idle_s:.0f}s ago, within the {idle_window_s:.0f}s idle window: keeping one replica"
    return replicas, None
