"""Issue 38, findings 3 and 4: calibrated profiles per namespace and configuration, planned with
on every reconcile, for the engine release the service runs; and the edge that keeps NaN out
of status (the LOW item)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from typing import Any

from kvscale.api.intent import Intent, read_spec
from kvscale.calibration.fit import Window, config_key
from kvscale.calibration.profile import NAMESPACE_LABEL, PINNED_ANNOTATION, profile_name, read_profile
from kvscale.control.calibration import (
    calibrated,
    calibrated_catalog,
    planning_catalog,
    profile_key,
    serving_config,
    step,
    stored_profile,
)
from kvscale.control.reconcile import Observed, Resource, reconcile
from kvscale.sizing.engine_profiles import profile_on
from tests.unit.test_calibration_fit import _measured
from tests.unit.test_calibration_tick import BATCHES, _intent, _service
from tests.unit.test_reconcile import CAT, NOW, POOLS, SETTINGS

OPERATOR_NS = "kvscale-system"


class Store:
    """The operator namespace's ConfigMaps, by name (what Kube.read_configmap / write_configmap do)."""

    def __init__(self) -> None:
        self.bodies: dict[str, dict[str, Any]] = {}

    def read(self, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.bodies.get(name))

    def write(self, body: dict[str, Any]) -> None:
        self.bodies[body["metadata"]["name"]] = copy.deepcopy(body)


def _tick(store: Store, cfg: Any, windows: list[Window], namespace: str) -> Any:
    """One calibration tick as the operator runs it (kvscale.operator.calibration._fit_and_write)."""
    _, _, stored = stored_profile(cfg, namespace, store.read)
    done = step(cfg, windows, stored, OPERATOR_NS, NOW, profile_key(cfg, namespace))
    if done.write is not None:
        store.write(done.write)
    return done


def test_another_namespaces_fit_never_changes_this_ones_profile_or_replans_it() -> None:
    spec, first, cfg, slow = _service(20)
    store = Store()
    victim = _tick(store, cfg, _measured(cfg, BATCHES), "team-a")  # its engines run as the catalog says
    assert victim.write is not None
    mine = profile_name(profile_key(cfg, "team-a"))
    assert victim.write["metadata"]["labels"][NAMESPACE_LABEL] == "team-a"
    kept = copy.deepcopy(store.bodies[mine])
    # The same spec in another namespace with a slow engine, fitted over and over.
    for seed in range(3):
        evil = _tick(store, cfg, _measured(slow, BATCHES, seed=seed), "evil")
        assert evil.write is None or evil.write["metadata"]["name"] != mine
    assert store.bodies[mine] == kept
    assert profile_name(config_key(cfg)) not in store.bodies  # no shared profile is ever written
    # The victim's next tick compares with its own fit: nothing moved, nothing re-planned.
    again = _tick(store, cfg, _measured(cfg, BATCHES, seed=7), "team-a")
    assert again.status.reason == "Unchanged" and again.moved == ()
    result = calibrated(
        again, cfg, _intent(spec), _res("team-a"), first.status, lambda: Observed(POOLS), CAT, SETTINGS, NOW
    )
    assert result.apply == () and result.events == () and result.status.plan == first.status.plan
    # ... and plans with its own profile, not the slow one.
    own = planning_catalog(CAT, _intent(spec), first.status, "team-a", store.read)
    theirs = planning_catalog(CAT, _intent(spec), first.status, "evil", store.read)
    name = cfg.engine.profile
    assert own.engines[name].matmul_efficiency_factor != theirs.engines[name].matmul_efficiency_factor


def test_a_shared_profile_counts_only_where_an_administrator_pinned_it() -> None:
    spec, first, cfg, slow = _service(20)
    store = Store()
    shared = step(cfg, _measured(slow, BATCHES), None, OPERATOR_NS, NOW).write  # keyed by the configuration alone
    assert shared is not None
    store.write(shared)
    # Unpinned (an older operator's shared profile, or anyone's): neither compared with nor planned on.
    assert stored_profile(cfg, "team-a", store.read)[1] is None
    assert planning_catalog(CAT, _intent(spec), first.status, "team-a", store.read) is CAT
    # Pinned by an administrator: every namespace plans and compares with it, and never rewrites it.
    shared["metadata"]["annotations"][PINNED_ANNOTATION] = "true"
    store.write(shared)
    done = _tick(store, cfg, _measured(cfg, BATCHES), "team-a")
    assert done.status.reason == "Pinned" and done.write is None
    assert done.status.profile == profile_name(config_key(cfg))
    pinned = planning_catalog(CAT, _intent(spec), first.status, "team-b", store.read)
    fitted = read_profile(shared, config_key(cfg))
    assert fitted is not None
    assert pinned.engines[cfg.engine.profile].matmul_efficiency_factor == fitted.updates["matmul_efficiency_factor"]


def test_a_newly_pinned_profile_is_planned_with_at_once() -> None:
    spec, first, cfg, slow = _service(20)
    store = Store()
    shared = step(cfg, _measured(slow, BATCHES), None, OPERATOR_NS, NOW).write
    assert shared is not None and first.status.plan is not None
    shared["metadata"]["annotations"][PINNED_ANNOTATION] = "true"
    store.write(shared)
    done = _tick(store, cfg, _measured(cfg, BATCHES), "team-a")
    result = calibrated(
        done, cfg, _intent(spec), _res("team-a"), first.status, lambda: Observed(POOLS), CAT, SETTINGS, NOW
    )
    after = result.status.plan
    assert after is not None and after.replicas > first.status.plan.replicas  # the pinned (slower) profile
    assert [e.reason for e in result.events][:1] == ["ProfileCalibrated"]
    # Pinned already: the next tick re-plans nothing more.
    again = calibrated(
        done, cfg, _intent(spec), _res("team-a"), result.status, lambda: Observed(POOLS), CAT, SETTINGS, NOW
    )
    assert again.apply == () and again.events == ()


def _res(namespace: str) -> Resource:
    return Resource(namespace, "chat", "uid-1", 1)


def test_a_restarted_operator_plans_the_calibrated_plan_again() -> None:
    spec, first, cfg, slow = _service(20)
    store = Store()
    res = _res("team-a")
    done = _tick(store, cfg, _measured(slow, BATCHES), "team-a")
    moved = calibrated(done, cfg, _intent(spec), res, first.status, lambda: Observed(POOLS), CAT, SETTINGS, NOW)
    plan = moved.status.plan
    assert plan is not None and first.status.plan is not None and plan.replicas != first.status.plan.replicas
    # A restart: no memory; the resume reconciles from status and the stored ConfigMap.
    status = moved.status
    catalog = planning_catalog(CAT, _intent(spec), status, "team-a", store.read)
    again = reconcile(read_spec(spec), res, status, Observed(POOLS), catalog, SETTINGS, now=NOW)
    after = again.status.plan
    assert after is not None
    assert (after.gpu_type, after.replicas, after.max_batch) == (plan.gpu_type, plan.replicas, plan.max_batch)
    assert after.rate_per_replica == plan.rate_per_replica
    # What it did before: the catalog's plan, the calibrated one lost.
    lost = reconcile(read_spec(spec), res, status, Observed(POOLS), CAT, SETTINGS, now=NOW).status.plan
    assert lost is not None and (lost.replicas, lost.max_batch) != (plan.replicas, plan.max_batch)


def test_calibration_fits_the_profile_of_the_release_the_service_runs() -> None:
    spec = copy.deepcopy(_service(20)[0])
    spec["engine"] = {"type": "vllm", "image": "vllm/vllm-openai:v0.6.3"}
    intent = read_spec(spec)
    assert isinstance(intent, Intent)
    first = reconcile(intent, _res("team-a"), first_status(), Observed(POOLS), CAT, SETTINGS, now=NOW)
    plan = first.status.plan
    assert plan is not None
    cfg = serving_config(intent, plan, CAT)
    assert cfg is not None
    release = profile_on(CAT, "vllm", CAT.gpu(plan.gpu_type), "vllm/vllm-openai:v0.6.3")
    assert release.profile != CAT.engine("vllm").profile  # an older release than the newest
    assert cfg.engine.profile == release.profile and cfg.engine.image == "vllm/vllm-openai:v0.6.3"
    assert "vllm@vllm/vllm-openai:v0.6.3" in profile_key(cfg, "team-a")  # the spec's image, not the catalog's
    patched = calibrated_catalog(CAT, cfg.engine.profile, {"matmul_efficiency_factor": 0.123})
    assert patched.engines[release.profile].matmul_efficiency_factor == 0.123
    assert patched.engine("vllm") == CAT.engine("vllm")  # the newest release left as it is


def first_status() -> Any:
    from kvscale.api.models import InferenceServiceStatus

    return InferenceServiceStatus()


def test_non_finite_or_negative_windows_are_dropped_and_status_stays_json() -> None:
    _, _, cfg, slow = _service(20)
    good = _measured(slow, BATCHES)
    bad = [
        replace(good[0], batch=math.nan),
        replace(good[1], context_tokens=math.inf),
        replace(good[2], context_tokens=-500.0),
        replace(good[3], prompt_tokens=math.nan),
        replace(good[4], steps=math.nan),
        replace(good[5], gaps=math.inf),
    ]
    assert not any(w.sane for w in bad)
    done = step(cfg, [*bad, *good[6:]], None, OPERATOR_NS, NOW)
    clean = step(cfg, good[6:], None, OPERATOR_NS, NOW)
    assert done.status.reason == clean.status.reason
    assert done.updates == clean.updates  # the bad windows did not enter the fit
    json.dumps(done.status.model_dump(by_alias=True), allow_nan=False)  # valid JSON: no NaN, no inf
    # Only bad windows: NotEnoughData, and still no NaN in status.
    only_bad = step(cfg, bad, None, OPERATOR_NS, NOW)
    assert only_bad.status.reason == "NotEnoughData"
    json.dumps(only_bad.status.model_dump(by_alias=True), allow_nan=False)
    written = read_profile(done.write or {}, config_key(cfg))
    assert written is None or all(math.isfinite(v) for v in written.updates.values())


def test_a_configuration_is_fitted_at_most_once_per_interval(monkeypatch: Any) -> None:
    """The fit is the tick's CPU (about 90 ms for 2 pods x 30 windows): between fits of a
    configuration the stored profile is only compared with the windows."""
    import kvscale.control.calibration as core
    from kvscale.operator.calibration import FitClock, min_fit_interval_s

    _, _, cfg, slow = _service(20)
    windows = _measured(slow, BATCHES)
    first = step(cfg, windows, None, OPERATOR_NS, NOW)
    assert first.fitted and first.write is not None
    calls = [0]
    real = core.fit  # type: ignore[attr-defined]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "fit", counted)
    skipped = step(cfg, windows, first.write, OPERATOR_NS, NOW, fit_due=False)
    assert calls[0] == 0 and not skipped.fitted and skipped.write is None and skipped.moved == ()
    assert skipped.status.reason == "Unchanged" and skipped.status.predicted_gap_seconds is not None
    # Nothing stored yet: the first fit is never held back.
    assert step(cfg, windows, None, OPERATOR_NS, NOW, fit_due=False).fitted and calls[0] == 1
    # A refit starts from the stored profile and lands where a fit from the catalog does.
    again = step(cfg, windows, first.write, OPERATOR_NS, NOW)
    assert again.fitted and again.status.reason == "Unchanged"
    clock = FitClock()
    interval = min_fit_interval_s(60.0, 1800.0)
    assert interval == 300.0 and min_fit_interval_s(600.0, 1800.0) == 600.0
    assert clock.due("k", 0.0, interval)
    clock.mark("k", 0.0)
    assert not clock.due("k", 299.0, interval) and clock.due("k", 300.0, interval) and clock.due("other", 1.0, interval)


def test_a_calibrated_move_to_another_configuration_is_planned_on_after_a_restart_too() -> None:
    """A re-plan on the calibrated profile that lands on another GPU type stores the profile it
    was made with under that configuration's key: a restart plans there with it, not with the
    catalog (which would move the service back)."""
    from kvscale.control.calibration import carried

    spec, first, cfg, slow = _service(20)
    store = Store()
    done = _tick(store, cfg, _measured(slow, BATCHES), "team-a")
    assert done.write is not None and first.status.plan is not None
    elsewhere = first.status.plan.model_copy(update={"gpu_type": "A100-80GB"})
    body = carried(done, _intent(spec), elsewhere, CAT, "team-a", NOW)
    assert body is not None
    moved_to = serving_config(_intent(spec), elsewhere, CAT)
    assert moved_to is not None
    key = profile_key(moved_to, "team-a")
    assert body["metadata"]["name"] == profile_name(key) and body["metadata"]["labels"]["kvscale.io/gpu"] == "A100-80GB"
    kept = read_profile(body, key)
    fitted = read_profile(done.write, profile_key(cfg, "team-a"))
    assert kept is not None and fitted is not None and kept.updates == fitted.updates and not kept.pinned
    store.write(body)
    status = first.status.model_copy(update={"plan": elsewhere})
    catalog = planning_catalog(CAT, _intent(spec), status, "team-a", store.read)
    assert catalog.engines[cfg.engine.profile].matmul_efficiency_factor == kept.updates["matmul_efficiency_factor"]
    # The same configuration: nothing more to store.
    assert carried(done, _intent(spec), first.status.plan, CAT, "team-a", NOW) is None


def test_every_plan_reads_the_profile_once_and_an_rbac_refusal_plans_on_the_catalog() -> None:
    """The shell (planning_catalog_of): a ConfigMap is read once per name, then from memory
    (the calibration tick refreshes it); no ConfigMap RBAC (an older chart) plans anyway."""
    from types import SimpleNamespace

    from kvscale.control.settings import Settings
    from kvscale.operator.calibration import planning_catalog_of
    from kvscale.operator.handlers import Runtime
    from kvscale.operator.k8s import Refused

    spec, first, cfg, slow = _service(20)
    store = Store()
    done = _tick(store, cfg, _measured(slow, BATCHES), "cache-ns")
    assert done.write is not None

    class Kube:
        reads = 0
        refuse = False

        def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
            Kube.reads += 1
            if Kube.refuse:
                raise Refused(f"reading ConfigMap {namespace}/{name}", 403, "forbidden")
            return store.read(name)

    rt = Runtime(Settings(), CAT, Kube())  # type: ignore[arg-type]
    call = SimpleNamespace(intent=_intent(spec), before=first.status, res=_res("cache-ns"))
    # The autoscale tick (in the loop) never reads: nothing kept yet, the catalog's.
    assert planning_catalog_of(rt, call, cached=True) is CAT and Kube.reads == 0  # type: ignore[arg-type]
    got = planning_catalog_of(rt, call)  # type: ignore[arg-type]
    assert got.engines[cfg.engine.profile] != CAT.engines[cfg.engine.profile] and Kube.reads == 2  # shared, own
    again = planning_catalog_of(rt, call)  # type: ignore[arg-type]
    assert again.engines[cfg.engine.profile] == got.engines[cfg.engine.profile] and Kube.reads == 2
    kept = planning_catalog_of(rt, call, cached=True)  # type: ignore[arg-type]
    assert kept.engines[cfg.engine.profile] == got.engines[cfg.engine.profile] and Kube.reads == 2
    Kube.refuse = True
    refused = planning_catalog_of(rt, SimpleNamespace(intent=_intent(spec), before=first.status, res=_res("other")))  # type: ignore[arg-type]
    assert refused is CAT
    off = Runtime(Settings(calibration_interval_s=0.0), CAT, Kube())  # type: ignore[arg-type]
    assert planning_catalog_of(off, call) is CAT  # type: ignore[arg-type]
