"""Load, replicas and latency against time for each policy; GPUs held under a budget per service
(matplotlib, only when asked for)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kvscale.sim.budget_run import FleetResult
from kvscale.sim.run import SimResult
from kvscale.sizing.workload import Slo


def outlier_cap(maxima: list[float], floor: float = 0.0) -> float | None:
    """An axis top that keeps one series' outliers from flattening the rest: 1.5 x the second
    largest series maximum (at least `floor`) when the largest is more than twice that; None when
    nothing stands out."""
    ordered = sorted((m for m in maxima if m > 0), reverse=True)
    if len(ordered) < 2:
        return None
    cap = max(floor, 1.5 * ordered[1])
    return cap if ordered[0] > 2 * cap else None


def timeline_title(head: str, slo: Slo, load: str, routing: str) -> str:
    """What a timeline shows: the fleet, the SLO, the load and how requests were routed."""
    return (
        f"{head}\nSLO p{slo.percentile:g}: TTFT <= {slo.ttft_s * 1e3:g} ms, TPOT <= {slo.tpot_s * 1e3:g} ms; "
        f"load {load}; routing {routing}"
    )


def timeline_figure(results: list[SimResult], slo: Slo, title: str) -> Figure:
    fig, (load, replicas, ttft) = plt.subplots(3, 1, figsize=(11, 9.4), sharex=True)
    if results and results[0].timeline:
        first = results[0].timeline
        load.plot([p.time_s / 60 for p in first], [p.arrival_rate_per_s for p in first], color="black")
    load.set_ylabel("arrivals (req/s, 60 s window)")
    load.set_title(title, fontsize=10)
    ready_max = [max((p.ready for p in r.timeline), default=0) for r in results]
    ttft_max = [max(((p.ttft_p_s or 0.0) * 1e3 for p in r.timeline), default=0.0) for r in results]
    ready_cap = outlier_cap([float(m) for m in ready_max], floor=1.0)
    ttft_cap = outlier_cap(ttft_max, floor=3 * slo.ttft_s * 1e3)
    for result, top_ready, top_ttft in zip(results, ready_max, ttft_max, strict=True):
        minutes = [p.time_s / 60 for p in result.timeline]
        label = result.policy
        if ready_cap is not None and top_ready > ready_cap:
            label += f" (up to {top_ready}, off the scale)"
        replicas.step(minutes, [p.ready for p in result.timeline], where="post", label=label)
        label = result.policy
        if ttft_cap is not None and top_ttft > ttft_cap:
            label += f" (up to {top_ttft / 1e3:,.0f} s, off the scale)"
        ttft.plot(minutes, [(p.ttft_p_s or 0.0) * 1e3 for p in result.timeline], label=label, linewidth=1)
    replicas.set_ylabel("ready replicas")
    replicas.yaxis.set_major_locator(MaxNLocator(integer=True))
    if ready_cap is not None:
        replicas.set_ylim(0, ready_cap)
    replicas.legend(fontsize=8, ncol=3)
    ttft.axhline(slo.ttft_s * 1e3, color="red", linestyle="--", label="TTFT target")
    ttft.set_ylabel(f"TTFT p{slo.percentile:g} (ms, 60 s window)")
    ttft.set_yscale("log")
    if ttft_cap is not None:
        ttft.set_ylim(top=ttft_cap)
    ttft.set_xlabel("minutes")
    ttft.legend(fontsize=8, ncol=3)
    for ax in (load, replicas, ttft):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def draw_timeline(results: list[SimResult], slo: Slo, path: Path, title: str) -> None:
    fig = timeline_figure(results, slo, title)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def draw_fleet(result: FleetResult, path: Path, title: str) -> None:
    """GPUs each service holds per budget GPU type (stacked) against the limit, and each
    service's granted and wanted replicas."""
    limited = list(result.budget.limits)
    used_types = sorted({gpu for r in result.services for p in r.timeline for gpu, _ in p.held} - set(limited))
    types = limited + used_types
    fig, axes = plt.subplots(len(types) + 1, 1, figsize=(11, 3.2 * (len(types) + 1)), sharex=True, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, gpu in zip(axes[:-1, 0], types, strict=True):
        stacks, labels = [], []
        minutes: list[float] = []
        for r in sorted(result.services, key=lambda r: -r.service.priority):
            minutes = [p.time_s / 60 for p in r.timeline]
            stacks.append([dict(p.held).get(gpu, 0) for p in r.timeline])
            labels.append(f"{r.service.name} (priority {r.service.priority})")
        if minutes:
            ax.stackplot(minutes, *stacks, labels=labels, step="post", colors=colors[: len(stacks)], alpha=0.8)
        if gpu in result.budget.limits:
            ax.axhline(
                result.budget.limits[gpu], color="red", linestyle="--", label=f"budget {result.budget.limits[gpu]}"
            )
        ax.set_ylabel(f"{gpu} GPUs held")
        ax.legend(fontsize=8, loc="upper left", ncol=2)
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_title(title)
    ax = axes[-1, 0]
    for i, r in enumerate(sorted(result.services, key=lambda r: -r.service.priority)):
        minutes = [p.time_s / 60 for p in r.timeline]
        color = colors[i % len(colors)]
        ax.step(minutes, [p.wanted for p in r.timeline], where="post", color=color, linestyle=":", linewidth=1)
        ax.step(minutes, [p.granted for p in r.timeline], where="post", color=color, label=f"{r.service.name} granted")
    ax.set_ylabel("replicas (dotted: wanted)")
    ax.set_xlabel("minutes")
    ax.legend(fontsize=8, ncol=3)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
