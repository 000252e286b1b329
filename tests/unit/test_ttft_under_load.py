"""What a new request waits for in the engine's scheduler: a slot, the token budget per step,
the prompts ahead of it, and the running decodes (kvscale.sim.engine step by step,
kvscale.sizing.closed_loop in closed form); the NIM closed-loop sweeps as the accuracy check."""

import math
import random
import statistics

import pytest

from benchmarks.reference import sweep_points
from kvscale.sim.engine import Replica, SimRequest, StepTimes
from kvscale.sim.policies import StaticPolicy
from kvscale.sim.report import summary
from kvscale.sim.run import SimSetup, Source, simulate
from kvscale.sim.trace import TraceRequest
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.catalog.loader import Catalog
from kvscale.sizing.closed_loop import closed_loop
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.load import ReplicaModel
from kvscale.sizing.roofline import step
from kvscale.sizing.workload import Slo, Workload

CAT = default_catalog()


def _catalog(engine: str, **update: float) -> Catalog:
    profile = CAT.engine(engine).model_copy(update=update)
    return CAT.model_copy(update={"engines": {**CAT.engines, engine: profile}})


def config(
    engine: str = "vllm", model: str = "llama-3.1-8b", gpu: str = "A100-80GB", tp: int = 1, **update: float
) -> ServingConfig:
    catalog = _catalog(engine, **update) if update else CAT
    return ServingConfig.build(catalog, catalog.model(model), catalog.gpu(gpu), "bf16", tp, "auto", engine)


def replica(cfg: ServingConfig, max_batch: int = 256) -> Replica:
    return Replica(0, StepTimes(cfg), max_batch, cfg.memory.kv_capacity_tokens, cfg.max_num_batched_tokens, 0.0, 0.0)


def run(rep: Replica, until_s: float = 1e6) -> list[SimRequest]:
    finished: list[SimRequest] = []
    rep.advance_to(until_s, finished)
    return finished


def closed_loop_sim(cfg: ServingConfig, users: int, inp: int, out: int, max_batch: int) -> tuple[float, float, float]:
    """Mean TTFT, mean ITL and output tokens/s of `users` closed-loop users, the first third left out."""
    duration = max(60.0, 6.0 * closed_loop(cfg, users, inp, out, max_batch).cycle_s)
    setup = SimSetup(cfg, Slo(60.0, 10.0), max_batch, cold_start_s=0.0, initial_replicas=1)
    result = simulate(setup, Source(closed=(users, inp, out, duration)), StaticPolicy(1))
    done = [r for r in result.requests if r.done]
    kept = [r for r in done if r.arrival_s >= duration / 3]
    end = max(r.finish_s for r in done)
    tokens = sum(r.output_tokens for r in done if r.first_token_s >= duration / 3)
    return (
        statistics.fmean(r.ttft_s for r in kept),
        statistics.fmean(r.tpot_s for r in kept),
        tokens / (end - duration / 3),
    )


# -- the engines' defaults, as their sources say (engines.yaml cites the files) ----------


def test_engine_profiles_carry_each_schedulers_defaults() -> None:
    vllm, sglang, trt = (CAT.engine(e) for e in ("vllm", "sglang", "tensorrt-llm"))
    assert vllm.chunked_prefill and vllm.decodes_during_prefill  # vLLM 0.11 V1: one budget, running first
    assert sglang.chunked_prefill and not sglang.decodes_during_prefill  # prefill first, no mixed chunk
    assert not trt.chunked_prefill and not trt.decodes_during_prefill


# -- admission -------------------------------------------------------------------------


def test_a_request_waits_for_a_slot_when_max_num_seqs_is_full() -> None:
    rep = replica(config(), max_batch=2)
    for i in range(3):
        rep.enqueue(SimRequest(i, 0.0, 100, 50))
    done = {r.id: r for r in run(rep)}
    first_two_finish = min(done[0].finish_s, done[1].finish_s)
    # The third is admitted only when a slot frees: its first token after a finish, not with the others.
    assert done[2].first_token_s >= first_two_finish
    assert done[0].first_token_s < first_two_finish


def test_closed_loop_slot_wait_is_littles_law_at_saturation() -> None:
    """12 users, 4 slots: X = 4 / cycle, so each request waits (12 / 4 - 1) cycles for a slot."""
    cfg = config()
    formula = closed_loop(cfg, 12, 500, 100, max_batch=4)
    assert formula.running == 4
    assert formula.slot_wait_s == pytest.approx(2.0 * formula.cycle_s)
    ttft, _, _ = closed_loop_sim(cfg, 12, 500, 100, max_batch=4)
    assert ttft == pytest.approx(formula.ttft_s, rel=0.1)
    assert ttft > 1.5 * formula.cycle_s  # the wait is whole request lifetimes, not a prefill


# -- the token budget per step ---------------------------------------------------------


def test_chunked_prefill_spends_the_token_budget_per_step() -> None:
    cfg = config()  # vLLM on A100: budget 2048 (vllm/engine/arg_utils.py _set_default_args)
    assert cfg.max_num_batched_tokens == 2048
    rep = replica(cfg)
    rep.enqueue(SimRequest(0, 0.0, 10_000, 2))
    rep.advance_to(1e-9, [])  # the admission and the prompt's chunk steps
    request = rep.running[0]
    # 10,000 tokens in 2048-token steps: four full chunks and one of 1808 (the sim buckets by 64 tokens).
    full = step(cfg, 0, 0.0, 2048, 10_000 / 2.0, 1.0).seconds
    rest = step(cfg, 0, 0.0, 1856, 10_000 / 2.0, 1.0).seconds
    assert request.first_token_s == pytest.approx(4 * full + rest, rel=0.02)
    one_step = step(cfg, 0, 0.0, 10_000, 10_000 / 2.0, 1.0).seconds
    assert request.first_token_s > one_step * 1.02  # chunks cost more than one step: weights read 5 times


def test_without_chunked_prefill_the_prompt_is_one_step() -> None:
    cfg = config("tensorrt-llm")  # whole prompts
    rep = replica(cfg)
    rep.enqueue(SimRequest(0, 0.0, 4000, 2))
    rep.advance_to(1e-9, [])
    assert rep.running[0].first_token_s == pytest.approx(step(cfg, 0, 0.0, 4032, 4032 / 2.0, 1.0).seconds, rel=0.02)


def test_decodes_advance_in_a_prefill_step_only_where_the_engine_mixes() -> None:
    """vLLM: a chunk step carries every running decode; SGLang and TensorRT-LLM: they wait."""
    for engine, advances in (("vllm", True), ("sglang", False), ("tensorrt-llm", False)):
        cfg = config(engine)
        rep = replica(cfg)
        rep.enqueue(SimRequest(0, 0.0, 100, 500))
        rep.advance_to(1e-9, [])  # request 0 prefilled and decoding
        step_before = rep.step
        rep.enqueue(SimRequest(1, rep.clock, 6000, 10))
        rep.advance_to(rep.clock + 1e-9, [])  # request 1's prefill steps
        chunks = math.ceil(6000 / (cfg.max_num_batched_tokens - 1)) if cfg.engine.chunked_prefill else 1
        assert rep.step - step_before == (chunks if advances else 0), engine


# -- closed loops: TTFT against concurrency --------------------------------------------


def test_closed_loop_ttft_grows_with_users_as_the_round_queues() -> None:
    """TensorRT-LLM (prefill steps alone, whole prompts, one 7000-token prompt per 8192-token step):
    users who start together finish together, so every round queues the N prompts FCFS and
    the mean TTFT is (N + 1) / 2 prefills; the NIM sweeps measure 1.5x at N = 2 and ~5.5x at N = 10."""
    cfg = config("tensorrt-llm", "llama-3.1-70b", "A100-80GB", 4)
    one, _, _ = closed_loop_sim(cfg, 1, 7000, 1000, 64)
    previous = one
    for users in (2, 5, 10):
        ttft, _, _ = closed_loop_sim(cfg, users, 7000, 1000, 64)
        assert ttft == pytest.approx((users + 1) / 2 * one, rel=0.05), users
        assert ttft > previous
        previous = ttft


def test_vllm_closed_loop_users_do_not_queue_behind_a_round() -> None:
    """vLLM advances the decodes in every chunk step: users drift a prompt apart and a new
    request waits only for its own prompt's chunks (beside the decodes)."""
    cfg = config("vllm", "llama-3.1-70b", "H100-SXM", 4)
    one, _, _ = closed_loop_sim(cfg, 1, 7000, 1000, 64)
    ten, _, _ = closed_loop_sim(cfg, 10, 7000, 1000, 64)
    assert ten < 2.0 * one


# -- the simulator and the formulas ----------------------------------------------------

CASES = [
    ("vllm", "llama-3.1-8b", "A100-80GB", 1, 5, 200, 500, 256),
    ("vllm", "llama-3.1-8b", "A100-80GB", 1, 40, 1000, 200, 256),
    ("vllm", "llama-3.1-8b", "A100-80GB", 1, 12, 500, 100, 4),
    ("tensorrt-llm", "llama-3.1-70b", "A100-80GB", 4, 5, 7000, 1000, 256),
    ("tensorrt-llm", "llama-3.1-8b", "A100-80GB", 2, 25, 2000, 200, 256),
    ("sglang", "llama-3.1-8b", "H100-SXM", 1, 20, 3000, 300, 256),
]


@pytest.mark.parametrize("engine,model,gpu,tp,users,inp,out,max_batch", CASES)
def test_simulator_and_closed_form_agree(
    engine: str, model: str, gpu: str, tp: int, users: int, inp: int, out: int, max_batch: int
) -> None:
    cfg = config(engine, model, gpu, tp)
    formula = closed_loop(cfg, users, inp, out, max_batch)
    ttft, itl, throughput = closed_loop_sim(cfg, users, inp, out, max_batch)
    assert formula.ttft_s == pytest.approx(ttft, rel=0.15)
    assert formula.itl_s == pytest.approx(itl, rel=0.15)
    assert formula.throughput_tokens_per_s == pytest.approx(throughput, rel=0.15)


# -- accuracy: the NIM closed-loop sweeps (benchmarks/ttft_under_load.py) -------------------


def test_nim_sweeps_mean_ttft_held_out_rows() -> None:
    """The 70B rows were not used for the scheduler choice. From 2 to 50 users the mean TTFT
    holds to the issue's aim, median |error| <= 15% and p90 <= 40% (8.2% / 30.2%; with vLLM's
    scheduler for every engine, as before: 19.5% / 84.9%, the long prompts 3-5x too low).
    Above 50 users the measured rounds break up: benchmarks/ttft_under_load.py reports them."""
    from benchmarks.ttft_under_load import replay

    errors = []
    for p in sweep_points():
        if p.model != "llama-3.1-70b" or not 2 <= p.concurrency <= 50:
            continue
        cfg = ServingConfig.build(
            CAT, CAT.model(p.model), CAT.gpu(p.gpu), p.precision, p.tensor_parallel, "auto", "tensorrt-llm"
        )
        _, ttft, _ = replay(cfg, p)
        errors.append(abs(ttft / p.ttft_mean_s - 1))
    assert len(errors) == 72
    errors.sort()
    assert statistics.median(errors) <= 0.15
    assert errors[round(0.9 * (len(errors) - 1))] <= 0.40


# -- open loop: the load model (kvscale.sizing.load) where prefill steps run alone -------


@pytest.mark.parametrize("engine", ["sglang", "tensorrt-llm"])
@pytest.mark.parametrize(
    ("model", "gpu", "tp", "inp", "out"),
    [("llama-3.1-8b", "H100-SXM", 1, 2000, 200), ("llama-3.1-70b", "H100-SXM", 4, 1000, 300)],
)
def test_load_model_and_simulator_agree_where_decodes_wait_out_prefill(
    engine: str, model: str, gpu: str, tp: int, inp: int, out: int
) -> None:
    """Ten minutes of Poisson arrivals at 30% of the replica's capacity. A running decode sees
    a prefill step it waits out as one long token gap (the prefill alone, then its decode
    step), and a prompt's own chunks carry no decodes. Read as vLLM's mixed step instead, the
    load model's p95 TPOT was 17-20% below the simulator's on these four; now within 12%."""
    # Compared with the profiles' fitted per-request intake (both charge it serially with the
    # steps), without their per-sequence cost: with SGLang's 250 us per running sequence the two
    # disagree by ~18% on p95 TPOT here (the simulator counts sequences per step differently in
    # prefill-only steps). Known gap, open.
    cfg = config(engine, model, gpu, tp, sequence_overhead_s=0.0)
    replica = ReplicaModel(cfg, Workload(inp, out, 1.0))
    batch = min(256, replica.slot_limit)
    rate = 0.3 * replica.capacity_rate_per_s(batch)
    rng = random.Random(7)
    t, trace = 0.0, []
    while t < 600.0:
        t += rng.expovariate(rate)
        trace.append(TraceRequest(t, inp, out))
    setup = SimSetup(cfg, Slo(10.0, 1.0), batch, cold_start_s=0.0, initial_replicas=1)
    row = summary(simulate(setup, Source(trace), StaticPolicy(1)), setup.slo)
    point = replica.at_rate(rate, batch, 95)
    assert point.tpot_p_s * 1e3 == pytest.approx(row["tpot_p95_ms"], rel=0.12)
    assert point.ttft_p_s * 1e3 == pytest.approx(row["ttft_p95_ms"], rel=0.35)


@pytest.mark.parametrize(("engine", "rate"), [("vllm", 30.0), ("sglang", 30.0)])
def test_load_model_charges_the_per_request_intake_as_the_simulator_does(engine: str, rate: float) -> None:
    """Short prompts at a high rate, where the profiles' fitted intake (3 ms per admitted
    request: HTTP, tokenization, admission) is a tenth of the replica's time: the simulator
    charges it serially with the steps, so the load model must too. Without the term its p95
    TPOT was 24% (vLLM) and 22% (SGLang) below the simulator's; with it 5% below and 2% above."""
    cfg = config(engine, "llama-3.1-8b", "H100-SXM", 1, sequence_overhead_s=0.0)
    assert cfg.engine.request_overhead_s == pytest.approx(3.0e-3)
    replica = ReplicaModel(cfg, Workload(200, 100, 1.0))
    batch = min(256, replica.slot_limit)
    rng = random.Random(7)
    t, trace = 0.0, []
    while t < 300.0:
        t += rng.expovariate(rate)
        trace.append(TraceRequest(t, 200, 100))
    setup = SimSetup(cfg, Slo(10.0, 1.0), batch, cold_start_s=0.0, initial_replicas=1)
    row = summary(simulate(setup, Source(trace), StaticPolicy(1)), setup.slo)
    point = replica.at_rate(rate, batch, 95)
    assert point.tpot_p_s * 1e3 == pytest.approx(row["tpot_p95_ms"], rel=0.10)
    # The replica's time the intake takes is capacity the planner no longer counts on
    free_cfg = config(engine, "llama-3.1-8b", "H100-SXM", 1, request_overhead_s=0.0, sequence_overhead_s=0.0)
    free = ReplicaModel(free_cfg, Workload(200, 100, 1.0))
    assert replica.capacity_rate_per_s(batch) < free.capacity_rate_per_s(batch)


def test_sglang_enable_mixed_chunk_puts_the_decodes_in_the_prefill_steps() -> None:
    from kvscale.engines.command import command_config, parse_engine_command

    gpu = CAT.gpu("H100-SXM")
    plain = parse_engine_command("python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B")
    mixed = parse_engine_command("python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --enable-mixed-chunk")
    assert not command_config(CAT, plain, gpu).config.engine.decodes_during_prefill
    assert command_config(CAT, mixed, gpu).config.engine.decodes_during_prefill
    assert "--enable-mixed-chunk" not in " ".join(command_config(CAT, mixed, gpu).notes)  # modelled, not ignored
