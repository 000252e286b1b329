#!/usr/bin/env python3
"""Time Llama-shaped decoder stacks on one GPU, to check kvscale's step-time model against it.

Self-contained: torch and the standard library only (it runs on a GPU machine with no
kvscale installed). Builds decoder stacks with random bf16 weights in plain torch:
token embedding, per layer RMSNorm, one fused QKV GEMM, rotary embedding (rotate-half, one
position table), attention through torch.nn.functional.scaled_dot_product_attention, the
output projection, RMSNorm and a SwiGLU MLP (fused gate+up GEMM, SiLU x up, down GEMM),
then the final RMSNorm and the lm_head GEMM on the last token of each sequence (as an
engine computes logits only where it samples). No sampling, no scheduler, no paged KV.

Shapes: Llama-3.1-8B whole (32 layers) and Llama-3.1-70B's layer (hidden 8192, 64 heads,
8 KV heads, intermediate 28672) built with 8 layers; the 70B rows are scaled to 80 layers
as head + (stack - head) x 80 / 8, where `head` is the embedding, final norm and lm_head
timed alone.

Measures, per shape:
- prefill of 1 x 512, 1 x 2048, 1 x 8192 and 8 x 512 tokens (causal, eager, as engines run
  prefill);
- decode steps, one new token per sequence attending to a contiguous KV cache of `context`
  tokens, at batch 1, 8, 32, 128, 256 and context 1024, 4096, captured in a CUDA graph (eager
  if capture fails; the row says which). The new token's K and V are written into the cache.
  When the per-layer caches do not all fit, layers share a pool of distinct cache buffers
  (the row's kv_buffers): each buffer is far larger than L2 and the weights stream through
  L2 between two uses, so sharing does not make the reads cheaper.
Also a bf16 8192^3 matmul and a device-to-device copy, the GPU's own achievable peaks.

Timing: CUDA events around `inner` calls, after warm-ups; the median of `reps` is reported.
Writes JSON to $OUT/device_roofline.json (or --out) and prints a table.

  python3 benchmarks/device_roofline.py            # on the GPU machine
  python3 benchmarks/device_roofline.py --tiny     # tiny dims on the CPU, eager: a smoke test
"""

from __future__ import annotations

import os
import sys

# `python3 benchmarks/device_roofline.py` puts benchmarks/ first on sys.path, where
# benchmarks/operator.py would shadow the standard library's `operator` (imported by enum,
# random, ...): drop it before anything else is imported.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse
import datetime
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    name: str  # the catalog model the comparison maps this shape to
    built_layers: int
    target_layers: int  # the measured stack is scaled to this many layers
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


LLAMA_8B = Shape("llama-3.1-8b", 32, 32, 4096, 32, 8, 128, 14336, 128256)
LLAMA_70B = Shape("llama-3.1-70b", 8, 80, 8192, 64, 8, 128, 28672, 128256)
TINY = Shape("tiny", 2, 4, 256, 4, 2, 64, 512, 1000)

PREFILLS = ((1, 512), (1, 2048), (1, 8192), (8, 512))  # (sequences, prompt tokens)
DECODE_BATCHES = (1, 8, 32, 128, 256)
DECODE_CONTEXTS = (1024, 4096)
EAGER_DECODE = ((1, 1024), (32, 1024))  # (batch, context) also timed without a graph
TINY_PREFILLS = ((1, 16), (2, 16))
TINY_BATCHES = (1, 4)
TINY_CONTEXTS = (32,)
EPS = 1e-5
GIB = 1024**3


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


def rope_table(positions: torch.Tensor, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Stack:
    """Random-weight Llama decoder: weights as [out, in] (F.linear), like the checkpoints."""

    def __init__(self, s: Shape, device: torch.device, dtype: torch.dtype, gqa: str) -> None:
        self.s, self.device, self.dtype, self.gqa = s, device, dtype, gqa
        qkv = (s.heads + 2 * s.kv_heads) * s.head_dim

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=device, dtype=dtype) * 0.02

        self.embed = w(s.vocab, s.hidden)
        self.layers = [
            {
                "ln1": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": w(qkv, s.hidden),
                "o": w(s.hidden, s.heads * s.head_dim),
                "ln2": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": w(2 * s.intermediate, s.hidden),
                "down": w(s.hidden, s.intermediate),
            }
            for _ in range(s.built_layers)
        ]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.vocab, s.hidden)

    def weight_bytes(self) -> int:
        tensors = [self.embed, self.norm, self.lm_head, *(t for layer in self.layers for t in layer.values())]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _mlp(self, x: torch.Tensor, layer: dict[str, torch.Tensor]) -> torch.Tensor:
        h = F.rms_norm(x, (self.s.hidden,), layer["ln2"], EPS)
        gate, up = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, layer["down"])

    def _qkv(
        self, x: torch.Tensor, layer: dict[str, torch.Tensor], cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.s
        b, t, _ = x.shape
        h = F.rms_norm(x, (s.hidden,), layer["ln1"], EPS)
        q, k, v = F.linear(h, layer["qkv"]).split(
            (s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim), dim=-1
        )
        q = rotate(q.view(b, t, s.heads, s.head_dim), cos, sin)
        k = rotate(k.view(b, t, s.kv_heads, s.head_dim), cos, sin)
        return q, k, v.view(b, t, s.kv_heads, s.head_dim)

    def head(self, ids: torch.Tensor) -> torch.Tensor:
        """Embedding, final norm and lm_head alone (what the layer scaling leaves out)."""
        x = F.embedding(ids, self.embed)
        return F.linear(F.rms_norm(x[:, -1], (self.s.hidden,), self.norm, EPS), self.lm_head)

    def prefill(self, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        s = self.s
        b, t = ids.shape
        x = F.embedding(ids, self.embed)
        for layer in self.layers:
            q, k, v = self._qkv(x, layer, cos[:, None], sin[:, None])
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if self.gqa == "enable_gqa":
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                group = s.heads // s.kv_heads
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(o.transpose(1, 2).reshape(b, t, s.heads * s.head_dim), layer["o"])
            x = self._mlp(x, layer)
        return F.linear(F.rms_norm(x[:, -1], (s.hidden,), self.norm, EPS), self.lm_head)

    def decode(
        self, ids: torch.Tensor, caches: list[torch.Tensor], context: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """One token per sequence; caches[i % len] is layer i's [2, batch, kv_heads, context + 1,
        head_dim]: the new K, V go to slot `context`, then the query heads of each KV head attend
        to all context + 1 slots as one group of heads/kv_heads queries (FlashDecoding's GQA
        packing; no mask is needed for the last position)."""
        s = self.s
        b = ids.shape[0]
        group = s.heads // s.kv_heads
        x = F.embedding(ids, self.embed)  # [b, 1, hidden]
        for i, layer in enumerate(self.layers):
            cache = caches[i % len(caches)]
            q, k, v = self._qkv(x, layer, cos, sin)  # [b, 1, heads, d]
            cache[0, :, :, context].copy_(k[:, 0])
            cache[1, :, :, context].copy_(v[:, 0])
            o = F.scaled_dot_product_attention(q.view(b, s.kv_heads, group, s.head_dim), cache[0], cache[1])
            x = x + F.linear(o.reshape(b, 1, s.heads * s.head_dim), layer["o"])
            x = self._mlp(x, layer)
        return F.linear(F.rms_norm(x[:, -1], (s.hidden,), self.norm, EPS), self.lm_head)


class Timer:
    def __init__(self, device: torch.device, warmup: int, reps: int) -> None:
        self.cuda = device.type == "cuda"
        self.warmup, self.reps = warmup, reps

    def __call__(self, fn: Callable[[], object], inner: int = 1) -> dict[str, Any]:
        for _ in range(self.warmup):
            fn()
        self.sync()
        samples: list[float] = []
        for _ in range(self.reps):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3 / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples.append((time.perf_counter() - t0) / inner)
        return {"median_s": statistics.median(samples), "samples_s": samples, "inner": inner}

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def graphed(fn: Callable[[], torch.Tensor], device: torch.device, use: bool) -> tuple[Callable[[], object], str]:
    """A CUDA-graph replay of fn, or fn itself (mode 'eager', with the reason) if capture fails."""
    if not use:
        return fn, "eager"
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay, "graph"
    except Exception as exc:  # any capture failure falls back to eager, recorded
        torch.cuda.synchronize()
        return fn, f"eager (graph capture failed: {type(exc).__name__}: {str(exc)[:160]})"


def pick_gqa(device: torch.device, dtype: torch.dtype) -> str:
    """'enable_gqa' if SDPA takes it on this device, else 'repeat_interleave'."""
    q = torch.randn(1, 4, 8, 64, device=device, dtype=dtype)
    kv = torch.randn(1, 2, 8, 64, device=device, dtype=dtype)
    try:
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return "enable_gqa"
    except Exception:
        return "repeat_interleave"


def probes(device: torch.device, timer: Timer, tiny: bool) -> dict[str, float]:
    n = 256 if tiny else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    mm = timer(lambda: a @ b, inner=3)["median_s"]
    size = (1 << 20) if tiny else (2 << 30)  # bytes copied
    src = torch.empty(size // 2, device=device, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    cp = timer(lambda: dst.copy_(src), inner=3)["median_s"]
    return {
        "matmul_bf16_n": n,
        "matmul_bf16_flops_per_s": 2.0 * n**3 / mm,
        "copy_bytes": size,
        "copy_read_write_bytes_per_s": 2.0 * size / cp,
    }


def free_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 1 << 40
    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info(device)[0])


def scaled(stack_s: float, head_s: float, s: Shape) -> float:
    return head_s + (stack_s - head_s) * s.target_layers / s.built_layers


def prefill_row(stack: Stack, seqs: int, prompt: int, timer: Timer) -> dict[str, Any]:
    s, device = stack.s, stack.device
    ids = torch.randint(0, s.vocab, (seqs, prompt), device=device)
    cos, sin = rope_table(torch.arange(prompt, device=device), s.head_dim, stack.dtype)
    stack_t = timer(lambda: stack.prefill(ids, cos, sin))
    head_t = timer(lambda: stack.head(ids), inner=3)
    return {
        "mode": "eager",
        "kv_buffers": None,
        "stack_s": stack_t["median_s"],
        "head_s": head_t["median_s"],
        "scaled_s": scaled(stack_t["median_s"], head_t["median_s"], s),
        "samples_s": stack_t["samples_s"],
    }


def decode_row(stack: Stack, batch: int, context: int, timer: Timer, graphs: bool, eager_too: bool) -> dict[str, Any]:
    s, device, dtype = stack.s, stack.device, stack.dtype
    per_layer = 2 * batch * s.kv_heads * (context + 1) * s.head_dim * 2
    reserve = 6 * GIB if device.type == "cuda" else 0  # activations, graph pools, the allocator's slack
    buffers = min(s.built_layers, (free_bytes(device) - reserve) // per_layer)
    if buffers < 1:
        return {"mode": "skipped (KV does not fit)", "kv_buffers": 0, "kv_bytes_per_layer": per_layer}
    caches = [
        torch.empty(2, batch, s.kv_heads, context + 1, s.head_dim, device=device, dtype=dtype).normal_()
        for _ in range(buffers)
    ]
    ids = torch.randint(0, s.vocab, (batch, 1), device=device)
    cos, sin = rope_table(torch.tensor([context], device=device), s.head_dim, dtype)
    fn, mode = graphed(lambda: stack.decode(ids, caches, context, cos, sin), device, graphs)
    head_fn, _ = graphed(lambda: stack.head(ids), device, graphs)
    stack_t = timer(fn, inner=3)
    head_t = timer(head_fn, inner=3)
    row = {
        "mode": mode,
        "kv_buffers": buffers,
        "kv_bytes_per_layer": per_layer,
        "stack_s": stack_t["median_s"],
        "head_s": head_t["median_s"],
        "scaled_s": scaled(stack_t["median_s"], head_t["median_s"], s),
        "samples_s": stack_t["samples_s"],
    }
    if eager_too:
        row["eager_stack_s"] = timer(lambda: stack.decode(ids, caches, context, cos, sin))["median_s"]
    return row


def measure(
    shape: Shape, device: torch.device, timer: Timer, tiny: bool, gqa: str, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    t0 = time.perf_counter()
    stack = Stack(shape, device, torch.bfloat16, gqa)
    timer.sync()
    gb = stack.weight_bytes() / 1e9
    log(f"{shape.name}: {shape.built_layers} layers built, {gb:.2f} GB of weights, {time.perf_counter() - t0:.1f} s")
    rows: list[dict[str, Any]] = []
    graphs = device.type == "cuda" and not tiny
    cases = [("prefill", seqs, prompt, 0) for seqs, prompt in (TINY_PREFILLS if tiny else PREFILLS)]
    cases += [
        ("decode", batch, 0, context)
        for context in (TINY_CONTEXTS if tiny else DECODE_CONTEXTS)
        for batch in (TINY_BATCHES if tiny else DECODE_BATCHES)
    ]
    with torch.inference_mode():
        for kind, seqs, prompt, context in cases:
            row: dict[str, Any] = {
                "model": shape.name,
                "built_layers": shape.built_layers,
                "target_layers": shape.target_layers,
                "kind": kind,
                "sequences": seqs,
                "prompt_tokens": prompt,
                "context_tokens": context,
            }
            try:
                if kind == "prefill":
                    row |= prefill_row(stack, seqs, prompt, timer)
                else:
                    eager_too = not tiny and (seqs, context) in EAGER_DECODE
                    row |= decode_row(stack, seqs, context, timer, graphs, eager_too)
            except Exception as exc:  # one row's failure (memory, a kernel) leaves the others
                timer.sync()
                row |= {"mode": f"failed: {type(exc).__name__}: {str(exc)[:200]}", "kv_buffers": None}
            free_bytes(device)
            rows.append(row)
            log(_line(row))
    return rows


def _line(r: dict[str, Any]) -> str:
    what = (
        f"prefill {r['sequences']} x {r['prompt_tokens']}"
        if r["kind"] == "prefill"
        else f"decode batch {r['sequences']} ctx {r['context_tokens']}"
    )
    if "stack_s" not in r:
        return f"  {r['model']:<15} {what:<28} {r['mode']}"
    extra = f"  eager {r['eager_stack_s'] * 1e3:.3f} ms" if "eager_stack_s" in r else ""
    kv = f"  kv_buffers {r['kv_buffers']}" if r["kv_buffers"] is not None else ""
    return (
        f"  {r['model']:<15} {what:<28} stack {r['stack_s'] * 1e3:9.3f} ms  head {r['head_s'] * 1e3:7.3f} ms  "
        f"{r['target_layers']} layers {r['scaled_s'] * 1e3:9.3f} ms  {r['mode']}{kv}{extra}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny dims on the CPU, eager (a smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default $OUT/device_roofline.json)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per row (median reported)")
    parser.add_argument("--models", default="8b,70b", help="comma list of 8b, 70b")
    args = parser.parse_args()
    out = args.out or Path(os.environ.get("OUT", ".")) / "device_roofline.json"
    started = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {line}", flush=True)

    if args.tiny:
        device = torch.device("cpu")
        shapes = [TINY]
    else:
        if not torch.cuda.is_available():
            print("no CUDA device (use --tiny for the CPU smoke test)", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        chosen = {"8b": LLAMA_8B, "70b": LLAMA_70B}
        shapes = [chosen[m.strip()] for m in args.models.split(",") if m.strip()]
        # No silent fallback to the math SDPA backend (it materializes the score matrix): a shape
        # no fused kernel takes fails its row instead, and prefill GQA falls back to repeated KV.
        torch.backends.cuda.enable_math_sdp(False)
    timer = Timer(device, warmup=2 if not args.tiny else 1, reps=args.reps or (7 if not args.tiny else 3))
    gqa = pick_gqa(device, torch.bfloat16)
    info: dict[str, Any] = {
        "script": "benchmarks/device_roofline.py",
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "tiny": args.tiny,
        "gqa_prefill": gqa,
        "reps": timer.reps,
        "warmup": timer.warmup,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "capability": f"{props.major}.{props.minor}",
        }
        info["sdpa_math_enabled"] = torch.backends.cuda.math_sdp_enabled()
    log(f"{info['device']}  torch {info['torch']}  cuda {info['cuda']}  gqa {gqa}")
    info["probes"] = probes(device, timer, args.tiny)
    p = info["probes"]
    log(
        f"probe: bf16 {p['matmul_bf16_n']}^3 matmul {p['matmul_bf16_flops_per_s'] / 1e12:.0f} TFLOP/s; copy {p['copy_read_write_bytes_per_s'] / 1e12:.2f} TB/s (read + write)"
    )
    info["shapes"] = [asdict(s) for s in shapes]
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        try:
            rows += measure(shape, device, timer, args.tiny, gqa, log)
        except Exception as exc:  # keep what was measured; say what failed
            log(f"{shape.name}: failed: {type(exc).__name__}: {exc}")
            rows.append({"model": shape.name, "kind": "error", "error": f"{type(exc).__name__}: {exc}"})
            free_bytes(device)
        info["rows"] = rows
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(info, indent=1))  # after each shape: a late failure keeps the rest
    info["rows"] = rows
    info["wall_s"] = time.perf_counter() - started
    out.write_text(json.dumps(info, indent=1))
    log(f"wrote {out} ({len(rows)} rows)")
    failed = [r for r in rows if r["kind"] == "error" or str(r.get("mode", "")).startswith("failed")]
    return 1 if failed or any(math.isnan(r.get("stack_s", 0.0)) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
