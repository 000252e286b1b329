"""Engine profiles per engine and release: selection by version and image tag, a source for
every performance field, overlays, and the per-request intake cost in the simulator."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscale.cli import app
from kvscale.engines.command import command_config, parse_engine_command
from kvscale.sizing.catalog import PERFORMANCE_FIELDS, CatalogError, EngineProfile, default_catalog, load_catalog
from kvscale.sizing.engine_profiles import profile_for, release_of

CAT = default_catalog()


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("vllm/vllm-openai:v0.11.0", "0.11.0"),
        ("docker.io/vllm/vllm-openai:v0.10.1.1", "0.10.1.1"),
        ("lmsysorg/sglang:v0.5.4.post2-cu126", "0.5.4"),
        ("rocm/vllm:rocm6.4.1_vllm_0.10.1_20250909", "0.10.1"),  # the vLLM release, not ROCm's
        ("ghcr.io/huggingface/text-generation-inference:3.3.7-rocm", "3.3.7"),
        ("registry.local:5000/vllm/vllm-openai:v0.6.3", "0.6.3"),  # the port is not a tag
        ("0.9", "0.9"),
        ("v0.11", "0.11"),
        ("registry.local:5000/vllm/vllm-openai", None),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai@sha256:0123abcd", None),
        ("vllm/vllm-openai", None),
        (None, None),
    ],
)
def test_the_release_an_image_or_version_names(text: str | None, release: str | None) -> None:
    assert release_of(text) == release


@pytest.mark.parametrize(
    ("engine", "image_or_version", "profile"),
    [
        ("vllm", "vllm/vllm-openai:v0.11.0", "vllm-0.11"),
        ("vllm", "0.10.1", "vllm-0.11"),  # the V1 engine: covered from 0.10
        ("vllm", "vllm/vllm-openai:v0.12.0", "vllm-0.11"),  # newer than every profile: the newest
        ("vllm", "vllm/vllm-openai:v0.6.3", "vllm-0.2"),  # before 0.10: the older profile
        ("vllm", "0.2.7", "vllm-0.2"),
        ("vllm", None, "vllm-0.11"),  # no version: the newest
        ("vllm", "vllm/vllm-openai:latest", "vllm-0.11"),
        ("sglang", "lmsysorg/sglang:v0.5.4.post2", "sglang-0.5"),
        ("tgi", "ghcr.io/huggingface/text-generation-inference:3.3.7", "tgi-3.3"),
        ("tensorrt-llm", "0.9.0", "tensorrt-llm-0.9"),
        ("vllm-0.2", "vllm/vllm-openai:v0.11.0", "vllm-0.2"),  # a profile key is that profile
    ],
)
def test_profile_for_an_engine_and_release(engine: str, image_or_version: str | None, profile: str) -> None:
    chosen = profile_for(CAT, engine, image_or_version)
    assert chosen.profile == profile
    assert chosen.name == engine.split("-0")[0]


def test_an_engine_name_means_its_newest_profile() -> None:
    assert CAT.engine("vllm").profile == "vllm-0.11"
    assert CAT.engine("sglang").profile == "sglang-0.5"
    assert CAT.engine("tensorrt-llm").profile == "tensorrt-llm-0.9"
    assert [p.profile for p in CAT.engine_profiles("vllm")] == ["vllm-0.2", "vllm-0.11"]
    with pytest.raises(CatalogError, match="unknown engine 'vllx'"):
        profile_for(CAT, "vllx", "0.11.0")


def test_every_performance_field_of_every_profile_names_its_data() -> None:
    for key, profile in CAT.engines.items():
        assert profile.profile == key
        missing = set(PERFORMANCE_FIELDS) - set(profile.fitted_on)
        assert not missing, f"{key}: no fitted_on for {sorted(missing)}"
        for field, source in profile.fitted_on.items():
            assert len(source.strip()) > 10, f"{key}.{field}: {source!r}"
        assert profile.version is not None


def test_a_fitted_on_entry_for_an_unknown_field_is_refused() -> None:
    fields = CAT.engine("vllm").model_dump()
    fields["fitted_on"] = {"not_a_field": "some data"}
    with pytest.raises(ValueError, match="unknown fields"):
        EngineProfile.model_validate(fields)


def test_todays_vllm_carries_the_burst_fit_and_the_2023_profile_does_not() -> None:
    new, old = CAT.engine("vllm-0.11"), CAT.engine("vllm-0.2")
    assert new.sequence_overhead_s > 0 and new.matmul_efficiency_factor < 1
    assert "gpustack-perf-lab.csv" in new.fitted_on["matmul_efficiency_factor"]
    assert old.sequence_overhead_s == 0 and old.matmul_efficiency_factor == 1 and old.request_overhead_s == 0
    # Only the fitted fields differ: the memory rules and per-layer costs are shared.
    same = {k for k in new.model_dump() if getattr(new, k) == getattr(old, k)}
    assert {"decode_layer_overhead_s", "gpu_memory_utilization", "kv_block_tokens"} <= same


def test_an_overlay_may_name_a_release_profile(tmp_path: Path) -> None:
    overlay = tmp_path / "old.yaml"
    overlay.write_text("engines:\n  vllm-0.2:\n    step_overhead_s: 0.002\n")
    cat = load_catalog(overlay)
    assert cat.engine("vllm-0.2").step_overhead_s == 0.002
    assert cat.engine("vllm").step_overhead_s == CAT.engine("vllm").step_overhead_s


def test_the_engine_command_selects_the_profile_by_version_or_image() -> None:
    gpu = CAT.gpu("H100-SXM")
    plain = parse_engine_command("vllm serve Qwen/Qwen3-8B")
    assert plain.version is None
    assert command_config(CAT, plain, gpu).config.engine.profile == "vllm-0.11"
    old = parse_engine_command("vllm serve Qwen/Qwen3-8B", "0.6.3")
    assert command_config(CAT, old, gpu).config.engine.profile == "vllm-0.2"
    docker = parse_engine_command(
        "docker run --gpus all lmsysorg/sglang:v0.5.4 python -m sglang.launch_server --model-path Qwen/Qwen3-8B"
    )
    assert docker.version == "lmsysorg/sglang:v0.5.4"
    assert command_config(CAT, docker, gpu).config.engine.profile == "sglang-0.5"
    # The command's own flags still apply over the chosen profile.
    tuned = parse_engine_command("vllm serve Qwen/Qwen3-8B --gpu-memory-utilization 0.8", "0.6.3")
    engine = command_config(CAT, tuned, gpu).config.engine
    assert engine.profile == "vllm-0.2" and engine.gpu_memory_utilization == 0.8


def test_predict_engine_version_option() -> None:
    runner = CliRunner()
    args = ["predict", "--gpu", "H100-SXM", "--batch", "64", "--input", "512", "--output", "128", "--json"]
    command = ["--engine-command", "vllm serve Qwen/Qwen3-8B"]
    new = runner.invoke(app, [*args, *command])
    old = runner.invoke(app, [*args, *command, "--engine-version", "vllm/vllm-openai:v0.6.3"])
    assert new.exit_code == 0 and old.exit_code == 0, new.output + old.output
    new_json, old_json = json.loads(new.stdout), json.loads(old.stdout)
    assert (new_json["engine_profile"], old_json["engine_profile"]) == ("vllm-0.11", "vllm-0.2")
    # Today's vLLM costs more per sequence and reaches less of the GEMM peak than the 2023 profile.
    assert new_json["tpot_ms"] > old_json["tpot_ms"]
    bad = runner.invoke(app, [*args, *command, "--engine-version", "newest"])
    assert bad.exit_code == 2
    assert "--engine-version 'newest': no release in it" in bad.output


def test_each_admitted_request_costs_the_intake_time_serially() -> None:
    from kvscale.sim.policies import StaticPolicy
    from kvscale.sim.run import SimSetup, Source, simulate
    from kvscale.sim.trace import TraceRequest
    from kvscale.sizing.config import ServingConfig
    from kvscale.sizing.workload import Slo

    plain = ServingConfig.build(CAT, CAT.model("llama-3.1-8b"), CAT.gpu("H100-SXM"), "bf16", 1)
    base = ServingConfig(
        plain.model,
        plain.gpu,
        plain.link,
        plain.precision,
        plain.kv,
        plain.engine.model_copy(update={"request_overhead_s": 0.0}),
        1,
    )
    intake = ServingConfig(
        base.model,
        base.gpu,
        base.link,
        base.precision,
        base.kv,
        base.engine.model_copy(update={"request_overhead_s": 0.01}),
        1,
    )
    burst = [TraceRequest(0.0, 128, 4) for _ in range(200)]

    def run(cfg: ServingConfig) -> tuple[float, float]:
        setup = SimSetup(cfg, Slo(3600.0, 60.0), 256, cold_start_s=0.0, initial_replicas=1)
        done = [r for r in simulate(setup, Source(trace=burst), StaticPolicy(1)).requests if r.done]
        assert len(done) == 200
        return max(r.finish_s for r in done), sum(r.ttft_s for r in done) / len(done)

    (span0, ttft0), (span1, ttft1) = run(base), run(intake)
    # 200 requests x 10 ms of intake, one after another, on top of the same steps.
    assert span1 - span0 == pytest.approx(200 * 0.01, rel=1e-6)
    assert ttft1 - ttft0 > 0.5  # the burst's later requests wait on the earlier ones' intake


def test_the_operator_plans_with_the_profile_of_the_engine_image_s_release() -> None:
    """spec.engine.image's tag picks the profile the plan is sized on and the one the status's
    plan is rebuilt with (serving_config); no image: the catalog's (vllm/vllm-openai:v0.11.0)."""
    from kvscale.api.intent import parse_intent, serving_config
    from kvscale.control.planning import Planned, plan_service
    from kvscale.control.status import plan_status
    from tests.unit.test_reconcile import POOLS, SPEC, spec

    def planned_with(body: dict[str, object]) -> tuple[str, str, Planned]:
        intent = parse_intent(body)
        planned = plan_service(intent, CAT, POOLS)
        assert isinstance(planned, Planned)
        rebuilt = serving_config(intent, plan_status(planned, 4096, ()), CAT)
        return planned.chosen.config.engine.profile, rebuilt.engine.profile, planned

    old, old_rebuilt, old_plan = planned_with(spec(engine={"image": "vllm/vllm-openai:v0.6.3"}))
    new, new_rebuilt, new_plan = planned_with(SPEC)
    assert (old, old_rebuilt) == ("vllm-0.2", "vllm-0.2")
    assert (new, new_rebuilt) == ("vllm-0.11", "vllm-0.11")
    # Every candidate of the search, not only the chosen one, ran on the image's release
    assert {c.config.engine.profile for c in old_plan.plan.alternatives} <= {"vllm-0.2"}
    assert {c.config.engine.profile for c in new_plan.plan.alternatives} <= {"vllm-0.11"}
    today = spec(engine={"image": "registry.local:5000/vllm/vllm-openai:v0.11.0"})
    assert planned_with(today)[:2] == ("vllm-0.11", "vllm-0.11")


def test_amd_gpus_plan_with_the_release_of_the_rocm_image() -> None:
    """On AMD GPUs the pods run spec.engine.rocmImage (else the catalog's ROCm image), so its tag,
    not spec.engine.image's, picks the profile."""
    from kvscale.sizing.engine_profiles import profile_on

    amd = next(g for g in CAT.gpus.values() if g.vendor == "amd")
    nvidia = CAT.gpu("H100-SXM")
    old = "vllm/vllm-openai:v0.6.3"
    assert profile_on(CAT, "vllm", nvidia, old).profile == "vllm-0.2"
    assert profile_on(CAT, "vllm", amd, old).profile == "vllm-0.11"  # the catalog's rocm/vllm ..._vllm_0.10.1_...
    assert profile_on(CAT, "vllm", amd, None, "rocm/vllm:rocm6.2_vllm_0.6.3").profile == "vllm-0.2"
