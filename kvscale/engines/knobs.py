"""How a plan's suggestions name what a user can change: the CLI's flags, or the
InferenceService's fields. A condition in the operator that said "raise --max-replicas" sent a
user looking for a flag the resource does not have."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Knobs:
    ttft: str
    tpot: str
    precision: str
    max_replicas: str
    rps: str
    separator: str  # between a knob and a value it could take
    joiner: str  # between two knobs set together
    smaller_precision: str  # what to write for a smaller precision (the CLI searches a list; the spec names one)
    itl: str = "--itl"  # the inter-token latency bound
    # What a simulated check no fleet passes suggests (kvscale.sim.check): the percentile, the
    # router in front of the fleet, the GPU type and the tensor-parallel degree.
    percentile: str = "--percentile"
    routing: str = "--routing gateway"
    gpu: str = "--gpu"
    tensor_parallel: str = "--tp"

    def to(self, knob: str, value: str) -> str:
        """`knob` set to `value`, as the user writes it."""
        return f"{knob}{self.separator}{value}"


CLI_KNOBS = Knobs("--ttft", "--tpot", "--precision", "--max-replicas", "--rps", " ", " ", "bf16,fp8,int4")
RESOURCE_KNOBS = Knobs(
    "spec.slo.timeToFirstToken",
    "spec.slo.timePerOutputToken",
    "spec.model.precision",
    "spec.scaling.maxReplicas",
    "spec.workload.requestsPerSecond",
    ": ",
    ", ",
    "fp8 (or int4 with a checkpoint quantized that way)",
    itl="spec.slo.maxInterTokenLatency",
    percentile="spec.slo.percentile",
    routing="spec.routing.inferencePool",
    gpu="spec.hardware.gpuTypes",
    tensor_parallel="spec.hardware.maxTensorParallel",
)
