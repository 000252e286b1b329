"""A re-plan that changes the engine pods (GPU type, tensor parallelism, engine arguments),
sized for the load that runs now, as values. Pure: reconcile and refresh use them.

Issue 27: a GPU type change while traffic flowed took 6 ready replicas to 1, because the
re-plan applied the plan's count for spec.workload. Two things made that drop:

- the count: the new fleet must carry the load observed, not spec.workload's rate;
- the Deployment controller: with maxUnavailable 0 it keeps `spec.replicas` pods available
  during a rolling update and scales the old ReplicaSet down to that many at once
  (kubernetes pkg/controller/deployment/rolling.go, reconcileOldReplicaSets: maxScaledDown =
  allPods - (replicas - maxUnavailable) - newRSUnavailable). A new count below the running
  one therefore removes old pods before any new one is ready.

So the workload is applied with at least as many replicas as run now (old pods then go one
for one as new ones become ready: maxSurge 1, maxUnavailable 0), and once every replica runs
the new template, refresh scales it to the load's count (`target`). The count applied and
the target travel on the workload as an annotation, so a restarted operator finishes the
change too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CONDITION = "Replanning"
TARGET_ANNOTATION = "kvscale.io/replan-replicas"  # the load's count, applied once the rollout is done


@dataclass(frozen=True)
class Before:
    """What runs before the re-plan: its replicas, what the policy last asked for, the observed
    arrival rate (status.observed), and one replica's capacity under the old plan."""

    replicas: int
    desired: int | None
    observed_rate_per_s: float | None
    rate_per_replica: float | None


@dataclass(frozen=True)
class Sizing:
    target: int  # the new fleet's size for the load
    applied: int  # what the workload runs while old pods are replaced: never fewer than run now
    need_per_s: float | None  # requests/s the new fleet is sized for (None: none known)
    basis: str  # what the need was read from, for the condition

    @property
    def rolling(self) -> bool:
        return self.applied != self.target


def size(before: Before, new_rate_per_replica: float, headroom: float, floor: int, ceiling: int) -> Sizing:
    """The new fleet's size for the current load: the larger of the policy's last decision and
    the observed rate with headroom, in requests/s (what runs now, when neither is known),
    over what one new replica carries; never below `floor` (the new plan's count for
    spec.workload, within the bounds), never above `ceiling` (maxReplicas)."""
    needs: list[tuple[float, str]] = []
    old = before.rate_per_replica
    if old is not None and old > 0 and before.desired:
        needs.append((before.desired * old, f"the last decision, {before.desired} x {old:g}/s"))
    if before.observed_rate_per_s is not None and before.observed_rate_per_s > 0:
        rate = before.observed_rate_per_s
        needs.append((rate * (1 + headroom), f"the observed {rate:g}/s with {headroom:.0%} headroom"))
    if not needs and old is not None and old > 0 and before.replicas > 0:
        needs.append((before.replicas * old, f"what runs now, {before.replicas} x {old:g}/s"))
    if not needs or new_rate_per_replica <= 0:
        target = max(floor, min(ceiling, before.replicas))
        return Sizing(target, max(target, before.replicas), None, "no load known: as many as run now")
    need, basis = max(needs)
    # A hair of float rounding (6 x 1.5 / 1.5) must not buy a replica.
    count = math.ceil(need / new_rate_per_replica - 1e-9)
    target = max(floor, min(ceiling, count))
    return Sizing(target, max(target, before.replicas), need, basis)


def annotate(workload: Mapping[str, Any], target: int) -> dict[str, Any]:
    """The workload body with the load's count recorded on it (see TARGET_ANNOTATION)."""
    body = dict(workload)
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), TARGET_ANNOTATION: str(target)}
    body["metadata"] = meta
    return body


def recorded_target(applied: Mapping[str, Any] | None) -> int | None:
    annotations = ((applied or {}).get("metadata") or {}).get("annotations") or {}
    value = annotations.get(TARGET_ANNOTATION)
    return int(value) if value is not None and str(value).isdigit() else None
