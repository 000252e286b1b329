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
calibrated profile predicts what was measured with the same code that plans. Maximum a
posteriori (Levenberg-Marquardt, numeric Jacobian: three parameters, tens of windows): the
windows' relative errors in units of their own scatter, and a prior on each field (the
catalog's value, a factor of 3 either way in log space). Each field's uncertainty is its
standard error from the posterior covariance (J^T J)^-1, with what a bias of the model common
to every window (MODEL_BIAS) would move it by. Per-sequence and per-step costs both lengthen
the gap as the batch grows; windows over too narrow a range of batches do not tell them apart,
and a field they leave nearly as uncertain as the prior stays near it, flagged
(FittedField.at_prior_with names the field it moves with), its stated error the prior's.
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
# The prior: each field is the catalog's value within a factor of PRIOR_SPREAD's exponent (one
# standard deviation, log space: a factor of 3 either way). The catalog's CPU costs come from a
# grid fit on other engines' bursts and its GEMM share from another GPU's; an engine a factor
# of 3 off is one standard deviation out, where the windows, when they can, decide.
PRIOR_SPREAD = math.log(3.0)
# Each field in log(value + floor): a zero cost is a value the fit can reach.
_PRIOR_FLOOR = {"matmul_efficiency_factor": 0.01, "sequence_overhead_s": 1.0e-6, "step_overhead_s": 1.0e-5}
# Least relative scatter a window's mean is held to: the model's own error against an engine
# (kvscale's step times against the simulator's, whose engine rounds contexts and chunks to 64
# tokens), so hundreds of windows cannot make a stated error smaller than the model can be.
MODEL_ERROR = 0.02
# The same model's error common to all windows (a bias that more windows do not average out):
# its share of each field's stated error is what a bias this large in every gap (and another
# in every prefill) would move the field by.
MODEL_BIAS = 0.015
# A field whose posterior spread (log space) is above this share of the prior's is one the
# windows do not determine: it stays at the prior, flagged.
AT_PRIOR = 0.5


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
    # Left at the catalog's value: the windows do not tell it apart from this field (its
    # stated error is then the prior's spread); "" when fitted.
    at_prior_with: str = ""

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

    @property
    def unidentified(self) -> tuple[str, ...]:
        """Fields left at the catalog's value: the windows do not determine them."""
        return tuple(f.name for f in self.fields if f.at_prior_with)

    def field(self, name: str) -> FittedField:
        return next(f for f in self.fields if f.name == name)

    def overlay(self) -> dict[str, object]:
        """A catalog overlay (`kvscale plan --catalog`): the engine profile's fitted fields."""
        said = ", ".join(
            f"{f.name} {f.value:.4g} ± {f.stderr:.2g} ({f.samples} samples"
            + (f"; at the prior, not told apart from {f.at_prior_with})" if f.at_prior_with else ")")
            for f in self.fields
        )
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


def _chunks_of(cfg: ServingConfig, w: Window, prompts: float) -> int:
    """Steps `prompts` prompts admitted together take: the token budget less the running decodes per step."""
    room = max(1.0, cfg.max_num_batched_tokens - w.batch)
    return max(1, math.ceil(prompts * w.prompt_tokens / room))


def _prefill_step_of(cfg: ServingConfig, w: Window, prompts: float) -> float:
    chunk = prompts * w.prompt_tokens / _chunks_of(cfg, w, prompts)
    return step(cfg, w.batch, w.context_tokens, chunk, w.prompt_tokens / 2.0, prompts).seconds


def prompts_per_step(cfg: ServingConfig, w: Window) -> float:
    """Prompts admitted with a request, its own included: the scheduler admits every prompt
    waiting (as many as the token budget holds) at once, so a request shares its prefill with
    those that arrived during the step (or the admission) it arrived in. A request lands in a
    long step more often than in a short one (length-biased): with Poisson arrivals at rate r,
    1 + r E[T^2] / E[T] over the window's decode steps and admissions (chunks and intake), not
    1 + r E[T]: a prefill of a long prompt takes ten decode steps and more, and the prompts
    that arrive during it are admitted together. r E[T] is prefills over steps (a ratio of
    counts: no clock in it); the step times are the profile's, so the count is found with them
    (a fixed point, a few rounds)."""
    if not w.steps or w.prefills <= 0:
        return 1.0
    cap = max(1.0, cfg.max_num_batched_tokens / max(w.prompt_tokens, 1.0))
    prompts = min(1.0 + min(w.prefills / w.steps, 4.0), cap)
    decode = step(cfg, max(w.batch, 1.0), w.context_tokens).seconds
    for _ in range(3):
        chunks = _chunks_of(cfg, w, prompts)
        admission = chunks * _prefill_step_of(cfg, w, prompts) + cfg.engine.request_overhead_s * prompts
        admissions = w.prefills / _per_admission(prompts)
        decodes = max(w.steps - admissions * chunks, 0.0)
        total = decodes * decode + admissions * admission
        square = decodes * decode * decode + admissions * admission * admission
        prompts = min(1.0 + min(w.prefills * square / (total * total), 4.0), cap)
    return prompts


def _per_admission(prompts: float) -> float:
    """Prompts per admission from the prompts a request is admitted with (request-weighted):
    those that arrive during a step of length T number K ~ Poisson(r T), a request sees r T
    others, an admission (K >= 1) about half as many."""
    return 1.0 + (prompts - 1.0) / 2.0


def _chunks(cfg: ServingConfig, w: Window) -> int:
    """Steps a prefill step's prompts take: the token budget less the running decodes per step."""
    return _chunks_of(cfg, w, prompts_per_step(cfg, w))


def prefill_step_s(cfg: ServingConfig, w: Window) -> float:
    """One step that carries a chunk of the prompts admitted together, beside the running decodes."""
    return _prefill_step_of(cfg, w, prompts_per_step(cfg, w))


def intake_s(cfg: ServingConfig, w: Window) -> float:
    """The engine profile's per-request intake (request_overhead_s) for the prompts admitted
    together: kvscale's model charges it in series with the steps that admit them (as the
    simulator's engine and the load model do), so the fit must too, or it reads the intake as
    a slower GEMM."""
    return cfg.engine.request_overhead_s * prompts_per_step(cfg, w)


def predicted_prefill_s(cfg: ServingConfig, w: Window) -> float:
    """vLLM's prefill time is first token less scheduled (vllm/v1/metrics/stats.py
    update_from_finished_request): the steps that carry the chunks of the prompts admitted with
    it, and their intake."""
    prompts = prompts_per_step(cfg, w)
    return _chunks_of(cfg, w, prompts) * _prefill_step_of(cfg, w, prompts) + cfg.engine.request_overhead_s * prompts


def mixed_share(cfg: ServingConfig, w: Window) -> float:
    """Share of the window's steps that also carried prompt chunks (their gaps are longer)."""
    if not w.steps or w.prefills <= 0:
        return 0.0
    prompts = prompts_per_step(cfg, w)
    return min(1.0, w.prefills / _per_admission(prompts) * _chunks_of(cfg, w, prompts) / w.steps)


def predicted_gap_s(cfg: ServingConfig, w: Window) -> float:
    """The mean inter-token gap: decode steps, and the steps that carried a chunk. A step of n
    sequences makes n gaps, so the mean gap weighs each step by its batch: the batch a token
    sees is E[n^2]/E[n] = mean + variance/mean, one more than the mean where the running count
    is Poisson (requests that arrive at random and stay a while: an M/G/infinity occupancy)."""
    decode = step(cfg, w.batch + 1.0, w.context_tokens).seconds
    if not w.steps or w.prefills <= 0:
        return decode
    prompts = prompts_per_step(cfg, w)
    chunks = _chunks_of(cfg, w, prompts)
    share = min(1.0, w.prefills / _per_admission(prompts) * chunks / w.steps)
    # the admission's intake lengthens the steps that carry its chunks (spread over them)
    mixed = _prefill_step_of(cfg, w, prompts) + cfg.engine.request_overhead_s * prompts / chunks
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


def _jacobian(residuals: Residuals, x: list[float], r0: list[float], names: Sequence[str]) -> list[list[float]]:
    """d residual / d x by central differences (forward at a bound)."""
    columns: list[list[float]] = []
    for i, name in enumerate(names):
        h = 1e-3 * max(1.0, abs(x[i]))
        low, high = (b / _SCALE[name] for b in _BOUNDS[name])
        up, down = min(x[i] + h, high), max(x[i] - h, low)
        xu, xd = list(x), list(x)
        xu[i], xd[i] = up, down
        ru = residuals(xu)
        rd = residuals(xd) if down < x[i] else r0
        columns.append([(u - d) / (up - (down if down < x[i] else x[i])) for u, d in zip(ru, rd, strict=True)])
    return [[columns[j][k] for j in range(len(names))] for k in range(len(r0))]


def _normal(jac: list[list[float]]) -> list[list[float]]:
    n = len(jac[0]) if jac else 0
    return [[sum(row[i] * row[j] for row in jac) for j in range(n)] for i in range(n)]


def _least_squares(
    residuals: Residuals, x0: list[float], names: Sequence[str], iterations: int = 60
) -> tuple[list[float], list[float]]:
    """Levenberg-Marquardt from x0 (scaled units); the minimum and its residuals."""
    x, r = list(x0), residuals(x0)
    cost, damping = sum(v * v for v in r), 1e-3
    for _ in range(iterations):
        jac = _jacobian(residuals, x, r, names)
        jtj = _normal(jac)
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
            trial = [_clip(n, (xi + d) * _SCALE[n]) / _SCALE[n] for n, xi, d in zip(names, x, delta, strict=True)]
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


def _prior_residual(name: str, value: float, prior: float) -> float:
    """The prior's residual: how far the field is from the catalog's value, in log space, in
    prior standard deviations."""
    floor = _PRIOR_FLOOR[name]
    return math.log((value + floor) / (prior + floor)) / PRIOR_SPREAD


def fit(
    cfg: ServingConfig,
    windows: Sequence[Window],
    metrics: dict[str, str] | None = None,
    start: Mapping[str, float] | None = None,
) -> Calibration:
    """The step-time fields that make `cfg`'s step times match the windows; NotEnoughData when
    the windows cannot carry a fit. `metrics` names the metrics read, for the messages;
    `start`: where the search starts (the stored profile: a refit of the same engines then
    converges in a few steps), the catalog's values staying the prior it reports against.

    Maximum a posteriori: each window's relative errors in units of the windows' own scatter
    (at least MODEL_ERROR), and each field's distance from the catalog's value in log space,
    in units of PRIOR_SPREAD. A field the windows leave almost as uncertain as the prior
    (posterior spread above AT_PRIOR of the prior's: a direction, such as a per-sequence
    against a per-step cost over too narrow a range of batches, along which the windows
    cannot tell the fields apart) stays near the catalog's value, where the prior holds it,
    flagged with the field it moves with; its stated error is then about the prior's, and the
    other fields' errors carry what it leaves open."""
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

    # Start between the bounds: a field at zero in the catalog (no per-sequence cost) is still fitted.
    begin = {n: max(prior[n], _SCALE[n] * 0.1) for n in FIELDS}
    begin["matmul_efficiency_factor"] = min(begin["matmul_efficiency_factor"], 0.9)
    for n in FIELDS:
        if start is not None and n in start and math.isfinite(start[n]):
            begin[n] = _clip(n, max(start[n], _SCALE[n] * 0.01))

    n_fields = len(FIELDS)

    def solve(sigma: float) -> tuple[dict[str, float], list[float], list[list[float]]]:
        """The MAP with the windows' scatter `sigma`, the windows' relative errors there, and
        the fields' covariance (scaled units): the windows' scatter's, and what a bias of
        MODEL_BIAS common to every window's gap (and another to every prefill) would add."""

        def values(x: list[float]) -> dict[str, float]:
            return {n: xi * _SCALE[n] for n, xi in zip(FIELDS, x, strict=True)}

        def residuals(x: list[float]) -> list[float]:
            v = values(x)
            gaps, prefills = relative_errors(with_fields(cfg, v), usable)
            data = [_robust(e) / sigma for e in (*gaps, *prefills)]
            return [*data, *(_prior_residual(n, v[n], prior[n]) for n in FIELDS)]

        x, r = _least_squares(residuals, [begin[n] / _SCALE[n] for n in FIELDS], FIELDS)
        jac = _jacobian(residuals, x, r, FIELDS)
        try:
            cov = _inverse(_normal(jac))
        except ValueError:
            raise NotEnoughData(
                "too little data to calibrate: the step times measured do not tell "
                f"{', '.join(FIELDS)} apart (traffic at different rates and prompt lengths helps)"
            ) from None
        for rows in (range(len(decode)), range(len(decode), len(r) - n_fields)):
            # the fields' shift a bias of MODEL_BIAS in these rows makes: cov J^T u
            pull = [sum(jac[k][j] for k in rows) * MODEL_BIAS / sigma for j in range(n_fields)]
            shift = [sum(cov[i][j] * pull[j] for j in range(n_fields)) for i in range(n_fields)]
            cov = [[cov[i][j] + shift[i] * shift[j] for j in range(n_fields)] for i in range(n_fields)]
        return values(x), [v * sigma for v in r[: len(r) - n_fields]], cov

    # The windows' scatter about the fit (at least MODEL_ERROR), estimated at the fit's own
    # solution: a few rounds.
    sigma = MODEL_ERROR
    for _ in range(4):
        found, errors, cov = solve(sigma)
        begin.update(found)
        scatter = max(MODEL_ERROR, math.sqrt(sum(e * e for e in errors) / max(len(errors) - n_fields, 1)))
        if abs(scatter / sigma - 1.0) < 0.05:
            break
        sigma = scatter
    # Fields the windows leave almost as uncertain as the prior, each with the field it moves
    # with most (what the windows cannot tell it apart from). They stay at the posterior's
    # value, which the prior holds near the catalog's, and their errors, the prior's spread
    # carried over, say so; the other fields' errors include what the flagged ones leave open.
    at_prior: dict[str, str] = {}
    for i, n in enumerate(FIELDS):
        spread = math.sqrt(max(cov[i][i], 0.0)) * _SCALE[n] / (found[n] + _PRIOR_FLOOR[n])
        if spread > AT_PRIOR * PRIOR_SPREAD:
            correlation = [abs(cov[i][j]) / math.sqrt(cov[i][i] * cov[j][j] or 1.0) for j in range(len(FIELDS))]
            at_prior[n] = max((m for j, m in enumerate(FIELDS) if j != i), key=lambda m: correlation[FIELDS.index(m)])
    gap_samples = int(sum(w.gaps for w in decode))
    prefill_samples = int(sum(w.prefills for w in prefill))
    data = {
        "matmul_efficiency_factor": (prefill_samples, len(prefill), names["prefill"]),
        "sequence_overhead_s": (gap_samples, len(decode), f"{names['gap']} against {names['batch']}"),
        "step_overhead_s": (gap_samples, len(decode), names["gap"]),
    }
    fields = []
    for n in FIELDS:
        value = found[n]
        samples, count, metric = data[n]
        i = FIELDS.index(n)
        stderr = math.sqrt(max(cov[i][i], 0.0)) * _SCALE[n]
        fields.append(
            FittedField(
                name=n,
                value=value,
                stderr=stderr,
                prior=prior[n],
                samples=samples,
                windows=count,
                data=metric,
                at_bound=value in _BOUNDS[n],
                at_prior_with=at_prior.get(n, ""),
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
