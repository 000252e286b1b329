"""The calibrated profile's object (kvscale.calibration.profile): a ConfigMap per serving
configuration that reads back to its fields, ignores another configuration's or a broken one,
honours a pin; the hysteresis that keeps noise from rewriting it; and the one Event text."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kvscale.calibration.fit import Calibration, FittedField, compare, fit, with_fields
from kvscale.calibration.profile import (
    PINNED_ANNOTATION,
    moves,
    profile_configmap,
    profile_name,
    read_profile,
    replan_message,
)
from kvscale.sizing.catalog import load_catalog
from tests.unit.test_calibration_fit import _configs, _measured

KEY = "llama-3.1-8b/H100-SXM/tp1/bf16/vllm@vllm/vllm-openai:v0.11.0"


def _calibration(f: float = 0.484, s: float = 204e-6, err: float = 0.01) -> Calibration:
    return Calibration(
        key=KEY,
        engine="vllm",
        fields=(
            FittedField("matmul_efficiency_factor", f, err, 1.0, 4421, 24, "vllm:request_prefill_time_seconds"),
            FittedField("sequence_overhead_s", s, 1.8e-5, 0.0, 10**6, 24, "vllm:inter_token_latency_seconds"),
            FittedField("step_overhead_s", 1.09e-3, 2.6e-4, 1e-3, 10**6, 24, "vllm:inter_token_latency_seconds"),
        ),
        decode_windows=24,
        prefill_windows=24,
        rms_error=0.078,
        prior_rms_error=0.429,
    )


def test_configmap_round_trip_and_overlay(tmp_path: Path) -> None:
    cm = profile_configmap(_calibration(), "kvscale-system", "2026-11-28T00:30:00Z")
    name = cm["metadata"]["name"]
    assert name == profile_name(KEY) and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
    labels = cm["metadata"]["labels"]
    assert labels["kvscale.io/gpu"] == "H100-SXM" and labels["kvscale.io/engine"] == "vllm"
    assert all(len(v) <= 63 and re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?", v) for v in labels.values())
    stored = read_profile(cm, KEY)
    assert stored is not None and not stored.pinned and stored.engine == "vllm"
    assert stored.updates == {
        "matmul_efficiency_factor": 0.484,
        "sequence_overhead_s": 0.000204,
        "step_overhead_s": 0.00109,
    }
    assert "± 0.01" in cm["data"]["summary"] and "4421 samples" in cm["data"]["summary"]
    # Its overlay.yaml is a catalog overlay as it stands.
    path = tmp_path / "overlay.yaml"
    path.write_text(cm["data"]["overlay.yaml"])
    assert load_catalog(path).engine("vllm").matmul_efficiency_factor == 0.484


def test_another_configuration_or_a_broken_body_is_not_planned_with() -> None:
    cm = profile_configmap(_calibration(), "ns", "now")
    assert read_profile(cm, KEY.replace("H100-SXM", "A100-80GB")) is None
    broken = {**cm, "data": {"overlay.yaml": "engines: [1, 2"}}
    assert read_profile(broken, KEY) is None
    empty = {**cm, "data": {"overlay.yaml": "engines: {vllm: {fitted: x}}"}}
    assert read_profile(empty, KEY) is None
    unlabelled = {**cm, "metadata": {**cm["metadata"], "labels": {}}}
    assert read_profile(unlabelled, KEY) is None


def test_a_pin_is_read() -> None:
    cm = profile_configmap(_calibration(), "ns", "now")
    cm["metadata"]["annotations"][PINNED_ANNOTATION] = "true"
    stored = read_profile(cm, KEY)
    assert stored is not None and stored.pinned


def test_hysteresis_moves_only_beyond_the_error() -> None:
    stored = {"matmul_efficiency_factor": 0.484, "sequence_overhead_s": 204e-6, "step_overhead_s": 1.09e-3}
    assert moves(stored, _calibration(f=0.49)) == []  # within 5% and 2 errors: noise
    assert moves(stored, _calibration(f=0.40, err=0.05)) == []  # 17% but within 2 standard errors
    (moved,) = moves(stored, _calibration(f=0.40, err=0.01))
    assert (
        moved.name == "matmul_efficiency_factor" and moved.describe() == "matmul_efficiency_factor 0.484 -> 0.4 (-17%)"
    )
    # Against the catalog (nothing stored yet), a fit far from it moves.
    assert [m.name for m in moves({}, _calibration())] == ["matmul_efficiency_factor", "sequence_overhead_s"]
    text = replan_message(KEY, moves({}, _calibration()), 1, 3)
    assert text.startswith(f"Calibrated profile of {KEY}: matmul_efficiency_factor 1 -> 0.484 (-52%)")
    assert text.endswith("replicas 1 -> 3")


def test_predicted_against_observed() -> None:
    base, true = _configs()
    windows = _measured(true, (2, 8, 32, 64), noise=0.0)
    against_catalog = compare(base, windows)
    assert against_catalog is not None
    assert against_catalog.predicted_gap_s < 0.8 * against_catalog.observed_gap_s  # the catalog is optimistic
    calibrated = fit(base, windows)
    after = compare(with_fields(base, calibrated.updates()), windows)
    assert after is not None and abs(after.predicted_gap_s / after.observed_gap_s - 1) < 0.05
    assert abs(after.predicted_prefill_s / after.observed_prefill_s - 1) < 0.05
    assert "observed" in after.describe()
    assert compare(base, []) is None
    assert yaml.safe_load(yaml.safe_dump(calibrated.overlay()))["engines"]["vllm"]["fitted"].startswith(
        "kvscale calibrate"
    )
