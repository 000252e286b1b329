"""What the operator remembers of one InferenceService between handler calls, as one frozen
value under one key of kopf's per-object memo (MEMO_KEY). The pure core returns a new value;
the handlers store it (kvscale.operator.handlers.update), never a field at a time.

Nothing here survives a restart: the children come back from the API server (kvscale looks
again and re-applies), the autoscaler's state starts empty (which only delays scale-downs),
the idle clock of scale to zero starts at the first tick."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kvscale.api import LLMD_ROLE
from kvscale.api.models import PlannedWorkloadStatus
from kvscale.control import children as owned
from kvscale.control import inference_pool
from kvscale.control.capacity import Confirmed
from kvscale.control.holding import Held
from kvscale.control.pool_scaling import PoolsMemory
from kvscale.control.reconcile import DEPLOYMENT, Result
from kvscale.control.scaling import ScalerMemory

MEMO_KEY = "kvscale"

ChildKey = tuple[str, str]  # (kind, name)


@dataclass(frozen=True)
class ServiceMemory:
    """One service's memory.

    - `children`: the bodies kvscale last applied, by (kind, name): the status tick re-applies
      those deleted or edited outside kvscale.
    - `applied`: the engine workload as last applied, kept at the replicas the tick scaled it to
      (drift is measured against it).
    - `scaler`: the autoscaler's capacity model and policy state.
    - `ready_pods`: engine pods whose start-to-ready time was counted (each counts once).
    - `replanned`: (generation, planned-for workload) of this operator's last drift re-plan.
    - `budget_draining`: (GPU type, GPUs per pod) of a plan a GPUBudget moved the service off,
      while its pods still hold GPUs there.
    - `last_active_s`: when requests last arrived or waited (scale to zero's idle clock).
    - `deleted`: the object is being deleted: a tick in flight exports no gauges after this.
    - `capacity`: the capacity the simulated search last confirmed (kvscale.control.capacity),
      which the policy acts on for that configuration.
    - `holding`: the burst-holding settings the last tune chose (kvscale.control.holding), which
      the tick runs for that configuration with KVSCALE_HOLDING=tuned.
    - `pools`: a disaggregated plan's pools' models and policy states (kvscale.control.pool_scaling).
    - `status_written`: (resourceVersion of the body it was made from, monotonic seconds) of the
      status tick's last status write: a body still at that version does not show the write yet.
    """

    children: Mapping[ChildKey, Mapping[str, Any]] = field(default_factory=dict)
    applied: Mapping[str, Any] | None = None
    scaler: ScalerMemory = field(default_factory=ScalerMemory)
    ready_pods: frozenset[str] = frozenset()
    replanned: tuple[int | None, PlannedWorkloadStatus | None] | None = None
    budget_draining: tuple[str, int] | None = None
    last_active_s: float | None = None
    deleted: bool = False
    capacity: Confirmed | None = None
    holding: Held | None = None
    pools: PoolsMemory = field(default_factory=PoolsMemory)
    status_written: tuple[str, float] | None = None

    def applied_children(self) -> tuple[Mapping[str, Any], ...]:
        """The children kvscale last applied; the Deployment as `applied`, which the scale tick
        keeps at the replicas it set."""
        bodies = [b for (kind, _), b in self.children.items() if kind != DEPLOYMENT or _pool_deployment(b)]
        return (*bodies, *((self.applied,) if self.applied is not None else ()))

    def remembered(self, result: Result) -> ServiceMemory:
        """With what `result` applied, deleted or pruned."""
        known = dict(self.children)
        applied = self.applied
        for kind, name in list(known):
            deleted = kind in result.delete or (kind, name) in result.delete_named
            pruned = result.prune_pools and kind == inference_pool.KIND and name != result.keep_pool
            if deleted or pruned:
                del known[kind, name]
                if kind == DEPLOYMENT:
                    applied = None
        for body in result.apply:
            known[owned.key(body)] = body
        if result.applied_deployment is not None:
            applied = result.applied_deployment
        return replace(self, children=known, applied=applied)

    def after_tick(self, ticked: ServiceMemory, scale_to: int | None) -> ServiceMemory:
        """This memory (as it is now: other handlers may have stored since the tick read it) with
        the scale tick's own fields from `ticked`, and the applied workload at the replicas it
        scaled to."""
        new = replace(
            self,
            scaler=ticked.scaler,
            ready_pods=ticked.ready_pods,
            last_active_s=ticked.last_active_s,
            budget_draining=ticked.budget_draining,
        )
        return new if scale_to is None else new.scaled(scale_to)

    def scaled(self, replicas: int) -> ServiceMemory:
        """The applied workload at the replicas the tick scaled it to (the same body among the
        children too, as the one object it is there)."""
        if self.applied is None:
            return self
        before = self.applied
        after = {**before, "spec": {**(before.get("spec") or {}), "replicas": replicas}}
        known = {k: (after if body is before else body) for k, body in self.children.items()}
        return replace(self, applied=after, children=known)

    def pools_ticked(self, pools: PoolsMemory, scaled: Mapping[str, int]) -> ServiceMemory:
        """This memory (as it is now) with the pools' tick: its models and states, and each pool
        Deployment it scaled kept at its new replicas (drift is measured against it)."""
        known = dict(self.children)
        for (kind, name), body in self.children.items():
            if kind == DEPLOYMENT and name in scaled:
                known[kind, name] = {**body, "spec": {**(body.get("spec") or {}), "replicas": scaled[name]}}
        return replace(self, pools=pools, children=known)


def _pool_deployment(body: Mapping[str, Any]) -> bool:
    """A disaggregated plan's pool Deployment (its selector names a role): restored as applied,
    at the replicas the pools' scale tick last set (ServiceMemory.pools_ticked)."""
    selected = ((body.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return LLMD_ROLE in selected
