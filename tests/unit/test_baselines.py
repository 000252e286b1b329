"""Today's autoscalers reproduce their documented formulas on hand-built inputs."""

from kvscale.autoscaling.observation import Observation
from kvscale.sim.policies import HpaRunningPolicy, KedaWaitingPolicy, SaturationPolicy, SchedulePolicy, StaticPolicy


def o(t: float, ready: int, running: float = 0, waiting: float = 0, kv: float = 0.1, starting: int = 0) -> Observation:
    return Observation(
        time_s=t,
        ready_replicas=ready,
        starting_replicas=starting,
        arrival_rate_per_s=1.0,
        running=running,
        waiting=waiting,
        kv_usage=kv,
    )


def test_hpa_formula_tolerance_and_limits() -> None:
    hpa = HpaRunningPolicy(target_running_per_replica=10)
    assert hpa.decide(o(15, 4, running=42)).replicas == 4  # ratio 1.05 within the 10% tolerance
    assert hpa.decide(o(30, 4, running=60)).replicas == 6  # ceil(4 x 1.5)
    assert hpa.decide(o(45, 2, running=400)).replicas == 6  # limited to max(+100%, +4 pods) = 6


def test_hpa_scale_down_stabilization_is_300s() -> None:
    hpa = HpaRunningPolicy(target_running_per_replica=10)
    assert hpa.decide(o(0, 6, running=60)).replicas == 6
    for t in range(15, 300, 15):
        assert hpa.decide(o(t, 6, running=10)).replicas == 6
    assert hpa.decide(o(315, 6, running=10)).replicas == 1


def test_keda_average_value_on_waiting() -> None:
    keda = KedaWaitingPolicy(threshold=5)
    assert keda.decide(o(15, 4, waiting=31)).replicas == 7  # ceil(31 / 5)
    assert KedaWaitingPolicy().decide(o(15, 2, waiting=31)).replicas == 6  # HPA scale-up limit: max(2x, +4)
    assert keda.decide(o(30, 7, waiting=0)).replicas == 7  # scale-down waits 300 s


def test_saturation_up_and_down() -> None:
    sat = SaturationPolicy(max_batch=64)
    assert sat.decide(o(15, 2, kv=0.85)).replicas == 3
    assert sat.decide(o(30, 2, waiting=11)).replicas == 3
    assert sat.decide(o(45, 2, kv=0.5, starting=1, waiting=20)).replicas == 3  # already starting one
    assert sat.decide(o(60, 3, running=20, kv=0.3)).replicas == 2  # 0.45 on two
    assert sat.decide(o(75, 2, running=20, kv=0.5)).replicas == 2  # 1.0 on one: stays


def test_static_and_schedule() -> None:
    assert StaticPolicy(4).decide(o(0, 1)).replicas == 4
    schedule = SchedulePolicy([(0.0, 1), (60.0, 3), (120.0, 2)])
    assert [schedule.decide(o(t, 1)).replicas for t in (0, 59, 60, 130)] == [1, 1, 3, 2]


def test_trailing_holds_1_3x_the_largest_closed_minute_of_the_last_ten() -> None:
    from kvscale.sim.policies import TrailingPolicy

    # Minute i's bound count; minute 2 needs 10, minute 14 needs 4.
    counts = [2, 3, 10, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 4, 2]
    trailing = TrailingPolicy(counts, 60.0)
    assert trailing.decide(o(30, 3)).replicas == 3  # no minute closed yet: hold what runs
    assert trailing.decide(o(60, 3)).replicas == 3  # minute 0 (2) closed: ceil(1.3 x 2) = 3
    # Causal: minute 2's 10 counts only once minute 2 is over, at t = 180 s, not during it.
    assert trailing.decide(o(179, 3)).replicas == 4  # ceil(1.3 x 3)
    assert trailing.decide(o(180, 4)).replicas == 13  # ceil(1.3 x 10)
    # It holds for ten minutes (minutes 3..12 once minute 12 has closed at 780 s), then fades.
    assert trailing.decide(o(779, 13)).replicas == 13
    assert trailing.decide(o(780, 13)).replicas == 3
    # A quantile below 1 drops the one high minute of ten.
    assert TrailingPolicy(counts, 60.0, quantile=0.8).decide(o(600, 13)).replicas == 3


def test_trailing_from_the_bound_runs_in_simulate() -> None:
    import json

    from typer.testing import CliRunner

    from kvscale.cli import app

    base = ["simulate", "--model", "llama-3.1-8b", "--ttft", "1s", "--tpot", "60ms", "--gpu", "L4", "--json"]
    load = "spikes:base=0.5,peak=4,every=2m,length=30s,input=400,output=60,duration=12m"
    result = CliRunner().invoke(app, [*base, "--load", load, "--policy", "trailing,bound", "--seed", "2"])
    assert result.exit_code == 0, result.output
    rows = {r["policy"]: r for r in json.loads(result.stdout)}
    # It holds 1.3 x the bound's past peak minute, so it never spends less than the bound
    # after its first ten minutes, and meets the SLO about as well.
    assert rows["trailing"]["requests"] == rows["bound"]["requests"]
    assert rows["trailing"]["gpu_hours"] > 0.9 * rows["bound"]["gpu_hours"]
    assert rows["trailing"]["slo_attainment"] > 0.9
