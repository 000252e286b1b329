"""The operator's settings: one class, read from environment variables once at startup.

Each field documents its variable; docs/operator.md's settings table is generated from these fields
(`settings_table()`), and a test fails when the two differ.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvscale.api.models import IMAGE_PATTERN  # the CRD's image reference pattern
from kvscale.control.pod_policy import PodPolicy, parse_images, parse_prefixes
from kvscale.sizing.units import UnitError, parse_duration_s


class SettingsError(ValueError):
    pass


def _duration(name: str, text: str) -> float:
    try:
        return parse_duration_s(text, field=name)
    except UnitError as exc:
        raise SettingsError(str(exc)) from exc


def _duration_or_off(name: str, text: str) -> float:
    """A positive duration, or `off` (0.0)."""
    return 0.0 if text.strip().lower() == "off" else _duration(name, text)


def _port(name: str, text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise SettingsError(f"{name} must be a port number (0 disables where allowed), got {text!r}")
    return int(text)


def _engine_port(name: str, text: str) -> int:
    port = _port(name, text)
    # Behind an InferencePool a decode pod's vLLM listens 200 above it, the routing sidecar on it
    # (kvscale.control.disaggregated.SIDECAR_ENGINE_PORT_OFFSET).
    if not 1 <= port <= 65535 - 200:
        raise SettingsError(f"{name} must be 1-65335 (a decode pod's vLLM listens on it + 200), got {text!r}")
    return port


def _level(name: str, text: str) -> str:
    if text.lower() not in ("debug", "info", "warning", "error"):
        raise SettingsError(f"{name} must be debug, info, warning or error, got {text!r}")
    return text.lower()


def _window(name: str, text: str) -> str:
    """A PromQL range: whole seconds, minutes or hours."""
    if not text or not text[:-1].isdigit() or text[-1] not in "smh" or int(text[:-1]) == 0:
        raise SettingsError(f"{name} must be a PromQL range such as 30s or 1m, got {text!r}")
    return text


def _factor(name: str, text: str) -> float | None:
    """A factor above 1, or `off`."""
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 1 and value < float("inf")):
        raise SettingsError(f"{name} must be a factor above 1 (such as 1.5) or off, got {text!r}")
    return value


def _bool(name: str, text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise SettingsError(f"{name} must be true or false, got {text!r}")
    return text.lower() == "true"


def _names(_: str, text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _paths(_: str, text: str) -> tuple[Path, ...]:
    return tuple(Path(p.strip()) for p in text.split(",") if p.strip())


def _host_paths(name: str, text: str) -> tuple[str, ...]:
    try:
        return parse_prefixes(text)
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from exc


def _images(name: str, text: str) -> tuple[str, ...]:
    try:
        return parse_images(text)
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from exc


def _count(name: str, text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise SettingsError(f"{name} must be a positive whole number, got {text!r}")
    return int(text)


def _holding(name: str, text: str) -> str:
    if text.strip().lower() not in ("configured", "tuned"):
        raise SettingsError(f"{name} must be configured or tuned, got {text!r}")
    return text.strip().lower()


def _text(_: str, text: str) -> str:
    return text.strip()


def _image(name: str, text: str) -> str:
    if re.fullmatch(IMAGE_PATTERN, text.strip()) is None:
        raise SettingsError(f"{name} must be an image reference (registry/name:tag or @sha256:...), got {text!r}")
    return text.strip()


def _optional(_: str, text: str) -> str | None:
    return text or None


def parse_tolerations(text: str, name: str = "KVSCALE_EXTRA_TOLERATIONS") -> tuple[dict[str, str], ...]:
    """'key=value:Effect,key:Effect' -> toleration dicts (Equal with a value, Exists without)."""
    out: list[dict[str, str]] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        head, sep, effect = item.rpartition(":")
        if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute") or not head:
            raise SettingsError(f"{name}: {item!r} is not key[=value]:NoSchedule|PreferNoSchedule|NoExecute")
        key, eq, value = head.partition("=")
        out.append(
            {"key": key, "operator": "Equal", "value": value, "effect": effect}
            if eq
            else {"key": key, "operator": "Exists", "effect": effect}
        )
    return tuple(out)


def _tolerations(name: str, text: str) -> tuple[dict[str, str], ...]:
    return parse_tolerations(text, name)


def setting(env: str, default: str, doc: str, parse: Callable[[str, str], Any]) -> Any:
    """A field read from `env` (default: `default`, as the user would write it)."""
    parsed = parse(env, default)
    factory: Callable[[], Any] = lambda: parsed  # noqa: E731 - dataclass defaults must be immutable or factories
    return field(default_factory=factory, metadata={"env": env, "default": default, "doc": doc, "parse": parse})


@dataclass(frozen=True)
class Settings:
    """Operator settings. Durations are seconds; every field comes from one environment variable."""

    namespaces: tuple[str, ...] = setting(
        "KVSCALE_NAMESPACES", "", "Comma-separated namespaces to watch; empty watches all.", _names
    )
    unschedulable_timeout_s: float = setting(
        "KVSCALE_UNSCHEDULABLE_TIMEOUT",
        "300s",
        "How long pods of the planned GPU type may wait for free GPUs (the scheduler: Insufficient <gpu>) "
        "before re-planning without it; other causes (a taint, a volume) never re-plan.",
        _duration,
    )
    gpu_exclusion_ttl_s: float = setting(
        "KVSCALE_GPU_EXCLUSION_TTL",
        "30m",
        "How long GPU types left out after their pods found no free GPUs stay out of planning (after the last "
        "was left out); then the cheaper plan is tried again.",
        _duration,
    )
    status_interval_s: float = setting(
        "KVSCALE_STATUS_INTERVAL",
        "10s",
        "How often each InferenceService's readiness is refreshed and drift in its children reverted.",
        _duration,
    )
    retry_backoff_s: float = setting(
        "KVSCALE_RETRY_BACKOFF",
        "30s",
        "Delay before retrying when no plan fits the cluster, or the API server failed (5xx, timeout).",
        _duration,
    )
    catalog_overlays: tuple[Path, ...] = setting(
        "KVSCALE_CATALOG", "", "Comma-separated catalog overlay YAML files (extra GPUs, prices).", _paths
    )
    engine_port: int = setting("KVSCALE_ENGINE_PORT", "8000", "Port the engine listens on.", _engine_port)
    routing_sidecar_image: str = setting(
        "KVSCALE_ROUTING_SIDECAR_IMAGE",
        "ghcr.io/llm-d/llm-d-routing-sidecar:v0.4.0",
        "llm-d's routing sidecar, run in each decode pod of a disaggregated plan behind an InferencePool.",
        _image,
    )
    extra_tolerations: tuple[dict[str, str], ...] = setting(
        "KVSCALE_EXTRA_TOLERATIONS",
        "",
        "Extra taints engine pods tolerate, as key[=value]:Effect, comma-separated.",
        _tolerations,
    )
    host_path_prefixes: tuple[str, ...] = setting(
        "KVSCALE_HOST_PATH_PREFIXES",
        "",
        "Comma-separated node directories under which spec.model.cache.hostPath may point (compared after "
        "resolving `..`, on whole path components); empty: no hostPath cache is allowed.",
        _host_paths,
    )
    host_path_writable: bool = setting(
        "KVSCALE_HOST_PATH_WRITABLE",
        "false",
        "Mount allowed hostPath caches read-write (the engine downloads into them; type DirectoryOrCreate); "
        "false: read-only, the directory must exist, filled by you. A writable node path lets a tenant's pod "
        "plant symlinks there that a later hostPath follows: allow writes only where tenants are trusted.",
        _bool,
    )
    allowed_images: tuple[str, ...] = setting(
        "KVSCALE_ALLOWED_IMAGES",
        "",
        "Comma-separated images engines may run: a repository (any tag), a reference with tag or digest (that "
        "one), or a prefix ending in / (e.g. ghcr.io/my-org/); includes the catalog's defaults only if listed. "
        "Empty: any image.",
        _images,
    )
    prometheus_url: str | None = setting(
        "KVSCALE_PROMETHEUS_URL",
        "",
        "Prometheus base URL the autoscaler reads engine metrics from; unset: no autoscaling, replicas held.",
        _optional,
    )
    scale_interval_s: float = setting(
        "KVSCALE_SCALE_INTERVAL", "15s", "How often the autoscaling policy runs per InferenceService.", _duration
    )
    metrics_window: str = setting("KVSCALE_METRICS_WINDOW", "1m", "PromQL range for rates and quantiles.", _window)
    metrics_stale_after_s: float = setting(
        "KVSCALE_METRICS_STALE_AFTER", "120s", "Engine samples older than this count as missing.", _duration
    )
    workload_interval_s: float = setting(
        "KVSCALE_WORKLOAD_INTERVAL",
        "60s",
        "How often each InferenceService's observed workload (lengths, token rates, peaks) is read and checked for drift.",
        _duration,
    )
    calibration_interval_s: float = setting(
        "KVSCALE_CALIBRATION_INTERVAL",
        "60s",
        "How often each planned InferenceService's engine profile is fitted to its engines' metrics (the calibrated "
        "profile ConfigMap); off disables.",
        _duration_or_off,
    )
    capacity_interval_s: float = setting(
        "KVSCALE_CAPACITY_INTERVAL",
        "5m",
        "How often each running InferenceService's capacity per replica is confirmed by the simulated sizing "
        "search on arrivals synthesized from its observed workload (status.capacity; the policy and the GPU "
        "budget act on it); off disables (the sizing model's figure is used).",
        _duration_or_off,
    )
    capacity_min_requests: int = setting(
        "KVSCALE_CAPACITY_MIN_REQUESTS",
        "200",
        "Requests the observed workload window must hold before the simulated capacity replaces the model's.",
        _count,
    )
    holding: str = setting(
        "KVSCALE_HOLDING",
        "configured",
        "The burst-holding settings the autoscaling policy runs: configured (its defaults), or tuned: re-chosen "
        "with each capacity search (KVSCALE_CAPACITY_INTERVAL) by replaying the service's observed history "
        "through the simulator with five candidates, the cheapest that met the SLO with a margin (status.holding; "
        "before enough history, a trailing floor). Opt-in: about neutral on the benchmarks' held-out traces.",
        _holding,
    )
    holding_history: str = setting(
        "KVSCALE_HOLDING_HISTORY",
        "30m",
        "How far back the arrivals the holding tuner replays are read (per KVSCALE_BURST_WINDOW); traffic over at least "
        "half of it before a choice.",
        _window,
    )
    calibration_window: str = setting(
        "KVSCALE_CALIBRATION_WINDOW",
        "1m",
        "Length of each window the calibration fit sees (one point per engine pod).",
        _window,
    )
    calibration_since: str = setting("KVSCALE_CALIBRATION_SINCE", "30m", "How far back the calibration reads.", _window)
    workload_window: str = setting(
        "KVSCALE_WORKLOAD_WINDOW", "10m", "PromQL range of the observed workload's rates and length quantiles.", _window
    )
    burst_window: str = setting(
        "KVSCALE_BURST_WINDOW",
        "30s",
        "Arrivals are counted per this window for the observed burstiness (at least twice the scrape interval).",
        _window,
    )
    replan_drift: float | None = setting(
        "KVSCALE_REPLAN_DRIFT",
        "1.5",
        "Re-plan when a mean length, the prompt p90 or the burstiness stays this factor away from the planned one; off disables.",
        _factor,
    )
    replan_after_s: float = setting(
        "KVSCALE_REPLAN_AFTER",
        "10m",
        "How long the workload must stay drifted before a re-plan (at least KVSCALE_WORKLOAD_WINDOW).",
        _duration,
    )
    metrics_port: int = setting(
        "KVSCALE_METRICS_PORT", "8081", "Port of the operator's own /metrics (0 disables).", _port
    )
    metrics_address: str = setting(
        "KVSCALE_METRICS_ADDRESS",
        "127.0.0.1",
        "Address /metrics binds (it lists every tenant's services and cost, without auth); the chart sets 0.0.0.0 "
        "inside the pod for Prometheus, with networkPolicy to limit who reaches it.",
        _text,
    )
    log_level: str = setting("KVSCALE_LOG_LEVEL", "info", "debug, info, warning or error.", _level)
    leader_election: bool = setting(
        "KVSCALE_LEADER_ELECTION",
        "true",
        "Act only while holding a coordination.k8s.io Lease, so replicas (or a second operator) stand by; "
        "false runs without (one operator only).",
        _bool,
    )
    lease_name: str = setting(
        "KVSCALE_LEASE_NAME",
        "kvscale",
        "Name of the Lease; operators that share it elect one leader (give installs watching other "
        "namespaces their own). The default is the chart's for `helm install kvscale`, its release's full name.",
        _text,
    )
    lease_namespace: str = setting(
        "KVSCALE_LEASE_NAMESPACE",
        "",
        "Namespace of the Lease; empty: the operator pod's own, else kvscale-system (the README's chart "
        "install) where it exists, else default.",
        _text,
    )
    lease_duration_s: float = setting(
        "KVSCALE_LEASE_DURATION",
        "15s",
        "How long a Lease not renewed stays its holder's; a standby takes over after this when the leader dies.",
        _duration,
    )

    @property
    def pod_policy(self) -> PodPolicy:
        """What engine pods may ask of nodes: hostPath prefixes and writes, images."""
        return PodPolicy(self.host_path_prefixes, self.host_path_writable, self.allowed_images)

    @property
    def metrics_window_s(self) -> float:
        return _duration("KVSCALE_METRICS_WINDOW", self.metrics_window)

    @property
    def calibration_window_s(self) -> float:
        return _duration("KVSCALE_CALIBRATION_WINDOW", self.calibration_window)

    @property
    def workload_window_s(self) -> float:
        return _duration("KVSCALE_WORKLOAD_WINDOW", self.workload_window)

    @property
    def holding_history_s(self) -> float:
        return _duration("KVSCALE_HOLDING_HISTORY", self.holding_history)

    @property
    def burst_window_s(self) -> float:
        return _duration("KVSCALE_BURST_WINDOW", self.burst_window)

    @property
    def calibration_since_s(self) -> float:
        return _duration("KVSCALE_CALIBRATION_SINCE", self.calibration_since)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            meta = f.metadata
            if meta["env"] in env:
                values[f.name] = meta["parse"](meta["env"], env[meta["env"]])
        return cls(**values)


def settings_table() -> str:
    """docs/operator.md's table of settings, generated from the class."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for f in fields(Settings):
        meta = f.metadata
        default = f"`{meta['default']}`" if meta["default"] else "(unset)"
        rows.append(f"| `{meta['env']}` | {default} | {meta['doc']} |")
    return "\n".join(rows)
