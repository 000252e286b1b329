"""benchmarks/device_compare.py: the device-name-to-catalog mapping, the layer scaling of the
measured rows, the error arithmetic and the shape-to-configuration mapping."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks.device_compare import (
    catalog_gpu,
    compare,
    load_measurements,
    measured_step_s,
    predict,
    relative_error,
    serving_config,
    stack_weight_bytes,
    summary,
)
from kvscale.sizing.catalog import default_catalog
from kvscale.sizing.roofline import decode_step, prefill

CATALOG = default_catalog()
SHAPE_70B = {
    "name": "llama-3.1-70b",
    "built_layers": 8,
    "target_layers": 80,
    "hidden": 8192,
    "heads": 64,
    "kv_heads": 8,
    "head_dim": 128,
    "intermediate": 28672,
    "vocab": 128256,
}


def row(
    model: str, kind: str, sequences: int, tokens: int, stack_s: float, head_s: float, built: int
) -> dict[str, Any]:
    target = CATALOG.model(model).layers
    return {
        "model": model,
        "built_layers": built,
        "target_layers": target,
        "kind": kind,
        "sequences": sequences,
        "prompt_tokens": tokens if kind == "prefill" else 0,
        "context_tokens": tokens if kind == "decode" else 0,
        "mode": "graph",
        "stack_s": stack_s,
        "head_s": head_s,
    }


def test_torch_device_names_map_to_the_catalog_gpus() -> None:
    assert catalog_gpu(CATALOG, "NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert catalog_gpu(CATALOG, "NVIDIA H200").name == "H200"
    assert catalog_gpu(CATALOG, "cpu", override="H200").name == "H200"
    with pytest.raises(ValueError, match="--gpu"):
        catalog_gpu(CATALOG, "cpu")


def test_error_is_predicted_over_measured_and_summaries_take_its_size() -> None:
    assert relative_error(1.2, 1.0) == pytest.approx(0.2)
    assert relative_error(0.5, 1.0) == pytest.approx(-0.5)
    median, p90 = summary([-0.5, 0.1, 0.2, -0.3, 0.05, 0.0, 0.4, -0.1, 0.15, 0.25, 0.35])
    assert median == pytest.approx(0.2)  # |errors| sorted: 0, .05, .1, .1, .15, .2, .25, .3, .35, .4, .5
    assert p90 == pytest.approx(0.4)  # nearest rank: index round(0.9 x 10) = 9


def test_layers_are_scaled_to_the_model_and_the_head_counted_once() -> None:
    # 8 of 80 layers took 10 ms beside a 1 ms head: 80 layers take 100 ms, plus the head.
    assert measured_step_s(row("llama-3.1-70b", "decode", 1, 1024, 0.011, 0.001, 8)) == pytest.approx(0.101)
    assert measured_step_s(row("llama-3.1-8b", "decode", 1, 1024, 0.011, 0.001, 32)) == pytest.approx(0.011)


def test_rows_map_to_the_planners_configuration_and_step_functions() -> None:
    gpu = CATALOG.gpu("H100-SXM")
    cfg = serving_config(CATALOG, "llama-3.1-8b", gpu)
    assert (cfg.tensor_parallel, cfg.precision.name, cfg.engine.name, cfg.kv.name) == (1, "bf16", "vllm", "auto")
    assert predict(cfg, row("llama-3.1-8b", "prefill", 8, 512, 1.0, 0.0, 32)) == prefill(cfg, 8, 512)
    assert predict(cfg, row("llama-3.1-8b", "decode", 32, 4096, 1.0, 0.0, 32)) == decode_step(cfg, 32, 4096)


def test_a_stack_measured_at_the_models_floor_compares_at_zero_error() -> None:
    gpu = CATALOG.gpu("H200")
    rows = []
    for model, built in (("llama-3.1-8b", 32), ("llama-3.1-70b", 8)):
        cfg = serving_config(CATALOG, model, gpu)
        layers = cfg.model.layers
        for kind, sequences, tokens in (("prefill", 1, 2048), ("decode", 128, 1024)):
            r = row(model, kind, sequences, tokens, 0.0, 0.0005, built)
            floor = predict(cfg, r).roofline_s
            r["stack_s"] = 0.0005 + (floor - 0.0005) * built / layers  # what the device would have timed
            rows.append(r)
    rows.append({"model": "llama-3.1-8b", "kind": "decode", "mode": "skipped (KV does not fit)"})
    comparisons = compare(rows, CATALOG, gpu)
    assert len(comparisons) == 4  # the skipped row is left out
    for c in comparisons:
        assert c.floor_error == pytest.approx(0.0, abs=1e-9)
        assert c.step_error > 0  # the vLLM step adds its overheads on top
        assert c.achieved == pytest.approx(c.modelled)
    assert [c.bound for c in comparisons] == ["compute", "memory", "compute", "memory"]


def test_a_row_scaled_to_other_layers_than_the_catalogs_is_refused() -> None:
    bad = row("llama-3.1-8b", "decode", 1, 1024, 0.01, 0.001, 8)
    bad["target_layers"] = 80
    with pytest.raises(ValueError, match="80 layers"):
        compare([bad], CATALOG, CATALOG.gpu("H200"))


def test_stack_weight_bytes_leave_out_the_embedding_table() -> None:
    model = CATALOG.model("llama-3.1-70b")
    embedding = model.vocab_size * model.hidden_size * 2.0
    # the catalog's 70.6 B params hold the embedding and the lm_head; the stack reads one of them
    assert math.isclose(stack_weight_bytes(SHAPE_70B), 2.0 * model.params - embedding, rel_tol=0.01)


def test_the_floor_is_the_models_roofline_and_one_max_the_form_before() -> None:
    gpu = CATALOG.gpu("H200")
    for model in ("llama-3.1-8b", "llama-3.1-70b"):
        cfg = serving_config(CATALOG, model, gpu)
        for kind, sequences, tokens in (("prefill", 1, 8192), ("decode", 1, 1024), ("decode", 256, 4096)):
            (c,) = compare([row(model, kind, sequences, tokens, 1.0, 0.0, cfg.model.layers)], CATALOG, gpu)
            step = c.predicted
            assert c.floor_s == pytest.approx(step.seconds - step.communication_s - step.overhead_s)
            assert c.one_max_s - c.layer_overhead_s <= c.floor_s * (1 + 1e-12)
    # batch 1: the GEMMs and the attention both wait on memory, so the two forms agree
    (c,) = compare([row("llama-3.1-8b", "decode", 1, 1024, 1.0, 0.0, 32)], CATALOG, gpu)
    assert c.floor_s == pytest.approx(c.predicted.memory_s)
    assert c.one_max_s == pytest.approx(c.with_layers_s)
    # 70B batch 256: the GEMMs are compute-bound, the KV reads are not hidden under them
    (c,) = compare([row("llama-3.1-70b", "decode", 256, 1024, 1.0, 0.0, 8)], CATALOG, gpu)
    assert c.floor_s > 1.3 * (c.one_max_s - c.layer_overhead_s)


def test_the_layer_cost_is_the_engines_per_layer_term_without_its_per_step_cost() -> None:
    gpu = CATALOG.gpu("H100-SXM")
    cfg = serving_config(CATALOG, "llama-3.1-8b", gpu)
    (c,) = compare([row("llama-3.1-8b", "decode", 8, 1024, 0.01, 0.0, 32)], CATALOG, gpu)
    assert c.layer_overhead_s == pytest.approx(32 * cfg.engine.decode_layer_overhead_s)
    assert c.predicted.seconds == pytest.approx(c.with_layers_s + cfg.engine.step_overhead_s)


def test_a_file_that_is_not_device_roofline_output_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="device_compare.py")
    cases = {"broken.json": '{"rows": 3', "other.json": '{"device": "NVIDIA H200"}', "absent.json": None}
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(SystemExit) as exc:
            load_measurements(path, parser)
        assert exc.value.code == 2 and name in capsys.readouterr().err
    good = tmp_path / "good.json"
    good.write_text('{"device": "NVIDIA H200", "rows": []}')
    assert load_measurements(good, parser) == {"device": "NVIDIA H200", "rows": []}
