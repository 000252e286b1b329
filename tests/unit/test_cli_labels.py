"""CLI output that says what each figure is (issue 39's MED/LOW list): a figure shown twice at
two loads names each load, a regime label agrees with the header above it, a field in a file
is named by its path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kvscale.cli import app

runner = CliRunner()


def _flat(text: str) -> str:
    """The output with rich's wrapping undone (it wraps at spaces, at 160 columns into a pipe)."""
    return " ".join(text.split())


def test_plan_labels_the_figures_at_the_load_and_at_the_replicas_max() -> None:
    # Issue 39: one plan printed "p95 TPOT" at the planned load and again at the replica's
    # maximum rate (the binds line) without saying which was which.
    args = ["plan", "-m", "llama-3.1-8b", "--ttft", "500ms", "--tpot", "50ms", "--rps", "20"]
    args += ["--input", "1000", "--output", "200", "--disaggregation", "off"]
    chosen: dict[str, Any] = json.loads(runner.invoke(app, [*args, "--json"]).stdout)["chosen"]
    human = runner.invoke(app, args)
    assert human.exit_code == 0, human.output
    out = _flat(human.stdout)
    per_replica = 20 / chosen["replicas"]
    assert f"predicted at this load ({per_replica:g} req/s per replica): p95 TTFT {chosen['ttft_ms']:.0f} ms" in out
    most = chosen["rate_per_replica_max"]
    assert f"binds at {most:.2f} req/s per replica (the max): p95 TPOT" in out


def test_roofline_header_says_what_its_rows_say() -> None:
    # Issue 39: the header said "compute-bound above B*" and the rows above B* read `overhead`
    # (the engine's per-sequence costs are the decode step's largest term there).
    args = ["roofline", "-m", "llama-3.1-8b", "--gpu", "H100-SXM"]
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    human = runner.invoke(app, args)
    assert human.exit_code == 0, human.output
    header = _flat(human.stdout.split("┏")[0])
    assert "compute-bound above" not in header
    above = [p for p in data["points"] if p["batch"] > data["ideal_batch"]]
    assert above and {p["limited_by"] for p in above} == {"overhead"}  # the model's own accounting
    first = min(p["batch"] for p in data["points"] if p["limited_by"] == "overhead")
    last = data["points"][-1]["batch"]
    assert f"overhead-bound (the engine's per-step and per-sequence costs) at batch {first}-{last}" in header
    assert header.index("bandwidth-bound at batch 1-") < header.index("overhead-bound")


def test_a_fleet_file_names_the_services_model_field_and_the_yaml_line(tmp_path: Path) -> None:
    # Issue 39: a model typo inside a fleet file was reported as `--model: unknown model`, and
    # malformed YAML had no line number.
    fleet = tmp_path / "fleet.yaml"
    service = (
        "  - {{name: {name}, model: {model}, slo: {{ttft: 1s, tpot: 60ms}}, load: 'poisson:rate=1,duration=1m'}}\n"
    )
    fleet.write_text(
        "budget: {H100-SXM: 4}\nservices:\n"
        + service.format(name="chat", model="llama-3.1-8b")
        + service.format(name="rag", model="llama-3.1-8bb")
    )
    typo = runner.invoke(app, ["simulate", "--fleet", str(fleet)])
    assert typo.exit_code == 2 and "Traceback" not in typo.output
    said = _flat(typo.stderr)
    assert f"--fleet {fleet}: services.1.model: unknown model 'llama-3.1-8bb'. Did you mean llama-3.1-8b" in said
    fleet.write_text("budget: {H100-SXM: 4}\nservices:\n  - name: chat\n    model: [llama\n")
    malformed = runner.invoke(app, ["simulate", "--fleet", str(fleet)])
    assert malformed.exit_code == 2 and "Traceback" not in malformed.output
    assert f"--fleet {fleet}: not YAML: line 5, column 1: expected ',' or ']'" in _flat(malformed.stderr)
    assert "that started at line 4, column 12" in _flat(malformed.stderr)


def test_a_config_json_plan_says_up_front_why_it_has_no_engine_line(tmp_path: Path) -> None:
    # Issue 39: a config.json model planned with no engine line and said why only at the end,
    # after the alternatives' and rejections' tables.
    config = tmp_path / "in-house-8b" / "config.json"
    config.parent.mkdir()
    fields = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32}
    fields |= {"num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    config.write_text(json.dumps({**fields, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}))
    args = ["plan", "-m", str(config), "--ttft", "500ms", "--tpot", "50ms", "--rps", "5", "--input", "512"]
    human = runner.invoke(app, [*args, "--output", "256"])
    assert human.exit_code == 0, human.output
    lines = human.stdout.splitlines()
    assert lines[1].startswith("engine: no engine command: a custom architecture or config.json file names no")
    profile = json.loads(runner.invoke(app, [*args, "--output", "256", "--json"]).stdout)["engine_profile"]
    assert f"(sized with the {profile} profile)" in _flat("\n".join(lines[1:3]))
    assert sum("no engine command" in line for line in lines) == 1  # said once, not again at the end


def test_help_texts_wrap_to_the_terminal() -> None:
    # Issue 39: hard line breaks in `--help`: typer's rich help printed a docstring's second
    # paragraph with the source's own line breaks, mid-sentence on a wide terminal.
    # COLUMNS only: typer reads TERMINAL_WIDTH once, when its rich help is first imported, and
    # a width fixed that way stayed for every later test in the process (test_static_fleet's
    # help at COLUMNS=400 then wrapped inside its panel and failed in the parallel suite)
    wide = runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "220"})
    assert wide.exit_code == 0, wide.output
    assert any(
        'instead of a plan: "what does the command I run today give me"' in line for line in wide.stdout.splitlines()
    )
    import typer

    def commands(group: Any) -> list[Any]:
        subs = getattr(group, "commands", {})
        return [group, *(c for sub in subs.values() for c in commands(sub))]

    for command in commands(typer.main.get_command(app)):
        for paragraph in (command.help or "").partition("\f")[0].split("\n\n"):
            assert "\n" not in paragraph.strip(), (command.name, paragraph)


def test_bench_and_calibrate_read_a_url_with_one_parser(monkeypatch: Any) -> None:
    # Issue 39: calibrate exited 1 on a URL without a scheme where bench exited 2; each had its
    # own check. Both now call common.http_url at the edge, and say the same thing.
    import kvscale.cli.bench as bench
    import kvscale.cli.calibrate  # noqa: F401  (registers the command)

    for url in ("localhost:9090", "http://127.0.0.1:99999", "ftp://host"):
        said = []
        for option, args in (("--endpoint", ["bench", "--model", "m"]), ("--prometheus", ["calibrate"])):
            out = runner.invoke(app, [*args, option, url, "--gpu", "H100-SXM"])
            assert out.exit_code == 2 and "Traceback" not in out.output, out.output
            said.append(_flat(out.stderr).replace(option, "OPTION").split(", e.g.")[0])
        assert said[0] == said[1], said
    seen: list[str] = []

    def spy(url: str, option: str, example: str) -> str:
        seen.append(option)
        return url

    monkeypatch.setattr(bench, "http_url", spy)
    runner.invoke(app, ["bench", "--model", "m", "--endpoint", "nowhere", "--rps", "0"])
    assert seen == ["--endpoint"]
