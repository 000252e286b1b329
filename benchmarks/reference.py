"""Readers for the published measurements in benchmarks/data/reference: the TensorRT-LLM 0.9.0
static-batching table and the NIM closed-loop sweeps, mapped onto kvscale catalog names."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent / "data" / "reference"  # copies of benchmarks/data/reference
STATIC_CSV = REFERENCE / "trtllm-0.9.0-static.csv"
SWEEPS_CSV = REFERENCE / "nim-genai-perf-sweeps.csv"

MODELS = {
    "LLaMA v2 7B": "llama-2-7b",
    "LLaMA v2 13B": "llama-2-13b",
    "LLaMA v2 70B": "llama-2-70b",
    "GPTJ 6B": "gpt-j-6b",
    "Mistral 7B": "mistral-7b",
    "Mixtral 8x7B": "mixtral-8x7b",
    "Falcon 180B": "falcon-180b",
    "meta-llama3-8b-instruct": "llama-3.1-8b",  # Llama 3 8B: the same shapes as 3.1 8B
    "meta-llama3-70b-instruct": "llama-3.1-70b",
}
GPUS = {
    "A100-SXM4-80GB": "A100-80GB",
    "L40S": "L40S",
    "L40": "L40",
    "H100 NVL": "H100-NVL",
    "H200 141GB HBM3": "H200",
    "GH200 120GB": "GH200",
}
# The table's precisions: FP8 = fp8 weights and fp8 KV cache; Mixed = fp16.
PRECISIONS = {"FP8": ("fp8", "fp8"), "Mixed": ("fp16", "fp16")}


@dataclass(frozen=True)
class StaticRow:
    model: str
    gpu: str
    precision: str
    kv_precision: str
    tensor_parallel: int
    batch: int
    input_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float
    throughput_tokens_per_s: float
    peak_memory_gb: float

    @property
    def regime(self) -> str:
        """small batch (<= 8), long prompt (2048 in), else large batch."""
        if self.batch <= 8:
            return "small batch"
        if self.input_tokens >= 2048:
            return "long prompt"
        return "large batch"


def static_rows(path: Path = STATIC_CSV) -> list[StaticRow]:
    """Rows that ran (every latency present); empty cells did not run and are skipped."""
    rows = []
    with path.open() as f:
        for r in csv.DictReader(f):
            if not (
                r["1st Token Latency (ms)"] and r["Token-to-token Latency (ms)"] and r["Throughput (tokens / sec)"]
            ):
                continue
            inp, out = (int(x) for x in r["Input/Output Lengths"].split(","))
            precision, kv = PRECISIONS[r["Precision"]]
            rows.append(
                StaticRow(
                    model=MODELS[r["Model"]],
                    gpu=GPUS[r["GPU"]],
                    precision=precision,
                    kv_precision=kv,
                    tensor_parallel=int(r["Tensor Model Parallel Size"]),
                    batch=int(r["Batch Size"]),
                    input_tokens=inp,
                    output_tokens=out,
                    ttft_s=float(r["1st Token Latency (ms)"]) / 1e3,
                    tpot_s=float(r["Token-to-token Latency (ms)"]) / 1e3,
                    throughput_tokens_per_s=float(r["Throughput (tokens / sec)"]),
                    peak_memory_gb=float(r["GPU Peak Memory Usage (GB)"] or "nan"),
                )
            )
    return rows


@dataclass(frozen=True)
class SweepPoint:
    model: str
    gpu: str
    precision: str
    tensor_parallel: int
    concurrency: int
    input_tokens: int
    output_tokens: int
    throughput_tokens_per_s: float
    ttft_mean_s: float
    itl_mean_s: float


def sweep_points(path: Path = SWEEPS_CSV) -> list[SweepPoint]:
    points = []
    with path.open() as f:
        for r in csv.DictReader(f):
            points.append(
                SweepPoint(
                    model=MODELS[r["task_inputs-model"]],
                    gpu=GPUS[r["task_inputs-GPU"]],
                    precision=r["task_inputs-precision"],
                    tensor_parallel=int(r["task_inputs-n_gpus"]),
                    concurrency=int(r["input_config-concurrency"]),
                    input_tokens=round(float(r["input_config-synthetic_input_tokens_mean"])),
                    output_tokens=round(float(r["input_config-output_tokens_mean"])),
                    throughput_tokens_per_s=float(r["output_token_throughput-avg"]),
                    ttft_mean_s=float(r["time_to_first_token-avg"]) / 1e9,
                    itl_mean_s=float(r["inter_token_latency-avg"]) / 1e9,
                )
            )
    return points
