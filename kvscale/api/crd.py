"""The CustomResourceDefinition, generated from the pydantic models.

Structural OpenAPI v3: every $ref inlined, anyOf-null turned into `nullable`, titles
dropped, descriptions kept (for `kubectl explain`), CEL rules where a rule spans fields.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from kvscale.api import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from kvscale.api.models import (
    MAX_ARGS_TOTAL_LENGTH,
    MAX_ENV_TOTAL_LENGTH,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ScalingSpec,
)
from kvscale.engines.args import OWNED_FLAGS
from kvscale.sizing.checkpoints import EngineType

# Names that must be valid for the children the operator creates from an InferenceService:
# the Service takes its name (a DNS-1035 label: a letter first, no dots) and the engine pods
# are <name>-<replicaset hash>-<id>; 52 characters leave <name>-<10-character hash> within 63,
# and room for the endpoint picker's default <name>-epp.
MAX_NAME_LENGTH = 52
DNS_LABEL_1035 = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Kubernetes' own check of environment variable names (IsEnvVarName).
ENV_VAR_NAME = "^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# The variable each engine reads its weights cache from (kvscale sets it: spec.model.cache); the
# catalog's engines.yaml `cache_env`, which a unit test keeps equal (kvscale.api imports no catalog).
ENGINE_CACHE_ENV = {"vllm": "HF_HOME", "sglang": "HF_HOME", "tgi": "HUGGINGFACE_HUB_CACHE"}
# A duration of zero (0s, 0.0ms, 00m): the pattern allows it, the operator cannot use it.
ZERO_DURATION = "^[0.]+[a-z]+$"
_MIN_REPLICAS = ScalingSpec.model_fields["min_replicas"].default
_MAX_REPLICAS = ScalingSpec.model_fields["max_replicas"].default
# A scaling block created by `kubectl scale` holds only `replicas`: rules read the other
# fields through has(), falling back on their defaults.
_MIN = f"(has(self.minReplicas) ? self.minReplicas : {_MIN_REPLICAS})"
_MAX = f"(has(self.maxReplicas) ? self.maxReplicas : {_MAX_REPLICAS})"


def _positive(field: str, label: str) -> dict[str, str]:
    return {
        "rule": f"!has(self.{field}) || !self.{field}.matches('{ZERO_DURATION}')",
        "message": f"{label} must be a positive duration such as 500ms or 2m, not zero",
        "fieldPath": f".{field}",
    }


def _cache_env() -> str:
    """CEL: the cache variable of the engine in spec.engine.type (default vllm)."""
    engine = "(has(self.type) ? self.type : 'vllm')"
    default = ENGINE_CACHE_ENV["vllm"]
    choices = [(t, v) for t, v in ENGINE_CACHE_ENV.items() if v != default]
    expr = f"'{default}'"
    for engine_type, variable in choices:
        expr = f"({engine} == '{engine_type}' ? '{variable}' : {expr})"
    return expr


def _owned_flags() -> str:
    """CEL: the flags kvscale sets for the engine in spec.engine.type (default vllm), as a list."""
    engine = "(has(self.type) ? self.type : 'vllm')"

    def listed(engine_type: EngineType) -> str:
        return "[" + ", ".join(f"'{f}'" for f in sorted(OWNED_FLAGS[engine_type])) + "]"

    expr = listed("vllm")
    others: tuple[EngineType, ...] = ("sglang", "tgi")
    for engine_type in others:
        expr = f"({engine} == '{engine_type}' ? {listed(engine_type)} : {expr})"
    return expr


def _dns_name(field: str, label: str, what: str) -> dict[str, str]:
    return {
        "rule": f"!has(self.{field}) || self.{field}.matches('{DNS_SUBDOMAIN}')",
        "message": f"{label} must be the name of {what}: lowercase letters, digits, '-' and '.', at most 253 characters",
        "fieldPath": f".{field}",
    }


# Rules on the whole object (the only place CEL sees metadata.name).
ROOT_RULES: list[dict[str, str]] = [
    {
        "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{DNS_LABEL_1035}')",
        "message": (
            f"metadata.name must be at most {MAX_NAME_LENGTH} characters of lowercase letters, digits and '-', "
            "starting with a letter (no dots): the engine's Service and pods are named after it"
        ),
    }
]

# Rules the API server enforces itself (CEL), keyed by the property path; "[]" steps into a list's items.
CEL_RULES: dict[tuple[str, ...], list[dict[str, str]]] = {
    ("model",): [
        {
            "rule": "has(self.name) || has(self.architecture)",
            "message": "set spec.model.name (a catalog model) or spec.model.architecture (custom shapes)",
        },
        _dns_name("credentialsSecret", "spec.model.credentialsSecret", "a Secret in the same namespace"),
    ],
    ("model", "cache"): [
        _dns_name("persistentVolumeClaim", "spec.model.cache.persistentVolumeClaim", "a PersistentVolumeClaim"),
        {
            "rule": "has(self.persistentVolumeClaim) != has(self.hostPath)",
            "message": "set exactly one of spec.model.cache.persistentVolumeClaim or spec.model.cache.hostPath",
        },
    ],
    ("engine",): [
        # Totals as well as each item's bound: the whole spec stays far below the annotation limit
        # (kvscale.api.models, MAX_*). sum() is Kubernetes' CEL list library (k8s.io/apiserver
        # pkg/cel/library/lists.go).
        {
            "rule": f"!has(self.args) || self.args.map(a, a.size()).sum() <= {MAX_ARGS_TOTAL_LENGTH}",
            "message": f"spec.engine.args may hold at most {MAX_ARGS_TOTAL_LENGTH} characters in all: pass long "
            "settings through a file in the image or a mounted ConfigMap",
            "fieldPath": ".args",
        },
        {
            "rule": "!has(self.env) || self.env.map(e, e.name.size() + (has(e.value) ? e.value.size() : 0)).sum() "
            f"<= {MAX_ENV_TOTAL_LENGTH}",
            "message": f"spec.engine.env may hold at most {MAX_ENV_TOTAL_LENGTH} characters of names and values in "
            "all: keep large values in a Secret (spec.model.credentialsSecret)",
            "fieldPath": ".env",
        },
        {
            "rule": f"!has(self.args) || !self.args.exists(a, a.split('=')[0].replace('_', '-') in {_owned_flags()})",
            "message": (
                "spec.engine.args must not repeat a flag kvscale sets from the plan (the engine takes the last one "
                "given): tensor, pipeline and data parallelism, batch and context limits, precision, KV-cache dtype, "
                "model, host and port; remove it (kubectl explain inferenceservice.spec.engine.args lists them)"
            ),
            "fieldPath": ".args",
        },
        {
            "rule": f"!has(self.env) || !self.env.exists(e, e.name == {_cache_env()})",
            "message": (
                "spec.engine.env must not set the weights cache variable (HF_HOME; HUGGINGFACE_HUB_CACHE for tgi): "
                "kvscale sets it; use spec.model.cache instead"
            ),
            "fieldPath": ".env",
        },
    ],
    ("engine", "env", "[]"): [
        {
            "rule": f"self.name.matches('{ENV_VAR_NAME}')",
            "message": (
                "spec.engine.env[].name must be an environment variable name: letters, digits, '_', '-' and '.', "
                "not starting with a digit, e.g. HF_TOKEN"
            ),
            "fieldPath": ".name",
        }
    ],
    ("workload",): [
        {
            "rule": "!has(self.maxContextTokens) || self.maxContextTokens >= self.inputTokens + self.outputTokens",
            "message": "maxContextTokens must be at least inputTokens + outputTokens",
        }
    ],
    ("slo",): [
        _positive("timeToFirstToken", "spec.slo.timeToFirstToken"),
        _positive("timePerOutputToken", "spec.slo.timePerOutputToken"),
        _positive("maxInterTokenLatency", "spec.slo.maxInterTokenLatency"),
    ],
    ("routing", "inferencePool", "endpointPickerRef"): [
        {
            "rule": "(has(self.kind) && self.kind != 'Service') || has(self.port)",
            "message": "endpointPickerRef.port is required when kind is Service (or unset)",
        }
    ],
    ("scaling",): [
        {"rule": f"{_MIN} <= {_MAX}", "message": "minReplicas must be <= maxReplicas"},
        {
            "rule": f"!has(self.replicas) || (self.replicas >= {_MIN} && self.replicas <= {_MAX})",
            "message": (
                "a pinned replicas count (kubectl scale) must lie within minReplicas and maxReplicas "
                f"(defaults {_MIN_REPLICAS} and {_MAX_REPLICAS})"
            ),
        },
        _positive("scaleDownStabilization", "spec.scaling.scaleDownStabilization"),
        _positive("idleWindow", "spec.scaling.idleWindow"),
    ],
}

# Bounds on the strings and lists the rules read: the API server refuses rules whose
# estimated cost is unbounded. Keyed like CEL_RULES.
BOUNDS: dict[tuple[str, ...], dict[str, int]] = {
    ("engine", "env"): {"maxItems": 256},
    ("engine", "env", "[]", "name"): {"maxLength": 256},
    ("model", "credentialsSecret"): {"maxLength": 253},
    ("model", "cache", "persistentVolumeClaim"): {"maxLength": 253},
    ("slo", "timeToFirstToken"): {"maxLength": 32},
    ("slo", "timePerOutputToken"): {"maxLength": 32},
    ("slo", "maxInterTokenLatency"): {"maxLength": 32},
    ("scaling", "scaleDownStabilization"): {"maxLength": 32},
    ("scaling", "idleWindow"): {"maxLength": 32},
}

# Lists keyed by a field: the API server refuses two entries with one key (duplicate env names).
LIST_MAPS: dict[tuple[str, ...], list[str]] = {("engine", "env"): ["name"]}

PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "GPU", "type": "string", "jsonPath": ".status.plan.gpuType"},
    {"name": "TP", "type": "integer", "jsonPath": ".status.plan.tensorParallel"},
    {"name": "Precision", "type": "string", "jsonPath": ".status.plan.precision"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".status.plan.nodes", "priority": 1},
    # The plan's other parallel dimensions, for `-o wide` (priority 1) to keep the default short.
    {"name": "EP", "type": "boolean", "jsonPath": ".status.plan.expertParallel", "priority": 1},
    {"name": "DP", "type": "integer", "jsonPath": ".status.plan.dataParallel", "priority": 1},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    # What kvscale recommends: the plan's replicas, and the policy's last wish (recommend mode
    # creates nothing, so Replicas stays empty there).
    {"name": "Planned", "type": "integer", "jsonPath": ".status.plan.replicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "USD/h", "type": "number", "jsonPath": ".status.plan.costPerHour"},
    # What one replica carries (the policy's and the budget's figure) and where it comes from, for `-o wide`.
    {
        "name": "RPS/Replica",
        "type": "number",
        "jsonPath": ".status.capacity.requestsPerSecondPerReplica",
        "priority": 1,
    },
    {"name": "Capacity", "type": "string", "jsonPath": ".status.capacity.source", "priority": 1},
    {"name": "TTFT", "type": "string", "jsonPath": ".status.observed.ttft"},
    {"name": "TPOT", "type": "string", "jsonPath": ".status.observed.tpot"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        target.update(node)  # a field's own description wins over the model's
        node = target
    for variant_key in ("anyOf", "oneOf"):
        variants = node.get(variant_key)
        if variants and any(v.get("type") == "null" for v in variants):
            rest = [v for v in variants if v.get("type") != "null"]
            node.pop(variant_key)
            if len(rest) == 1:
                merged = _structural(rest[0], defs)
                merged.update({k: v for k, v in node.items() if k not in merged or k == "description"})
                node = merged
            node["nullable"] = True
    node.pop("title", None)
    # Kubernetes' structural schema has no propertyNames: a map's keys are bounded by a CEL rule
    # where they need it (the models' key bounds still hold in the operator and the CLI).
    node.pop("propertyNames", None)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "exclusiveMaximum" in node and not isinstance(node["exclusiveMaximum"], bool):
        node["maximum"], node["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if "exclusiveMinimum" in node and not isinstance(node["exclusiveMinimum"], bool):
        node["minimum"], node["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if node.get("default") is None:
        node.pop("default", None)
    if "properties" in node:
        node["type"] = "object"
        node["properties"] = {k: _structural(v, defs) for k, v in node["properties"].items()}
        node.pop("additionalProperties", None)
    elif node.get("type") == "object" and node.get("additionalProperties") is True:
        node.pop("additionalProperties")  # a free-form object (a config.json): kept as written
        node["x-kubernetes-preserve-unknown-fields"] = True
    if "items" in node:
        node["items"] = _structural(node["items"], defs)
    if "type" not in node and "enum" not in node:
        node["x-kubernetes-preserve-unknown-fields"] = True
    return node


def openapi_schema(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return dict(_structural(raw, defs))


def _node(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for key in path:
        schema = schema["items"] if key == "[]" else schema["properties"][key]
    return schema


def _add_rules(spec_schema: dict[str, Any]) -> None:
    for path, bounds in BOUNDS.items():
        _node(spec_schema, path).update(bounds)
    for path, rules in CEL_RULES.items():
        _node(spec_schema, path)["x-kubernetes-validations"] = rules
    for path, keys in LIST_MAPS.items():
        _node(spec_schema, path).update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": keys})


def crd() -> dict[str, Any]:
    spec = openapi_schema(InferenceServiceSpec)
    _add_rules(spec)
    status = openapi_schema(InferenceServiceStatus)
    spec["description"] = "What to serve, for which traffic, within which latency."
    status["description"] = "The plan, its predictions, and what is observed."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An LLM served on Kubernetes, sized and scaled by kvscale from TTFT/TPOT targets.",
                            "required": ["spec"],
                            "properties": {
                                # Only metadata.name may be constrained here (no description on metadata
                                # itself: the API server refuses it); the bound keeps the root rule's cost
                                # estimate finite (its message says the real limit).
                                "metadata": {
                                    "type": "object",
                                    "properties": {
                                        "name": {
                                            "type": "string",
                                            "maxLength": 253,
                                            "description": f"At most {MAX_NAME_LENGTH} characters of lowercase "
                                            "letters, digits and '-', starting with a letter: the engine's Service "
                                            "and pods are named after it.",
                                        }
                                    },
                                },
                                "spec": spec,
                                "status": status,
                            },
                            "x-kubernetes-validations": ROOT_RULES,
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.scaling.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `kvscale crd` from kvscale/api/models.py. Do not edit; regenerate.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)
