"""The GPUBudget resource (kvscale.io/v1alpha1, cluster-scoped): GPU limits per type (and
optionally per namespace) over the InferenceServices it selects, and in status what each
got, what it wanted and why. Without a budget nothing changes: services are sized alone."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from kvscale.api.models import Condition, _Status, _Wire
from kvscale.autoscaling.budget import Budget
from kvscale.autoscaling.drain import DEFAULT_PREEMPTION_GRACE_S

BUDGET_KIND = "GPUBudget"
BUDGET_PLURAL = "gpubudgets"
BUDGET_SINGULAR = "gpubudget"
BUDGET_SHORT_NAMES = ["gpub"]

GpuCount = Annotated[int, Field(ge=0, le=1_000_000)]
# Bounds on what a budget lists (a cluster-scoped object every tenant's scaling reads).
MAX_BUDGET_TYPES = 64
MAX_BUDGET_NAMESPACES = 256
MAX_LABELS = 32
NAMESPACE_LENGTH = 63  # a namespace is a DNS-1123 label
LABEL_KEY_LENGTH = 317  # a 253-character prefix, '/', a 63-character name
LABEL_VALUE_LENGTH = 63
Namespace = Annotated[str, Field(max_length=NAMESPACE_LENGTH)]
# Kubernetes' own forms (apimachinery validation): a namespace is a DNS-1123 label; a label key an
# optional DNS-1123 subdomain prefix and '/', then a name; a label value empty or a name. A
# selector naming anything else matches nothing, silently (issue 38: `bad key!`, `namespaces: [""]`).
NAMESPACE_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_NAME_PATTERN = "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
LABEL_PREFIX_PATTERN = "[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY_PATTERN = f"^({LABEL_PREFIX_PATTERN}/)?{LABEL_NAME_PATTERN}$"
LABEL_VALUE_PATTERN = f"^({LABEL_NAME_PATTERN})?$"
LABEL_NAME_LENGTH = 63
LABEL_PREFIX_LENGTH = 253


def namespace_error(field: str, namespace: str) -> str | None:
    """Why `namespace` is not a namespace name (None when it is one)."""
    if re.fullmatch(NAMESPACE_PATTERN, namespace) and len(namespace) <= NAMESPACE_LENGTH:
        return None
    return (
        f"{field} {namespace!r} is not a namespace name: a DNS-1123 label (lowercase letters, digits and '-', "
        f"starting and ending with a letter or digit, at most {NAMESPACE_LENGTH} characters), e.g. team-a"
    )


def label_key_error(field: str, key: str) -> str | None:
    """Why `key` is not a label key (None when it is one)."""
    prefix, _, name = key.rpartition("/")
    if re.fullmatch(LABEL_KEY_PATTERN, key) and len(name) <= LABEL_NAME_LENGTH and len(prefix) <= LABEL_PREFIX_LENGTH:
        return None
    return (
        f"{field} key {key!r} is not a label key: an optional DNS subdomain prefix and '/', then a name of at most "
        f"{LABEL_NAME_LENGTH} letters, digits, '-', '_' or '.' starting and ending with a letter or digit, "
        "e.g. tier or example.com/team"
    )


MAX_PREEMPTION_GRACE_S = 3600


class BudgetSelector(_Wire):
    """Which InferenceServices the budget governs: all of them when empty."""

    namespaces: list[Namespace] = Field(
        default_factory=list,
        max_length=MAX_BUDGET_NAMESPACES,
        description="Only InferenceServices in these namespaces; empty: every namespace.",
    )
    match_labels: dict[
        Annotated[str, Field(max_length=LABEL_KEY_LENGTH)], Annotated[str, Field(max_length=LABEL_VALUE_LENGTH)]
    ] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        description="Only InferenceServices carrying all these labels; empty: no label needed.",
    )

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, namespaces: list[str]) -> list[str]:
        for i, namespace in enumerate(namespaces):
            error = namespace_error(f"spec.selector.namespaces[{i}]", namespace)
            if error:
                raise ValueError(f"{error}; fix it or remove it")
        return namespaces

    @field_validator("match_labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            error = label_key_error("spec.selector.matchLabels", key)
            if error:
                raise ValueError(f"{error}; fix it or remove it")
            if not re.fullmatch(LABEL_VALUE_PATTERN, value):
                raise ValueError(
                    f"spec.selector.matchLabels.{key} value {value!r} is not a label value: empty, or up to "
                    f"{LABEL_VALUE_LENGTH} letters, digits, '-', '_' or '.' starting and ending with a letter or digit"
                )
        return labels

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if self.namespaces and namespace not in self.namespaces:
            return False
        return all(labels.get(k) == v for k, v in self.match_labels.items())


class GPUBudgetSpec(_Wire):
    limits: dict[str, GpuCount] = Field(
        max_length=MAX_BUDGET_TYPES,
        description="GPUs per GPU type (catalog names, e.g. H100-SXM: 64). Types not listed are not limited; "
        "list a type with 0 to keep governed services off it.",
    )
    namespace_limits: dict[Namespace, dict[str, GpuCount]] = Field(
        default_factory=dict,
        max_length=MAX_BUDGET_NAMESPACES,
        description="Optional GPUs per type for one namespace (namespace -> type -> GPUs), within the limits above.",
    )
    selector: BudgetSelector = Field(
        default_factory=BudgetSelector, description="Which InferenceServices it governs (namespace and labels)."
    )
    preemption_grace_seconds: int = Field(
        default=int(DEFAULT_PREEMPTION_GRACE_S),
        ge=0,
        le=MAX_PREEMPTION_GRACE_S,
        description="How long a replica the budget takes from a lower priority (for a higher priority's want) "
        "keeps serving its in-flight requests, out of routing, before it is stopped: the deleted pods' grace "
        "period, shortened to this.",
    )

    @model_validator(mode="after")
    def _some(self) -> GPUBudgetSpec:
        if not self.limits:
            raise ValueError("spec.limits must name at least one GPU type, e.g. {H100-SXM: 8}")
        for namespace in self.namespace_limits:
            error = namespace_error("spec.namespaceLimits", namespace)
            if error:
                raise ValueError(f"{error}; fix it or remove it")
        for namespace, limits in self.namespace_limits.items():
            for gpu, count in limits.items():
                if gpu in self.limits and count > self.limits[gpu]:
                    raise ValueError(
                        f"spec.namespaceLimits.{namespace}.{gpu} is {count}, above spec.limits.{gpu} "
                        f"({self.limits[gpu]}): a namespace's share lies within the budget's limit; lower it or "
                        "raise the limit"
                    )
        return self

    def unknown_gpu_types(self, known: Iterable[str]) -> list[str]:
        """GPU types named in the limits that are not in the operator's catalog (a typo such as
        `H100` for `H100-SXM` would otherwise limit nothing, silently)."""
        names = set(known)
        named = [*self.limits, *(t for limits in self.namespace_limits.values() for t in limits)]
        return sorted({t for t in named if t not in names})


class BudgetServiceStatus(_Status):
    namespace: str = Field(description="Namespace of the InferenceService.")
    name: str = Field(description="Name of the InferenceService.")
    priority: int = Field(description="Its spec.scaling.priority.")
    gpu_type: str = Field(description="GPU type it was granted.")
    gpus_per_replica: int = Field(description="GPUs per replica on that type.")
    replicas: int = Field(description="Replicas granted.")
    wanted: int = Field(description="Replicas it wanted on that type.")
    reason: str = Field(description="What it got and why.")


class GPUBudgetStatus(_Status):
    observed_generation: int | None = Field(default=None, description="Spec generation the status describes.")
    allocated: dict[str, int] = Field(default_factory=dict, description="GPUs granted per type.")
    wanted: dict[str, int] = Field(
        default_factory=dict, description="GPUs the governed services want per type (each on its cheapest plan)."
    )
    services: list[BudgetServiceStatus] = Field(
        default_factory=list, description="Each governed service in priority order: what it got, wanted and why."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Ready, and why not.")


def parse_budget_spec(spec: Mapping[str, Any]) -> GPUBudgetSpec:
    return GPUBudgetSpec.model_validate(dict(spec))


def budget_spec_error(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(['spec', *(str(p) for p in e['loc'])])}: {e['msg']}" for e in exc.errors())


def budget_of(name: str, spec: GPUBudgetSpec) -> Budget:
    """The allocator's value for this budget."""
    return Budget(name, dict(spec.limits), {ns: dict(v) for ns, v in spec.namespace_limits.items()})


def service_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"
