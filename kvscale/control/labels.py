"""Label values for the engine pods: which model, GPU type and serving variant a pod runs, so a
shared InferencePool (or a person with kubectl) can tell pods apart. Pure."""

from __future__ import annotations

import re

from kvscale.api import LABEL_GPU_TYPE, LABEL_MODEL, LABEL_VARIANT, LLMD_INFERENCE_SERVING, LLMD_MODEL, LLMD_VARIANT

MODEL_LABEL = LABEL_MODEL
GPU_LABEL = LABEL_GPU_TYPE
VARIANT_LABEL = LABEL_VARIANT

MAX_LABEL_VALUE = 63
_INVALID = re.compile(r"[^A-Za-z0-9._-]+")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
# Kubernetes label values (apimachinery validation.IsValidLabelValue): at most 63 characters,
# empty or starting and ending with an alphanumeric, with - _ . between.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_value(text: str) -> str:
    """`text` as a valid label value: runs of other characters become '-', the value is cut to 63
    characters and trimmed to alphanumerics at both ends (so 'meta-llama/Llama-3.1-8B' becomes
    'meta-llama-Llama-3.1-8B'). Nothing valid left gives 'unknown'."""
    value = _EDGE.sub("", _INVALID.sub("-", text))
    value = _EDGE.sub("", value[:MAX_LABEL_VALUE])
    return value or "unknown"


def serving_labels(model: str, gpu_type: str, tensor_parallel: int, precision: str) -> dict[str, str]:
    """Model (catalog name), GPU type and variant (GPU type, tensor parallelism, precision): two
    services of one model on different hardware share the model label and differ in variant.
    The llm-d.ai/* labels carry the same values for an llm-d router or WVA."""
    model_value = label_value(model)
    variant = label_value(f"{gpu_type}-tp{tensor_parallel}-{precision}".lower())
    return {
        MODEL_LABEL: model_value,
        GPU_LABEL: label_value(gpu_type),
        VARIANT_LABEL: variant,
        LLMD_INFERENCE_SERVING: "true",
        LLMD_MODEL: model_value,
        LLMD_VARIANT: variant,
    }
