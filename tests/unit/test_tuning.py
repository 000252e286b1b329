"""One policy (issue 27 item 4): the operator, `kvscale simulate`, `simulate --fleet` and the
benchmarks build the policy's settings through one constructor
(kvscale.autoscaling.tuning.policy_config), so a simulated run is the deployed policy."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from kvscale.api.intent import parse_intent, policy_config
from kvscale.autoscaling.capacity import SizingCapacity
from kvscale.autoscaling.policy import PolicyConfig
from kvscale.planner.search import PlanRequest, plan
from kvscale.sim.budget_run import FleetService, ServiceOption, _ServiceRun
from kvscale.sim.compare import make_policies
from kvscale.sim.policies import KvscalePolicy
from kvscale.sim.run import SimSetup
from kvscale.sim.trace import TraceRequest
from tests.unit.test_reconcile import CAT, SETTINGS, spec

ROOT = Path(__file__).resolve().parents[2]
CONSTRUCTOR = ROOT / "kvscale" / "autoscaling" / "tuning.py"


def _builds_policy_config(path: Path) -> list[int]:
    """Lines where the module calls PolicyConfig(...) or dataclasses.replace(<a PolicyConfig>, ...)
    by name: a second place that tunes the policy."""
    tree = ast.parse(path.read_text(), str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name == "PolicyConfig":
                lines.append(node.lineno)
    return lines


def test_only_the_constructor_builds_the_policys_settings() -> None:
    sources = [*(ROOT / "kvscale").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    assert CONSTRUCTOR in sources
    elsewhere = {
        str(p.relative_to(ROOT)): lines for p in sources if p != CONSTRUCTOR and (lines := _builds_policy_config(p))
    }
    assert elsewhere == {}, f"PolicyConfig built outside kvscale/autoscaling/tuning.py: {elsewhere}"
    assert _builds_policy_config(CONSTRUCTOR)  # the check itself finds a call where there is one


def _same_setup(routing: str) -> tuple[PolicyConfig, SimSetup, list[TraceRequest]]:
    """The operator's config for the test resource, and a simulation of the same service: its
    SLO, its plan, its lengths (the trace's means), its bounds, the same cold start, tick and window."""
    body = spec(routing={"inferencePool": {}}) if routing == "gateway" else spec()
    intent = parse_intent(body)
    operator = policy_config(intent, 90.0, SETTINGS.scale_interval_s, SETTINGS.metrics_window_s)
    chosen = plan(
        CAT,
        PlanRequest(model=CAT.model("llama-3.1-8b"), workload=intent.workload, slo=intent.slo, gpus=("L4",)),
    ).chosen
    assert chosen is not None
    setup = SimSetup(
        chosen.config,
        intent.slo,
        chosen.prediction.max_batch,
        90.0,
        1,
        tick_s=SETTINGS.scale_interval_s,
        window_s=SETTINGS.metrics_window_s,
        routing=routing,
    )
    w = intent.workload
    trace = [TraceRequest(float(i), int(w.input_tokens), int(w.output_tokens)) for i in range(20)]
    return operator, setup, trace


def _fields(config: PolicyConfig) -> dict[str, object]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def test_simulate_runs_the_operators_policy_with_the_same_tuning() -> None:
    for routing in ("service", "gateway"):
        operator, setup, trace = _same_setup(routing)
        capacity = SizingCapacity(setup.cfg, setup.slo, setup.max_batch)
        max_replicas = operator.max_replicas
        (policy,) = make_policies(("kvscale",), setup, capacity, trace, operator.headroom, None, max_replicas)
        assert isinstance(policy, KvscalePolicy)
        # Field by field, so a new setting that only one side sets fails here by name.
        assert _fields(policy.config) == _fields(operator), routing
        # The settings that drifted before (issue 27): feedback waits a window plus a tick.
        assert policy.config.feedback_cooldown_s == SETTINGS.metrics_window_s + SETTINGS.scale_interval_s


def test_simulate_fleet_runs_the_operators_policy_with_the_same_tuning() -> None:
    for routing in ("service", "gateway"):
        operator, setup, trace = _same_setup(routing)
        svc = FleetService(
            "chat",
            (ServiceOption(setup, 1.0),),
            trace,
            min_replicas=operator.min_replicas,
            max_replicas=operator.max_replicas,
            headroom=operator.headroom,
        )
        run = _ServiceRun(svc, SETTINGS.scale_interval_s, SETTINGS.metrics_window_s)
        assert [_fields(c) for c in run.configs] == [_fields(operator)], routing


def test_a_stabilization_window_from_the_spec_reaches_the_policy() -> None:
    intent = parse_intent(spec(scaling={"scaleDownStabilization": "5m"}))
    assert policy_config(intent, 90.0, 15.0, 60.0).scale_down_stabilization_s == 300.0
