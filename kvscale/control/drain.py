"""Drain-aware scale-down, the operator's pure part: before a Deployment scale-down, the
pod-deletion-cost of each engine pod from its requests in flight, so the ReplicaSet deletes the
least loaded (kvscale.autoscaling.drain, the rule the simulator uses too).

What follows the deletion is Kubernetes' and the pod's: a pod being deleted leaves routing at
once (the EndpointSlice controller marks its endpoint not ready and terminating, k8s.io/endpointslice
v0.34.4 utils.go podToEndpoint, so kube-proxy and a gateway's endpoint picker send it nothing
new; tests/cluster/test_drain.py watches it happen), the preStop sleep
(kvscale.control.resources.PRE_STOP_SLEEP_S) lets its in-flight requests finish, and only then
does the engine get SIGTERM, on which vLLM 0.11 stops at once (vllm/entrypoints/launcher.py,
serve_http: the handler cancels the HTTP server task; api_server.py shuts the engine down before
it awaits the server): the preStop is the drain's bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kvscale.autoscaling.drain import deletion_costs
from kvscale.control.inventory import EnginePod
from kvscale.control.reconcile import DEPLOYMENT


def scale_down_marks(
    scale_to: int | None,
    scale_kind: str,
    current: int | None,
    pods: Sequence[EnginePod],
    in_flight: Mapping[str, float],
) -> dict[str, int]:
    """The deletion cost to write on each live engine pod before the Deployment goes from
    `current` to `scale_to` replicas; none when it is not a scale-down (a LeaderWorkerSet
    scales whole groups by index, which a cost does not steer). A pod whose load Prometheus did
    not report gets the highest cost: it may be busy."""
    if scale_to is None or current is None or scale_kind != DEPLOYMENT or scale_to >= current:
        return {}
    live = sorted(p.name for p in pods if not p.deleting)
    return deletion_costs({name: in_flight.get(name, math.nan) for name in live})
