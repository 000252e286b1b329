"""Whether a fleet behind a plain Service would be markedly cheaper behind a least-loaded
gateway, from the planner's own model of each router (pure)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvscale.planner.search import Feasible, Plan, plan
from kvscale.sizing.catalog import Catalog

# Advise only where the gateway saves at least this share of the cost: a gateway is one more
# thing to run, and a saving of a replica in ten is within the capacity model's own error
# (its rate per replica sits ~5% from the simulator's on bursty loads, and replicas round up).
MIN_SAVING = 0.2


@dataclass(frozen=True)
class GatewayAdvice:
    """The chosen plan behind a plain Service beside the plan on the same GPU type behind a
    least-loaded router (an InferencePool's endpoint picker)."""

    gpu: str
    service_replicas: int
    service_gpus: int
    service_usd_per_hour: float
    gateway_replicas: int
    gateway_gpus: int
    gateway_usd_per_hour: float

    @property
    def saving(self) -> float:
        """The share of the Service plan's cost the gateway saves."""
        return 1.0 - self.gateway_usd_per_hour / self.service_usd_per_hour

    def message(self, fix: str) -> str:
        """Why, in the planner's terms; `fix` says how to put the service behind a gateway."""
        return (
            f"behind a least-loaded gateway this workload needs {self.gateway_replicas} replica(s) "
            f"({self.gateway_gpus} x {self.gpu}, ${self.gateway_usd_per_hour:.2f}/h) instead of "
            f"{self.service_replicas} ({self.service_gpus} x {self.gpu}, ${self.service_usd_per_hour:.2f}/h) "
            f"behind a plain Service, {self.saving:.0%} less: a Service routes at random, so a prompt "
            f"can wait behind another's prefill on a busy replica while others idle; {fix}"
        )


def gateway_advice(catalog: Catalog, planned: Plan, min_saving: float = MIN_SAVING) -> GatewayAdvice | None:
    """The advice for a plan made for a plain Service, or None when a gateway would not save
    `min_saving` of its cost (or the plan already assumes one). Re-plans on the chosen GPU type,
    tensor-parallel degree and precision only, within the same limits, so it costs one candidate's evaluation, not a
    second search."""
    chosen: Feasible | None = planned.chosen
    request = planned.request
    if chosen is None or request.least_loaded:
        return None
    behind_gateway = plan(
        catalog,
        replace(
            request,
            gpus=(chosen.gpu,),
            tensor_parallel=(chosen.tensor_parallel,),
            precisions=(chosen.precision,),
            least_loaded=True,
        ),
    ).chosen
    if behind_gateway is None:
        return None
    advice = GatewayAdvice(
        gpu=chosen.gpu,
        service_replicas=chosen.prediction.replicas,
        service_gpus=chosen.total_gpus,
        service_usd_per_hour=chosen.prediction.cost_usd_per_hour,
        gateway_replicas=behind_gateway.prediction.replicas,
        gateway_gpus=behind_gateway.total_gpus,
        gateway_usd_per_hour=behind_gateway.prediction.cost_usd_per_hour,
    )
    return advice if advice.saving >= min_saving else None
