"""The calibration tick's pure core: from the windows the engines' metrics gave (read by the
operator shell, kvscale.operator.calibration) and the profile ConfigMap as stored, what to write,
what status says, and whether the plan is made again on the calibrated profile.

- Too little data (NotEnoughData) writes nothing; status says why (reason NotEnoughData): it
  is the normal state of a new or idle service, not an error.
- A pinned ConfigMap is read, never rewritten (kvscale.calibration.profile).
- A stored profile is rewritten only where a field moved beyond the hysteresis (`moves`);
  a re-plan follows only when the calibrated profile changes the plan's replicas or GPU type.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvscale.api.intent import Intent
from kvscale.api.models import CalibrationStatus, InferenceServiceStatus, PlanStatus
from kvscale.calibration.fit import NotEnoughData, Window, compare, config_key, fit, with_fields
from kvscale.calibration.profile import (
    Move,
    StoredProfile,
    moves,
    profile_configmap,
    profile_name,
    read_profile,
    replan_message,
)
from kvscale.control.reconcile import Event, Observed, Resource, Result, replan
from kvscale.control.replan import ProfileCalibrated
from kvscale.control.settings import Settings
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.config import ServingConfig


def serving_config(intent: Intent, plan: PlanStatus, catalog: Catalog) -> ServingConfig | None:
    """The planned configuration (model, GPU type, TP, precision, engine); None where the
    catalog cannot build it (a custom architecture, a GPU type no longer in the catalog)."""
    try:
        return ServingConfig.build(
            catalog,
            catalog.model(intent.model.name or ""),
            catalog.gpu(plan.gpu_type),
            plan.precision,
            plan.tensor_parallel,
            intent.kv_cache_precision,
            intent.engine,
            plan.max_num_batched_tokens,
            plan.pipeline_parallel,
            plan.expert_parallel,
            plan.data_parallel,
        )
    except (KeyError, ValueError):
        return None


def calibrated_catalog(catalog: Catalog, engine: str, updates: Mapping[str, float]) -> Catalog:
    """The catalog with `engine`'s profile (what the planner resolves the name to) carrying the
    fitted fields: what a re-plan on the calibrated profile plans with."""
    profile = catalog.engine(engine)
    key = next(k for k, p in catalog.engines.items() if p is profile)
    engines = {**catalog.engines, key: profile.model_copy(update=dict(updates))}
    return catalog.model_copy(update={"engines": engines})


@dataclass(frozen=True)
class Step:
    """One calibration tick's outcome."""

    status: CalibrationStatus
    write: dict[str, Any] | None = None  # the ConfigMap to create or replace
    moved: tuple[Move, ...] = ()  # fields beyond the hysteresis (a re-plan is weighed on these)
    updates: Mapping[str, float] | None = None  # the profile to plan with, when it moved


def step(
    cfg: ServingConfig,
    windows: Sequence[Window],
    stored: Mapping[str, Any] | None,
    namespace: str,
    now: dt.datetime,
) -> Step:
    """Fit, compare with the stored profile, and say what to write."""
    key = config_key(cfg)
    name = profile_name(key)
    when = now.isoformat(timespec="seconds")
    kept: StoredProfile | None = None if stored is None else read_profile(stored, key)
    current = cfg if kept is None else with_fields(cfg, kept.updates)
    against = compare(current, windows)
    times: dict[str, float | None] = {
        "predicted_gap_seconds": None if against is None else against.predicted_gap_s,
        "observed_gap_seconds": None if against is None else against.observed_gap_s,
        "predicted_prefill_seconds": None if against is None else against.predicted_prefill_s,
        "observed_prefill_seconds": None if against is None else against.observed_prefill_s,
    }
    profile = None if kept is None else name
    if kept is not None and kept.pinned:
        return Step(
            CalibrationStatus(profile=name, reason="Pinned", message=f"{name} is pinned", last_time=when, **times)
        )
    try:
        result = fit(cfg, windows)
    except NotEnoughData as exc:
        message = f"{exc} ({len(windows)} window(s) read)"
        return Step(
            CalibrationStatus(profile=profile, reason="NotEnoughData", message=message, last_time=when, **times)
        )
    moved = moves(kept.updates if kept is not None else {}, result)
    if kept is not None and not moved:
        message = f"Fitted within the stored profile's error (rms error {result.rms_error:.1%})"
        return Step(CalibrationStatus(profile=name, reason="Unchanged", message=message, last_time=when, **times))
    fitted = with_fields(cfg, result.updates())
    against = compare(fitted, windows)
    if against is not None:
        times = {
            "predicted_gap_seconds": against.predicted_gap_s,
            "observed_gap_seconds": against.observed_gap_s,
            "predicted_prefill_seconds": against.predicted_prefill_s,
            "observed_prefill_seconds": against.observed_prefill_s,
        }
    message = (
        f"Fitted {result.decode_windows} decode and {result.prefill_windows} prefill windows: rms error "
        f"{result.rms_error:.1%} (catalog {result.prior_rms_error:.1%})"
    )
    return Step(
        CalibrationStatus(profile=name, reason="Fitted", message=message, last_time=when, **times),
        write=profile_configmap(result, namespace, when),
        moved=tuple(moved),
        updates=result.updates(),
    )


def changes_plan(before: PlanStatus, after: PlanStatus | None) -> bool:
    """Whether a plan made on the calibrated profile deploys on something else: replicas, GPU
    type, parallelism. The batch limit alone is not enough: nearly any move shifts it by a few
    sequences, and a new --max-num-seqs restarts every engine for little gain."""
    if after is None:
        return False
    return (before.replicas, before.gpu_type, before.tensor_parallel, before.pipeline_parallel) != (
        after.replicas,
        after.gpu_type,
        after.tensor_parallel,
        after.pipeline_parallel,
    )


def calibrated(
    done: Step,
    cfg: ServingConfig,
    intent: Intent,
    res: Resource,
    before: InferenceServiceStatus,
    observed: Callable[[], Observed],
    catalog: Catalog,
    settings: Settings,
    now: dt.datetime,
) -> Result:
    """The tick's status, and the re-plan on the calibrated profile where a field moved beyond
    the hysteresis and the plan made with it deploys something else (one Event, replan_message,
    saying what moved and what it did to the replicas). A profile that moved without changing
    the plan re-plans nothing: the children stay as they are."""
    status = before.model_copy(update={"calibration": done.status})
    if done.updates is None or not done.moved or before.plan is None:
        return Result(status=status)
    reason = ProfileCalibrated(done.status.profile or profile_name(config_key(cfg)))
    with_profile = calibrated_catalog(catalog, intent.engine, done.updates)
    result = replan(reason, intent, res, status, observed(), with_profile, settings, now)
    after = result.status.plan
    if result.retry is not None or after is None or not changes_plan(before.plan, after):
        return Result(status=status)
    message = replan_message(config_key(cfg), list(done.moved), before.plan.replicas, after.replicas)
    if after.gpu_type != before.plan.gpu_type:
        message += f"; GPU type {before.plan.gpu_type} -> {after.gpu_type}"
    events = (Event(reason.event_type, reason.reason, message[:1000]), *result.events[1:])
    return replace(result, status=result.status.model_copy(update={"calibration": done.status}), events=events)
