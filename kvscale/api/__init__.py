"""The InferenceService resource (kvscale.io/v1alpha1): pydantic models and the CRD made from them."""

GROUP = "kvscale.io"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ["kvis"]
