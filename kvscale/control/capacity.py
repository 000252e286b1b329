"""status.capacity and the capacity the policy acts on (issue 35, part 1, online).

Every KVSCALE_CAPACITY_INTERVAL the operator's search worker hands `measure` the service's
observed workload (the window the workload timer reads: request rate, burstiness, prompt and
output length histograms); `measure` synthesizes arrivals like it and runs the simulated sizing
search on the current plan (kvscale.sim.online). The rule that combines the two figures:

- before there is traffic (no workload read, fewer than KVSCALE_CAPACITY_MIN_REQUESTS requests
  in the window, or no fleet meeting the SLO on the replay), the sizing model's figure stands
  (source `analytic`); a figure confirmed earlier for the same configuration stays (a quiet
  window says nothing new of what a replica carries);
- once a search replayed enough requests and met the SLO, its figure (status.capacity.simulated)
  is acted on where it is above the model's figure for the same traffic, its burstiness
  included (source `simulated`); below it the model's stands (source `analytic`) and the
  policy's SLO feedback lowers it while the observed SLO is missed. The policy acts on it
  through kvscale.autoscaling.capacity.ConfirmedCapacity (the model's shape, scaled to the
  confirmed level), and so does the GPU budget's want (the policy's count).

Why only upward: replayed through the simulator on the autoscaling corpus (benchmarks/
autoscaling.py; kvscale.sim.online_refresh runs this same search causally inside the replay),
acting on the window's figure in both directions cost 30-135% more GPU-hours on bursty and
heavy-tailed traffic for at most a few tenths of a point of attainment (a window's search
sizes for the bursts inside it, which the policy's burst holding already provisions); acting
on it only upward moved GPU-hours by -16% to +6% per case against the model's figure alone,
and attainment by at most 0.7 point but for one flash crowd (1.6): benchmarks/RESULTS.md.
The same rule offline: kvscale.sim.session.policy_capacity.

Pure: the worker times the call and applies the status."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from kvscale.api.intent import Intent, serving_config
from kvscale.api.models import CapacityStatus, InferenceServiceStatus, PlanStatus
from kvscale.autoscaling.capacity import ConfirmedCapacity, SizingCapacity
from kvscale.autoscaling.observation import ObservedWorkload
from kvscale.control.scaling import ScalerMemory, configuration_key
from kvscale.control.scaling import capacity as capacity_model
from kvscale.control.status import now_rfc3339
from kvscale.sim.online import MAX_REPLAY_REQUESTS, OnlineSearch, search_capacity, synthesize
from kvscale.sizing.catalog import Catalog


@dataclass(frozen=True)
class Confirmed:
    """A confirmed capacity as the operator keeps it (its memory), for the configuration `key`
    (kvscale.control.scaling.configuration_key): the rate per replica and the traffic it was
    confirmed on."""

    key: tuple[object, ...]
    rate_per_s: float
    input_tokens: float
    output_tokens: float
    fleet_rate_per_s: float
    requests: int
    measured_at: str
    # the model's figure for that traffic itself (its burstiness too): what the confirmed rate is
    # set against (ConfirmedCapacity); None: the model's at the lengths and rate
    analytic_rate_per_s: float | None = None


@dataclass(frozen=True)
class Measured:
    status: CapacityStatus
    confirmed: Confirmed | None  # what the policy acts on from now (None: the model's figure)
    search: OnlineSearch | None  # None: nothing was replayed (no workload read)


def _round(x: float) -> float:
    return round(x, 4)


def analytic_status(model: SizingCapacity, plan: PlanStatus, message: str) -> CapacityStatus:
    """The model's figure at the plan's workload (its lengths and rate)."""
    w = plan.workload
    inp, out = (w.input_tokens, w.output_tokens) if w is not None else (512.0, 256.0)
    rate = w.requests_per_second if w is not None and w.requests_per_second > 0 else None
    figure = _round(model.rate_per_replica(inp, out, fleet_rate_per_s=rate))
    return CapacityStatus(requests_per_second_per_replica=figure, analytic=figure, source="analytic", message=message)


def raises(confirmed: Confirmed) -> bool:
    """Whether the policy acts on a confirmed figure: above the model's for the traffic it was
    confirmed on (the module's rule). A figure kept from before the reference was stored acts."""
    return confirmed.analytic_rate_per_s is None or confirmed.rate_per_s > confirmed.analytic_rate_per_s


def _status(confirmed: Confirmed, analytic: float, message: str, replicas: int | None = None) -> CapacityStatus:
    """status.capacity around a confirmed figure: acted on (source simulated) or not (the model's
    figure stands, the confirmed one beside it)."""
    acts = raises(confirmed)
    below = "" if acts else f"; below the model's {analytic:.4g} req/s for that traffic: the model's figure stands"
    return CapacityStatus(
        requests_per_second_per_replica=_round(confirmed.rate_per_s if acts else analytic),
        analytic=_round(analytic),
        source="simulated" if acts else "analytic",
        simulated=_round(confirmed.rate_per_s),
        measured_at=confirmed.measured_at,
        requests=confirmed.requests,
        replicas=replicas,
        message=message + below,
    )


def _kept(previous: Confirmed, analytic: float, why: str) -> CapacityStatus:
    return _status(previous, analytic, f"{why}; the figure confirmed at {previous.measured_at} stays")


def measure(
    intent: Intent,
    plan: PlanStatus,
    workload: ObservedWorkload | None,
    missing: str | None,
    previous: Confirmed | None,
    catalog: Catalog,
    min_requests: int,
    now: dt.datetime,
    seed: int = 0,
    max_requests: int = MAX_REPLAY_REQUESTS,
    counts: Sequence[float] | None = None,
    counts_step_s: float | None = None,
) -> Measured:
    """status.capacity after one search on `workload` (None: not read, `missing` says why), and
    the confirmed capacity the policy acts on next. `counts`: the window's requests per
    `counts_step_s` at scrape resolution (kvscale.metrics.arrivals), which the replay follows
    where read. CPU-bound (one search: kvscale.sim.online)."""
    model, _ = capacity_model(ScalerMemory(), intent, plan, catalog)
    key = configuration_key(intent, plan)
    kept = previous if previous is not None and previous.key == key else None
    if workload is None or workload.requests_per_s is None:
        why = f"observed workload not read ({missing or 'no data'})"
        status = analytic_status(model, plan, why + ": the model's figure")
        if kept is not None:
            status = _kept(kept, status.analytic, why)
        return Measured(status, kept, None)
    replay = synthesize(workload, plan.max_context_tokens, seed, max_requests, counts, counts_step_s)
    counted = counts is not None and counts_step_s is not None and sum(counts) >= 2
    observed = sum(counts) if counts is not None and counted else workload.requests_per_s * workload.window_s
    cfg = serving_config(intent, plan, catalog)
    routing = "gateway" if intent.routing.least_loaded else "service"
    found = search_capacity(
        cfg, intent.slo, plan.max_batch, model, replay, observed, routing, min_requests=min_requests
    )
    when = now_rfc3339(now)
    if found.confirmed_rate_per_s is None or not replay:
        status = (
            analytic_status(model, plan, found.reason or "nothing to replay")
            if not replay
            else CapacityStatus(
                requests_per_second_per_replica=_round(found.analytic_rate_per_s),
                analytic=_round(found.analytic_rate_per_s),
                source="analytic",
                requests=found.requests if found.replicas is not None else 0,
                measured_at=when if found.replicas is not None else None,
                message=found.reason,
            )
        )
        if kept is not None:
            status = _kept(kept, status.analytic, found.reason)
        return Measured(status, kept, found)
    confirmed = Confirmed(
        key,
        found.confirmed_rate_per_s,
        found.input_tokens,
        found.output_tokens,
        found.replay_rate_per_s,
        found.requests,
        when,
        found.analytic_rate_per_s,
    )
    return Measured(_status(confirmed, found.analytic_rate_per_s, found.reason, found.replicas), confirmed, found)


def acted_on(
    model: SizingCapacity, confirmed: Confirmed | None, intent: Intent, plan: PlanStatus
) -> SizingCapacity | ConfirmedCapacity:
    """The capacity the tick's policy acts on: the confirmed one for this configuration, the
    model's shape around it, where it raises the model's (`raises`); the model's otherwise,
    before, or when the plan or the SLO changed since."""
    if confirmed is None or confirmed.key != configuration_key(intent, plan) or not raises(confirmed):
        return model
    return ConfirmedCapacity(
        model,
        confirmed.rate_per_s,
        confirmed.input_tokens,
        confirmed.output_tokens,
        confirmed.fleet_rate_per_s,
        confirmed.analytic_rate_per_s,
    )


def with_capacity(status: InferenceServiceStatus, capacity: CapacityStatus) -> InferenceServiceStatus:
    return status.model_copy(update={"capacity": capacity})
