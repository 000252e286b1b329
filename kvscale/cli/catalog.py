"""`kvscale gpus` and `kvscale models`: the catalog."""

from __future__ import annotations

from rich.table import Table

from kvscale.cli.common import CatalogOpt, JsonOpt, console, load, print_json
from kvscale.cli.root import app
from kvscale.sizing.memory import kv_bytes_per_token_per_layer


@app.command()
def gpus(catalog: CatalogOpt = None, as_json: JsonOpt = False) -> None:
    """The GPU catalog: memory, bandwidth, peak FLOPS, link, price, efficiency factors."""
    cat = load(catalog)
    rows = [g.model_dump() for g in cat.gpus.values()]
    if as_json:
        print_json(rows)
        return
    table = Table(title="GPU catalog (dense peaks; efficiencies apart)")
    for col in (
        "GPU",
        "mem GiB",
        "HBM GB/s",
        "16-bit TFLOPS",
        "8-bit TFLOPS",
        "link",
        "$/GPU-h",
        "matmul eff",
        "bw eff",
        "node label",
    ):
        table.add_column(col)
    for g in cat.gpus.values():
        eight = g.flops_fp8_per_s or g.ops_int8_per_s
        suffix = "" if g.flops_fp8_per_s else " (int8)"
        table.add_row(
            g.name,
            f"{g.memory_gib:g}",
            f"{g.hbm_bandwidth_bytes_per_s / 1e9:.0f}",
            f"{g.flops_16bit_per_s / 1e12:.0f}",
            f"{(eight or 0) / 1e12:.0f}{suffix}",
            g.link,
            f"{g.price_usd_per_gpu_hour:.2f}",
            f"{g.matmul_efficiency:.2f}",
            f"{g.bandwidth_efficiency:.2f}",
            g.node_labels[0],
        )
    console.print(table)


@app.command()
def models(catalog: CatalogOpt = None, as_json: JsonOpt = False) -> None:
    """The model catalog: architecture, parameters, KV bytes per token."""
    cat = load(catalog)
    if as_json:
        print_json([m.model_dump() for m in cat.models.values()])
        return
    table = Table(title="Model catalog")
    for col in (
        "model",
        "layers",
        "hidden",
        "heads",
        "kv heads",
        "head dim",
        "FFN",
        "vocab",
        "params",
        "KV KiB/token (16-bit, full layers)",
    ):
        table.add_column(col)
    sixteen_bit = cat.kv_precision("auto")
    for m in cat.models.values():
        # As vLLM caches it at TP 1: MLA one latent per layer; windowed layers hold at most the window.
        kv = m.full_attention_layers * kv_bytes_per_token_per_layer(m, sixteen_bit) / 1024
        ffn = str(m.intermediate_size)
        if m.is_moe:
            ffn = f"{m.expert_width} x{m.experts}, top-{m.active_experts}"
            ffn += f" +{m.shared_experts} shared" if m.shared_experts else ""
            ffn += f", {m.dense_layers} dense" if m.dense_layers else ""
        params = f"{m.params / 1e9:.2f}B" + (f" ({m.params_per_token / 1e9:.1f}B active)" if m.is_moe else "")
        table.add_row(
            m.name,
            str(m.layers),
            str(m.hidden_size),
            str(m.heads),
            str(m.kv_heads),
            str(m.head_dim),
            ffn,
            str(m.vocab_size),
            params,
            f"{kv:.0f}",
        )
    console.print(table)
