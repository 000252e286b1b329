"""A fleet of replicas: cold starts, draining, GPU-hours, and how requests reach replicas.

Routing modes:
- `service` (a plain Kubernetes Service through kube-proxy in iptables mode, the cluster
  default): each request goes to a ready endpoint chosen at random, and stays on that
  replica's queue; a replica started later never takes it over.
- `round-robin` (kube-proxy in IPVS mode, `rr` scheduler): the same, in turn.
- `gateway` (the Gateway API inference extension's endpoint picker with its flow control):
  requests wait at the gateway and are sent to the least-loaded replica that could admit
  them now (a free batch slot and KV cache for the prompt), so a replica that becomes ready
  takes the backlog.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from dataclasses import dataclass

from kvscale.sim.engine import KV_WATERMARK, Replica, SimRequest, StepTimes

ROUTINGS = ("service", "round-robin", "gateway")
GATEWAY_POLL_S = 0.05  # while requests wait at the gateway, it looks for free replicas this often
# How long a replica taken out of routing keeps serving its in-flight requests before it is
# stopped and what it still holds is cut: the engine pod's preStop sleep
# (kvscale.control.resources.PRE_STOP_SLEEP_S; a unit test holds them equal). vLLM 0.11 does not
# finish requests itself on SIGTERM (vllm/entrypoints/launcher.py, serve_http: the SIGTERM
# handler cancels the HTTP server task, and api_server.py shuts the engine down before awaiting
# the server), so the drain happens out of routing, before the signal.
DRAIN_BOUND_S = 30.0


class RoutingError(ValueError):
    """An unknown routing mode; the message lists the known ones."""


def check_routing(routing: str) -> str:
    if routing not in ROUTINGS:
        raise RoutingError(f"--routing {routing!r}: choose one of {', '.join(ROUTINGS)}")
    return routing


@dataclass(frozen=True)
class FleetSpec:
    max_batch: int
    kv_capacity_tokens: int
    token_budget: int
    gpus_per_replica: int
    cold_start_s: float
    routing: str = "service"
    seed: int = 0
    cold_start_jitter: float = 0.0  # each start takes cold_start_s x U(1 - j, 1 + j)
    drain_bound_s: float = DRAIN_BOUND_S  # a draining replica's in-flight requests left after this are cut

    def __post_init__(self) -> None:
        check_routing(self.routing)
        if self.drain_bound_s < 0:
            raise ValueError(f"drain_bound_s must be >= 0, got {self.drain_bound_s}")
        if not 0 <= self.cold_start_jitter < 1:
            raise ValueError(f"cold_start_jitter must be in [0, 1), got {self.cold_start_jitter}")


class Fleet:
    def __init__(self, spec: FleetSpec, steps: StepTimes) -> None:
        self.spec = spec
        self.steps = steps
        self.replicas: list[Replica] = []
        self.unrouted: deque[SimRequest] = deque()  # arrived while no replica was ready, or held at the gateway
        self.lost: list[SimRequest] = []  # cut at a drain's bound or rejected, not yet counted by the run
        self.scale_events = 0
        self._rng = random.Random(spec.seed)
        self._jitter_rng = random.Random(spec.seed + 1)
        self._turn = 0
        self._now = 0.0
        # Stepping only replicas with something to do: a replica idle and serving, its clock at
        # or past every time the fleet was advanced to, is parked (its id in _parked, sorted):
        # advancing it would only set its clock to each event's time, so it is skipped, and its
        # clock is set to the latest such time (_advanced_s) when it is next needed (a request
        # enqueued on it wakes it, a scale or the run's end wakes all). _active: the replicas
        # stepped, in id order (the order they report finishes in); stopped ones leave it.
        self._active: list[Replica] = []
        self._parked: list[int] = []
        self._advanced_s = -math.inf
        # serving()'s last answer: (Replica.changes, replicas, valid from, valid until, the list)
        self._serving: tuple[int, int, float, float, list[Replica]] | None = None

    # -- views -------------------------------------------------------------------------

    def serving(self, now_s: float) -> list[Replica]:
        return list(self._serving_now(now_s))

    def _serving_now(self, now_s: float) -> list[Replica]:
        """The replicas serving at now_s, in id order (not to be changed: it is kept). The
        simulator asks on every arrival; the answer changes only when a replica starts,
        stops, starts or ends a drain (Replica.changes) or becomes ready, so it is kept with
        the times between which no replica becomes ready."""
        kept = self._serving
        if (
            kept is not None
            and kept[0] == Replica.changes
            and kept[1] == len(self.replicas)
            and kept[2] <= now_s < kept[3]
        ):
            return kept[4]
        serving: list[Replica] = []
        since, until = -math.inf, math.inf
        for r in self.replicas:
            if r._stopped_s is None and not r._draining:
                if r.ready_s <= now_s:
                    serving.append(r)
                    since = max(since, r.ready_s)
                else:
                    until = min(until, r.ready_s)
        self._serving = (Replica.changes, len(self.replicas), since, until, serving)
        return serving

    def starting(self, now_s: float) -> list[Replica]:
        return [r for r in self.replicas if r._stopped_s is None and not r._draining and r.ready_s > now_s]

    def desired_size(self) -> int:
        return sum(1 for r in self.replicas if r._stopped_s is None and not r._draining)

    def waiting(self, now_s: float) -> int:
        """Requests not yet admitted: on replica queues, at the gateway, or with no replica."""
        return sum(len(r.waiting) for r in self._serving_now(now_s)) + len(self.unrouted)

    def waiting_max(self, now_s: float) -> int:
        """The longest queue of one serving replica (the gateway's queue excluded)."""
        return max((len(r.waiting) for r in self._serving_now(now_s)), default=0)

    def became_ready(self, since_s: float, now_s: float) -> tuple[float, ...]:
        """Start-to-ready seconds of replicas that became ready in (since_s, now_s]."""
        return tuple(
            r.ready_s - r.started_s
            for r in self.replicas
            if since_s < r.ready_s <= now_s and r.ready_s > r.started_s and r.stopped_s is None
        )

    # -- changes -----------------------------------------------------------------------

    replica_type: type[Replica] = Replica  # a pool of decode-only workers starts another kind

    def _new_replica(self, now_s: float, cold_start_s: float) -> Replica:
        replica = self.replica_type(
            len(self.replicas),
            self.steps,
            self.spec.max_batch,
            self.spec.kv_capacity_tokens,
            self.spec.token_budget,
            started_s=now_s,
            ready_s=now_s + cold_start_s,
        )
        self.replicas.append(replica)
        self._active.append(replica)  # the highest id: _active stays in id order
        return replica

    def _wake(self, replica: Replica) -> None:
        """A parked replica back among those stepped, its clock where stepping it at every
        advance would have left it."""
        replica.waker = None
        if replica.clock < self._advanced_s:
            replica.clock = self._advanced_s
        del self._parked[bisect.bisect_left(self._parked, replica.id)]
        bisect.insort(self._active, replica, key=_replica_id)

    def _wake_all(self) -> None:
        if not self._parked:
            return
        woken = [self.replicas[i] for i in self._parked]
        for replica in woken:
            replica.waker = None
            if replica.stopped_s is None and replica.clock < self._advanced_s:
                replica.clock = self._advanced_s
        self._parked = []
        self._active = sorted([*self._active, *woken], key=_replica_id)

    def start(self, count: int, now_s: float, warm: bool = False) -> None:
        for _ in range(count):
            jitter = self.spec.cold_start_jitter
            factor = 1.0 + jitter * (2 * self._jitter_rng.random() - 1) if jitter else 1.0
            self._new_replica(now_s, 0.0 if warm else self.spec.cold_start_s * factor)

    def scale_to(self, desired: int, now_s: float, bound_s: float | None = None) -> int:
        """Scales to `desired` replicas; returns how many serving replicas it took out of
        routing. A scale-down stops replicas still starting first (nothing to drain), newest
        first; then drains the least loaded (the operator's pod-deletion-cost order): no new
        request reaches them, their in-flight requests have `bound_s` (default: the spec's
        drain bound) to finish, and what is left then is cut. Behind the gateway a drained
        replica's queue (not admitted yet) goes back to the gateway for the other replicas."""
        current = self.desired_size()
        if desired == current:
            return 0
        self._wake_all()
        self.scale_events += 1
        if desired > current:
            needed = desired - current
            for replica in self.replicas:  # cancelling a drain is cheaper than a cold start
                if needed and replica.stopped_s is None and replica.draining:
                    replica.draining = False
                    replica.drain_deadline_s = math.inf
                    needed -= 1
            self.start(needed, now_s)
            return 0
        surplus = current - desired
        for replica in sorted(self.starting(now_s), key=lambda r: -r.started_s):
            if surplus == 0:
                return 0
            replica.stopped_s = now_s
            surplus -= 1
        bound = self.spec.drain_bound_s if bound_s is None else bound_s
        drained = 0
        for replica in sorted(self.serving(now_s), key=lambda r: (r.load, -r.id))[:surplus]:
            replica.draining = True
            replica.drain_deadline_s = now_s + bound
            if self.spec.routing == "gateway" and replica.waiting:
                self.unrouted.extendleft(reversed(replica.waiting))
                replica.waiting.clear()
            drained += 1
        return drained

    def _cut(self, replica: Replica, at_s: float) -> None:
        for request in replica.release():
            request.lost = "cut"
            self.lost.append(request)
        replica.stopped_s = at_s

    def end(self, now_s: float) -> None:
        """The run's end: what a replica still holds is cut, what waits at the gateway (or for
        any replica) is rejected (the gateway answers 429), and every replica stops."""
        self._wake_all()
        for replica in self.replicas:
            if replica.stopped_s is None and not replica.idle:
                self._cut(replica, max(now_s, replica.clock))
        while self.unrouted:
            request = self.unrouted.popleft()
            request.lost = "rejected"
            self.lost.append(request)
        self.stop_all(now_s)

    def take_lost(self) -> list[SimRequest]:
        lost, self.lost = self.lost, []
        return lost

    @staticmethod
    def _room(replica: Replica) -> tuple[int, float]:
        """Batch slots and KV tokens left once the replica's own queue is admitted."""
        slots = replica.max_batch - len(replica.running) - len(replica.waiting)
        kv = replica.kv_capacity * (1 - KV_WATERMARK) - replica.kv_used
        kv -= sum(r.input_tokens + r.generated + 1 for r in replica.waiting)
        return slots, kv

    def _spare(self, now_s: float, seen: dict[int, Replica]) -> Replica | None:
        """The parked replica serving at now_s with the lowest id, of those not in `seen`."""
        for i in self._parked:
            replica = self.replicas[i]
            if i not in seen and replica._stopped_s is None and replica.ready_s <= now_s and not replica._draining:
                return replica
        return None

    def _gateway_send(self, now_s: float) -> None:
        """The endpoint picker: the oldest request at the gateway goes to the least-loaded
        replica that could admit it now (a free batch slot and the KV cache for its prompt).

        The parked replicas (idle: no load, an empty cache, the same room each) are one
        candidate, the lowest id of them: the others tie with it on load and room and lose on
        the id, so only the stepped replicas and that one are looked at. The least-loaded
        replica that fits is among the least-loaded replicas where any fits: a replica's room is
        read only when its load is the lowest left to try."""
        if not self.unrouted:
            return
        serving = [r for r in self._active if r._stopped_s is None and r.ready_s <= now_s and not r._draining]
        by_id = {r.id: r for r in serving}
        rooms: dict[int, tuple[int, float]] = {}  # read once per call, then kept by what is sent
        spare: Replica | None = None  # the parked replica among by_id, not sent a request yet
        while self.unrouted:
            if spare is None:
                spare = self._spare(now_s, by_id)
                if spare is not None:
                    by_id[spare.id] = spare
            if not by_id:
                return
            request = self.unrouted[0]
            need = request.input_tokens + request.generated + 1
            levels: dict[int, list[int]] = {}  # load -> replicas
            for i, r in by_id.items():
                levels.setdefault(len(r.running) + len(r.waiting), []).append(i)
            for load in sorted(levels):
                fits = []
                for i in levels[load]:
                    room = rooms.get(i)
                    if room is None:
                        room = rooms[i] = self._room(by_id[i])
                    if room[0] > 0 and room[1] >= need:
                        fits.append(i)
                if fits:
                    chosen = min(fits, key=lambda i: (-rooms[i][1], i))
                    break
            else:
                # A prompt larger than any free cache still goes to an idle replica, served alone.
                idle = levels.get(0)
                if not idle:
                    return
                chosen = min(idle)
            by_id[chosen].enqueue(self.unrouted.popleft())
            if spare is not None and chosen == spare.id:
                spare = None  # woken by the request: the next parked one is the candidate
            slots, kv = rooms[chosen]
            rooms[chosen] = (slots - 1, kv - need)

    def route(self, request: SimRequest, now_s: float) -> None:
        if self.spec.routing == "gateway":
            self.unrouted.append(request)  # first come, first served at the gateway
            self._gateway_send(now_s)
            return
        candidates = self._serving_now(now_s)
        if not candidates:
            self.unrouted.append(request)
            return
        if self.spec.routing == "round-robin":
            self._turn += 1
            candidates[self._turn % len(candidates)].enqueue(request)
        else:
            candidates[self._rng.randrange(len(candidates))].enqueue(request)

    def _dispatch(self, now_s: float) -> None:
        """Requests held at the gateway (or waiting for any replica) go where there is room."""
        if not self.unrouted:
            return
        if self.spec.routing == "gateway":
            self._gateway_send(now_s)
        elif self._serving_now(now_s):
            pending, self.unrouted = self.unrouted, deque()
            for request in pending:
                self.route(request, now_s)

    def _advance_replicas(self, now_s: float, finished: list[SimRequest], stop_after_finish: bool = False) -> None:
        if now_s > self._advanced_s:
            self._advanced_s = now_s
        latest = self._advanced_s
        left = False  # whether a replica left _active (stopped or parked)
        for replica in self._active:
            if replica._stopped_s is not None:
                left = True  # stopped for good: never stepped again
                continue
            if replica.ready_s > now_s:
                continue
            until = min(now_s, replica.drain_deadline_s)
            if replica.clock < until:  # else the step in flight already ends past it
                if replica.running or replica.waiting:
                    replica.advance_to(until, finished, stop_after_finish)
                else:
                    replica.clock = until  # idle (Replica.advance_to's first test, inlined)
            if replica._draining:
                if replica.idle:
                    replica.stopped_s = max(replica.clock, until)
                    left = True
                elif replica.clock >= replica.drain_deadline_s:
                    self._cut(replica, replica.drain_deadline_s)  # the grace period ended: the pod is killed
                    left = True
            elif not replica.running and not replica.waiting and replica.clock >= latest:
                replica.waker = self._wake  # parked until a request reaches it
                bisect.insort(self._parked, replica.id)
                left = True
        if left:
            self._active = [r for r in self._active if r._stopped_s is None and r.waker is None]

    def advance_to(self, now_s: float, finished: list[SimRequest], stop_after_finish: bool = False) -> None:
        """Advances every replica to now_s; with stop_after_finish, a replica in which a
        request finishes stops at that step's end (closed loops release the next one then)."""
        if self.spec.routing == "gateway" and self.unrouted:
            # Requests at the gateway leave as soon as a replica has room, not at the next event.
            t = self._now
            while self.unrouted and t < now_s:
                t = min(now_s, t + GATEWAY_POLL_S)
                self._advance_replicas(t, finished, stop_after_finish)
                self._dispatch(t)
                if stop_after_finish and finished:
                    return
        self._advance_replicas(now_s, finished, stop_after_finish)
        self._dispatch(now_s)
        self._now = max(self._now, now_s)

    def stop_all(self, now_s: float) -> None:
        self._wake_all()
        for replica in self.replicas:
            if replica.stopped_s is None:
                replica.stopped_s = max(now_s, replica.clock)

    def gpu_hours(self) -> float:
        self._wake_all()
        seconds = sum((r.stopped_s if r.stopped_s is not None else r.clock) - r.started_s for r in self.replicas)
        return seconds * self.spec.gpus_per_replica / 3600.0


def _replica_id(replica: Replica) -> int:
    return replica.id
