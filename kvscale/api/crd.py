"""The CustomResourceDefinition, generated from the pydantic models.

Structural OpenAPI v3: every $ref inlined, anyOf-null turned into `nullable`, titles
dropped, descriptions kept (for `kubectl explain`), CEL rules where a rule spans fields.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from kvscale.api import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from kvscale.api.models import InferenceServiceSpec, InferenceServiceStatus

# Cross-field rules the API server enforces itself (CEL), keyed by the property path.
CEL_RULES: dict[tuple[str, ...], list[dict[str, str]]] = {
    ("model",): [
        {
            "rule": "has(self.name) || has(self.architecture)",
            "message": "set spec.model.name (a catalog model) or spec.model.architecture (custom shapes)",
        }
    ],
    ("workload",): [
        {
            "rule": "!has(self.maxContextTokens) || self.maxContextTokens >= self.inputTokens + self.outputTokens",
            "message": "maxContextTokens must be at least inputTokens + outputTokens",
        }
    ],
    ("routing", "inferencePool", "endpointPickerRef"): [
        {
            "rule": "(has(self.kind) && self.kind != 'Service') || has(self.port)",
            "message": "endpointPickerRef.port is required when kind is Service (or unset)",
        }
    ],
    ("scaling",): [
        {"rule": "self.minReplicas <= self.maxReplicas", "message": "minReplicas must be <= maxReplicas"},
        {
            "rule": "!has(self.replicas) || (self.replicas >= self.minReplicas && self.replicas <= self.maxReplicas)",
            "message": "a pinned replicas count must lie within minReplicas and maxReplicas",
        },
    ],
}

PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "GPU", "type": "string", "jsonPath": ".status.plan.gpuType"},
    {"name": "TP", "type": "integer", "jsonPath": ".status.plan.tensorParallel"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
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
    if "items" in node:
        node["items"] = _structural(node["items"], defs)
    if "type" not in node and "enum" not in node:
        node["x-kubernetes-preserve-unknown-fields"] = True
    return node


def openapi_schema(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return dict(_structural(raw, defs))


def _add_rules(spec_schema: dict[str, Any]) -> None:
    for path, rules in CEL_RULES.items():
        node = spec_schema
        for key in path:
            node = node["properties"][key]
        node["x-kubernetes-validations"] = rules


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
                            "properties": {"spec": spec, "status": status},
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
