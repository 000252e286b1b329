"""`kvscale simulate --fleet FILE`: several services under one GPU budget, through the
allocator the operator runs (kvscale.autoscaling.budget).

FILE (YAML):

    budget: {H100-SXM: 8, L40S: 8}          # GPUs per type; types not listed are not limited
    routing: gateway                          # optional: service (default), round-robin, gateway
    preemption_grace: 15s                     # optional: how long a replica the budget takes drains
    drain: 5m                                 # optional: the run ends this long after the loads end
    services:
      - name: chat
        model: llama-3.1-8b
        priority: 100
        gpus: [H100-SXM, L40S]                # accepted types; default: the budget's
        slo: {ttft: 500ms, tpot: 50ms, percentile: 95}
        load: bursty:base=2,peak=20,duration=30m   # or trace: FILE (relative to FILE)
        rate_scale: 1.0                       # optional
        min_replicas: 1                       # optional (0 with idle_window: scale to zero)
        max_replicas: 20                      # optional
        idle_window: 5m                       # optional, with min_replicas 0
        disaggregation: off                   # optional: off (default), on or auto, as an
                                              # InferenceService's spec.serving.disaggregation

A service with `disaggregation: on` (or `auto` where the planner chooses the pools and the
fleet's routing is `gateway`, the P/D-aware picker the operator's auto requires) is planned as
a prefill pool and a decode pool (`kvscale simulate --disaggregation`'s layout) and replayed
as two pools: each is a want in the budget of its own (`NAME-prefill`, `NAME-decode`), and
what the two get on one limited GPU type is split by what they serve together, as the
operator's budget book splits them (kvscale.control.pool_budget). min_replicas is each pool's
floor (at least one worker); max_replicas each pool's bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from rich.table import Table

from kvscale.cli.common import EXIT_INFEASIBLE, console, fail, print_json, yaml_error
from kvscale.cli.progress import StderrProgress
from kvscale.sizing.catalog import Catalog, CatalogError

MAX_SERVICES = 50


class _SloIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttft: str
    tpot: str
    percentile: float = Field(default=95.0, ge=50, lt=100)


class _ServiceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=63)
    model: str = Field(min_length=1)
    priority: int = 0
    gpus: list[str] = Field(default_factory=list)
    slo: _SloIn
    load: str | None = None
    trace: str | None = None
    rate_scale: float = Field(default=1.0, gt=0, le=1000)
    min_replicas: int = Field(default=1, ge=0, le=1000)
    max_replicas: int = Field(default=100, ge=1, le=1000)
    idle_window: str = "5m"
    disaggregation: Literal["auto", "on", "off"] = "off"

    @field_validator("disaggregation", mode="before")
    @classmethod
    def _yaml_switch(cls, value: Any) -> Any:
        """YAML 1.1 reads a bare on/off as a boolean (as the InferenceService's quoted field is not)."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class _FleetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    budget: dict[str, int] = Field(min_length=1)
    routing: str = "service"
    seed: int = 0
    preemption_grace: str = "15s"
    drain: str = "5m"
    services: list[_ServiceIn] = Field(min_length=1, max_length=MAX_SERVICES)


def _read(path: Path) -> _FleetIn:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        fail(f"--fleet {path}: cannot read it ({exc.strerror or exc})")
    except yaml.YAMLError as exc:
        fail(f"--fleet {path}: not YAML: {yaml_error(exc)}")
    if not isinstance(raw, dict):
        fail(f"--fleet {path}: expected a mapping with budget: and services:, got {type(raw).__name__}")
    try:
        fleet = _FleetIn.model_validate(raw)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        fail(f"--fleet {path}: {where}")
    names = [s.name for s in fleet.services]
    if len(set(names)) != len(names):
        fail(f"--fleet {path}: service names must be unique, got {names}")
    for gpu, n in fleet.budget.items():
        if n < 0:
            fail(f"--fleet {path}: budget.{gpu} must be >= 0 GPUs, got {n}")
    for s in fleet.services:
        if (s.load is None) == (s.trace is None):
            fail(f"--fleet {path}: service {s.name}: give one of load: KIND:key=value,... or trace: FILE")
        if s.min_replicas > s.max_replicas:
            fail(f"--fleet {path}: service {s.name}: min_replicas must be <= max_replicas")
    return fleet


def fleet_services(path: Path, cat: Catalog) -> tuple[Any, list[Any], str]:
    """The budget, the services (each with its cheapest feasible plan per accepted GPU type)
    and the routing a fleet file describes: what `simulate --fleet` runs, for a benchmark to
    run the same (benchmarks/budget_contention.py). Exits with the file's error."""
    from kvscale.autoscaling.budget import Budget
    from kvscale.cli.common import duration, model
    from kvscale.sim.budget_run import FleetService
    from kvscale.sim.fleet import RoutingError, check_routing

    spec = _read(path)
    try:
        check_routing(spec.routing)
    except RoutingError as exc:
        fail(f"--fleet {path}: routing: {str(exc).removeprefix('--routing ')}")
    limits: dict[str, int] = {}
    for gpu, n in spec.budget.items():
        try:
            limits[cat.gpu(gpu).name] = n
        except CatalogError as exc:
            fail(f"--fleet {path}: budget: {exc}")
    budget = Budget(path.stem, limits)
    services: list[FleetService] = []
    # Every service's model first: a typo in the last one is said before any planning.
    archs = [model(cat, s.model, f"--fleet {path}: services.{i}.model") for i, s in enumerate(spec.services)]
    for i, (s, arch) in enumerate(zip(spec.services, archs, strict=True)):
        slo = _slo(s, duration)
        trace = _arrivals(path, s, spec.seed)
        gpus = tuple(s.gpus) or tuple(limits)
        try:
            gpus = tuple(cat.gpu(g).name for g in gpus)
        except CatalogError as exc:
            fail(f"--fleet {path}: service {s.name}: gpus: {exc}")
        if s.disaggregation != "off":
            pools = _pools(cat, arch, slo, trace, gpus, s, f"--fleet {path}: services.{i} ({s.name})", spec)
            if pools is not None:
                services.append(pools)
                continue
        options = _options(cat, arch, slo, trace, gpus, s, spec.routing, spec.seed)
        if not options:
            fail(f"--fleet {path}: service {s.name}: no plan on {', '.join(gpus)} meets its SLO", EXIT_INFEASIBLE)
        services.append(
            FleetService(
                s.name,
                options,
                trace,
                s.priority,
                s.min_replicas,
                s.max_replicas,
                idle_window_s=duration(s.idle_window, f"services[{s.name}].idle_window"),
            )
        )
    seen: set[str] = set()
    for service in services:
        for name in _budget_names(service):
            if name in seen:
                fail(f"--fleet {path}: {name} is both a service's name and a disaggregated service's pool: rename one")
            seen.add(name)
    return budget, services, spec.routing


def _budget_names(service: Any) -> tuple[str, ...]:
    """The names a service has in the budget: its own, or each of its pools'."""
    from kvscale.sim.budget_run import PoolsService

    if isinstance(service, PoolsService):
        return (service.pool("prefill"), service.pool("decode"))
    return (service.name,)


def _workload(trace: list[Any]) -> Any:
    """The mean lengths and rate a service's plan is made for."""
    from kvscale.sim.trace import duration_s
    from kvscale.sizing.workload import Workload

    span = max(duration_s(trace), 1.0)
    return Workload(
        max(1, round(sum(r.input_tokens for r in trace) / len(trace))),
        max(1, round(sum(r.output_tokens for r in trace) / len(trace))),
        len(trace) / span,
    )


def _pools(
    cat: Catalog,
    arch: Any,
    slo: Any,
    trace: list[Any],
    gpus: tuple[str, ...],
    s: _ServiceIn,
    where: str,
    spec: _FleetIn,
) -> Any:
    """A service with disaggregation on or auto: its pools (a PoolsService) when the layout
    chosen is disaggregated, as `simulate --disaggregation` chooses it (kvscale.cli.
    simulate_pools.choose_layout: planned least-loaded, behind the P/D picker); None: it runs
    aggregated (auto). `auto` keeps aggregated replicas unless the fleet's routing is `gateway`:
    the operator's auto does not pick pools that no P/D-aware router reaches
    (kvscale.control.planning.plan_layout)."""
    from kvscale.cli.simulate_pools import choose_layout
    from kvscale.planner.search import PlanRequest, plan
    from kvscale.sim.budget_run import PoolsService
    from kvscale.sim.disaggregated_fleet import setup_from_disaggregated

    if s.disaggregation == "auto" and spec.routing != "gateway":
        return None
    request = PlanRequest(model=arch, workload=_workload(trace), slo=slo, gpus=gpus)
    aggregated = plan(cat, request) if s.disaggregation == "auto" else None
    found, pools = choose_layout(cat, request, aggregated, s.disaggregation)
    if pools is None:
        if s.disaggregation == "on":
            why = found.reason if found is not None else ""
            fail(
                f"{where}: disaggregation on, but no prefill and decode pools on {', '.join(gpus)}: {why}",
                EXIT_INFEASIBLE,
            )
        return None
    if s.min_replicas == 0:
        fail(
            f"{where}: min_replicas 0 (scale to zero) is not replayed on prefill and decode pools: each pool keeps "
            "at least one worker; set min_replicas: 1 or disaggregation: off"
        )
    setup = setup_from_disaggregated(pools, None, spec.seed)
    return PoolsService(
        s.name,
        setup,
        trace,
        shape=pools.request.workload,
        step_target_s=pools.request.step_target_s,
        priority=s.priority,
        min_replicas=s.min_replicas,
        max_replicas=s.max_replicas,
        layout=found.reason if found is not None else "",
        planned_rates=(pools.prefill.rate_per_worker_max, pools.decode.rate_per_worker_max),
    )


def run_fleet(path: Path, cat: Catalog, as_json: bool, png: Path | None) -> None:
    from kvscale.autoscaling.budget import Budget
    from kvscale.cli.common import duration, write_picture
    from kvscale.sim import budget_run

    budget, services, routing = fleet_services(path, cat)
    spec = _read(path)
    limits = dict(budget.limits)
    grace_s = duration(spec.preemption_grace, "preemption_grace")
    drain_s = duration(spec.drain, "drain")
    # 20-45 s on a laptop: progress on stderr (kvscale.cli.progress), the fleet's run, then each
    # service's alone, in the simulated time of its loads.
    last_arrival = max((r.arrival_s for s in services for r in s.trace), default=0.0)
    total = max(last_arrival, 1e-9)
    with StderrProgress() as progress:

        def ticked(task: str) -> Callable[[float], None]:
            def tick(now_s: float) -> None:
                line = f"{task}: {min(now_s / total, 1.0):.0%} of {total / 3600:.2f} h simulated"
                progress.update(task, now_s, total, line)

            return tick

        result = budget_run.simulate_fleet(
            budget,
            services,
            drain_limit_s=drain_s,
            preemption_grace_s=grace_s,
            progress=ticked(f"simulating {len(services)} services under the budget"),
        )
        # What each service would have met alone: the same load, fleet and policy, no budget.
        alone = {
            s.name: budget_run.simulate_fleet(
                Budget(f"{s.name}-alone", {}), [s], drain_limit_s=drain_s, progress=ticked(f"simulating {s.name} alone")
            ).services[0]
            for s in services
        }
    rows = [
        _pools_row(r, alone[r.service.name])
        if isinstance(r, budget_run.PoolsResult)
        else _row(r, alone[r.service.name])
        for r in result.services
    ]
    out = {
        "budget": dict(limits),
        "routing": routing,
        "preemption_grace_s": grace_s,
        "drain_s": drain_s,
        "duration_s": round(result.duration_s, 1),
        "max_gpus_used": result.max_gpus_used,
        "services": rows,
        # GPUs held per type after each tick (starting, serving and draining replicas).
        "budget_use": [{"time_s": round(t, 1), "gpus": dict(used)} for t, used in result.usage],
    }
    if as_json:
        print_json(out)
    else:
        _render(out)
    if png is not None:
        from kvscale.cli.simulate_plot import draw_fleet

        write_picture(png, lambda: draw_fleet(result, png, fleet_title(len(services), limits, path.name)))
        if not as_json:
            console.print(f"wrote {png}")


def _slo(s: _ServiceIn, duration: Any) -> Any:
    from kvscale.sizing.workload import Slo

    return Slo(
        duration(s.slo.ttft, f"services[{s.name}].slo.ttft"),
        duration(s.slo.tpot, f"services[{s.name}].slo.tpot"),
        s.slo.percentile,
    )


def _arrivals(path: Path, s: _ServiceIn, seed: int) -> list[Any]:
    from kvscale.sim.generators import LoadError
    from kvscale.sim.load_profile import DEFAULT_DURATION_S, load_requests
    from kvscale.sim.trace import TraceError, rate_scale, read_trace

    try:
        if s.load is not None:
            requests = load_requests(s.load, 512, 256, seed, DEFAULT_DURATION_S)
        else:
            assert s.trace is not None
            requests = read_trace((path.parent / s.trace) if not Path(s.trace).is_absolute() else Path(s.trace))
        requests = rate_scale(requests, s.rate_scale, seed)
    except (TraceError, LoadError) as exc:
        fail(f"--fleet {path}: service {s.name}: {exc}")
    if not requests:
        fail(f"--fleet {path}: service {s.name}: its load has no requests")
    return requests


def _options(
    cat: Catalog, arch: Any, slo: Any, trace: list[Any], gpus: tuple[str, ...], s: _ServiceIn, routing: str, seed: int
) -> tuple[Any, ...]:
    """The cheapest feasible plan on each accepted GPU type, cheapest first."""
    from dataclasses import replace

    from kvscale.planner.search import PlanRequest, plan
    from kvscale.sim.budget_run import ServiceOption
    from kvscale.sim.session import setup_from_plan

    result = plan(cat, PlanRequest(model=arch, workload=_workload(trace), slo=slo, gpus=gpus))
    options = []
    seen: set[str] = set()
    for c in (result.chosen, *result.alternatives) if result.chosen else ():
        if c.gpu in seen:
            continue
        seen.add(c.gpu)
        setup = replace(setup_from_plan(cat, _only(result, c), None, None), routing=routing, seed=seed)
        options.append(ServiceOption(setup, c.prediction.rate_per_replica_max))
    return tuple(options)


def _only(result: Any, candidate: Any) -> Any:
    from dataclasses import replace

    return replace(result, chosen=candidate)


def _attainment(r: Any) -> float:
    from kvscale.sim.report import attainment
    from kvscale.sim.run import SimResult

    svc = r.service
    return attainment(SimResult(svc.name, r.requests, r.gpu_hours, r.cost_usd, 0, 0, 0.0), svc.options[0].setup.slo)


def _shared(r: Any, attained: float, attained_alone: float) -> dict[str, Any]:
    """The columns an aggregated service and a pools service share (the budget's and the run's)."""
    return {
        "name": r.service.name,
        "priority": r.service.priority,
        "requests": len(r.requests),
        "slo_attainment": round(attained, 5),
        "alone_slo_attainment": round(attained_alone, 5),
        # Requests lost: rejected at the gateway (HTTP 429; never reached a replica) and cut
        # (on a replica at a drain's bound or at the run's end).
        "rejected": r.lost("rejected"),
        "cut": r.lost("cut"),
        "preemptions": r.preemptions,
        "grant_wait_s": round(r.grant_wait_s, 1),
        "gpu_hours": round(r.gpu_hours, 4),
        "cost_usd": round(r.cost_usd, 4),
    }


def _row(r: Any, alone: Any) -> dict[str, Any]:
    svc = r.service
    ttfts = [x for x in r.first_request_ttfts_s if not math.isnan(x)]
    return {
        **_shared(r, _attainment(r), _attainment(alone)),
        "gpu_types": [o.gpu_type for o in svc.options],
        "held_ticks": r.held_ticks,
        "ticks": len(r.timeline),
        "moves": r.moves,
        "max_gpus": max((p.gpus for p in r.timeline), default=0),
        "scale_from_zero": r.cold_starts_from_zero,
        # With min_replicas 0: the cold start a request that finds no replica waits through at
        # the gateway (on the service's first GPU type), and the TTFT each such first request saw.
        "cold_start_s": round(svc.options[0].setup.cold_start_s, 1) if svc.min_replicas == 0 else None,
        "first_request_ttft_ms": [round(x * 1e3, 1) for x in ttfts],
        "last_reason": r.reasons[-1][1] if r.reasons else "",
    }


def _pools_attainment(r: Any) -> float:
    from kvscale.sim.report import attainment

    return attainment(r.replay, r.service.setup.prefill.slo)


def _pools_row(r: Any, alone: Any) -> dict[str, Any]:
    """An aggregated service's columns over both pools together, and under `disaggregation`
    each pool's GPUs and GPU-hours, and the splits the budget held the pools to."""
    svc = r.service
    pools: dict[str, Any] = {}
    for i, role in enumerate(("prefill", "decode")):
        stats = r.replay.pools[role]
        pools[role] = {
            "gpu": stats.gpu,
            "tensor_parallel": stats.tensor_parallel,
            "gpus_per_replica": stats.gpus_per_replica,
            "planned_workers": stats.replicas_start,
            "workers_max": max((p.granted[i] for p in r.pool_timeline), default=0),
            "max_gpus": max((p.gpus[i] for p in r.pool_timeline), default=0),
            "gpu_hours": round(stats.gpu_hours, 4),
            "cost_usd": round(stats.cost_usd, 4),
            "held_ticks": r.pool_held_ticks[role],
            "rate_per_worker": round(r.rates[i], 3),
        }
    splits = sorted(r.splits.items(), key=lambda kv: (-kv[1], kv[0].prefill, kv[0].decode))
    return {
        **_shared(r, _pools_attainment(r), _pools_attainment(alone)),
        "gpu_types": sorted({svc.setup.prefill.cfg.gpu.name, svc.setup.decode.cfg.gpu.name}),
        "held_ticks": r.held_ticks,
        "ticks": len(r.timeline),
        "moves": 0,
        "max_gpus": max((p.gpus for p in r.timeline), default=0),
        "scale_from_zero": 0,
        "cold_start_s": None,
        "first_request_ttft_ms": [],
        "last_reason": r.reasons[-1][1] if r.reasons else "",
        "disaggregation": {
            "layout": svc.layout,
            "budget_names": [svc.pool("prefill"), svc.pool("decode")],
            "prefill": pools["prefill"],
            "decode": pools["decode"],
            # Each split the budget held the pools to (either pool below its want), and for how many ticks.
            "held_to": [
                {
                    "prefill": k.prefill,
                    "decode": k.decode,
                    "wanted_prefill": k.wanted_prefill,
                    "wanted_decode": k.wanted_decode,
                    "gpus": k.gpus,
                    "ticks": n,
                }
                for k, n in splits
            ],
            # GPUs each pool held after each tick (starting, serving and draining workers).
            "gpus_over_time": [
                {"time_s": round(p.time_s, 1), "prefill": p.gpus[0], "decode": p.gpus[1]} for p in r.pool_timeline
            ],
        },
    }


def _render_pools(row: dict[str, Any]) -> None:
    d = row["disaggregation"]
    parts = [
        f"{role} {p['gpus_per_replica']} x {p['gpu']} per worker (planned {p['planned_workers']}), at most "
        f"{p['workers_max']} worker{'s' if p['workers_max'] != 1 else ''} / {p['max_gpus']} GPUs, "
        f"{p['gpu_hours']:.2f} GPU-h"
        for role, p in (("prefill", d["prefill"]), ("decode", d["decode"]))
    ]
    console.print(
        f"{row['name']}: prefill and decode pools ({' and '.join(d['budget_names'])} in the budget): "
        f"{'; '.join(parts)}; SLO met {row['slo_attainment']:.2%} (alone {row['alone_slo_attainment']:.2%})",
        highlight=False,
    )
    if not d["held_to"]:
        console.print(f"{row['name']}: the budget never held its pools below their wants", highlight=False)
        return
    splits = "; ".join(
        f"{h['gpus']} GPUs to prefill {h['prefill']} + decode {h['decode']} (wanted {h['wanted_prefill']} + "
        f"{h['wanted_decode']}) for {h['ticks']} ticks"
        for h in d["held_to"][:3]
    )
    more = f"; {len(d['held_to']) - 3} other splits" if len(d["held_to"]) > 3 else ""
    console.print(
        f"{row['name']}: the budget held its pools for {row['held_ticks']} of {row['ticks']} ticks (prefill "
        f"{d['prefill']['held_ticks']}, decode {d['decode']['held_ticks']}), split to serve the most requests/s "
        f"(a prefill worker {d['prefill']['rate_per_worker']:.2f} req/s, a decode worker "
        f"{d['decode']['rate_per_worker']:.2f}), not in proportion: {splits}{more}",
        highlight=False,
    )


def _render(out: dict[str, Any]) -> None:
    budget = ", ".join(f"{g} {n}" for g, n in out["budget"].items())
    used = ", ".join(f"{g} {n}" for g, n in out["max_gpus_used"].items())
    console.print(
        f"Budget {budget}; at most {used} GPUs in use; routing {out['routing']}; preemption grace "
        f"{out['preemption_grace_s']:.0f}s; the run ends {out['drain_s']:.0f}s after the loads end"
    )
    table = Table(title="Services under one budget, in priority order")
    for col in (
        "service",
        "priority",
        "requests",
        "SLO met",
        "alone",
        "rejected",
        "cut",
        "preempted",
        "grant wait",
        "GPU-h",
        "held ticks",
        "moves",
        "max GPUs",
        "last reason",
    ):
        table.add_column(col)
    for row in sorted(out["services"], key=lambda r: -r["priority"]):
        table.add_row(
            row["name"],
            str(row["priority"]),
            str(row["requests"]),
            f"{row['slo_attainment']:.2%}",
            f"{row['alone_slo_attainment']:.2%}",
            str(row["rejected"]),
            str(row["cut"]),
            str(row["preemptions"]),
            f"{row['grant_wait_s']:.0f}s",
            f"{row['gpu_hours']:.2f}",
            f"{row['held_ticks']}/{row['ticks']}",
            str(row["moves"]),
            str(row["max_gpus"]),
            row["last_reason"],
        )
    console.print(table)
    for row in out["services"]:
        if "disaggregation" in row:
            _render_pools(row)
    for row in out["services"]:
        if row["cold_start_s"] is None:
            continue
        seen = ", ".join(f"{ms / 1e3:.1f}s" for ms in row["first_request_ttft_ms"]) or "none"
        console.print(
            f"{row['name']}: scales to zero; a request that finds no replica waits at the gateway about "
            f"{row['cold_start_s']:.0f}s (the cold start). Scaled from zero {row['scale_from_zero']} time(s); "
            f"the first request's TTFT each time: {seen}"
        )


def fleet_title(services: int, limits: Mapping[str, int], source: str) -> str:
    """The picture's title: what shares what ("3 services sharing 8 H100-SXM (fleet.yaml)"); the
    budget's name alone was the file's stem ("under budget fleet")."""
    gpus = ", ".join(f"{n} {gpu}" for gpu, n in sorted(limits.items()))
    return f"{services} service{'s' if services != 1 else ''} sharing {gpus} ({source})"
