"""The calibrated profile as an object users can read, pin and reset: one ConfigMap per
namespace and serving configuration (pure: builds and reads the object's body; the operator
applies it).

Why per namespace (issue 38): a profile shared by every namespace let one tenant's engines (a
slow engine, a forged load) rewrite the profile another tenant's re-plans compared with and
planned on. So the operator writes and compares only the service's own namespace's profile
(`scoped_key`); a profile keyed by the configuration alone, with no namespace, is one an
administrator made (the ConfigMaps live in the operator's namespace) and is honoured for every
namespace only when pinned.

Why a ConfigMap and not a CRD: no second resource to install and upgrade with the chart, and
the verbs users already know do what is asked: `kubectl get cm -l kvscale.io/calibrated-profile`
reads them, `kubectl annotate cm NAME kvscale.io/pinned=true` pins one (read, never rewritten),
`kubectl delete cm NAME` resets one (the catalog's profile again, fitted afresh). Its
`overlay.yaml` is the catalog overlay itself (`kvscale plan --catalog`). What a ConfigMap lacks,
a schema, is made up for on reading: a body that does not parse, or a key that is not its
configuration's, is ignored, never planned with.

Hysteresis: a new fit replaces the stored one only where a field moved by more than
max(2 standard errors, MIN_MOVE of its value); noise within the fit's own error never rewrites
the object or re-plans.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from kvscale.calibration.fit import Calibration

PROFILE_LABEL = "kvscale.io/calibrated-profile"
CONFIG_ANNOTATION = "kvscale.io/config"  # the configuration's key (config_key): model/GPU/TP/precision/engine
PINNED_ANNOTATION = "kvscale.io/pinned"
NAMESPACE_LABEL = "kvscale.io/namespace"  # the namespace whose engines the profile was fitted on
OVERLAY_KEY = "overlay.yaml"
SUMMARY_KEY = "summary"
MIN_MOVE = 0.05  # a field moves when it changes by more than 5% (and 2 standard errors)
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


def scoped_key(config: str, namespace: str | None) -> str:
    """A configuration's key (config_key) within one namespace: `team-a:model/GPU/tp1/bf16/vllm@image`
    (a namespace name has no colon); None: the shared key, for a profile an administrator pins."""
    return f"{namespace}:{config}" if namespace else config


def profile_name(key: str) -> str:
    """The ConfigMap's name: a DNS-1123 name from the configuration's key (too long and too
    free-form to be one itself)."""
    return "kvscale-profile-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def _label_value(text: str) -> str:
    """A label value (63 characters of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    return _LABEL_VALUE.sub("_", text)[:63].strip("_.-")


@dataclass(frozen=True)
class StoredProfile:
    key: str
    updates: dict[str, float]  # the engine profile's fitted fields
    engine: str
    pinned: bool


def profile_configmap(calibration: Calibration, namespace: str, updated: str, key: str | None = None) -> dict[str, Any]:
    """The ConfigMap (in the operator's `namespace`) that holds `calibration` under `key`
    (scoped_key; default: the configuration's own, shared key)."""
    key = key or calibration.key
    summary = "\n".join(
        f"{f.name}: {f.value:.6g} ± {f.stderr:.2g} (catalog {f.prior:.6g}; {f.samples} samples in "
        f"{f.windows} windows of {f.data})"
        for f in calibration.fields
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": profile_name(key),
            "namespace": namespace,
            "labels": _labels(key),
            "annotations": {CONFIG_ANNOTATION: key, "kvscale.io/updated": updated},
        },
        "data": {
            OVERLAY_KEY: yaml.safe_dump(calibration.overlay(), sort_keys=False, allow_unicode=True),
            SUMMARY_KEY: summary
            + f"\nrms error {calibration.rms_error:.1%} (catalog {calibration.prior_rms_error:.1%})",
        },
    }


def _labels(key: str) -> dict[str, str]:
    """The labels that say which configuration (and namespace) a profile is for."""
    scope, _, config = key.partition(":") if ":" in key.split("/", 1)[0] else ("", "", key)
    model, gpu, parallel, precision, engine = (config.split("/", 4) + [""] * 5)[:5]
    labels = {
        PROFILE_LABEL: "true",
        "kvscale.io/model": _label_value(model),
        "kvscale.io/gpu": _label_value(gpu),
        "kvscale.io/parallel": _label_value(parallel),
        "kvscale.io/precision": _label_value(precision),
        "kvscale.io/engine": _label_value(engine.split("@", 1)[0]),
    }
    if scope:
        labels[NAMESPACE_LABEL] = _label_value(scope)
    return labels


def rekeyed(configmap: Mapping[str, Any], key: str, updated: str) -> dict[str, Any]:
    """The same fitted fields stored for configuration `key`: what a plan that moved to another
    configuration on a calibrated profile was made with (kvscale.control.calibration.carried)."""
    meta = configmap.get("metadata") or {}
    summary = (configmap.get("data") or {}).get(SUMMARY_KEY, "")
    was = (meta.get("annotations") or {}).get(CONFIG_ANNOTATION, "")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": profile_name(key),
            "namespace": meta.get("namespace"),
            "labels": _labels(key),
            "annotations": {CONFIG_ANNOTATION: key, "kvscale.io/updated": updated, "kvscale.io/carried-from": was},
        },
        "data": {
            **dict(configmap.get("data") or {}),
            SUMMARY_KEY: f"carried from {was}, the plan moved here on it (fitted there):\n{summary}",
        },
    }


def read_profile(configmap: Mapping[str, Any], key: str) -> StoredProfile | None:
    """The fitted fields a ConfigMap holds for configuration `key`; None when it is not one, is
    another configuration's, or does not parse (a user's hand edit gone wrong is not planned with)."""
    meta = configmap.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if (meta.get("labels") or {}).get(PROFILE_LABEL) != "true" or annotations.get(CONFIG_ANNOTATION) != key:
        return None
    try:
        overlay = yaml.safe_load((configmap.get("data") or {}).get(OVERLAY_KEY, ""))
        ((engine, fields),) = overlay["engines"].items()
        updates = {name: float(value) for name, value in fields.items() if name != "fitted"}
    except (yaml.YAMLError, AttributeError, KeyError, TypeError, ValueError):
        return None
    if not updates:
        return None
    return StoredProfile(key, updates, str(engine), annotations.get(PINNED_ANNOTATION, "").lower() == "true")


@dataclass(frozen=True)
class Move:
    name: str
    before: float
    after: float

    def describe(self) -> str:
        change = f" ({self.after / self.before - 1:+.0%})" if self.before else ""
        return f"{self.name} {self.before:.4g} -> {self.after:.4g}{change}"


def moves(stored: Mapping[str, float], calibration: Calibration) -> list[Move]:
    """The fields that moved beyond the hysteresis: more than 2 standard errors and MIN_MOVE."""
    out: list[Move] = []
    for f in calibration.fields:
        before = stored.get(f.name, f.prior)
        if abs(f.value - before) > max(2.0 * f.stderr, MIN_MOVE * abs(before)):
            out.append(Move(f.name, before, f.value))
    return out


def replan_message(key: str, moved: list[Move], replicas_before: int, replicas_after: int) -> str:
    """The one Event a re-plan on a calibrated profile makes: what moved, by how much, and what
    it did to the plan."""
    what = ", ".join(m.describe() for m in moved) or "no field beyond its error"
    return f"Calibrated profile of {key}: {what}; replicas {replicas_before} -> {replicas_after}"
