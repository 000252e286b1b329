"""A fleet of replicas: cold starts, draining, GPU-hours, least-loaded routing."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvscale.sim.engine import Replica, SimRequest, StepTimes


@dataclass(frozen=True)
class FleetSpec:
    max_batch: int
    kv_capacity_tokens: int
    token_budget: int
    gpus_per_replica: int
    cold_start_s: float


class Fleet:
    def __init__(self, spec: FleetSpec, steps: StepTimes) -> None:
        self.spec = spec
        self.steps = steps
        self.replicas: list[Replica] = []
        self.unrouted: deque[SimRequest] = deque()  # arrived while no replica was ready
        self.scale_events = 0

    # -- views -------------------------------------------------------------------------

    def serving(self, now_s: float) -> list[Replica]:
        return [r for r in self.replicas if r.is_ready(now_s) and not r.draining]

    def starting(self, now_s: float) -> list[Replica]:
        return [r for r in self.replicas if r.stopped_s is None and not r.draining and r.ready_s > now_s]

    def desired_size(self) -> int:
        return sum(1 for r in self.replicas if r.stopped_s is None and not r.draining)

    # -- changes -----------------------------------------------------------------------

    def _new_replica(self, now_s: float, cold_start_s: float) -> Replica:
        replica = Replica(
            len(self.replicas),
            self.steps,
            self.spec.max_batch,
            self.spec.kv_capacity_tokens,
            self.spec.token_budget,
            started_s=now_s,
            ready_s=now_s + cold_start_s,
        )
        self.replicas.append(replica)
        return replica

    def start(self, count: int, now_s: float, warm: bool = False) -> None:
        for _ in range(count):
            self._new_replica(now_s, 0.0 if warm else self.spec.cold_start_s)

    def scale_to(self, desired: int, now_s: float) -> None:
        current = self.desired_size()
        if desired == current:
            return
        self.scale_events += 1
        if desired > current:
            needed = desired - current
            for replica in self.replicas:  # cancelling a drain is cheaper than a cold start
                if needed and replica.stopped_s is None and replica.draining:
                    replica.draining = False
                    needed -= 1
            self.start(needed, now_s)
            return
        surplus = current - desired
        # Replicas still starting go first (nothing to drain), newest first; then the least loaded.
        for replica in sorted(self.starting(now_s), key=lambda r: -r.started_s):
            if surplus == 0:
                return
            replica.stopped_s = now_s
            surplus -= 1
        for replica in sorted(self.serving(now_s), key=lambda r: (r.load, -r.id)):
            if surplus == 0:
                return
            replica.draining = True
            surplus -= 1

    def route(self, request: SimRequest, now_s: float) -> None:
        candidates = self.serving(now_s)
        if not candidates:
            self.unrouted.append(request)
            return
        min(candidates, key=lambda r: (r.load, r.id)).enqueue(request)

    def advance_to(self, now_s: float, finished: list[SimRequest]) -> None:
        for replica in self.replicas:
            if replica.stopped_s is not None or replica.ready_s > now_s:
                continue
            replica.advance_to(now_s, finished)
            if replica.draining and replica.idle:
                replica.stopped_s = max(replica.clock, now_s)
        if self.unrouted and self.serving(now_s):
            pending, self.unrouted = self.unrouted, deque()
            for request in pending:
                self.route(request, now_s)

    def stop_all(self, now_s: float) -> None:
        for replica in self.replicas:
            if replica.stopped_s is None:
                replica.stopped_s = max(now_s, replica.clock)

    def gpu_hours(self) -> float:
        seconds = sum((r.stopped_s if r.stopped_s is not None else r.clock) - r.started_s for r in self.replicas)
        return seconds * self.spec.gpus_per_replica / 3600.0
