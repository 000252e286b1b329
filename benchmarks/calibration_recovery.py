"""Does calibration recover the profile a stand-in runs? (issue 37 item 3)

Offline, without a cluster: stand-in engines (kvscale.standin.fleet.PodFleet, the simulator's
engine) run a known engine profile under Poisson load; their metrics
(kvscale.standin.exposition.EngineCollector, what `kvscale sim serve` exposes) are "scraped"
every second; the windows are what `kvscale calibrate`'s range queries
(kvscale.metrics.calibration.window_queries) would answer: each query's increase() and
avg_over_time() evaluated as Prometheus does on the scraped samples, then turned into
`Window`s by kvscale.metrics.calibration.windows, the CLI's and the operator's own code. The fit
(kvscale.calibration.fit) runs on the catalog's profile and is compared with the truth: each
field's fitted value and stated standard error, and the plan the fitted overlay makes.

Run: .venv/bin/python -m benchmarks.calibration_recovery [--seconds 150] [--window 10] [--scrape 1] [--seed 7]
(as a module: this directory holds a prometheus_client.py that a script run would import instead)
"""

from __future__ import annotations

import argparse
import math
import re
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client.registry import CollectorRegistry

from kvscale.calibration.fit import FIELDS, Calibration, NotEnoughData, Window, fit, with_fields
from kvscale.metrics.calibration import Key, Series, cache_tokens, key_of, window_queries, windows
from kvscale.metrics.engines import ENGINES
from kvscale.planner.search import PlanRequest, plan
from kvscale.sim.engine import StepTimes
from kvscale.sim.fleet import FleetSpec
from kvscale.sim.load_profile import parse_profile
from kvscale.sizing.catalog import default_catalog, load_catalog
from kvscale.sizing.config import ServingConfig
from kvscale.sizing.workload import Slo, Workload
from kvscale.standin.exposition import EngineCollector
from kvscale.standin.fleet import PodFleet

MODEL, GPU = "llama-3.1-8b", "H100-SXM"
K = 2.0  # a field is recovered when within K stated standard errors of the truth
# The load of tests/cluster/test_calibrate.py (fleet rates over two engines, lengths changing).
CHANGING = "steps:2@0,8@100,16@200,4@300,10@450;lengths:512/256@0,2048/128@300,1024/256@450"
STEADY = "constant:6;lengths:512/256@0"
_QUERY = re.compile(r'(increase|avg_over_time)\(\{__name__="([^"]+)"')


def base_config(gpu: str = GPU) -> ServingConfig:
    cat = default_catalog()
    return ServingConfig.build(cat, cat.model(MODEL), cat.gpu(gpu))


@dataclass(frozen=True)
class StandIn:
    """A stand-in engine profile: the catalog's with some fields scaled."""

    name: str
    scale: tuple[tuple[str, float], ...] = ()

    def config(self, base: ServingConfig) -> ServingConfig:
        return with_fields(base, {f: getattr(base.engine, f) * k for f, k in self.scale})


STANDINS = (
    StandIn("catalog"),
    StandIn("2x faster CPU", (("sequence_overhead_s", 0.5), ("step_overhead_s", 0.5))),
    StandIn("2x slower CPU", (("sequence_overhead_s", 2.0), ("step_overhead_s", 2.0))),
    StandIn("GEMM share / 2", (("matmul_efficiency_factor", 0.5),)),
)


class Scrapes:
    """Every sample the collector exposes, per sample name and engine, at each scrape."""

    def __init__(self) -> None:
        self.samples: dict[str, dict[Key, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
        self.cache: list[dict[str, str]] = []

    def scrape(self, registry: CollectorRegistry, at_s: float, cache_info: str) -> None:
        for family in registry.collect():
            for s in family.samples:
                if s.name == cache_info:
                    self.cache = [*(c for c in self.cache if key_of(c) != key_of(s.labels)), dict(s.labels)]
                elif not s.name.endswith("_bucket"):
                    self.samples[s.name][key_of(s.labels)].append((at_s, float(s.value)))

    def increase(self, name: str, key: Key, end_s: float, range_s: float) -> float | None:
        """Prometheus's increase() over (end - range, end] (promql/functions.go extrapolatedRate)."""
        points = [(t, v) for t, v in self.samples.get(name, {}).get(key, []) if end_s - range_s < t <= end_s]
        if len(points) < 2:
            return None
        delta, previous = 0.0, points[0][1]
        for _, v in points[1:]:
            delta += v - previous if v >= previous else v  # a counter reset
            previous = v
        first_t, last_t = points[0][0], points[-1][0]
        sampled = last_t - first_t
        average = sampled / (len(points) - 1)
        to_start, to_end = first_t - (end_s - range_s), end_s - last_t
        if delta > 0 and points[0][1] >= 0:
            to_zero = sampled * points[0][1] / delta
            to_start = min(to_start, to_zero)
        threshold = average * 1.1
        to_start = to_start if to_start < threshold else average / 2
        to_end = to_end if to_end < threshold else average / 2
        return delta * (sampled + to_start + to_end) / sampled

    def average(self, name: str, key: Key, end_s: float, range_s: float) -> float | None:
        """avg_over_time() over (end - range, end]."""
        values = [v for t, v in self.samples.get(name, {}).get(key, []) if end_s - range_s < t <= end_s]
        return sum(values) / len(values) if values else None

    def series(self, queries: dict[str, str], ends: list[float], range_s: float) -> dict[str, Series]:
        """Each query's answer at each window end, per engine: the first alternative (`or`)
        with data, as Prometheus answers a union per label set."""
        out: dict[str, Series] = {}
        keys = {k for per in self.samples.values() for k in per}
        for name, promql in queries.items():
            alternatives = _QUERY.findall(promql)
            answer: Series = {}
            for key in keys:
                for end in ends:
                    for function, metric in alternatives:
                        read = self.increase if function == "increase" else self.average
                        value = read(metric, key, end, range_s)
                        if value is not None:
                            answer[(key, end)] = value
                            break
            out[name] = answer
        return out


def scraped_windows(
    true: ServingConfig,
    load: str,
    seconds: float,
    window_s: float,
    pods: int = 2,
    seed: int = 7,
    scrape_s: float = 1.0,
) -> list[Window]:
    """The windows `kvscale calibrate --window {window_s}s --since {seconds}s` reads from
    stand-ins running `true` under `load` for `seconds` (simulated), scraped every `scrape_s`."""
    clock = {"t": 0.0}
    standin = PodFleet(
        FleetSpec(256, true.memory.kv_capacity_tokens, true.max_num_batched_tokens, true.gpus, 0.0),
        StepTimes(true),
        parse_profile(load, 512, 256, seed=seed),
        clock=lambda: clock["t"],
    )
    standin.sync_pods([f"llama-{i}" for i in range(pods)])
    registry = CollectorRegistry()
    registry.register(EngineCollector(standin, "ns", "meta-llama/Llama-3.1-8B-Instruct"))
    vllm = ENGINES["vllm"]
    scrapes = Scrapes()
    steps = round(seconds / scrape_s)
    for i in range(steps + 1):
        clock["t"] = i * scrape_s
        standin.tick()
        scrapes.scrape(registry, clock["t"], vllm.cache_config_info[0])
    # The CLI's range query: start = now - since + window, step = window, up to now.
    ends = [window_s * k for k in range(1, math.floor(seconds / window_s) + 1)]
    series = scrapes.series(window_queries(vllm, "", f"{round(window_s)}s"), ends, window_s)
    kv = cache_tokens(scrapes.cache)
    return windows(series, lambda key: kv.get(key, float(true.memory.kv_capacity_tokens)))


def replicas(cfg: ServingConfig, calibration: Calibration | None) -> str:
    """Replicas the plan chooses for the cluster test's service (20 req/s of 512/256 on one
    GPU type, p95 TTFT 1 s, TPOT 50 ms), on the catalog or on the fitted overlay."""
    with tempfile.TemporaryDirectory() as tmp:
        paths: list[Path] = []
        if calibration is not None:
            path = Path(tmp) / "overlay.yaml"
            path.write_text(yaml.safe_dump(calibration.overlay()))
            paths.append(path)
        cat = load_catalog(*paths)
        request = PlanRequest(cat.model(MODEL), Workload(512, 256, 20.0), Slo(1.0, 0.05), gpus=(cfg.gpu.name,))
        chosen = plan(cat, request).chosen
    return f"{chosen.prediction.replicas} x {chosen.label}" if chosen is not None else "none"


@dataclass(frozen=True)
class Outcome:
    standin: str
    load: str
    truth: dict[str, float]
    calibration: Calibration | None
    error: str = ""

    def within(self, name: str, k: float = K) -> bool:
        """Within k stated standard errors of the truth, or left at the prior and flagged."""
        if self.calibration is None:
            return False
        f = self.calibration.field(name)
        if f.name in self.calibration.unidentified:
            return True
        return abs(f.value - self.truth[name]) <= k * f.stderr

    @property
    def recovered(self) -> bool:
        return self.calibration is not None and all(self.within(n) for n in FIELDS)


def run_case(
    standin: StandIn, load: str, seconds: float, window_s: float, seed: int = 7, scrape_s: float = 1.0
) -> Outcome:
    base = base_config()
    true = standin.config(base)
    found = scraped_windows(true, load, seconds, window_s, seed=seed, scrape_s=scrape_s)
    truth = {n: float(getattr(true.engine, n)) for n in FIELDS}
    try:
        return Outcome(standin.name, load, truth, fit(base, found))
    except NotEnoughData as exc:
        return Outcome(standin.name, load, truth, None, str(exc))


_UNIT = {"matmul_efficiency_factor": (1.0, ""), "sequence_overhead_s": (1e6, " us"), "step_overhead_s": (1e6, " us")}


def describe(o: Outcome, k: float = K) -> str:
    """One table row: each field true / fitted ± stderr, within?"""
    if o.calibration is None:
        return f"| {o.standin} | {o.load} | not fitted: {o.error} |"
    cells = []
    for n in FIELDS:
        scale, unit = _UNIT[n]
        f = o.calibration.field(n)
        flag = " (prior)" if n in o.calibration.unidentified else (" (bound)" if f.at_bound else "")
        mark = "yes" if o.within(n, k) else "**no**"
        cells.append(f"{o.truth[n] * scale:.3g} / {f.value * scale:.3g} ± {f.stderr * scale:.2g}{unit}{flag} {mark}")
    return f"| {o.standin} | {o.load} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=150.0, help="simulated seconds of traffic")
    parser.add_argument("--window", type=float, default=10.0, help="window length (s)")
    parser.add_argument("--scrape", type=float, default=1.0, help="scrape interval (s)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the arrivals")
    parser.add_argument("--no-plan", action="store_true", help="skip the plans")
    args = parser.parse_args()
    loads = {"steady": STEADY, "changing": CHANGING}
    print(
        f"{args.seconds:g} s of traffic on two stand-ins ({MODEL}, {GPU}), scraped every {args.scrape:g} s, windows of "
        f"{args.window:g} s; 'yes': within {K:g} stated standard errors of the truth\n"
    )
    print("| stand-in | load | GEMM share true / fitted | per-sequence | per-step | plan before -> after |")
    print("|---|---|---|---|---|---|")
    base = base_config()
    before = "-" if args.no_plan else replicas(base, None)
    for standin in STANDINS:
        for label, load in loads.items():
            started = time.perf_counter()
            outcome = run_case(standin, load, args.seconds, args.window, args.seed, args.scrape)
            outcome = Outcome(outcome.standin, label, outcome.truth, outcome.calibration, outcome.error)
            after = "-" if args.no_plan or outcome.calibration is None else replicas(base, outcome.calibration)
            took = time.perf_counter() - started
            print(describe(outcome).removesuffix(" |") + f" | {before} -> {after} ({took:.1f} s) |")


if __name__ == "__main__":
    main()
