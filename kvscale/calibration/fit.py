"""The engine profile's step-time fields fitted to what one serving configuration's engines
measured: pure (numbers in, numbers out; the Prometheus reads live in kvscale.metrics.calibration).

Three physical parameters of `EngineProfile` (kvscale/sizing/catalog/loader.py), those that
differ most between engines and versions and that the engines' own metrics can tell apart:

- matmul_efficiency_factor: the share of the GPU's GEMM efficiency the engine's steps reach.
  Prefill is compute-bound, so the time from a request's scheduling to its first token
  (vllm:request_prefill_time_seconds) carries it; decode at large batches too.
- sequence_overhead_s: the engine's CPU cost per running sequence per step. The slope of the
  inter-token gap (vllm:inter_token_latency_seconds) against the running batch.
- step_overhead_s: the fixed cost of a step (scheduler, sampling launch). The gap's intercept.
  The per-layer overheads stay at the catalog's: with one model the layer count is fixed, so a
  per-layer and a per-step cost cannot be told apart, and the per-step one is kept.

Each window is one engine over a stretch of time (kvscale.metrics.calibration reads them): the
mean running batch and context, the mean inter-token gap and prefill time, and the number of
engine steps. The model is the planner's own step time (kvscale.sizing.roofline.step), so a
calibrated profile predicts what was measured with the same code that plans. Least squares on
relative errors (Levenberg-Marquardt, numeric Jacobian: three parameters, tens of windows);
each field's uncertainty is its standard error from the fit's covariance, s^2 (J^T J)^-1.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from kvscale.sizing.config import ServingConfig
from kvscale.sizing.roofline import step

FIELDS = ("matmul_efficiency_factor", "sequence_overhead_s", "step_overhead_s")
# Each field in units near its size, so the Jacobian's columns are alike (1, 100 us, 1 ms).
_SCALE = {"matmul_efficiency_factor": 1.0, "sequence_overhead_s": 1.0e-4, "step_overhead_s": 1.0e-3}
_BOUNDS = {
    "matmul_efficiency_factor": (0.02, 1.0),  # EngineProfile: a factor in (0, 1]
    "sequence_overhead_s": (0.0, 0.05),
    "step_overhead_s": (0.0, 0.5),
}

# Least data a fit is made on; below it, NotEnoughData says what is missing.
MIN_GAPS_PER_WINDOW = 50  # inter-token gaps in a window for its mean to count
MIN_PREFILLS_PER_WINDOW = 3  # timed prefills in a window for their mean to count
MIN_DECODE_WINDOWS = 5
MIN_PREFILL_WINDOWS = 3
MIN_BATCH_SPREAD = 1.5  # largest over smallest mean batch: the per-sequence cost needs a slope
ROBUST_SCALE = 0.05  # relative errors beyond 5% count linearly, not squared


class NotEnoughData(ValueError):
    """Too little (or too uniform) data to fit; the message names the metric and what it needs."""


@dataclass(frozen=True)
class Window:
    """What one engine did over one stretch of time, from its metrics."""

    batch: float  # mean running sequences per engine step
    context_tokens: float  # mean KV tokens held per running sequence
    gaps: float  # inter-token gaps observed
    gap_s: float  # their mean (NaN when none)
    prefills: float  # requests whose prefill was timed
    prefill_s: float  # mean time from scheduling to first token (NaN when none)
    prompt_tokens: float  # mean prompt of those requests
    steps: float | None = None  # engine steps (vllm:iteration_tokens_total's count); None: not exported
    label: str = ""  # where it comes from (pod and time), for messages

    @property
    def sane(self) -> bool:
        """Every count and mean finite and not negative (gap_s and prefill_s may be NaN: none
        measured). A scrape across a counter reset or a gauge exported as NaN gives such a
        window; fitted, it wrote NaN into status and pulled the context to a bound."""
        counts = (self.batch, self.context_tokens, self.gaps, self.prefills, self.prompt_tokens)
        if not all(math.isfinite(v) and v >= 0 for v in counts):
            return False
        return self.steps is None or (math.isfinite(self.steps) and self.steps >= 0)

    @property
    def decode_usable(self) -> bool:
        return (
            self.sane
            and self.gaps >= MIN_GAPS_PER_WINDOW
            and self.batch > 0
            and math.isfinite(self.gap_s)
            and self.gap_s > 0
        )

    @property
    def prefill_usable(self) -> bool:
        return (
            self.sane
            and self.prefills >= MIN_PREFILLS_PER_WINDOW
            and self.prompt_tokens >= 1
            and math.isfinite(self.prefill_s)
            and self.prefill_s > 0
        )


@dataclass(frozen=True)
class FittedField:
    name: str
    value: float
    stderr: float  # one standard error, in the field's unit
    prior: float  # the catalog's value the fit started from
    samples: int  # measurements behind it (token gaps or timed prefills)
    windows: int
    data: str  # which metric carries it
    at_bound: bool = False  # the fit ended on the field's limit (its error is then a lower bound)

    @property
    def relative_stderr(self) -> float:
        return self.stderr / self.value if self.value > 0 else math.inf


@dataclass(frozen=True)
class Calibration:
    key: str  # the configuration fitted (config_key)
    engine: str  # the catalog's engine profile the fields belong to
    fields: tuple[FittedField, ...]
    decode_windows: int
    prefill_windows: int
    rms_error: float  # relative, calibrated profile against the windows
    prior_rms_error: float  # the catalog's profile against the same windows

    def updates(self) -> dict[str, float]:
        return {f.name: f.value for f in self.fields}

    def field(self, name: str) -> FittedField:
        return next(f for f in self.fields if f.name == name)

    def overlay(self) -> dict[str, object]:
        """A catalog overlay (`kvscale plan --catalog`): the engine profile's fitted fields."""
        said = ", ".join(f"{f.name} {f.value:.4g} ± {f.stderr:.2g} ({f.samples} samples)" for f in self.fields)
        note = (
            f"kvscale calibrate on {self.key}: {said}; {self.decode_windows} decode and "
            f"{self.prefill_windows} prefill windows, rms error {self.rms_error:.1%} (catalog {self.prior_rms_error:.1%})"
        )
        return {"engines": {self.engine: {**{f.name: float(f"{f.value:.6g}") for f in self.fields}, "fitted": note}}}


def config_key(cfg: ServingConfig) -> str:
    """What a calibrated profile is for: model, GPU type, parallelism, precision, engine and its
    image (the engine's version)."""
    parallel = f"tp{cfg.tensor_parallel}" + ("-ep" if cfg.expert_parallel else "")
    if cfg.data_parallel > 1:
        parallel += f"-dp{cfg.data_parallel}"
    engine = cfg.engine.name + (f"@{cfg.engine.image}" if cfg.engine.image else "")
    return f"{cfg.model.name}/{cfg.gpu.name}/{parallel}/{cfg.precision.name}/{engine}"


def with_fields(cfg: ServingConfig, values: dict[str, float]) -> ServingConfig:
    """The configuration with these engine-profile fields."""
    return replace(cfg, engine=cfg.engine.model_copy(update=values))


# -- the model of each window's measurements --------------------------------------------------


def prompts_per_step(w: Window) -> float:
    """Prompts a prefill step carries: the request's own and those that arrived during the step
    before it (the scheduler admits every waiting prompt the budget holds at once). With
    Poisson arrivals at rate r and steps of length t, 1 + r t; r t is the share of steps that
    see a new request, prefills over steps (a ratio of counts: no clock in it)."""
    if not w.steps or w.prefills <= 0:
        return 1.0
    return 1.0 + min(w.prefills / w.steps, 4.0)


def _chunks(cfg: ServingConfig, w: Window) -> int:
    """Steps a prefill step's prompts take: the token budget less the running decodes per step."""
    room = max(1.0, cfg.max_num_batched_tokens - w.batch)
    return max(1, math.ceil(prompts_per_step(w) * w.prompt_tokens / room))


def prefill_step_s(cfg: ServingConfig, w: Window) -> float:
    """One step that carries a chunk of the prompts admitted together, beside the running decodes."""
    prompts = prompts_per_step(w)
    chunk = prompts * w.prompt_tokens / _chunks(cfg, w)
    return step(cfg, w.batch, w.context_tokens, chunk, w.prompt_tokens / 2.0, prompts).seconds


def intake_s(cfg: ServingConfig, w: Window) -> float:
    """The engine profile's per-request intake (request_overhead_s) for the prompts admitted
    together: kvscale's model charges it in series with the steps that admit them (as the
    simulator's engine and the load model do), so the fit must too, or it reads the intake as
    a slower GEMM."""
    return cfg.engine.request_overhead_s * prompts_per_step(w)


def predicted_prefill_s(cfg: ServingConfig, w: Window) -> float:
    """vLLM's prefill time is first token less scheduled (vllm/v1/metrics/stats.py
    update_from_finished_request): the steps that carry the chunks of the prompts admitted with
    it, and their intake."""
    return _chunks(cfg, w) * prefill_step_s(cfg, w) + intake_s(cfg, w)


def mixed_share(cfg: ServingConfig, w: Window) -> float:
    """Share of the window's steps that also carried prompt chunks (their gaps are longer)."""
    if not w.steps or w.prefills <= 0:
        return 0.0
    return min(1.0, w.prefills / prompts_per_step(w) * _chunks(cfg, w) / w.steps)


def predicted_gap_s(cfg: ServingConfig, w: Window) -> float:
    """The mean inter-token gap: decode steps, and the steps that carried a chunk. A step of n
    sequences makes n gaps, so the mean gap weighs each step by its batch: the batch a token
    sees is E[n^2]/E[n] = mean + variance/mean, one more than the mean where the running count
    is Poisson (requests that arrive at random and stay a while: an M/G/infinity occupancy)."""
    decode = step(cfg, w.batch + 1.0, w.context_tokens).seconds
    share = mixed_share(cfg, w)
    if share == 0.0:
        return decode
    # the admission's intake lengthens the steps that carry its chunks (spread over them)
    mixed = prefill_step_s(cfg, w) + intake_s(cfg, w) / _chunks(cfg, w)
    return (1.0 - share) * decode + share * mixed


def relative_errors(cfg: ServingConfig, windows: Sequence[Window]) -> tuple[list[float], list[float]]:
    """(gap, prefill) errors of `cfg`'s predictions, relative to what was measured, per usable window."""
    gaps = [predicted_gap_s(cfg, w) / w.gap_s - 1.0 for w in windows if w.decode_usable]
    prefills = [predicted_prefill_s(cfg, w) / w.prefill_s - 1.0 for w in windows if w.prefill_usable]
    return gaps, prefills


# -- checks ----------------------------------------------------------------------------------


def check_enough(windows: Sequence[Window], gap_metric: str, prefill_metric: str, batch_metric: str) -> None:
    """NotEnoughData naming what is missing, unless the windows can carry a fit."""
    decode = [w for w in windows if w.decode_usable]
    prefill = [w for w in windows if w.prefill_usable]
    problems: list[str] = []
    if len(decode) < MIN_DECODE_WINDOWS:
        problems.append(
            f"{gap_metric}: {len(decode)} window(s) with >= {MIN_GAPS_PER_WINDOW} token gaps, "
            f"need {MIN_DECODE_WINDOWS} (more traffic, or a longer --since)"
        )
    if len(prefill) < MIN_PREFILL_WINDOWS:
        problems.append(
            f"{prefill_metric}: {len(prefill)} window(s) with >= {MIN_PREFILLS_PER_WINDOW} finished requests, "
            f"need {MIN_PREFILL_WINDOWS}"
        )
    if len(decode) >= MIN_DECODE_WINDOWS:
        low, high = min(w.batch for w in decode), max(w.batch for w in decode)
        if high < MIN_BATCH_SPREAD * low:
            problems.append(
                f"{batch_metric}: the running batch stayed between {low:.1f} and {high:.1f}; the per-sequence "
                f"cost needs batches at least {MIN_BATCH_SPREAD:g}x apart (traffic at different rates)"
            )
    if problems:
        raise NotEnoughData("too little data to calibrate: " + "; ".join(problems))


# -- least squares ---------------------------------------------------------------------------


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """a x = b by Gaussian elimination with partial pivoting; ValueError when singular."""
    n = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            raise ValueError("singular")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                k = m[r][col] / m[col][col]
                m[r] = [x - k * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def _inverse(a: list[list[float]]) -> list[list[float]]:
    n = len(a)
    columns = [_solve(a, [1.0 if i == j else 0.0 for i in range(n)]) for j in range(n)]
    return [[columns[j][i] for j in range(n)] for i in range(n)]


def _clip(name: str, value: float) -> float:
    low, high = _BOUNDS[name]
    return min(max(value, low), high)


Residuals = Callable[[list[float]], list[float]]


def _jacobian(residuals: Residuals, x: list[float], r0: list[float]) -> list[list[float]]:
    """d residual / d x by central differences (forward at a bound)."""
    columns: list[list[float]] = []
    for i, name in enumerate(FIELDS):
        h = 1e-3 * max(1.0, abs(x[i]))
        low, high = (b / _SCALE[name] for b in _BOUNDS[name])
        up, down = min(x[i] + h, high), max(x[i] - h, low)
        xu, xd = list(x), list(x)
        xu[i], xd[i] = up, down
        ru = residuals(xu)
        rd = residuals(xd) if down < x[i] else r0
        columns.append([(u - d) / (up - (down if down < x[i] else x[i])) for u, d in zip(ru, rd, strict=True)])
    return [[columns[j][k] for j in range(len(FIELDS))] for k in range(len(r0))]


def _least_squares(residuals: Residuals, x0: list[float], iterations: int = 60) -> tuple[list[float], list[float]]:
    """Levenberg-Marquardt from x0 (scaled units); the minimum and its residuals."""
    x, r = list(x0), residuals(x0)
    cost, damping = sum(v * v for v in r), 1e-3
    for _ in range(iterations):
        jac = _jacobian(residuals, x, r)
        jtj = [[sum(row[i] * row[j] for row in jac) for j in range(len(x))] for i in range(len(x))]
        jtr = [sum(row[i] * v for row, v in zip(jac, r, strict=True)) for i in range(len(x))]
        improved = False
        while damping < 1e10:
            a = [
                [jtj[i][j] + (damping * (jtj[i][i] or 1.0) if i == j else 0.0) for j in range(len(x))]
                for i in range(len(x))
            ]
            try:
                delta = _solve(a, [-v for v in jtr])
            except ValueError:
                damping *= 10
                continue
            trial = [_clip(n, (xi + d) * _SCALE[n]) / _SCALE[n] for n, xi, d in zip(FIELDS, x, delta, strict=True)]
            r_trial = residuals(trial)
            trial_cost = sum(v * v for v in r_trial)
            if trial_cost < cost:
                done = cost - trial_cost < 1e-12 * max(cost, 1e-30)
                x, r, cost, damping, improved = trial, r_trial, trial_cost, max(damping / 10, 1e-9), True
                if done:
                    return x, r
                break
            damping *= 10
        if not improved:
            break
    return x, r


def fit(
    cfg: ServingConfig,
    windows: Sequence[Window],
    metrics: dict[str, str] | None = None,
    start: Mapping[str, float] | None = None,
) -> Calibration:
    """The step-time fields that make `cfg`'s step times match the windows; NotEnoughData when
    the windows cannot carry a fit. `metrics` names the metrics read, for the messages;
    `start`: where the search starts (the stored profile: a refit of the same engines then
    converges in a few steps), the catalog's values staying the prior it reports against."""
    names = {
        "gap": "vllm:inter_token_latency_seconds",
        "prefill": "vllm:request_prefill_time_seconds",
        "batch": "vllm:num_requests_running",
        **(metrics or {}),
    }
    check_enough(windows, names["gap"], names["prefill"], names["batch"])
    decode = [w for w in windows if w.decode_usable]
    prefill = [w for w in windows if w.prefill_usable]
    usable = [w for w in windows if w.decode_usable or w.prefill_usable]
    prior = {n: float(getattr(cfg.engine, n)) for n in FIELDS}

    def residuals(x: list[float]) -> list[float]:
        trial = with_fields(cfg, {n: xi * _SCALE[n] for n, xi in zip(FIELDS, x, strict=True)})
        gaps, prefills = relative_errors(trial, usable)
        return [_robust(e) for e in (*gaps, *prefills)]

    # Start between the bounds: a field at zero in the catalog (no per-sequence cost) is still fitted.
    x0 = [max(prior[n], _SCALE[n] * 0.1) / _SCALE[n] for n in FIELDS]
    x0[0] = min(x0[0], 0.9)
    for i, n in enumerate(FIELDS):
        if start is not None and n in start and math.isfinite(start[n]):
            x0[i] = _clip(n, max(start[n], _SCALE[n] * 0.01)) / _SCALE[n]
    x, r = _least_squares(residuals, x0)
    jac = _jacobian(residuals, x, r)
    dof = max(len(r) - len(FIELDS), 1)
    s2 = sum(v * v for v in r) / dof
    try:
        cov = _inverse([[sum(row[i] * row[j] for row in jac) for j in range(len(x))] for i in range(len(x))])
    except ValueError:
        raise NotEnoughData(
            "too little data to calibrate: the step times measured do not tell "
            f"{', '.join(FIELDS)} apart (traffic at different rates and prompt lengths helps)"
        ) from None
    gap_samples = int(sum(w.gaps for w in decode))
    prefill_samples = int(sum(w.prefills for w in prefill))
    data = {
        "matmul_efficiency_factor": (prefill_samples, len(prefill), names["prefill"]),
        "sequence_overhead_s": (gap_samples, len(decode), f"{names['gap']} against {names['batch']}"),
        "step_overhead_s": (gap_samples, len(decode), names["gap"]),
    }
    fields = []
    for i, n in enumerate(FIELDS):
        value = x[i] * _SCALE[n]
        samples, count, metric = data[n]
        fields.append(
            FittedField(
                name=n,
                value=value,
                stderr=math.sqrt(max(s2 * cov[i][i], 0.0)) * _SCALE[n],
                prior=prior[n],
                samples=samples,
                windows=count,
                data=metric,
                at_bound=value in _BOUNDS[n],
            )
        )
    before = [e for errors in relative_errors(cfg, usable) for e in errors]
    fitted = with_fields(cfg, {f.name: f.value for f in fields})
    after = [e for errors in relative_errors(fitted, usable) for e in errors]
    return Calibration(
        key=config_key(cfg),
        engine=cfg.engine.name,
        fields=tuple(fields),
        decode_windows=len(decode),
        prefill_windows=len(prefill),
        rms_error=_rms(after),
        prior_rms_error=_rms(before),
    )


def _robust(error: float) -> float:
    """A relative error as the least-squares residual of a soft-L1 loss (quadratic within
    ROBUST_SCALE, linear beyond: a window that straddles a change of load, its batch and
    prompts not those its steps ran with, pulls the fit less than its square would)."""
    c = ROBUST_SCALE
    return math.copysign(math.sqrt(2.0 * c * c * (math.sqrt(1.0 + (error / c) ** 2) - 1.0)), error)


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(statistics.fmean(v * v for v in values)) if values else math.nan


@dataclass(frozen=True)
class Comparison:
    """A profile's predictions against what the windows measured, each weighted by its samples."""

    predicted_gap_s: float
    observed_gap_s: float
    predicted_prefill_s: float
    observed_prefill_s: float

    def describe(self) -> str:
        return (
            f"inter-token gap {self.predicted_gap_s * 1e3:.1f} ms predicted, {self.observed_gap_s * 1e3:.1f} ms "
            f"observed; prefill {self.predicted_prefill_s * 1e3:.0f} ms predicted, "
            f"{self.observed_prefill_s * 1e3:.0f} ms observed"
        )


def compare(cfg: ServingConfig, windows: Sequence[Window]) -> Comparison | None:
    """`cfg`'s mean gap and prefill against the measured ones; None without usable windows."""
    decode = [w for w in windows if w.decode_usable]
    prefill = [w for w in windows if w.prefill_usable]
    if not decode or not prefill:
        return None
    gaps, prefills = sum(w.gaps for w in decode), sum(w.prefills for w in prefill)
    return Comparison(
        sum(predicted_gap_s(cfg, w) * w.gaps for w in decode) / gaps,
        sum(w.gap_s * w.gaps for w in decode) / gaps,
        sum(predicted_prefill_s(cfg, w) * w.prefills for w in prefill) / prefills,
        sum(w.prefill_s * w.prefills for w in prefill) / prefills,
    )
