"""kvscale's step-time model against step times measured on a GPU by benchmarks/device_roofline.py.

The measured stack is plain torch (cuBLAS GEMMs, torch's SDPA, unfused norms and rotary, CUDA
graphs for decode), not vLLM: no scheduler, sampler, detokenizer or paged KV. So the primary
comparison is the model's roofline floor (StepTime.roofline_s: the GEMMs' and the attention's
rooflines added) for the catalog GPU that matches the device (TP 1, bf16, vLLM profile: its
GEMM-size curve and chunk budget); the vLLM step (floor + the engine's per-layer and per-step
overheads) is printed beside it and is expected to sit above a stack that has none of the
engine's CPU work. The `one max` column is the form the model had before 2026-11-26, one
max(compute_s, memory_s) over the whole step, plus the per-layer cost.

Errors are predicted / measured - 1; summaries are of |error| (median and p90, nearest rank,
as benchmarks/accuracy.py). The 70B rows were measured with 8 layers and are scaled to 80
(head + (stack - head) x 80 / 8) before they are compared.

Run: PYTHONPATH=. .venv/bin/python benchmarks/device_compare.py benchmarks/data/device-roofline-*.json
     [--gpu H100-SXM]  (default: the catalog GPU whose node label matches the device's name)
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscale.sizing.catalog import Catalog, GpuSpec, default_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.roofline import StepTime, decode_step, prefill

# The profile without the CPU-side and GEMM-share fit of a serving engine (engines.yaml vllm-0.2): the
# stack is plain torch, and only the per-layer and per-step overheads appear, in the step column.
ENGINE = "vllm-0.2"


@dataclass(frozen=True)
class Comparison:
    model: str
    kind: str  # prefill | decode
    sequences: int
    prompt_tokens: int
    context_tokens: int
    mode: str
    measured_s: float
    predicted: StepTime
    layers: int
    layer_overhead_s: float  # the engine's per-layer cost x layers (decode or prefill), no per-step cost

    @property
    def with_layers_s(self) -> float:
        """The floor plus the engine's per-layer costs: kvscale's step less its per-step
        (scheduler, sampling, detokenization) cost, which a bare torch stack does not have."""
        return self.floor_s + self.layer_overhead_s

    @property
    def with_layers_error(self) -> float:
        return relative_error(self.with_layers_s, self.measured_s)

    @property
    def one_max_s(self) -> float:
        """The step's roofline as one max over its summed compute and memory times (the GEMMs'
        and the attention's together), plus the per-layer cost: the model's form before it
        added the ops' rooflines."""
        return max(self.predicted.compute_s, self.predicted.memory_s) + self.layer_overhead_s

    @property
    def one_max_error(self) -> float:
        return relative_error(self.one_max_s, self.measured_s)

    @property
    def label(self) -> str:
        if self.kind == "prefill":
            return f"prefill {self.sequences} x {self.prompt_tokens}"
        return f"decode b{self.sequences} ctx {self.context_tokens}"

    @property
    def floor_s(self) -> float:
        return self.predicted.roofline_s

    @property
    def floor_error(self) -> float:
        return relative_error(self.floor_s, self.measured_s)

    @property
    def step_error(self) -> float:
        return relative_error(self.predicted.seconds, self.measured_s)

    @property
    def bound(self) -> str:
        """The larger side of the step (its summed compute or memory time)."""
        return "compute" if self.predicted.compute_s >= self.predicted.memory_s else "memory"

    @property
    def mixed(self) -> bool:
        """The GEMMs wait on one side and the attention on the other (the floor is above both sums'
        larger one)."""
        return self.floor_s > max(self.predicted.compute_s, self.predicted.memory_s) * (1 + 1e-9)

    @property
    def achieved(self) -> float:
        """What the GPU did at the measured time on the bound side: the modelled rate x floor /
        measured (a step bound on one side: the model's own FLOPs, or bytes, over the measured
        time)."""
        return self.modelled * self.floor_s / self.measured_s

    @property
    def modelled(self) -> float:
        """The rate the model assumes for the bound side (FLOP/s or bytes/s)."""
        if self.bound == "compute":
            return self.predicted.flops_per_gpu / self.predicted.compute_s
        return self.predicted.bytes_per_gpu / self.predicted.memory_s

    @property
    def gap_per_layer_s(self) -> float:
        """Measured time above the floor, per layer: what the stack spends outside the roofline."""
        return (self.measured_s - self.floor_s) / self.layers


def relative_error(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile, as benchmarks/accuracy.py reports its p90."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(errors: list[float]) -> tuple[float, float]:
    """Median and p90 of |error|."""
    values = [abs(e) for e in errors]
    return statistics.median(values), quantile(values, 0.9)


def catalog_gpu(catalog: Catalog, device_name: str, override: str | None = None) -> GpuSpec:
    """The catalog GPU for torch's device name ('NVIDIA H100 80GB HBM3' is the node label
    NVIDIA-H100-80GB-HBM3, H100-SXM's)."""
    if override:
        return catalog.gpu(override)
    gpu = catalog.gpu_for_node_label(device_name.strip().replace(" ", "-"))
    if gpu is None:
        raise ValueError(f"no catalog GPU has the node label of {device_name!r}; name one with --gpu")
    return gpu


def serving_config(catalog: Catalog, model: str, gpu: GpuSpec) -> ServingConfig:
    """The configuration the planner builds for the model on one GPU at bf16 with vLLM."""
    return ServingConfig.build(catalog, catalog.model(model), gpu, "bf16", 1, "auto", ENGINE)


def measured_step_s(row: dict[str, Any]) -> float:
    """The measured step scaled from the built layers to the model's: the embedding, final
    norm and lm_head (head_s) once, the layers (stack_s - head_s) x target / built."""
    head, stack = float(row["head_s"]), float(row["stack_s"])
    return head + (stack - head) * int(row["target_layers"]) / int(row["built_layers"])


def predict(cfg: ServingConfig, row: dict[str, Any]) -> StepTime:
    if row["kind"] == "prefill":
        return prefill(cfg, int(row["sequences"]), int(row["prompt_tokens"]))
    return decode_step(cfg, int(row["sequences"]), float(row["context_tokens"]))


def compare(rows: list[dict[str, Any]], catalog: Catalog, gpu: GpuSpec) -> list[Comparison]:
    """One comparison per measured row (rows skipped or failed on the device are left out)."""
    configs: dict[str, ServingConfig] = {}
    out = []
    for row in rows:
        if row.get("kind") not in ("prefill", "decode") or "stack_s" not in row:
            continue
        model = str(row["model"])
        cfg = configs.setdefault(model, serving_config(catalog, model, gpu))
        if cfg.model.layers != int(row["target_layers"]):
            raise ValueError(f"{model}: scaled to {row['target_layers']} layers, the catalog has {cfg.model.layers}")
        out.append(
            Comparison(
                model=model,
                kind=str(row["kind"]),
                sequences=int(row["sequences"]),
                prompt_tokens=int(row["prompt_tokens"]),
                context_tokens=int(row["context_tokens"]),
                mode=str(row["mode"]),
                measured_s=measured_step_s(row),
                predicted=predict(cfg, row),
                layers=cfg.model.layers,
                layer_overhead_s=cfg.model.layers
                * (
                    cfg.engine.prefill_layer_overhead_s
                    if row["kind"] == "prefill"
                    else cfg.engine.decode_layer_overhead_s
                ),
            )
        )
    return out


def stack_weight_bytes(shape: dict[str, Any]) -> float:
    """Weight bytes one step of the measured stack reads, scaled to the target layers: the
    layers and lm_head (the embedding only by rows); bf16."""
    h, d = shape["hidden"], shape["head_dim"]
    qkv = (shape["heads"] + 2 * shape["kv_heads"]) * d * h
    layer = qkv + shape["heads"] * d * h + 3 * h * shape["intermediate"] + 2 * h
    return 2.0 * float(layer * shape["target_layers"] + shape["vocab"] * h + h)


def _rate(c: Comparison, value: float) -> str:
    return f"{value / 1e12:5.0f} TF/s" if c.bound == "compute" else f"{value / 1e12:5.2f} TB/s"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:7.1f}ms" if seconds >= 0.1 else f"{seconds * 1e3:7.2f}ms"


def report(data: dict[str, Any], gpu: GpuSpec, comparisons: list[Comparison], catalog: Catalog) -> str:
    lines = [
        f"Device: {data['device']} (torch {data['torch']}, CUDA {data.get('cuda')}), measured {data['date_utc']}; "
        f"catalog GPU {gpu.name}: {gpu.flops_16bit_per_s / 1e12:.0f} TFLOP/s bf16 x matmul_efficiency "
        f"{gpu.matmul_efficiency:.3f}, {gpu.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s x bandwidth_efficiency "
        f"{gpu.bandwidth_efficiency:.3f}; engine profile {ENGINE}, TP 1, bf16."
    ]
    probes = data.get("probes") or {}
    if probes:
        mm, cp = probes["matmul_bf16_flops_per_s"], probes["copy_read_write_bytes_per_s"]
        lines.append(
            f"Device probes: bf16 {probes['matmul_bf16_n']}^3 matmul {mm / 1e12:.0f} TFLOP/s "
            f"({mm / gpu.flops_16bit_per_s:.2f} of the catalog peak); device copy {cp / 1e12:.2f} TB/s read+write "
            f"({cp / gpu.hbm_bandwidth_bytes_per_s:.2f} of the catalog HBM bandwidth)."
        )
    for shape in data.get("shapes", []):
        if shape["name"] in {c.model for c in comparisons}:
            model = catalog.model(shape["name"])
            lines.append(
                f"{shape['name']}: built {shape['built_layers']} layers, compared at {shape['target_layers']}; "
                f"kvscale reads {2.0 * model.params / 1e9:.2f} GB of weights per step (all {model.params / 1e9:.2f} B "
                f"params), the stack {stack_weight_bytes(shape) / 1e9:.2f} GB (embedding by rows only)."
            )
    header = (
        f"{'model':<13} {'step':<20} {'measured':>9} {'floor':>9} {'bound':<7} {'err':>6} {'+layers':>9} {'err':>6} "
        f"{'vLLM step':>9} {'err':>6} {'one max':>9} {'err':>6} {'achieved':>11} {'modelled':>11} {'gap/layer':>9}"
    )
    lines += ["", header, "-" * len(header)]
    for c in comparisons:
        bound = "mixed" if c.mixed else c.bound
        lines.append(
            f"{c.model:<13} {c.label:<20} {_ms(c.measured_s)} {_ms(c.floor_s)} {bound:<7} {c.floor_error:+6.0%} "
            f"{_ms(c.with_layers_s)} {c.with_layers_error:+6.0%} {_ms(c.predicted.seconds)} {c.step_error:+6.0%} "
            f"{_ms(c.one_max_s)} {c.one_max_error:+6.0%} {_rate(c, c.achieved):>11} {_rate(c, c.modelled):>11} "
            f"{c.gap_per_layer_s * 1e6:7.0f}us"
        )
    modes = sorted({c.mode for c in comparisons})
    lines.append(f"modes: {', '.join(modes)} (decode in CUDA graphs unless a row says otherwise)")
    lines.append("mixed: the GEMMs wait on compute and the attention on memory; achieved/modelled on the larger side")
    lines.append("")
    columns = ("floor", "+layers", "vLLM step", "one max")
    lines.append(f"{'|error| median / p90':<24} {'n':>3} " + " ".join(f"{c:>16}" for c in columns))
    groups = [
        ("all", comparisons),
        ("prefill", [c for c in comparisons if c.kind == "prefill"]),
        ("decode", [c for c in comparisons if c.kind == "decode"]),
        *(
            (f"{model} {kind}", [c for c in comparisons if c.model == model and c.kind == kind])
            for model in dict.fromkeys(c.model for c in comparisons)
            for kind in ("prefill", "decode")
        ),
    ]
    for name, group in groups:
        if group:
            cells = []
            for errors in (
                [c.floor_error for c in group],
                [c.with_layers_error for c in group],
                [c.step_error for c in group],
                [c.one_max_error for c in group],
            ):
                median, p90 = summary(errors)
                cells.append(f"{median:7.1%} / {p90:6.1%}")
            lines.append(f"{name:<24} {len(group):>3} " + " ".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def load_measurements(path: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """device_roofline.py's JSON, or an error that names the file and what it lacks."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        parser.error(f"{path}: {exc} (give the device_roofline.json that benchmarks/device_roofline.py wrote)")
    missing = [k for k in ("device", "rows") if not isinstance(data, dict) or k not in data]
    if missing:
        parser.error(f"{path}: no {' or '.join(repr(k) for k in missing)}: not benchmarks/device_roofline.py output")
    return dict(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, help="device_roofline.py's output")
    parser.add_argument("--gpu", default=None, help="catalog GPU to predict for (default: from the device name)")
    args = parser.parse_args()
    data = load_measurements(args.json, parser)
    catalog = default_catalog()
    try:
        gpu = catalog_gpu(catalog, str(data["device"]), args.gpu)
    except (KeyError, ValueError) as exc:
        parser.error(f"--gpu: {exc}")
    comparisons = compare(data["rows"], catalog, gpu)
    print(report(data, gpu, comparisons, catalog))
    left_out = [r for r in data["rows"] if "stack_s" not in r]
    for r in left_out:
        print(f"not compared: {r.get('model')} {r.get('kind')} {r.get('sequences')} {r.get('mode', r.get('error'))}")


if __name__ == "__main__":
    main()
