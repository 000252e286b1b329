"""status.holding and the burst-holding settings the scale tick runs (issue 35, part 2, online;
opt-in: KVSCALE_HOLDING=tuned, default configured).

With each capacity search (KVSCALE_CAPACITY_INTERVAL) the operator's search worker hands `tune`
the service's observed history: the requests its engines took in per KVSCALE_BURST_WINDOW over
the last KVSCALE_HOLDING_HISTORY (30 min by default, at scrape resolution: kvscale.metrics.
arrivals), with prompt and output lengths drawn from the engines' histograms of the workload
window (kvscale.sim.online.synthesize). The simulator's tuner (kvscale.autoscaling.autotune,
kvscale.sim.autotune.replayer: the same candidates, replay and choice as `simulate --policy
kvscale-tuned`) replays that history with each candidate through the deployed tick, on the
capacity the tick acts on, warm at the count the service runs, scoring what follows the first
REPLAY_WARMUP_S; the cheapest setting that met the SLO's percentile with a margin runs until
the next search (none met: the closest).

Before there is history (traffic over less than half of it, fewer than
KVSCALE_CAPACITY_MIN_REQUESTS requests, the lengths or the arrivals not read), a choice made
earlier for the same configuration stays; with none, the causal trailing rule runs (the
configured holding with a floor at 1.3x the largest recent per-minute need), as in the
simulator before its first re-tune.

CPU: the history is thinned at random to MAX_HOLDING_REQUESTS requests (each replica of a fleet
behind a Service serves a random thinning of the traffic: the replayed fleet is that share of
the service's, maxReplicas with it, and its GPU-hours are scaled back), so one tune costs at
most five replays of that many requests.

Pure: the worker times the call and applies the status and the Event."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from kvscale.api.intent import Intent, serving_config
from kvscale.api.models import HoldingCandidateStatus, HoldingStatus, InferenceServiceStatus, PlanStatus
from kvscale.autoscaling.autotune import HoldingSettings, before_history, tune
from kvscale.autoscaling.observation import ObservedWorkload
from kvscale.autoscaling.policy import Capacity, PolicyConfig
from kvscale.control.reconcile import Event
from kvscale.control.scaling import configuration_key
from kvscale.control.status import now_rfc3339
from kvscale.sim.autotune import REPLAY_WARMUP_S, replayer
from kvscale.sim.autotune import RETUNE_S as SIM_RETUNE_S
from kvscale.sim.online import synthesize
from kvscale.sim.run import SimSetup
from kvscale.sizing.catalog import Catalog

HISTORY_S = 1800.0  # KVSCALE_HOLDING_HISTORY's default (the simulator's REPLAY_S)
MAX_HOLDING_REQUESTS = 8000  # requests one candidate's replay holds at most (the CPU bound)
# A thinned replay is a smaller fleet: below this many replicas at its peak (by the capacity the
# tick acts on) the candidates differ by rounding more than by their settings, and nothing is chosen.
MIN_REPLAYED_REPLICAS = 3.0
RETUNE_S = SIM_RETUNE_S  # a replay at most this often (the simulator's); the capacity search runs between
CONFIGURED, TUNED = "configured", "tuned"


@dataclass(frozen=True)
class Held:
    """The settings the last tune chose, as the operator keeps them (its memory), for the
    configuration `key` (kvscale.control.scaling.configuration_key), and the status shown then."""

    key: tuple[object, ...]
    settings: HoldingSettings
    status: HoldingStatus
    replayed_s: float = 0.0  # when (epoch seconds) the history was last replayed

    def due(self, now: dt.datetime, key: tuple[object, ...]) -> bool:
        """Whether the next capacity search replays the history again (RETUNE_S since the last)."""
        return key != self.key or now.timestamp() - self.replayed_s >= RETUNE_S - 1.0


@dataclass(frozen=True)
class Tuned:
    status: HoldingStatus
    held: Held | None  # what the tick runs from now (None: the trailing rule before history)
    event: Event | None  # the settings changed


def running(config: PolicyConfig, mode: str, held: Held | None, key: tuple[object, ...]) -> HoldingSettings | None:
    """The holding settings the tick runs: None with KVSCALE_HOLDING=configured (the config as
    it is); tuned: the last choice for this configuration, or the trailing rule before one."""
    if mode != TUNED:
        return None
    if held is not None and held.key == key:
        return held.settings
    return before_history(config)


def holding_config(
    config: PolicyConfig, mode: str, held: Held | None, intent: Intent, plan: PlanStatus
) -> PolicyConfig:
    """The tick's policy configuration with the holding settings it runs (`running`)."""
    settings = running(config, mode, held, configuration_key(intent, plan))
    return config if settings is None else settings.apply(config)


def _settings_status(settings: HoldingSettings, source: str, message: str, **kw: object) -> HoldingStatus:
    return HoldingStatus(
        settings=settings.name,
        burst_quantile=settings.burst_quantile,
        burst_hold_seconds=settings.burst_hold_s,
        headroom=round(settings.headroom, 4),
        trailing_margin=settings.trailing_margin,
        source=source,  # type: ignore[arg-type]
        message=message,
        **kw,  # type: ignore[arg-type]
    )


def _changed(before: HoldingSettings, after: HoldingSettings, why: str) -> Event | None:
    if before == after:
        return None
    return Event("Normal", "HoldingTuned", f"Holding settings {before.name} -> {after.name}: {why}"[:1000])


def _untuned(config: PolicyConfig, kept: Held | None, ran: HoldingSettings, why: str, when: str) -> Tuned:
    """Too little history: the choice made before for this configuration stays, or the trailing rule runs."""
    if kept is not None:
        message = f"{why}; the settings chosen at {kept.status.chosen_at} stay"
        status = kept.status.model_copy(update={"source": "kept", "replayed_at": when, "message": message})
        return Tuned(status, kept, _changed(ran, kept.settings, message))
    settings = before_history(config)
    message = f"{why}: the trailing rule runs ({settings.describe()}) until there is history to replay"
    return Tuned(
        _settings_status(settings, "beforeHistory", message, replayed_at=when), None, _changed(ran, settings, message)
    )


def tune_holding(
    intent: Intent,
    plan: PlanStatus,
    catalog: Catalog,
    config: PolicyConfig,
    capacity: Capacity,
    workload: ObservedWorkload | None,
    counts: Sequence[float] | None,
    counts_step_s: float,
    replicas: int,
    previous: Held | None,
    min_requests: int,
    now: dt.datetime,
    history_s: float = HISTORY_S,
    seed: int = 0,
    max_requests: int = MAX_HOLDING_REQUESTS,
) -> Tuned:
    """status.holding after one tune on the history (`counts`: requests per `counts_step_s`,
    oldest first; None: not read), and the settings the tick runs next. `config`: the tick's
    configured policy configuration (the candidates vary it); `capacity`: what the tick acts on;
    `replicas`: the count the service runs; `history_s`: how far back `counts` go (at least half
    of it must hold traffic: 15 min of the default 30, when the simulator's tuner first chooses).
    CPU-bound: at most five replays of `max_requests`."""
    key = configuration_key(intent, plan)
    kept = previous if previous is not None and previous.key == key else None
    ran = kept.settings if kept is not None else before_history(config)  # what the tick ran (`running`)
    when = now_rfc3339(now)
    total = sum(counts) if counts is not None else 0.0
    first = next((i for i, c in enumerate(counts or ()) if c > 0), None)
    span_s = (len(counts) - first) * counts_step_s if counts is not None and first is not None else 0.0
    if counts is None or workload is None:
        return _untuned(config, kept, ran, "the service's arrivals or lengths were not read", when)
    if total < min_requests or span_s < history_s / 2:
        why = (
            f"{total:.0f} request(s) over {span_s / 60:.3g} min of history, fewer than the {min_requests} "
            f"over {history_s / 120:.3g} min a replay needs"
        )
        return _untuned(config, kept, ran, why, when)
    past = synthesize(workload, plan.max_context_tokens, seed, max_requests, counts, counts_step_s)
    if len(past) < 2:
        return _untuned(config, kept, ran, "the engines' length histograms were not read", when)
    share = min(1.0, len(past) / total) if total > max_requests else 1.0  # thinned (`from_counts`)
    inp = sum(r.input_tokens for r in past) / len(past)
    out = sum(r.output_tokens for r in past) / len(past)
    per_replica = capacity.rate_per_replica(inp, out, total / span_s)
    peak = max(counts) / counts_step_s / per_replica if per_replica > 0 else float("inf")
    if share < 1.0 and peak * share < MIN_REPLAYED_REPLICAS:
        why = (
            f"the history ({total:.0f} requests) is thinned to {len(past)} to bound the CPU: its peak would need "
            f"{peak * share:.1f} of the {peak:.1f} replicas it needs, too few to tell the settings apart"
        )
        return _untuned(config, kept, ran, why, when)
    routing = "gateway" if intent.routing.least_loaded else "service"
    setup = SimSetup(
        serving_config(intent, plan, catalog),
        intent.slo,
        plan.max_batch,
        config.cold_start_s,
        max(1, round(max(1, replicas) * share)),
        tick_s=config.tick_s,
        window_s=config.rate_window_s,
        routing=routing,
    )
    warmup_s = min(REPLAY_WARMUP_S, span_s / 2)
    choice = tune(config, replayer(setup, past, capacity, warmup_s, share=share), intent.slo.percentile / 100)
    chosen_at = kept.status.chosen_at if kept is not None and kept.settings == choice.settings else when
    trials = [
        HoldingCandidateStatus(
            name=t.settings.name,
            settings=t.settings.describe(),
            attainment=round(t.attainment, 4),
            gpu_hours=round(t.gpu_hours, 3),
        )
        for t in choice.trials
    ]
    message = (
        f"{choice.reason}; replayed the last {span_s / 60:.3g} min ({total:.0f} requests, {len(past)} replayed, "
        f"the first {warmup_s / 60:.3g} min unscored)"
    )
    status = _settings_status(
        choice.settings,
        "tuned",
        message,
        chosen_at=chosen_at,
        replayed_at=when,
        requests=round(total),
        replayed_requests=len(past),
        history_seconds=span_s,
        candidates=trials,
    )
    held = Held(key, choice.settings, status, now.timestamp())
    return Tuned(status, held, _changed(ran, choice.settings, message))


def with_holding(status: InferenceServiceStatus, holding: HoldingStatus | None) -> InferenceServiceStatus:
    return status.model_copy(update={"holding": holding})
