"""The calibration tick's pure core: from the windows the engines' metrics gave (read by the
operator shell, kvscale.operator.calibration) and the profile ConfigMap as stored, what to write,
what status says, and whether the plan is made again on the calibrated profile.

- Too little data (NotEnoughData) writes nothing; status says why (reason NotEnoughData): it
  is the normal state of a new or idle service, not an error.
- A pinned ConfigMap is read, never rewritten (kvscale.calibration.profile).
- A stored profile is rewritten only where a field moved beyond the hysteresis (`moves`);
  a re-plan follows only when the calibrated profile changes the plan's replicas or GPU type.
- Profiles are the service's namespace's own (`profile_key`): another tenant's engines never
  write what this one compares with or plans on. A configuration's shared profile (no
  namespace) is honoured only where an administrator pinned it (issue 38).
- The profile is that of the engine release the pods run (spec.engine.image's tag, as the
  planner resolves it), and the stored or pinned one is what every reconcile plans with
  (`planning_catalog`), not only the tick where it moved: a restarted operator plans the
  calibrated plan again instead of rolling back to the catalog's.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvscale.api.intent import Intent, SpecError
from kvscale.api.models import CalibrationStatus, InferenceServiceStatus, PlanStatus
from kvscale.calibration.fit import Comparison, NotEnoughData, Window, compare, config_key, fit, with_fields
from kvscale.calibration.profile import (
    CONFIG_ANNOTATION,
    Move,
    StoredProfile,
    moves,
    profile_configmap,
    profile_name,
    read_profile,
    rekeyed,
    replan_message,
    scoped_key,
)
from kvscale.control.reconcile import Event, Observed, Resource, Result, replan
from kvscale.control.replan import ProfileCalibrated
from kvscale.control.resources import EngineImageError, engine_image
from kvscale.control.settings import Settings
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.engine_profiles import profile_on


def serving_config(intent: Intent, plan: PlanStatus, catalog: Catalog) -> ServingConfig | None:
    """The planned configuration (model, GPU type, TP, precision, engine); None where the
    catalog cannot build it (a custom architecture, a GPU type no longer in the catalog). The
    engine is the profile of the release the pods run (profile_on: what the planner sized them
    with), carrying the image they run, so the key names the spec's engine version."""
    try:
        gpu = catalog.gpu(plan.gpu_type)
        release = profile_on(catalog, intent.engine, gpu, intent.spec.engine.image, intent.spec.engine.rocm_image)
        cfg = ServingConfig.build(
            catalog,
            catalog.model(intent.model.name or ""),
            gpu,
            plan.precision,
            plan.tensor_parallel,
            intent.kv_cache_precision,
            release.profile,
            plan.max_num_batched_tokens,
            plan.pipeline_parallel,
            plan.expert_parallel,
            plan.data_parallel,
        )
        image = engine_image(intent.spec, release, gpu)
    except (KeyError, ValueError, EngineImageError):
        return None
    return replace(cfg, engine=cfg.engine.model_copy(update={"image": image}))


def profile_key(cfg: ServingConfig, namespace: str) -> str:
    """The key of the namespace's own profile of `cfg` (the only one the operator writes)."""
    return scoped_key(config_key(cfg), namespace)


def stored_profile(
    cfg: ServingConfig, namespace: str, read: Callable[[str], Mapping[str, Any] | None]
) -> tuple[str, StoredProfile | None, Mapping[str, Any] | None]:
    """The profile `cfg` is planned and compared with in `namespace`: the configuration's shared
    profile where an administrator pinned it, else the namespace's own. `read(name)`: a ConfigMap
    of the operator's namespace, or None. Returns (ConfigMap name, the profile, its body as read)."""
    shared_key = config_key(cfg)
    shared = read(profile_name(shared_key))
    pinned = None if shared is None else read_profile(shared, shared_key)
    if pinned is not None and pinned.pinned:
        return profile_name(shared_key), pinned, shared
    key = profile_key(cfg, namespace)
    own = read(profile_name(key))
    return profile_name(key), None if own is None else read_profile(own, key), own


def planning_catalog(
    catalog: Catalog,
    intent: Intent | SpecError,
    status: InferenceServiceStatus,
    namespace: str,
    read: Callable[[str], Mapping[str, Any] | None],
) -> Catalog:
    """The catalog a service plans with: its planned configuration's stored (or pinned) profile
    over the catalog's, else the catalog as it is (no plan yet, nothing stored)."""
    if isinstance(intent, SpecError) or status.plan is None:
        return catalog
    cfg = serving_config(intent, status.plan, catalog)
    if cfg is None:
        return catalog
    _, kept, _ = stored_profile(cfg, namespace, read)
    return catalog if kept is None else calibrated_catalog(catalog, cfg.engine.profile, kept.updates)


def calibrated_catalog(catalog: Catalog, engine: str, updates: Mapping[str, float]) -> Catalog:
    """The catalog with `engine`'s profile (a profile key such as vllm-0.11, or an engine's name
    for its newest) carrying the fitted fields: what a plan on the calibrated profile plans with."""
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
    fitted: bool = False  # the fit ran (the CPU-bound part: see kvscale.operator.calibration)


def _finite(value: float | None) -> float | None:
    """A number for status, or None: NaN and infinity are not JSON and must never reach it."""
    return value if value is not None and math.isfinite(value) else None


def _times(against: Comparison | None) -> dict[str, float | None]:
    return {
        "predicted_gap_seconds": _finite(None if against is None else against.predicted_gap_s),
        "observed_gap_seconds": _finite(None if against is None else against.observed_gap_s),
        "predicted_prefill_seconds": _finite(None if against is None else against.predicted_prefill_s),
        "observed_prefill_seconds": _finite(None if against is None else against.observed_prefill_s),
    }


def step(
    cfg: ServingConfig,
    windows: Sequence[Window],
    stored: Mapping[str, Any] | None,
    namespace: str,
    now: dt.datetime,
    key: str | None = None,
    fit_due: bool = True,
) -> Step:
    """Fit, compare with the stored profile, and say what to write. `key`: the profile's key
    (profile_key: the service's namespace's own; default the configuration's, as the CLI has
    it); `stored`: the ConfigMap as read for it (or the shared one an administrator pinned,
    stored_profile). Windows with a non-finite or negative count are dropped here, at the edge
    (Window.sane): they neither enter the fit nor put NaN into status. `fit_due` False: the
    configuration was fitted a short while ago; a stored profile is compared with the windows
    (cheap) and not fitted again."""
    windows = [w for w in windows if w.sane]
    key = key or config_key(cfg)
    kept: StoredProfile | None = None if stored is None else read_profile(stored, key)
    if stored is not None and kept is None and key != config_key(cfg):
        shared = read_profile(stored, config_key(cfg))  # another namespace's is never this
        kept = shared if shared is not None and shared.pinned else None
    name = profile_name(key if kept is None else kept.key)
    when = now.isoformat(timespec="seconds")
    current = cfg if kept is None else with_fields(cfg, kept.updates)
    times = _times(compare(current, windows))
    profile = None if kept is None else name
    if kept is not None and kept.pinned:
        return Step(
            CalibrationStatus(profile=name, reason="Pinned", message=f"{name} is pinned", last_time=when, **times),
            updates=kept.updates,
        )
    if kept is not None and not fit_due:
        message = f"{name} compared with the windows read; fitted again once due (at most one fit per configuration and while)"
        return Step(CalibrationStatus(profile=name, reason="Unchanged", message=message, last_time=when, **times))
    try:
        result = fit(cfg, windows, start=None if kept is None else kept.updates)
    except NotEnoughData as exc:
        message = f"{exc} ({len(windows)} window(s) read)"
        return Step(
            CalibrationStatus(profile=profile, reason="NotEnoughData", message=message, last_time=when, **times)
        )
    moved = moves(kept.updates if kept is not None else {}, result)
    if kept is not None and not moved:
        message = f"Fitted within the stored profile's error (rms error {result.rms_error:.1%})"
        return Step(
            CalibrationStatus(profile=name, reason="Unchanged", message=message, last_time=when, **times), fitted=True
        )
    fitted = with_fields(cfg, result.updates())
    against = compare(fitted, windows)
    if against is not None:
        times = _times(against)
    message = (
        f"Fitted {result.decode_windows} decode and {result.prefill_windows} prefill windows: rms error "
        f"{result.rms_error:.1%} (catalog {result.prior_rms_error:.1%})"
    )
    return Step(
        CalibrationStatus(profile=name, reason="Fitted", message=message, last_time=when, **times),
        write=profile_configmap(result, namespace, when, key),
        moved=tuple(moved),
        updates=result.updates(),
        fitted=True,
    )


def carried(
    done: Step, intent: Intent, after: PlanStatus | None, catalog: Catalog, namespace: str, now: dt.datetime
) -> dict[str, Any] | None:
    """Where a re-plan on the calibrated profile moved to another configuration (GPU type,
    parallelism), the same profile stored under that configuration's key too: the next
    reconcile (a restart, a spec edit) plans with the profile of the configuration in status
    (planning_catalog), and finds there what this plan was made with instead of the catalog
    (which would move it back). The engines there refit it from their own windows."""
    if done.write is None or after is None:
        return None
    moved_to = serving_config(intent, after, catalog)
    if moved_to is None:
        return None
    key = profile_key(moved_to, namespace)
    if key == ((done.write.get("metadata") or {}).get("annotations") or {}).get(CONFIG_ANNOTATION):
        return None
    return rekeyed(done.write, key, now.isoformat(timespec="seconds"))


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
    # A profile an administrator just pinned is planned with at once, as a moved one is (every
    # reconcile after plans with it too: planning_catalog).
    was = before.calibration.reason if before.calibration is not None else None
    newly_pinned = done.status.reason == "Pinned" and was != "Pinned"
    if done.updates is None or not (done.moved or newly_pinned) or before.plan is None:
        return Result(status=status)
    reason = ProfileCalibrated(done.status.profile or profile_name(config_key(cfg)))
    with_profile = calibrated_catalog(catalog, cfg.engine.profile, done.updates)
    result = replan(reason, intent, res, status, observed(), with_profile, settings, now)
    after = result.status.plan
    if result.retry is not None or after is None or not changes_plan(before.plan, after):
        return Result(status=status)
    message = replan_message(config_key(cfg), list(done.moved), before.plan.replicas, after.replicas)
    if after.gpu_type != before.plan.gpu_type:
        message += f"; GPU type {before.plan.gpu_type} -> {after.gpu_type}"
    events = (Event(reason.event_type, reason.reason, message[:1000]), *result.events[1:])
    return replace(result, status=result.status.model_copy(update={"calibration": done.status}), events=events)
