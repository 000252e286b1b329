"""Operator settings, from environment variables (documented in README)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kvscale.sizing.units import UnitError, parse_duration_s


class SettingsError(ValueError):
    pass


def _duration(name: str, default: str) -> float:
    try:
        return parse_duration_s(os.environ.get(name, default), field=name)
    except UnitError as exc:
        raise SettingsError(str(exc)) from exc


@dataclass(frozen=True)
class Settings:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    unschedulable_timeout_s: float = 300.0
    status_interval_s: float = 10.0
    retry_backoff_s: float = 30.0
    catalog_overlays: tuple[Path, ...] = ()
    engine_port: int = 8000
    extra_tolerations: tuple[dict[str, str], ...] = field(default_factory=tuple)
    prometheus_url: str | None = None
    scale_interval_s: float = 15.0
    metrics_window: str = "1m"
    metrics_stale_after_s: float = 120.0
    metrics_port: int = 9090
    log_level: str = "info"

    @classmethod
    def from_env(cls) -> Settings:
        namespaces = tuple(n.strip() for n in os.environ.get("KVSCALE_NAMESPACES", "").split(",") if n.strip())
        overlays = tuple(Path(p) for p in os.environ.get("KVSCALE_CATALOG", "").split(",") if p.strip())
        port = _port("KVSCALE_ENGINE_PORT", "8000")
        return cls(
            extra_tolerations=parse_tolerations(os.environ.get("KVSCALE_EXTRA_TOLERATIONS", "")),
            namespaces=namespaces,
            unschedulable_timeout_s=_duration("KVSCALE_UNSCHEDULABLE_TIMEOUT", "300s"),
            status_interval_s=_duration("KVSCALE_STATUS_INTERVAL", "10s"),
            retry_backoff_s=_duration("KVSCALE_RETRY_BACKOFF", "30s"),
            catalog_overlays=overlays,
            engine_port=port,
            prometheus_url=os.environ.get("KVSCALE_PROMETHEUS_URL") or None,
            scale_interval_s=_duration("KVSCALE_SCALE_INTERVAL", "15s"),
            metrics_window=_window(os.environ.get("KVSCALE_METRICS_WINDOW", "1m")),
            metrics_stale_after_s=_duration("KVSCALE_METRICS_STALE_AFTER", "120s"),
            metrics_port=_port("KVSCALE_METRICS_PORT", "9090"),
            log_level=_level(os.environ.get("KVSCALE_LOG_LEVEL", "info")),
        )


def _port(name: str, default: str) -> int:
    text = os.environ.get(name, default)
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise SettingsError(f"{name} must be a port number (0 disables where allowed), got {text!r}")
    return int(text)


def _level(text: str) -> str:
    if text.lower() not in ("debug", "info", "warning", "error"):
        raise SettingsError(f"KVSCALE_LOG_LEVEL must be debug, info, warning or error, got {text!r}")
    return text.lower()


def _window(text: str) -> str:
    """A PromQL range: whole seconds or minutes."""
    if not text or not text[:-1].isdigit() or text[-1] not in "smh":
        raise SettingsError(f"KVSCALE_METRICS_WINDOW must be a PromQL range such as 30s or 1m, got {text!r}")
    return text


def parse_tolerations(text: str) -> tuple[dict[str, str], ...]:
    """'key=value:Effect,key:Effect' -> toleration dicts (Equal with a value, Exists without)."""
    out: list[dict[str, str]] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        head, sep, effect = item.rpartition(":")
        if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute") or not head:
            raise SettingsError(
                f"KVSCALE_EXTRA_TOLERATIONS: {item!r} is not key[=value]:NoSchedule|PreferNoSchedule|NoExecute"
            )
        key, eq, value = head.partition("=")
        out.append(
            {"key": key, "operator": "Equal", "value": value, "effect": effect}
            if eq
            else {"key": key, "operator": "Exists", "effect": effect}
        )
    return tuple(out)


ENV_DOCS = {
    "KVSCALE_NAMESPACES": "Comma-separated namespaces to watch; empty watches all.",
    "KVSCALE_UNSCHEDULABLE_TIMEOUT": "How long pods of the planned GPU type may stay unschedulable before re-planning without it (default 300s).",
    "KVSCALE_STATUS_INTERVAL": "How often each InferenceService's status is refreshed (default 10s).",
    "KVSCALE_RETRY_BACKOFF": "Delay before retrying when no plan fits the cluster (default 30s).",
    "KVSCALE_CATALOG": "Comma-separated catalog overlay YAML files (extra GPUs, prices).",
    "KVSCALE_ENGINE_PORT": "Port the engine listens on (default 8000).",
    "KVSCALE_EXTRA_TOLERATIONS": "Extra taints engine pods tolerate, as key[=value]:Effect, comma-separated.",
    "KVSCALE_PROMETHEUS_URL": "Prometheus base URL the autoscaler reads engine metrics from; unset: no autoscaling, replicas held.",
    "KVSCALE_SCALE_INTERVAL": "How often the autoscaling policy runs per InferenceService (default 15s).",
    "KVSCALE_METRICS_WINDOW": "PromQL range for rates and quantiles (default 1m).",
    "KVSCALE_METRICS_STALE_AFTER": "Engine samples older than this count as missing (default 120s).",
    "KVSCALE_METRICS_PORT": "Port of the operator's own /metrics (default 9090; 0 disables).",
    "KVSCALE_LOG_LEVEL": "debug, info, warning or error (default info).",
}
