"""The stand-in's fleet for a disaggregated plan (status.plan.mode "disaggregated"): the
simulator's prefill and decode pools (kvscale.sim.disaggregated_fleet), driven by the cluster's
pods, each pod's engine counted as vLLM counts it.

A pod's role is its `llm-d.ai/role` label (kvscale.control.disaggregated.role_labels): a prefill
pod gets a replica of the prefill pool (PoolFleet("prefill"), the prefill pool's serving
configuration), a decode pod one of the decode pool (DecodeReplica, the decode pool's); a pod
with neither role gets none. Each pool's configuration is status.plan.prefill / .decode read as
the aggregated stand-in reads status.plan (kvscale.api.intent.pool_serving_config: GPU type, TP,
precision, chunk budget; the batch limit), and the KV path between them is the one the operator
planned over (kvscale.sizing.disaggregation.kv_transfer_path, between nodes).

A request runs as vLLM 0.11's P/D with NixlConnector runs it (the simulator's module docstring):
every arrival reaches the prefill pool's gateway as a copy with max_tokens 1; when that copy
finishes, its prompt's KV moves to the decode pool (DisaggregatedSetup.transfer_s at its own
prompt), and the request then reaches the decode pool's gateway with its real output length.
Either gateway holds requests while its pool has no serving pod (none vanish: they wait for a
pod, as Fleet's gateway routing holds them).

Each pod's metrics are its engine's (kvscale.standin.fleet.PodStats, the same families):
- a prefill pod counts each copy it finished: 1 generation token, the prompt tokens, TTFT = its
  wait at the gateway and on the engine + the prefill (from the user's arrival), e2e = TTFT, no
  TPOT and no inter-token gaps (a copy leaves after its first token);
- a decode pod counts each request it decoded, as that engine saw it: the request reaches it
  when the prefill ends (the proxy sends it on then; vLLM's decode side waits for the KV in
  WAITING_FOR_REMOTE_KVS), so its TTFT is the transfer + the wait for a slot + the step that
  computes the prompt's last token, then TPOT, the inter-token gaps of its steps, its generation
  tokens, running/waiting gauges and KV usage.

A finish is counted once the engines' clock has reached it (a step is computed whole when it
starts, so a replica knows its finishes ahead of now); a pod that goes away loses what it held,
and what it would have finished after that.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Literal

from kvscale.api.intent import Intent, pool_serving_config
from kvscale.api.models import PlanStatus, PoolPlanStatus
from kvscale.sim.disaggregated_fleet import DECODE_SEED_OFFSET, DecodeReplica, DisaggregatedSetup, PoolFleet
from kvscale.sim.engine import SimRequest
from kvscale.sim.load_profile import Arrivals
from kvscale.sim.run import SimSetup
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.disaggregation import kv_transfer_path
from kvscale.standin.fleet import EngineFleet, PodStats

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")


class CountingDecodeReplica(DecodeReplica):
    """DecodeReplica with the tokens of its first steps in vllm:generation_tokens_total: the step
    that computes a new request's last prompt token emits its first token, and one token of each
    running decode beside it (DecodeReplica._first_step counts the step's gaps, not its tokens)."""

    def _first_step(self, fresh: list[SimRequest], finished: list[SimRequest]) -> None:
        tokens = len(self.running) + len(fresh)
        super()._first_step(fresh, finished)
        self.generated_tokens += tokens


def pool_setup(
    catalog: Catalog, intent: Intent, plan: PlanStatus, pool: PoolPlanStatus, cold_start_s: float, seed: int
) -> SimSetup:
    """One pool's replicas as status.plan records them: the pool's GPU type, TP, precision and
    chunk budget read as serving_config reads the aggregated plan's (the service's model, KV
    precision and engine profile), its batch limit, behind the gateway, no replica to start with
    (the pods bring them)."""
    return SimSetup(
        cfg=pool_serving_config(intent, plan, pool, catalog),
        slo=intent.slo,
        max_batch=pool.max_batch,
        cold_start_s=cold_start_s,
        initial_replicas=0,
        routing="gateway",
        seed=seed,
    )


def pools_setup(
    catalog: Catalog, intent: Intent, plan: PlanStatus, cold_start_s: float, seed: int
) -> DisaggregatedSetup:
    """Both pools of a disaggregated status.plan and the KV path between them (ValueError when
    the plan is not disaggregated or no path joins the pools' GPUs)."""
    if plan.mode != "disaggregated" or plan.prefill is None or plan.decode is None:
        raise ValueError(f"status.plan is {plan.mode}, not a disaggregated plan with prefill and decode pools")
    prefill = pool_setup(catalog, intent, plan, plan.prefill, cold_start_s, seed)
    decode = pool_setup(catalog, intent, plan, plan.decode, cold_start_s, seed + DECODE_SEED_OFFSET)
    # The operator plans the pools on separate nodes (plan_layouts' within_node default).
    path = kv_transfer_path(catalog, prefill.cfg.gpu, decode.cfg.gpu)
    if path is None:
        raise ValueError(
            f"no KV transfer path between {prefill.cfg.gpu.name} and {decode.cfg.gpu.name} in the catalog "
            "(no inter-node bandwidth known)"
        )
    return DisaggregatedSetup(prefill, decode, path, prefix_cache_hit_share=intent.workload.prefix_cache_hit_share)


class PoolsPodFleet(EngineFleet):
    """The simulator's prefill and decode pools, driven by the cluster's pods: `sync_pods` (each
    Running pod's role) and `tick` are called by the serve loop, `serving` by the metrics
    collector (all under one lock), as kvscale.standin.fleet.PodFleet's."""

    def __init__(self, setup: DisaggregatedSetup, arrivals: Arrivals, clock: Callable[[], float]) -> None:
        self.setup = setup
        self.arrivals = arrivals
        self.pools: dict[Role, PoolFleet] = {
            "prefill": PoolFleet(setup.prefill, "prefill"),
            "decode": PoolFleet(setup.decode, "decode"),
        }
        self.pools["decode"].replica_type = CountingDecodeReplica
        super().__init__(clock)
        self.roles: dict[str, Role] = {}  # pod -> its role
        self._stats: dict[tuple[Role, int], PodStats] = {}  # (role, replica id) -> its pod's, kept when it goes
        self._ids = 0
        self._outputs: dict[int, int] = {}  # request id -> its output tokens, while its prefill copy runs
        self._ahead: dict[Role, list[tuple[float, int, SimRequest]]] = {"prefill": [], "decode": []}
        self.in_transfer: list[tuple[float, int, SimRequest]] = []  # (reaches the decode pool, id, request)
        self.lost: Counter[Role] = Counter()  # requests lost with their pod, per the pool they were in

    def sync_pods(self, running_pods: Mapping[str, str | None]) -> None:
        """Running pods (name -> its llm-d.ai/role label) get a replica of their role's pool
        (serving after the cold start); gone pods lose theirs, with their in-flight requests, as
        when a pod dies. A pod of neither role gets none."""
        now = self.now()
        running = {pod: role for pod, role in running_pods.items() if role in ROLES}
        with self.lock:
            for pod in sorted(set(running) - set(self.pods)):
                role: Role = "prefill" if running[pod] == "prefill" else "decode"
                fleet = self.pools[role]
                fleet.start(1, now)
                replica = fleet.replicas[-1]
                self.pods[pod] = self._stats[(role, replica.id)] = PodStats(pod, replica)
                self.roles[pod] = role
            for pod in set(self.pods) - set(running):
                replica = self.pods.pop(pod).replica
                role = self.roles.pop(pod)
                for request in replica.release():
                    self._lose(role, request)
                replica.stopped_s = now

    def tick(self) -> None:
        """Runs both pools to now. Each arrival reaches the prefill pool at its own time (the
        pools run up to it first), and each request the decode pool when its transfer ends."""
        now = self.now()
        with self.lock:
            for arrival in self.arrivals.until(now):
                self._ids += 1
                self._advance(arrival.arrival_s)
                self._outputs[self._ids] = arrival.output_tokens
                copy = SimRequest(self._ids, arrival.arrival_s, arrival.input_tokens, 1)  # max_tokens 1
                self.pools["prefill"].route(copy, arrival.arrival_s)
            self._advance(now)

    def finished(self, role: Role) -> int:
        """Requests the role's pods have counted as finished, gone pods' too (call under `lock`)."""
        return int(sum(s.success for (r, _), s in self._stats.items() if r == role))

    def held(self, role: Role) -> int:
        """Requests in the pool and not finished by now: at its gateway, on its replicas, and
        finished by steps still running (call under `lock`)."""
        fleet = self.pools[role]
        on_replicas = sum(r.load for r in fleet.replicas if r.stopped_s is None)
        return len(fleet.unrouted) + on_replicas + len(self._ahead[role])

    # -- internals -----------------------------------------------------------------------

    def _advance(self, t: float) -> None:
        """Both pools to `t`: the prefill pool, then in time order each prefill copy's finish
        (counted on its pod; the request starts its transfer) and each transfer's end (the
        decode pool runs up to it, then its gateway takes the request), then the decode pool."""
        prefill, decode = self.pools["prefill"], self.pools["decode"]
        finished: list[SimRequest] = []
        prefill.advance_to(t, finished)
        self._ahead_of("prefill", finished)
        done = self._ahead["prefill"]
        while True:
            next_done = done[0][0] if done else float("inf")
            next_entry = self.in_transfer[0][0] if self.in_transfer else float("inf")
            if min(next_done, next_entry) > t:
                break
            if next_done <= next_entry:
                _, _, copy = heapq.heappop(done)
                if self._count("prefill", copy):
                    request = SimRequest(copy.id, copy.finish_s, copy.input_tokens, self._outputs.pop(copy.id))
                    at = copy.finish_s + self.setup.transfer_s(copy.input_tokens)
                    heapq.heappush(self.in_transfer, (at, request.id, request))
            else:
                at, _, request = heapq.heappop(self.in_transfer)
                finished = []
                decode.advance_to(at, finished)
                self._ahead_of("decode", finished)
                decode.route(request, at)
        finished = []
        decode.advance_to(t, finished)
        self._ahead_of("decode", finished)
        done = self._ahead["decode"]
        while done and done[0][0] <= t:
            self._count("decode", heapq.heappop(done)[2])

    def _ahead_of(self, role: Role, finished: list[SimRequest]) -> None:
        for request in finished:
            heapq.heappush(self._ahead[role], (request.finish_s, request.id, request))

    def _count(self, role: Role, request: SimRequest) -> bool:
        """A finish the clock has reached: counted on its pod's engine, unless the pod went away
        before it (then it is lost)."""
        stats = self._stats[(role, request.replica)]
        replica = stats.replica
        if replica.stopped_s is not None and replica.stopped_s < request.finish_s:
            self._lose(role, request)
            return False
        stats.record(request)
        return True

    def _lose(self, role: Role, request: SimRequest) -> None:
        request.lost = "cut"
        self.lost[role] += 1
        if role == "prefill":
            self._outputs.pop(request.id, None)
