"""The InferenceService resource (kvscale.io/v1alpha1): pydantic models, the CRD made from them,
the spec parsed once into domain values, and the label keys every part of kvscale shares."""

GROUP = "kvscale.io"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ["kvis"]

MANAGED_BY = "kvscale"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_OWNER_UID = "kvscale.io/owner-uid"  # on engine pods: the InferenceService's uid
LABEL_GPU_TYPE = "kvscale.io/gpu-type"  # on engine pods: the planned catalog GPU type
LABEL_MODEL = "kvscale.io/model"  # on engine pods: the catalog model
LABEL_VARIANT = "kvscale.io/variant"  # on engine pods: GPU type, tensor parallelism, precision
# The llm-d conventions (also on engine pods), so an llm-d router or the workload-variant
# autoscaler sees them: serving pods, their model and their variant (same values as kvscale's).
LLMD_INFERENCE_SERVING = "llm-d.ai/inference-serving"
LLMD_MODEL = "llm-d.ai/model"
LLMD_VARIANT = "llm-d.ai/variant"
# A disaggregated service's engine pods: prefill or decode (llm-d's P/D scheduler picks each by it).
LLMD_ROLE = "llm-d.ai/role"


def labels(name: str) -> dict[str, str]:
    """The labels of every object an InferenceService owns, and the selector of its pods."""
    return {LABEL_NAME: "inferenceservice", LABEL_INSTANCE: name, LABEL_MANAGED_BY: MANAGED_BY}


def selector(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in labels(name).items())
