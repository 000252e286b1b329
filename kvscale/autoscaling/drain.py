"""Which replicas a scale-down takes, and how long they may drain (pure; the operator and the
simulator use the same rule).

A scale-down takes the least-loaded replicas: fewest requests in flight (running plus
queued on the engine), ties by name, so the fewest requests have to finish (or are cut at the
bound). The operator tells the ReplicaSet controller which pods to delete through the
`controller.kubernetes.io/pod-deletion-cost` annotation: among pods alike in phase and
readiness it deletes the lower cost first (k8s.io/kubernetes v1.34.4
pkg/controller/controller_utils.go, ActivePodsWithRanks.Less rule 4, behind the PodDeletionCost
gate, beta and on since 1.22; pkg/apis/core/helper/helpers.go GetDeletionCostFromPodAnnotations
reads an int32 and counts an unparsable value as 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
# The annotation is an int32 (the ReplicaSet controller ignores values it cannot parse as one).
DELETION_COST_MAX = 2**31 - 1
# A preempted replica's in-flight requests have this long to finish by default (a GPUBudget's
# spec.preemptionGraceSeconds): short, as the GPUs are another service's grant (half the preStop
# drain of an ordinary scale-down, kvscale.control.resources.PRE_STOP_SLEEP_S).
DEFAULT_PREEMPTION_GRACE_S = 15.0


def drain_order(in_flight: Mapping[str, float]) -> list[str]:
    """Replicas by name, the first to drain first: the fewest requests in flight, then by name
    (a replica whose load is unknown, NaN, goes last: it may be busy)."""
    return sorted(in_flight, key=lambda name: (math.isnan(in_flight[name]), in_flight[name], name))


def deletion_costs(in_flight: Mapping[str, float]) -> dict[str, int]:
    """The pod-deletion-cost of each pod: its requests in flight, rounded up, capped to int32
    (lower: deleted first); a pod whose load is unknown gets the highest cost."""
    return {
        name: DELETION_COST_MAX if math.isnan(n) else min(DELETION_COST_MAX, max(0, math.ceil(n)))
        for name, n in in_flight.items()
    }


def victims(in_flight: Mapping[str, float], keep: int) -> list[str]:
    """The replicas a scale-down to `keep` takes, least loaded first."""
    return drain_order(in_flight)[: max(0, len(in_flight) - max(0, keep))]
