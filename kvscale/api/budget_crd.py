"""The GPUBudget CustomResourceDefinition, generated from kvscale/api/budget.py the same way
as the InferenceService's (structural, descriptions kept)."""

from __future__ import annotations

from typing import Any

import yaml

from kvscale.api import GROUP, VERSION
from kvscale.api.budget import (
    BUDGET_KIND,
    BUDGET_PLURAL,
    BUDGET_SHORT_NAMES,
    BUDGET_SINGULAR,
    LABEL_KEY_LENGTH,
    LABEL_KEY_PATTERN,
    LABEL_NAME_LENGTH,
    LABEL_VALUE_PATTERN,
    MAX_BUDGET_TYPES,
    NAMESPACE_LENGTH,
    NAMESPACE_PATTERN,
    GPUBudgetSpec,
    GPUBudgetStatus,
)
from kvscale.api.crd import openapi_schema

GPU_TYPE_LENGTH = 64
GPU_TYPE_PATTERN = "^[A-Za-z0-9][-A-Za-z0-9_.]*$"

PRINTER_COLUMNS = [
    {"name": "Limits", "type": "string", "jsonPath": ".spec.limits"},
    {"name": "Allocated", "type": "string", "jsonPath": ".status.allocated"},
    {"name": "Wanted", "type": "string", "jsonPath": ".status.wanted"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def budget_crd() -> dict[str, Any]:
    spec = openapi_schema(GPUBudgetSpec)
    spec["x-kubernetes-validations"] = [
        {
            "rule": "self.limits.size() > 0",
            "message": "spec.limits must name at least one GPU type, e.g. {H100-SXM: 8}",
        },
        {
            "rule": "!has(self.namespaceLimits) || self.namespaceLimits.all(ns, self.namespaceLimits[ns].all(t, "
            "!(t in self.limits) || self.namespaceLimits[ns][t] <= self.limits[t]))",
            "message": "a spec.namespaceLimits entry is above spec.limits for its GPU type: a namespace's share lies "
            "within the budget's limit; lower it or raise the limit",
            "fieldPath": ".namespaceLimits",
        },
    ]
    # GPU type names: the schema bounds their form; which names exist is the operator's catalog
    # (overlays add GPUs), so the operator refuses unknown ones (Ready False, UnknownGPUType).
    gpu_name = {
        "rule": f"self.all(t, t.size() <= {GPU_TYPE_LENGTH} && t.matches('{GPU_TYPE_PATTERN}'))",
        "message": "GPU types are catalog names such as H100-SXM or A100-80GB (`kvscale gpus` lists them)",
    }
    spec["properties"]["limits"]["x-kubernetes-validations"] = [gpu_name]
    per_namespace = spec["properties"]["namespaceLimits"]["additionalProperties"]
    per_namespace["maxProperties"] = MAX_BUDGET_TYPES
    per_namespace["x-kubernetes-validations"] = [gpu_name]
    namespace_form = (
        "a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit), e.g. team-a"
    )
    spec["properties"]["namespaceLimits"]["x-kubernetes-validations"] = [
        {
            "rule": f"self.all(ns, ns.size() <= {NAMESPACE_LENGTH} && ns.matches('{NAMESPACE_PATTERN}'))",
            "message": f"spec.namespaceLimits keys are namespaces: {namespace_form}",
        }
    ]
    selector = spec["properties"]["selector"]["properties"]
    selector["namespaces"]["items"]["pattern"] = NAMESPACE_PATTERN
    selector["namespaces"]["x-kubernetes-validations"] = [
        {
            "rule": f"self.all(ns, ns.matches('{NAMESPACE_PATTERN}'))",
            "message": f"spec.selector.namespaces are namespace names: {namespace_form}",
        }
    ]
    selector["matchLabels"]["x-kubernetes-validations"] = [
        {
            "rule": f"self.all(k, k.size() <= {LABEL_KEY_LENGTH} && k.matches('{LABEL_KEY_PATTERN}') && "
            f"k.split('/')[k.split('/').size() - 1].size() <= {LABEL_NAME_LENGTH})",
            "message": "spec.selector.matchLabels keys are label keys: an optional DNS subdomain prefix and '/', then "
            f"a name of at most {LABEL_NAME_LENGTH} letters, digits, '-', '_' or '.' starting and ending with a letter "
            "or digit, e.g. tier or example.com/team",
        },
        {
            "rule": f"self.all(k, self[k].matches('{LABEL_VALUE_PATTERN}'))",
            "message": "spec.selector.matchLabels values are label values: empty, or letters, digits, '-', '_' or '.' "
            "starting and ending with a letter or digit",
        },
    ]
    status = openapi_schema(GPUBudgetStatus)
    spec["description"] = "GPU limits per type and which InferenceServices they govern."
    status["description"] = "What is allocated, to whom, and what is wanted."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{BUDGET_PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": BUDGET_KIND,
                "listKind": f"{BUDGET_KIND}List",
                "plural": BUDGET_PLURAL,
                "singular": BUDGET_SINGULAR,
                "shortNames": BUDGET_SHORT_NAMES,
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A GPU budget shared by many InferenceServices: allocation by priority "
                            "and SLO gap, never above a limit.",
                            "required": ["spec"],
                            "properties": {"spec": spec, "status": status},
                        }
                    },
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def budget_crd_yaml() -> str:
    header = "# Generated by `kvscale crd --kind gpubudget` from kvscale/api/budget.py. Do not edit; regenerate.\n"
    return header + yaml.safe_dump(budget_crd(), sort_keys=False, width=120)
