"""Applying a Result: children, scale, status, Events, then kopf's retry policy. The only
place where a reconcile's value turns into writes."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kvscale.api import selector
from kvscale.api.models import InferenceServiceStatus, status_patch
from kvscale.control.reconcile import NAME_CONFLICT, Resource, Result, name_conflict
from kvscale.control.status import condition, with_conditions
from kvscale.operator import telemetry
from kvscale.operator.k8s import Foreign, Kube, Refused

log = logging.getLogger("kvscale.operator")


def write_status(patch: kopf.Patch, before: InferenceServiceStatus, after: InferenceServiceStatus) -> None:
    """Only what changed; nothing at all when nothing did."""
    for key, value in status_patch(before, after).items():
        patch.status[key] = value


def writes(result: Result) -> bool:
    """Whether applying `result` calls the API server (beyond kopf's own status patch)."""
    return bool(
        result.apply
        or result.delete
        or result.delete_named
        or result.scale_to is not None
        or result.scale_named
        or result.prune_pools
    )


def _post(body: Any, result: Result) -> None:
    for event in result.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _refused(
    body: Any,
    patch: kopf.Patch,
    before: InferenceServiceStatus,
    status: InferenceServiceStatus,
    res: Resource,
    exc: Refused,
) -> None:
    message = str(exc)[:1000]
    failed = with_conditions(
        status,
        condition(status, "Ready", False, "Refused", message, res.generation),
        phase="Failed",
        observed_generation=res.generation,
    )
    write_status(patch, before, failed)
    kopf.warn(body, reason="Refused", message=message)
    raise kopf.PermanentError(message) from exc


def _foreign(
    body: Any, patch: kopf.Patch, before: InferenceServiceStatus, result: Result, res: Resource, exc: Foreign
) -> None:
    """Another's object held a child's name when kvscale went to write it (the informers had
    not seen it): nothing was written to it. Not deployed yet: Pending with NameConflict, which
    the status tick re-checks; already serving: NameConflict and Ready False beside what runs."""
    conflict = name_conflict(result.status, res, (exc.view,))
    status = result.status
    if status.ready_replicas:
        status = with_conditions(status, *(c for c in conflict.status.conditions if c.type in (NAME_CONFLICT, "Ready")))
    else:
        status = conflict.status
    write_status(patch, before, status)
    _post(body, conflict)


def apply(
    kube: Kube, body: Any, patch: kopf.Patch, before: InferenceServiceStatus, result: Result, res: Resource
) -> None:
    """Delete, apply (owned by the resource), scale, write the status, post the Events, and
    raise kopf's TemporaryError when the result asks for a retry after a delay (a spec that
    cannot be met is logged as a warning: not_planned)."""
    try:
        for kind in result.delete:
            kube.delete_if_present(kind, res.namespace, res.name)
        for kind, name in result.delete_named:  # a disaggregated plan's pools, by their own names
            kube.delete_if_present(kind, res.namespace, name)
        children = [dict(c) for c in result.apply]
        kopf.adopt(children, owner=body)
        for child in children:
            kube.apply(child)
        if result.scale_to is not None:
            kube.scale(res.namespace, res.name, result.scale_to, result.scale_kind)
        for kind, name, replicas in result.scale_named:  # a disaggregated plan's pools
            kube.scale(res.namespace, name, replicas, kind)
        if result.prune_pools:
            kube.prune_pools(res.namespace, selector(res.name), res.uid, result.keep_pool)
    except Refused as exc:
        _refused(body, patch, before, result.status, res, exc)
    except Foreign as exc:
        _foreign(body, patch, before, result, res, exc)
        return
    write_status(patch, before, result.status)
    _post(body, result)
    if result.retry is not None:
        if result.retry.delay_s is None:
            not_planned(res, result)
            return
        raise kopf.TemporaryError(result.retry.message, delay=result.retry.delay_s)


def not_planned(res: Resource, result: Result) -> None:
    """A spec that cannot be met as written (an SLO no GPU type meets, a context above the
    model's, ...) is the user's to change, not the operator's failure: logged once at WARNING with
    its reason, beside the status condition and the Warning Event `result` carries. kopf's
    PermanentError logged it at ERROR ("Handler 'on_spec' failed permanently") and posted a second,
    Error-typed Event; a handler that returns waits for the next spec edit all the same."""
    reason = next((e.reason for e in result.events if e.type == "Warning"), "NotPlanned")
    message = result.retry.message if result.retry is not None else ""
    log.warning("[%s/%s] Not planned (%s): %s", res.namespace, res.name, reason, message)


def timer_failed(
    stage: str, body: Any, patch: kopf.Patch, before: InferenceServiceStatus, res: Resource, exc: Exception
) -> None:
    """A timer failed unexpectedly: counted, logged naming the object, and visible in status
    (condition Synced=False) until a later run succeeds. No retry loop: the timer runs again."""
    telemetry.ERRORS.labels(stage).inc()
    log.warning("Timer %s failed for %s/%s: %s: %s", stage, res.namespace, res.name, type(exc).__name__, exc)
    message = f"{stage} failed: {type(exc).__name__}: {exc}"
    failed = with_conditions(
        before, condition(before, "Synced", False, f"{stage.capitalize()}Failed", message, res.generation)
    )
    write_status(patch, before, failed)
