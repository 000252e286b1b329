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

Issue 38 (finding 5): the template is rolled at exactly the count that runs now, never more.
Replicas and the pod template changed in one write give the increase to the old ReplicaSet
(the Deployment controller scales up the newest ReplicaSet only after a rollout, and during
one splits a change of spec.replicas across the ReplicaSets in proportion to their size:
pkg/controller/deployment/sync.go, scale): 5-7 cold starts on the GPU type being left, on
GPUs that may not be free. So the new ReplicaSet grows as the old one drains, one for one,
and grows past it (to `target`) only once the rollout is done.

Issue 38 (finding 6): the new fleet is sized on the load, not on the old fleet: the observed
arrival rate with headroom, else the rate the new plan was made for. The policy's last
decision times the old replica's capacity is what the old fleet could carry (1 A100 of 16.3
requests/s for a load of 1/s moved back to L4 as 8 replicas).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from kvscale.api.models import InferenceServiceStatus, PlanStatus
from kvscale.autoscaling.budget import Grant
from kvscale.control import exclusions
from kvscale.control.status import condition, with_conditions, without_condition
from kvscale.sizing.workload import Workload

CONDITION = "Replanning"
TARGET_ANNOTATION = "kvscale.io/replan-replicas"  # the load's count, applied once the rollout is done


@dataclass(frozen=True)
class Before:
    """What runs before the re-plan: its replicas, the observed arrival rate (status.observed),
    and the rate the new plan was made for (spec.workload's, or the observed workload a drift
    re-plan chose): the fallback where nothing is observed."""

    replicas: int
    observed_rate_per_s: float | None
    planned_rate_per_s: float | None = None


@dataclass(frozen=True)
class Sizing:
    target: int  # the new fleet's size for the load
    applied: int  # what the workload runs while old pods are replaced: what runs now
    need_per_s: float | None  # requests/s the new fleet is sized for (None: none known)
    basis: str  # what the need was read from, for the condition

    @property
    def rolling(self) -> bool:
        return self.applied != self.target


def size(
    before: Before, new_rate_per_replica: float, headroom: float, floor: int, ceiling: int, moves_type: bool = True
) -> Sizing:
    """The new fleet's size for the load: the observed arrival rate with headroom, else the rate
    the plan was made for, in requests/s, over what one new replica carries; never below
    `floor` (the new plan's count for its workload, within the bounds), never above `ceiling`
    (maxReplicas). A move to another GPU type (`moves_type`) rolls the template at the count
    running now (`applied`) and grows to `target` once the rollout is done (module doc); a
    change on the same type (TP, engine args) starts at the larger of the two, as before: its
    extra pods land on GPUs of the type already in use."""
    need: tuple[float, str] | None = None
    observed, planned = before.observed_rate_per_s, before.planned_rate_per_s
    if observed is not None and math.isfinite(observed) and observed > 0:
        need = (observed * (1 + headroom), f"the observed {observed:.3g}/s with {headroom:.0%} headroom")
    elif planned is not None and math.isfinite(planned) and planned > 0:
        need = (planned, f"the plan's {planned:.3g}/s, none observed")
    running = before.replicas if before.replicas > 0 else None  # the count the template rolls at

    def applied(target: int) -> int:
        if running is None:
            return target
        return running if moves_type else max(target, running)

    if need is None or new_rate_per_replica <= 0:
        target = max(floor, min(ceiling, before.replicas))
        return Sizing(target, applied(target), None, "no load known: as many as run now")
    # A hair of float rounding (6 x 1.5 / 1.5) must not buy a replica.
    count = math.ceil(need[0] / new_rate_per_replica - 1e-9)
    target = max(floor, min(ceiling, count))
    return Sizing(target, applied(target), need[0], need[1])


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


# Why a re-plan runs: one type per trigger (as Karpenter has one per disruption method), each
# saying what it changes for the planner (`steer`), what it marks in status before planning
# (`mark`) and, once, why (`says`). `kvscale.control.reconcile.replan` is their one caller.


@dataclass(frozen=True)
class Steer:
    """What a re-plan changes for the planner; None: as reconcile takes it from status and spec."""

    excluded: tuple[str, ...] | None = None  # GPU types left out
    traffic: Workload | None = None  # the workload planned for instead of spec.workload
    prefer_gpu: str | None = None  # the GPU type to pick where a plan fits there


@dataclass(frozen=True)
class Unschedulable:
    """The planned GPU type's pods waited too long for free GPUs: plan without it (and the types
    left out earlier, while their time lasts)."""

    gpu: str
    left_out: tuple[str, ...]
    message: str  # the Scheduled condition's, and the Event's
    ttl_s: float

    event_type: ClassVar[Literal["Normal", "Warning"]] = "Warning"
    reason: ClassVar[str] = "GPUTypeUnschedulable"
    quiet_plan: ClassVar[bool] = False  # the reconcile's own Planned Event follows

    def steer(self) -> Steer:
        return Steer(excluded=self.left_out)

    def mark(self, status: InferenceServiceStatus, generation: int | None, now: dt.datetime) -> InferenceServiceStatus:
        return with_conditions(
            status,
            condition(status, "Scheduled", False, self.reason, self.message, generation, now),
            exclusions.excluded(self.left_out, "their pods found no free GPUs", now, self.ttl_s, generation),
        )

    def says(self, before: PlanStatus | None, after: PlanStatus | None) -> str:
        return self.message


@dataclass(frozen=True)
class TypesReturned:
    """The GPU types left out earlier are due back: plan with every type again."""

    message: str

    event_type: ClassVar[Literal["Normal", "Warning"]] = "Normal"
    reason: ClassVar[str] = "GPUTypesReturned"
    quiet_plan: ClassVar[bool] = False

    def steer(self) -> Steer:
        return Steer(excluded=())

    def mark(self, status: InferenceServiceStatus, generation: int | None, now: dt.datetime) -> InferenceServiceStatus:
        return without_condition(status, exclusions.CONDITION)

    def says(self, before: PlanStatus | None, after: PlanStatus | None) -> str:
        return self.message


@dataclass(frozen=True)
class Drifted:
    """The observed workload stayed away from the planned one: plan for what was observed."""

    workload: Workload
    drift: str  # the measures that drifted, said
    held: str  # how long, said

    event_type: ClassVar[Literal["Normal", "Warning"]] = "Normal"
    reason: ClassVar[str] = "Replanned"
    quiet_plan: ClassVar[bool] = True  # this Event says the plan; reconcile's Planned would say it twice

    def steer(self) -> Steer:
        return Steer(traffic=self.workload)

    def mark(self, status: InferenceServiceStatus, generation: int | None, now: dt.datetime) -> InferenceServiceStatus:
        return status

    def says(self, before: PlanStatus | None, after: PlanStatus | None) -> str:
        if before is None or after is None:
            return f"Re-planned for the observed workload (drifted for {self.held}: {self.drift})"
        shape = ((p.gpu_type, p.tensor_parallel, p.max_batch, p.max_num_batched_tokens) for p in (before, after))
        old, new = (f"{g} TP{tp} batch {b} budget {t}" for g, tp, b, t in shape)
        change = f"configuration unchanged ({old})" if old == new else f"{old} -> {new}"
        return f"Re-planned for the observed workload (drifted for {self.held}: {self.drift}): {change}"


@dataclass(frozen=True)
class BudgetMove:
    """A GPUBudget granted another GPU type: plan on that type where a plan fits there."""

    grant: Grant
    budget: str

    event_type: ClassVar[Literal["Normal", "Warning"]] = "Normal"
    reason: ClassVar[str] = "MovedByBudget"
    quiet_plan: ClassVar[bool] = True

    def steer(self) -> Steer:
        return Steer(prefer_gpu=self.grant.gpu_type)

    def mark(self, status: InferenceServiceStatus, generation: int | None, now: dt.datetime) -> InferenceServiceStatus:
        return status

    def says(self, before: PlanStatus | None, after: PlanStatus | None) -> str:
        if before is None or after is None:
            return f"budget {self.budget}: {self.grant.reason}"
        origin = before.budget_moved_from or before.gpu_type
        back = " back" if after.gpu_type == origin else ""
        return (
            f"budget {self.budget}: moved{back} from {before.gpu_type} TP{before.tensor_parallel} to {after.gpu_type} "
            f"TP{after.tensor_parallel} with {self.grant.replicas} replica(s) (the pods on {before.gpu_type} go as "
            f"the new ones become ready): {self.grant.reason}"
        )


@dataclass(frozen=True)
class ProfileCalibrated:
    """A calibrated performance profile for the planned configuration changed what the model
    predicts: plan again with it. Nothing raises this one yet (the calibration feeds, issue 26,
    name it when they land)."""

    profile: str

    event_type: ClassVar[Literal["Normal", "Warning"]] = "Normal"
    reason: ClassVar[str] = "ProfileCalibrated"
    quiet_plan: ClassVar[bool] = True

    def steer(self) -> Steer:
        return Steer()

    def mark(self, status: InferenceServiceStatus, generation: int | None, now: dt.datetime) -> InferenceServiceStatus:
        return status

    def says(self, before: PlanStatus | None, after: PlanStatus | None) -> str:
        return f"Re-planned with the calibrated profile {self.profile}"


Replan = Unschedulable | TypesReturned | Drifted | BudgetMove | ProfileCalibrated
