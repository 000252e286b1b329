"""Disaggregated services in `simulate --fleet` (issue 36, item 5) and pools under a GPU limit
in `simulate --disaggregation --gpu-limit`: each pool is a want of its own in the budget, the
two are held within the limit, and what they get together is split by what they serve
together (kvscale.autoscaling.pool_capacity.split_pools, as the operator's budget book)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvscale.autoscaling.budget import Budget
from kvscale.autoscaling.observation import Decision, DecisionKind
from kvscale.autoscaling.pool_capacity import split_pools
from kvscale.autoscaling.tick import Seat, SeatOption, Want
from kvscale.cli import app
from kvscale.cli.simulate_fleet import fleet_services
from kvscale.sim.budget_run import PoolsResult, PoolsService, simulate_fleet
from kvscale.sim.pool_policies import SplitPooled
from kvscale.sizing.catalog import default_catalog

CAT = default_catalog()
runner = CliRunner()

# Long prompts, a tight TPOT: the planner's pools (1-GPU prefill workers, 2-GPU decode workers
# on H100s for this SLO; tests/unit/test_disaggregated_sim.py replays the same shape alone).
POOLS = """
  - name: rag
    model: llama-3.1-8b
    priority: 50
    gpus: [H100-SXM]
    disaggregation: {mode}
    slo: {{ttft: 1.5s, tpot: 12ms}}
    load: poisson:rate=12,duration=3m,input=4000,output=300
"""
CHAT = """
  - name: chat
    model: llama-3.1-8b
    priority: 100
    gpus: [H100-SXM]
    slo: {ttft: 1s, tpot: 50ms}
    load: poisson:rate=4,duration=3m,input=1000,output=200
"""


def _fleet(tmp_path: Path, budget: int, services: str, routing: str = "gateway") -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(f"budget: {{H100-SXM: {budget}}}\nrouting: {routing}\nservices:{services}")
    return path


def test_a_tight_budget_holds_both_pools_within_it_at_the_split_that_serves_the_most(tmp_path: Path) -> None:
    limit = 5  # the plan's pools (3 prefill x 1 + 3 decode x 2 = 9 GPUs) do not fit
    path = _fleet(tmp_path, limit, POOLS.format(mode="on"))  # a bare YAML `on`: read as the switch, not a boolean
    budget, services, _ = fleet_services(path, CAT)
    (svc,) = services
    assert isinstance(svc, PoolsService)
    planned = svc.setup.prefill.initial_replicas * svc.setup.prefill.cfg.gpus
    planned += svc.setup.decode.initial_replicas * svc.setup.decode.cfg.gpus
    assert planned > limit
    result = simulate_fleet(budget, services)
    (r,) = result.services
    assert isinstance(r, PoolsResult)
    gpus = (svc.setup.prefill.cfg.gpus, svc.setup.decode.cfg.gpus)
    # never above the limit: at the start, after every tick, each pool's and both together
    assert all(used.get("H100-SXM", 0) <= limit for _, used in result.usage)
    assert all(sum(p.gpus) <= limit and min(p.granted) >= 1 for p in r.pool_timeline)
    # and the pools do use it: less than one worker of each left idle at their peak
    assert limit - sum(gpus) < result.max_gpus_used["H100-SXM"] <= limit
    # the budget bound, and every split it held the pools to is split_pools' on what was granted
    assert r.held_ticks > 0 and r.splits
    for split, ticks in r.splits.items():
        assert ticks > 0 and split.gpus <= limit
        want = (split.wanted_prefill, split.wanted_decode)
        assert (split.prefill, split.decode) == split_pools(split.gpus, want, r.rates, gpus)
        assert split.prefill * gpus[0] + split.decode * gpus[1] <= split.gpus
        assert split.prefill < split.wanted_prefill or split.decode < split.wanted_decode
    # each pool's GPU-hours are its own; the service's are both pools'
    assert r.replay is not None
    assert r.gpu_hours == pytest.approx(sum(p.gpu_hours for p in r.replay.pools.values()))
    assert r.replay.pools["prefill"].gpu_hours > 0 and r.replay.pools["decode"].gpu_hours > 0
    assert len(r.requests) > 1000 and all(q.done or q.lost for q in r.requests)


def test_the_fleet_report_carries_each_pool_and_the_splits(tmp_path: Path) -> None:
    path = _fleet(tmp_path, 6, CHAT + POOLS.format(mode='"on"'))
    out = runner.invoke(app, ["simulate", "--fleet", str(path), "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["max_gpus_used"]["H100-SXM"] <= 6
    rows = {row["name"]: row for row in report["services"]}
    assert "disaggregation" not in rows["chat"]  # an aggregated service's row is as it was
    rag = rows["rag"]["disaggregation"]
    assert rag["budget_names"] == ["rag-prefill", "rag-decode"]
    assert rag["prefill"]["gpus_per_replica"] == 1 and rag["decode"]["gpus_per_replica"] == 2
    assert rows["rag"]["gpu_hours"] == pytest.approx(rag["prefill"]["gpu_hours"] + rag["decode"]["gpu_hours"], abs=2e-4)
    assert rag["held_to"] and all(h["gpus"] <= 6 for h in rag["held_to"])
    assert sum(h["ticks"] for h in rag["held_to"]) == rows["rag"]["held_ticks"]
    assert all(p["prefill"] + p["decode"] <= 6 for p in rag["gpus_over_time"])
    assert len(rag["gpus_over_time"]) == rows["rag"]["ticks"]
    # chat outranks rag: its SLO holds; rag's pools get what is left and miss more than alone
    assert rows["chat"]["slo_attainment"] >= 0.99
    assert rows["rag"]["slo_attainment"] < rows["rag"]["alone_slo_attainment"]
    table = runner.invoke(app, ["simulate", "--fleet", str(path)])
    assert table.exit_code == 0, table.output
    said = " ".join(table.stdout.split())
    assert "rag: prefill and decode pools (rag-prefill and rag-decode in the budget)" in said
    assert "split to serve the most requests/s" in said


def test_disaggregation_off_is_the_default_and_changes_nothing(tmp_path: Path) -> None:
    plain = _fleet(tmp_path, 4, CHAT)
    off = tmp_path / "off.yaml"
    off.write_text(plain.read_text().replace("    priority: 100\n", "    priority: 100\n    disaggregation: off\n"))
    assert "disaggregation: off" in off.read_text()
    a = runner.invoke(app, ["simulate", "--fleet", str(plain), "--json"])
    b = runner.invoke(app, ["simulate", "--fleet", str(off), "--json"])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert a.stdout == b.stdout
    (row,) = json.loads(a.stdout)["services"]
    assert "disaggregation" not in row and row["gpu_types"] == ["H100-SXM"]


def test_auto_runs_pools_only_behind_the_gateway_as_the_operator(tmp_path: Path) -> None:
    _, services, _ = fleet_services(_fleet(tmp_path, 12, POOLS.format(mode="auto")), CAT)
    assert isinstance(services[0], PoolsService) and services[0].layout.startswith("disaggregated: ")
    (tmp_path / "service").mkdir()
    _, services, _ = fleet_services(_fleet(tmp_path / "service", 12, POOLS.format(mode="auto"), "service"), CAT)
    assert not isinstance(services[0], PoolsService)


@pytest.mark.parametrize("value", ["maybe", "1", "[on]"])
def test_a_bad_disaggregation_names_the_field_and_the_values(tmp_path: Path, value: str) -> None:
    out = runner.invoke(app, ["simulate", "--fleet", str(_fleet(tmp_path, 6, CHAT + POOLS.format(mode=value)))])
    assert out.exit_code == 2
    said = " ".join(out.stderr.split())
    assert "services.1.disaggregation" in said and "'auto', 'on' or 'off'" in said


def test_pools_refuse_scale_to_zero_and_a_name_their_pool_takes(tmp_path: Path) -> None:
    zero = POOLS.format(mode="on") + "    min_replicas: 0\n"
    out = runner.invoke(app, ["simulate", "--fleet", str(_fleet(tmp_path, 6, zero))])
    assert out.exit_code == 2 and "services.0 (rag): min_replicas 0" in " ".join(out.stderr.split())
    clash = POOLS.format(mode="on") + CHAT.replace("name: chat", "name: rag-decode")
    out = runner.invoke(app, ["simulate", "--fleet", str(_fleet(tmp_path, 6, clash))])
    assert out.exit_code == 2 and "rag-decode is both a service's name" in " ".join(out.stderr.split())


def test_split_pooled_splits_each_pair_on_a_limited_type_only() -> None:
    def want(name: str, n: int, gpu: str, gpus: int, rate: float) -> Want:
        seat = Seat(name, (SeatOption(gpu, gpus, rate),), 0, 0, 1, 100, gpu)
        d = Decision(n, "test", DecisionKind.FEEDBACK)
        return Want(d, d, None, 0, 0.0, seat)

    # two services' pools on H100s (limited to 8 GPUs) and one on L40S (no limit)
    wants = [
        want("a-prefill", 4, "H100-SXM", 1, 10.0),
        want("a-decode", 4, "H100-SXM", 1, 2.0),
        want("b-prefill", 3, "L40S", 1, 10.0),
        want("b-decode", 3, "L40S", 1, 2.0),
    ]
    answers = SplitPooled(Budget("b", {"H100-SXM": 8}), {}, [(0, 1), (2, 3)]).answer(wants)
    # 8 H100s granted for 4 + 4 wanted: the split that serves the most is 1 prefill worker
    # (10 req/s) and the decode pool at its want (4 x 2 req/s), not the grants as they were
    assert [a.replicas for a in answers[:2]] == [1, 4] == list(split_pools(8, (4, 4), (10.0, 2.0), (1, 1)))
    assert [a.replicas for a in answers[2:]] == [3, 3]  # no limit on L40S: each keeps its grant


LOAD = "poisson:rate=12,input=4000,output=300,duration=3m"
BASE = ["simulate", "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--ttft", "1.5s", "--tpot", "12ms", "--load", LOAD]


def test_gpu_limit_holds_the_pools_within_it_from_the_start() -> None:
    out = runner.invoke(app, [*BASE, "--disaggregation", "on", "--gpu-limit", "H100-SXM=6", "--json"])
    assert out.exit_code == 0, out.output
    rows = {row["policy"]: row for row in json.loads(out.stdout)}
    assert set(rows) == {"kvscale", "static", "ratematch"}
    for row in rows.values():
        assert row["gpu_limits"] == {"H100-SXM": 6} and row["max_gpus_used"]["H100-SXM"] <= 6
    start = rows["kvscale"]["start"]
    assert start["prefill"] + 2 * start["decode"] <= 6 and "the plan: 3 and 3" in start["why"]
    free = runner.invoke(app, [*BASE, "--disaggregation", "on", "--policy", "kvscale", "--json"])
    assert free.exit_code == 0, free.output
    (unlimited,) = json.loads(free.stdout)
    assert "gpu_limits" not in unlimited
    assert unlimited["prefill"]["replicas_max"] * 1 + unlimited["decode"]["replicas_max"] * 2 > 6


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--disaggregation", "on", "--gpu-limit", "H100-SXM=lots"], "write TYPE=N"),
        (["--disaggregation", "on", "--gpu-limit", "H100-SXM=2"], "not one prefill worker (1 GPUs) and one decode"),
        (["--gpu-limit", "H100-SXM=6"], "give --disaggregation on or auto"),
    ],
)
def test_gpu_limit_refuses_what_it_cannot_hold(extra: list[str], said: str) -> None:
    out = runner.invoke(app, [*BASE, *extra])
    assert out.exit_code != 0 and said in " ".join(out.stderr.split()), out.output
