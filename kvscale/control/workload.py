"""The observed workload in status, and a re-plan when it drifts from the planned one (pure).

Every workload tick (KVSCALE_WORKLOAD_INTERVAL) the handler reads what the engines saw over
KVSCALE_WORKLOAD_WINDOW (kvscale.metrics.observe.observe_workload_batched: one query per key
for every service); `workload_tick` shows it in status.observedWorkload and compares it
with the workload the plan was made for (status.plan.workload: spec.workload at first). When the mean prompt or output length, or
the prompt's p90 where the plan had a distribution, or the arrivals' burstiness (the index of
dispersion of the requests arriving per KVSCALE_BURST_WINDOW), stays KVSCALE_REPLAN_DRIFT
times away from the planned value (either way) for KVSCALE_REPLAN_AFTER, the service is
re-planned for the observed workload (GPU type, tensor parallelism, chunk budget, batch
limit) with an Event that says why. Hysteresis: drift starts at the factor and ends only
once every measure is back within its square root, and a window with fewer than
MIN_REQUESTS finished requests judges nothing. The burstiness is an estimate from a few
dozen windows: it counts as drift only beyond NOISE_Z of its standard errors (half that to
stay drifting), as a ratio, and an unread one is neither drift nor Poisson (a re-plan keeps the planned
burstiness). The hold lasts at least one window, so a re-plan reads
a window of the new traffic only. The request rate alone is no reason to re-plan: the
autoscaler follows it with replicas. spec.workload stays the starting point: a spec change
plans from it again.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvscale.api.intent import SpecError, parse_intent
from kvscale.api.models import (
    BurstinessStatus,
    InferenceServiceStatus,
    ObservedWorkloadStatus,
    PlannedWorkloadStatus,
    TokenLengthsStatus,
)
from kvscale.autoscaling.observation import LengthHistogram, ObservedWorkload, dispersion_noise
from kvscale.control.reconcile import Event, Observed, Resource, Result, reconcile
from kvscale.control.settings import Settings
from kvscale.control.status import burstiness_status, now_rfc3339, planned_workload
from kvscale.sizing.catalog import Catalog
from kvscale.sizing.workload import Burstiness, LengthDistribution, Workload

MIN_REQUESTS = 30.0  # finished requests in the window before its lengths say anything
TAIL = 0.9  # the prompt quantile compared besides the means
NOISE_Z = 3.0  # standard errors an estimated measure must move before it drifts (half that to stay drifted)


def _round(value: float | None, digits: int = 3) -> float | None:
    """`digits` significant digits: status moves only when a value does, not its noise."""
    if value is None or not math.isfinite(value) or value == 0:
        return value
    return round(value, max(0, digits - 1 - math.floor(math.log10(abs(value)))))


def _lengths(mean: float | None, hist: LengthHistogram | None) -> TokenLengthsStatus | None:
    if mean is None and hist is None:
        return None

    def q(p: float) -> float | None:
        return _round(hist.quantile(p)) if hist is not None else None

    return TokenLengthsStatus(mean=_round(mean), p50=q(0.5), p90=q(0.9), p99=q(0.99))


def _window(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return f"{seconds / 60:g}m" if seconds % 60 == 0 else f"{seconds:g}s"


def observed_status(
    w: ObservedWorkload, drift: str | None, since: dt.datetime | None, message: str | None
) -> ObservedWorkloadStatus:
    return ObservedWorkloadStatus(
        observed_at=now_rfc3339(dt.datetime.fromtimestamp(w.time_s, dt.UTC)),
        window=_window(w.window_s),
        requests_per_second=_round(w.requests_per_s),
        input_tokens=_lengths(w.input_tokens_mean, w.prompt_lengths),
        output_tokens=_lengths(w.output_tokens_mean, w.output_lengths),
        prefill_tokens_per_second=_round(w.prefill_tokens_per_s),
        decode_tokens_per_second=_round(w.decode_tokens_per_s),
        prefix_cache_hit_ratio=_round(w.prefix_cache_hit_ratio),
        peak_window=_window(w.peak_window_s),
        peak_requests_per_second_last_hour=_round(w.peak_requests_per_s_1h),
        peak_requests_per_second_last_day=_round(w.peak_requests_per_s_1d),
        peak_prefill_tokens_per_second_last_hour=_round(w.peak_prefill_tokens_per_s_1h),
        peak_prefill_tokens_per_second_last_day=_round(w.peak_prefill_tokens_per_s_1d),
        burstiness=_burstiness_status(w.burstiness),
        drift=drift,
        drifting_since=now_rfc3339(since) if since is not None else None,
        message=message,
    )


def _burstiness_status(burstiness: Burstiness | None) -> BurstinessStatus | None:
    shown = burstiness_status(burstiness)
    if shown is None:
        return None
    return shown.model_copy(update={"index_of_dispersion": _round(shown.index_of_dispersion, 2)})


def _distribution(hist: LengthHistogram | None, mean: float) -> LengthDistribution:
    """Lengths from the histogram's buckets, rescaled so the mean is the exact one (the
    histogram places each request at its bucket's middle); constant at the mean without one."""
    if hist is None:
        return LengthDistribution.constant(max(1, round(mean)))
    try:
        dist = LengthDistribution.from_histogram(hist.upper_bounds, hist.counts)
    except ValueError:
        return LengthDistribution.constant(max(1, round(mean)))
    return dist.scaled(mean / dist.mean)


def as_workload(w: ObservedWorkload, base: Workload, planned_burstiness: Burstiness | None = None) -> Workload | None:
    """The observed workload as the planner takes it (lengths as distributions, the request
    rate, the arrivals' burstiness, the prefix-cache hit share), within the spec's context
    limit; None without the means and the rate. Without a burstiness reading, the one planned
    for stays (an unread measure is not Poisson)."""
    if w.requests_per_s is None or w.input_tokens_mean is None or w.output_tokens_mean is None:
        return None
    hits = min(0.99, max(0.0, w.prefix_cache_hit_ratio or 0.0))
    try:
        return Workload.of(
            _distribution(w.prompt_lengths, w.input_tokens_mean),
            _distribution(w.output_lengths, w.output_tokens_mean),
            w.requests_per_s,
            base.max_context_tokens,
            burstiness=w.burstiness or planned_burstiness,
            prefix_cache_hit_share=hits,
        )
    except ValueError:
        return None


@dataclass(frozen=True)
class DriftCheck:
    drift: str | None  # the measures away from the plan's, said; None: within bounds
    since: dt.datetime | None  # since when (None: not drifting)
    replan: bool  # drifted long enough: re-plan now


@dataclass(frozen=True)
class Measure:
    """One thing the drift check compares: what was seen, what the plan was made for."""

    name: str
    seen: float
    planned: float
    unit: str = " tokens"
    noise: float = 0.0  # relative standard error of `seen` as an estimate of the planned value

    @property
    def ratio(self) -> float:
        return max(self.seen, 1.0) / max(self.planned, 1.0)

    def off(self, factor: float, z: float) -> bool:
        """At least `factor` away, either way, and beyond `z` standard errors of the estimate
        (a band in ratio, 1 + z x noise either way: a dispersion estimate is skewed, its low
        readings as rare as its high ones only in ratio)."""
        return max(self.ratio, 1 / self.ratio) >= max(factor, 1.0 + z * self.noise)

    def said(self) -> str:
        return f"{self.name} {self.seen:.{0 if self.unit else 1}f}{self.unit} vs {self.planned:.{0 if self.unit else 1}f} planned ({self.ratio:.2g}x)"


def _measures(planned: Workload, w: ObservedWorkload) -> list[Measure]:
    out = []
    if w.input_tokens_mean is not None:
        out.append(Measure("mean prompt", w.input_tokens_mean, float(planned.input_tokens)))
    if w.output_tokens_mean is not None:
        out.append(Measure("mean output", w.output_tokens_mean, float(planned.output_tokens)))
    if w.prompt_lengths is not None and w.input_tokens_mean is not None and not planned.inputs.is_constant:
        # The tail as the planner would take it (the same estimate on both sides: the
        # histogram's interpolated quantile reads far from a distribution placed at mid-buckets).
        seen = _distribution(w.prompt_lengths, w.input_tokens_mean).quantile(TAIL)
        out.append(Measure(f"prompt p{TAIL * 100:.0f}", float(seen), float(planned.inputs.quantile(TAIL))))
    burst = w.burstiness
    if burst is not None:
        # Over the observed windows: the planned burstiness as it reads at that window length.
        want = planned.arrivals.dispersion_at(burst.window_s)
        name = f"burstiness (index of dispersion over {burst.window_s:g}s)"
        out.append(Measure(name, burst.index_of_dispersion, want, "", dispersion_noise(w.burst_windows)))
        if burst.burst_requests > 0.0 and planned.arrivals.burst_requests > 0.0:
            # The burst a request finds, in requests (a batch shorter than either window reads
            # the same over both): batches that grew or shrank, which the dispersion may not
            # show when fewer of them come. A size-biased mean over the bursts the window
            # held: an error of about sqrt(2 / bursts) (twice a plain mean's variance).
            bursts = burst.burst_share * (w.requests_per_s or 0.0) * w.window_s / burst.burst_requests
            noise = math.sqrt(2.0 / bursts) if bursts > 0.0 else math.inf
            size = Measure("burst size", burst.burst_requests, planned.arrivals.burst_requests, " requests", noise)
            out.append(size)
    return out


def check_drift(
    planned: Workload, w: ObservedWorkload, since: dt.datetime | None, now: dt.datetime, factor: float, hold_s: float
) -> DriftCheck:
    """Whether the observed workload has drifted from the planned one, since when, and whether
    long enough to re-plan (hysteresis: starts at `factor` and NOISE_Z standard errors, ends
    within its square root or half those errors)."""
    if (w.requests_per_s or 0.0) * w.window_s < MIN_REQUESTS:
        return DriftCheck(None, None, False)
    threshold, z = (factor, NOISE_Z) if since is None else (math.sqrt(factor), NOISE_Z / 2)
    off = [m for m in _measures(planned, w) if m.off(threshold, z)]
    if not off:
        return DriftCheck(None, None, False)
    since = since or now
    said = "; ".join(m.said() for m in off)
    return DriftCheck(said, since, (now - since).total_seconds() >= hold_s)


def _since(status: InferenceServiceStatus) -> dt.datetime | None:
    text = status.observed_workload.drifting_since if status.observed_workload is not None else None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def predates(
    replanned: tuple[int | None, PlannedWorkloadStatus | None] | None,
    status: InferenceServiceStatus,
    generation: int | None,
) -> bool:
    """Whether `status` is older than the re-plan this operator last wrote for the same spec
    generation (`replanned`: that generation and the planned-for workload it recorded): a
    timer may be handed the object before the watch delivers its own write, and must neither
    re-plan again nor write back the drift the re-plan settled."""
    if replanned is None or replanned[0] != generation:
        return False
    return (status.plan.workload if status.plan is not None else None) != replanned[1]


def workload_tick(
    spec: Mapping[str, Any],
    res: Resource,
    status: InferenceServiceStatus,
    cluster: Callable[[], Observed],
    w: ObservedWorkload | None,
    missing: str | None,
    catalog: Catalog,
    settings: Settings,
    now: dt.datetime,
) -> Result | None:
    """status.observedWorkload, and a re-plan when the workload drifted long enough; None
    before a plan or with a spec that cannot be read (spec handling says why). `cluster` is
    asked only for a re-plan (it may read the API server)."""
    if status.plan is None or status.phase in (None, "Failed", "Pending"):
        return None
    try:
        intent = parse_intent(spec)
    except SpecError:
        return None
    if w is None:  # unread: keep what was observed, say why; the drift clock does not move
        kept = status.observed_workload or ObservedWorkloadStatus()
        return Result(status.model_copy(update={"observed_workload": kept.model_copy(update={"message": missing})}))
    recorded = status.plan.workload
    planned = planned_workload(recorded, intent.workload.max_context_tokens) if recorded else None
    planned = planned or intent.workload
    factor = settings.replan_drift
    # The hold covers at least one window: a re-plan reads a window of the new traffic only,
    # not one mixed with the old (which would drift again once the window fills).
    hold_s = max(settings.replan_after_s, w.window_s)
    check = (
        check_drift(planned, w, _since(status), now, factor, hold_s)
        if factor is not None
        else DriftCheck(None, None, False)
    )
    shown = status.model_copy(update={"observed_workload": observed_status(w, check.drift, check.since, missing)})
    if not check.replan:
        return Result(shown)
    workload = as_workload(w, intent.workload, planned.burstiness)
    if workload is None:
        return Result(shown)
    held = f"{hold_s:.0f}s"
    settled = shown.model_copy(update={"observed_workload": observed_status(w, None, None, missing)})
    result = reconcile(spec, res, settled, cluster(), catalog, settings, now=now, traffic=workload)
    if result.retry is not None:
        # No plan for the observed workload: the current plan stays; try again after another hold.
        why = result.retry.message
        again = shown.model_copy(update={"observed_workload": observed_status(w, check.drift, now, missing)})
        message = f"the workload drifted for {held} ({check.drift}) but re-planning for it failed: {why}"
        return Result(again, events=(Event("Warning", "ReplanFailed", message[:1000]),))
    before, after = status.plan, result.status.plan
    if after is None:  # reconcile records a plan whenever it succeeds
        return result
    change = (
        f"{before.gpu_type} TP{before.tensor_parallel} batch {before.max_batch} budget {before.max_num_batched_tokens}"
        f" -> {after.gpu_type} TP{after.tensor_parallel} batch {after.max_batch} budget {after.max_num_batched_tokens}"
    )
    same = (before.gpu_type, before.tensor_parallel, before.max_batch, before.max_num_batched_tokens) == (
        after.gpu_type,
        after.tensor_parallel,
        after.max_batch,
        after.max_num_batched_tokens,
    )
    message = f"Re-planned for the observed workload (drifted for {held}: {check.drift}): " + (
        f"configuration unchanged ({change.split(' -> ')[0]})" if same else change
    )
    events = (Event("Normal", "Replanned", message[:1000]), *(e for e in result.events if e.reason != "Planned"))
    return replace(result, events=events)
