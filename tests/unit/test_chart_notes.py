"""The chart's install notes show an InferenceService a chart-only user can apply as it is: they
pointed at deploy/samples/, which only a clone of the repository has (issue 31, LOW)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import yaml

from kvscale.api.models import parse_spec

NOTES = Path(__file__).resolve().parents[2] / "charts" / "kvscale" / "templates" / "NOTES.txt"


def test_the_notes_sample_is_a_valid_inference_service_and_no_path_into_the_repository() -> None:
    text = NOTES.read_text()
    assert "deploy/samples" not in text
    heredoc = re.search(r"<<'EOF'\n(.*?)\n\s*EOF\n", text, re.S)
    assert heredoc is not None
    body = yaml.safe_load(textwrap.dedent(heredoc.group(1)))
    assert body["kind"] == "InferenceService" and body["apiVersion"] == "kvscale.io/v1alpha1"
    spec = parse_spec(body["spec"])
    assert spec.scaling.mode == "recommend"
