"""Load, replicas and latency against time for each policy (matplotlib, only when asked for)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kvscale.sim.run import SimResult
from kvscale.sizing.workload import Slo


def draw_timeline(results: list[SimResult], slo: Slo, path: Path, title: str) -> None:
    fig, (load, replicas, ttft) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    if results and results[0].timeline:
        first = results[0].timeline
        load.plot([p.time_s / 60 for p in first], [p.arrival_rate_per_s for p in first], color="black")
    load.set_ylabel("arrivals (req/s, 60 s window)")
    load.set_title(title)
    for result in results:
        minutes = [p.time_s / 60 for p in result.timeline]
        replicas.step(minutes, [p.ready for p in result.timeline], where="post", label=result.policy)
        ttft.plot(minutes, [(p.ttft_p_s or 0.0) * 1e3 for p in result.timeline], label=result.policy, linewidth=1)
    replicas.set_ylabel("ready replicas")
    replicas.legend(fontsize=8, ncol=3)
    ttft.axhline(slo.ttft_s * 1e3, color="red", linestyle="--", label="TTFT target")
    ttft.set_ylabel(f"TTFT p{slo.percentile:g} (ms, 60 s window)")
    ttft.set_yscale("log")
    ttft.set_xlabel("minutes")
    ttft.legend(fontsize=8, ncol=3)
    for ax in (load, replicas, ttft):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
