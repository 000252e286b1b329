"""What makes `kvscale plan` fast changes no answer: the fp8 line's search for the cheapest
candidate alone, the load model's caches, and tail sums cut short once a comparison is decided."""

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscale.planner.search import PlanRequest, cheapest, plan
from kvscale.sizing import load
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.load import ReplicaModel
from kvscale.sizing.workload import Burstiness, LengthDistribution, Slo, Workload

CAT = default_catalog()
MODELS = ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b")
GPUS = ("L4", "A100-80GB", "H100-SXM", "H200", "B200", "MI300X")


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    """Mean-value workloads and mixtures of lengths, Poisson or bursty."""
    if draw(st.booleans()):
        return Workload(draw(st.integers(16, 8000)), draw(st.integers(2, 1000)), draw(st.floats(0.05, 60.0)))
    inputs = _mixture(draw, 16, 30000)
    outputs = _mixture(draw, 2, 1500)
    bursts = Burstiness(draw(st.floats(1.0, 8.0)), 5.0, draw(st.sampled_from((1.0, 0.3))))
    return Workload.of(inputs, outputs, draw(st.floats(0.05, 40.0)), burstiness=bursts)


def _mixture(draw: st.DrawFn, low: int, high: int) -> LengthDistribution:
    lengths = draw(st.lists(st.integers(low, high), min_size=1, max_size=5, unique=True))
    weights = draw(st.lists(st.floats(0.05, 1.0), min_size=len(lengths), max_size=len(lengths)))
    return LengthDistribution(tuple(lengths), tuple(weights))


@st.composite
def requests(draw: st.DrawFn) -> PlanRequest:
    model = CAT.model(draw(st.sampled_from(MODELS)))
    workload = draw(workloads())
    gpus = tuple(draw(st.lists(st.sampled_from(GPUS), min_size=1, max_size=3, unique=True)))
    slo = Slo(draw(st.floats(0.2, 20.0)), draw(st.floats(0.01, 0.3)), draw(st.sampled_from((50.0, 90.0, 99.0))))
    limits = draw(st.none() | st.just({g: draw(st.integers(0, 64)) for g in gpus}))
    return PlanRequest(
        model=model,
        workload=workload,
        slo=slo,
        gpus=gpus,
        precisions=draw(st.sampled_from((("bf16",), ("fp8",), ("bf16", "fp8")))),
        headroom=draw(st.sampled_from((0.0, 0.1, 0.3))),
        max_replicas=draw(st.none() | st.integers(1, 40)),
        gpu_limits=limits,
        data_parallel_attention=model.is_moe and draw(st.booleans()),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_cheapest_is_the_plans_choice(request: PlanRequest) -> None:
    full = plan(CAT, request).chosen
    fast = cheapest(CAT, request)
    if full is None:
        assert fast is None
        return
    assert fast is not None
    assert fast.config == full.config
    assert fast.replicas == full.prediction.replicas
    assert fast.cost_usd_per_hour == full.prediction.cost_usd_per_hour
    assert fast.option.max_batch == full.prediction.max_batch
    assert fast.rate_per_replica_max == full.prediction.rate_per_replica_max


def test_cheapest_answers_the_fp8_line_of_the_trace_plan() -> None:
    """The case it was written for: one GPU type, fp8, a tail-bound mixture. Three of four
    tensor-parallel degrees are sized, the fourth pruned by one SLO check per budget."""
    inputs = LengthDistribution((800, 4000, 15000, 40000, 80000), (0.3, 0.3, 0.25, 0.12, 0.03))
    outputs = LengthDistribution((20, 70, 200, 800), (0.3, 0.4, 0.25, 0.05))
    workload = Workload.of(inputs, outputs, 4.3, max_context_tokens=131072)
    request = PlanRequest(
        CAT.model("llama-3.1-70b"), workload, Slo(10.0, 0.08, 99.0), gpus=("B200",), precisions=("fp8",)
    )
    full = plan(CAT, request).chosen
    fast = cheapest(CAT, request)
    assert full is not None and fast is not None
    assert (fast.config, fast.replicas) == (full.config, full.prediction.replicas)


def test_cheapest_ranks_by_cost_only() -> None:
    request = PlanRequest(CAT.model("llama-3.1-8b"), Workload(512, 128, 5.0), Slo(1.0, 0.05), objective="latency")
    with pytest.raises(ValueError, match="latency objective"):
        cheapest(CAT, request)


def _config(gpu: str, budget: int) -> ServingConfig:
    return ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu(gpu), "bf16", 1).with_chunk_budget(budget)


@settings(max_examples=30, deadline=None)
@given(
    workloads(),
    st.sampled_from(("L4", "H100-SXM")),
    st.sampled_from((512, 2048, 8192)),
    st.lists(st.floats(0.01, 30.0), min_size=1, max_size=6),
    st.sampled_from((90.0, 99.0)),
)
def test_a_replica_model_with_warm_caches_answers_as_a_fresh_one(
    workload: Workload, gpu: str, budget: int, rates: list[float], percentile: float
) -> None:
    """Step times, prompt prefill times and the per-batch arrival moments are cached on the
    model: after any sequence of rates, each answer equals a new model's."""
    cfg = _config(gpu, budget)
    warm = ReplicaModel(cfg, workload)
    slo = Slo(2.0, 0.06, percentile)
    batch = max(1, warm.tpot_batch_limit(slo.tpot_s))
    for rate in rates:
        fresh = ReplicaModel(cfg, workload)
        assert warm.at_rate(rate, batch, percentile) == fresh.at_rate(rate, batch, percentile)
        assert warm.meets(slo, batch, rate) == ReplicaModel(cfg, workload).meets(slo, batch, rate)


@settings(max_examples=30, deadline=None)
@given(workloads(), st.lists(st.floats(0.01, 30.0), min_size=1, max_size=4), st.sampled_from((90.0, 99.0)))
def test_tail_sums_cut_short_give_the_same_percentiles(
    workload: Workload, rates: list[float], percentile: float
) -> None:
    """`_bisect_percentile` lets a tail sum stop once it passes the threshold; the same
    searches with every term added find the same percentiles and the same verdicts."""
    cfg = _config("H100-SXM", 2048)
    slo = Slo(2.0, 0.06, percentile)
    batch = max(1, ReplicaModel(cfg, workload).tpot_batch_limit(slo.tpot_s))
    short = [ReplicaModel(cfg, workload).at_rate(r, batch, percentile) for r in rates]
    verdicts = [ReplicaModel(cfg, workload).meets(slo, batch, r) for r in rates]
    search = load._bisect_percentile
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            load,
            "_bisect_percentile",
            lambda over, lo, hi, tail, against=None: search(lambda x, _: over(x, math.inf), lo, hi, tail, against),
        )
        assert short == [ReplicaModel(cfg, workload).at_rate(r, batch, percentile) for r in rates]
        assert verdicts == [ReplicaModel(cfg, workload).meets(slo, batch, r) for r in rates]


def test_a_meets_check_that_misses_on_ttft_leaves_tpot_unresolved() -> None:
    cfg = _config("L4", 2048)
    workload = Workload(2000, 200, 0.1)
    replica = ReplicaModel(cfg, workload)
    slo = Slo(0.05, 1.0)  # no TTFT this short
    point = replica.at_rate(0.1, 16, slo.percentile, against=(slo.ttft_s, slo.tpot_s))
    assert point.ttft_p_s > slo.ttft_s and math.isinf(point.tpot_p_s)
    assert not replica.meets(slo, 16, 0.1)
    loose = replace(slo, ttft_s=100.0)  # the same load within TTFT: TPOT is resolved and met
    point = replica.at_rate(0.1, 16, loose.percentile, against=(loose.ttft_s, loose.tpot_s))
    assert math.isfinite(point.tpot_p_s) and replica.meets(loose, 16, 0.1)
