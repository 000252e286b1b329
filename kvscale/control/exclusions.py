"""GPU types left out of planning after their pods found no free GPUs, for a while (pure).

A shortage passes: other workloads finish or scale down, and a cluster autoscaler adds nodes
(Cluster Autoscaler gives a scale-up up after --max-node-provision-time, 15 minutes by default:
kubernetes/autoscaler, cluster-autoscaler/FAQ.md). Kept for good, an exclusion left services on
dearer plans once the GPUs were back (issue 31: $22.24/h instead of $10.76/h). So the types
stay out for KVSCALE_GPU_EXCLUSION_TTL (30 minutes by default: twice that provisioning limit, so a
scale-up in flight has landed or failed) after the last one was left out; then the planner sees
every type again. Trying the cheaper type again costs little: the engine Deployment rolls with
maxUnavailable 0, so the pods that serve stay until new ones are ready, and a type still short
is left out again after KVSCALE_UNSCHEDULABLE_TIMEOUT.

status.plan.excludedGpuTypes has no time of its own: the GPUTypesExcluded condition carries it
(its lastTransitionTime is when the last type was left out; its message says until when).
"""

from __future__ import annotations

import datetime as dt
import re

from kvscale.api.models import Condition, InferenceServiceStatus
from kvscale.control.status import get_condition, now_rfc3339

CONDITION = "GPUTypesExcluded"
_UNTIL = re.compile(r"until (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


def _span(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"


def _stamp(text: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def expires_at(status: InferenceServiceStatus, ttl_s: float) -> dt.datetime | None:
    """When the exclusions end; None without a time recorded (an operator before this one
    wrote them): they count as ended."""
    found = get_condition(status, CONDITION)
    since = _stamp(found.last_transition_time) if found is not None and found.status == "True" else None
    return None if since is None else since + dt.timedelta(seconds=ttl_s)


def active(status: InferenceServiceStatus, ttl_s: float, now: dt.datetime) -> tuple[str, ...]:
    """The GPU types the planner leaves out now."""
    types = tuple(status.plan.excluded_gpu_types) if status.plan else ()
    until = expires_at(status, ttl_s)
    return types if types and until is not None and now < until else ()


def expired(status: InferenceServiceStatus, ttl_s: float, now: dt.datetime) -> bool:
    """Whether the plan leaves types out that it no longer should (a re-plan brings them back)."""
    return bool(status.plan and status.plan.excluded_gpu_types) and not active(status, ttl_s, now)


def excluded(types: tuple[str, ...], why: str, since: dt.datetime, ttl_s: float, generation: int | None) -> Condition:
    """The condition for `types` left out from `since` (when the last was)."""
    until = now_rfc3339(since + dt.timedelta(seconds=ttl_s))
    message = (
        f"{', '.join(types)} left out of planning until {until} (KVSCALE_GPU_EXCLUSION_TTL "
        f"{_span(ttl_s)} after the last was left out): {why}; kvscale then plans with every type again"
    )
    return Condition(
        type=CONDITION,
        status="True",
        reason="GPUsShort",
        message=message[:1000],
        last_transition_time=now_rfc3339(since),
        observed_generation=generation,
    )


def until_in(message: str | None) -> dt.datetime | None:
    """The end of the exclusions, as the condition's message says it (for `kvscale status`)."""
    found = _UNTIL.search(message or "")
    return _stamp(found.group(1)) if found else None
