"""The holding tuner in the simulator (issue 35, part 2): kvscale's policy whose burst
settings are re-chosen every `retune_s` by replaying the arrivals before that moment
(kvscale.autoscaling.autotune), never any after. `kvscale simulate --policy kvscale-tuned`.

Each re-tune replays at most the last `replay_s` of arrivals through the same simulator and
the deployed tick (KvscalePolicy), starting warm at the count the policy ran then, and scores
the part after `replay_warmup_s` (the replayed policy learns the load first). Its CPU is
bounded: candidates x replay_s of simulated time per re-tune.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace

from kvscale.autoscaling.autotune import Choice, HoldingSettings, Replay, before_history, candidates, tune
from kvscale.autoscaling.observation import Decision, Observation
from kvscale.autoscaling.policy import Capacity, PolicyConfig
from kvscale.sim.engine import StepTimes
from kvscale.sim.policies import KvscalePolicy
from kvscale.sim.report import attainment_from, gpu_hours_from
from kvscale.sim.run import SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest

RETUNE_S = 900.0  # every 15 simulated minutes
REPLAY_S = 1800.0  # the past replayed at each re-tune
REPLAY_WARMUP_S = 600.0  # of it, what the replayed policy learns on (not scored)


@dataclass
class TunedKvscalePolicy(KvscalePolicy):
    """KvscalePolicy with its holding settings tuned causally on the arrivals before now.
    `trace`: the whole arrival list; at time t only requests that arrived before t are read."""

    setup: SimSetup | None = None
    trace: list[TraceRequest] = field(default_factory=list)
    retune_s: float = RETUNE_S
    replay_s: float = REPLAY_S
    replay_warmup_s: float = REPLAY_WARMUP_S
    name: str = "kvscale-tuned"
    base: PolicyConfig | None = None  # the configured settings the candidates vary
    choice: Choice | None = None
    choices: list[tuple[float, Choice]] = field(default_factory=list)  # (time, choice), each re-tune
    _next_tune_s: float = field(default=0.0, init=False)
    _ran: list[tuple[float, int]] = field(default_factory=list, init=False)  # (time, replicas) decided
    _steps: StepTimes | None = field(default=None, init=False)
    _times: list[float] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.base is None:
            self.base = self.config
        settings = before_history(self.base)
        self.choice = Choice(settings, f"{settings.describe()}: no history to replay yet")
        self.config = settings.apply(self.base)
        self._next_tune_s = self.retune_s
        self._times = [r.arrival_s for r in self.trace]

    def decide(self, obs: Observation) -> Decision:
        if obs.time_s >= self._next_tune_s:
            self._retune(obs.time_s)
            self._next_tune_s = obs.time_s + self.retune_s
        decision = super().decide(obs)
        self._ran.append((obs.time_s, decision.replicas))
        assert self.choice is not None
        return replace(decision, reason=f"{decision.reason} [holding {self.choice.reason}]")

    def _ran_at(self, time_s: float) -> int:
        count = self.setup.initial_replicas if self.setup is not None else 1
        for when, replicas in self._ran:
            if when > time_s:
                break
            count = replicas
        return count

    def _retune(self, now_s: float) -> None:
        assert self.base is not None and self.setup is not None
        start_s = max(0.0, now_s - self.replay_s)
        if now_s - start_s < self.retune_s - 1e-9:
            return  # too little past to score: the trailing rule keeps running
        first = bisect.bisect_left(self._times, start_s)
        last = bisect.bisect_left(self._times, now_s)  # arrivals strictly before now
        past = [replace(r, arrival_s=r.arrival_s - start_s) for r in self.trace[first:last]]
        if len(past) < 50:
            return
        setup = replace(self.setup, initial_replicas=max(1, self._ran_at(start_s)))
        if self._steps is None:
            self._steps = StepTimes(setup.cfg)
        goal = setup.slo.percentile / 100
        warmup_s = min(self.replay_warmup_s, (now_s - start_s) / 2)
        replay = replayer(setup, past, self.capacity, warmup_s, self._steps)
        self.choice = tune(self.base, replay, goal, tried=candidates(self.base))
        self.choices.append((now_s, self.choice))
        self.config = self.choice.settings.apply(self.base)


def replayer(
    setup: SimSetup,
    past: list[TraceRequest],
    capacity: Capacity,
    warmup_s: float,
    steps: StepTimes | None = None,
    share: float = 1.0,
) -> Replay:
    """The tuner's replay (kvscale.autoscaling.autotune.Replay) of `past` (arrival times from
    0): a setting's config -> (attainment, GPU-hours) of the deployed tick (KvscalePolicy) on
    it through the simulator, scored after `warmup_s`. `share`: the part of the traffic `past`
    kept (the operator's replay is thinned at random to bound its CPU,
    kvscale.control.holding): the fleet is that share of the service's (maxReplicas with it),
    and its GPU-hours are scaled back to the whole."""
    steps = steps if steps is not None else StepTimes(setup.cfg)

    def replay(config: PolicyConfig) -> tuple[float, float]:
        if share < 1.0:
            most = max(config.min_replicas, 1, math.ceil(config.max_replicas * share))
            config = replace(config, max_replicas=most)
        result = simulate(setup, Source(past), KvscalePolicy(capacity, config), steps=steps)
        return (
            attainment_from(result, setup.slo, warmup_s),
            gpu_hours_from(result, setup.cfg.gpus, warmup_s) / share,
        )

    return replay


def settings_run(policy: TunedKvscalePolicy) -> list[tuple[float, HoldingSettings]]:
    """Which settings ran from when (the report's line)."""
    return [(t, c.settings) for t, c in policy.choices]
