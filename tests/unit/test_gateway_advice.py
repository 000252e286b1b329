"""The advice to put a plain-Service fleet behind a least-loaded gateway: the planner's own
two models of the router, the CLI line, and the operator's GatewayAdvised condition."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from typer.testing import CliRunner

from kvscale.api.intent import read_spec
from kvscale.cli import app
from kvscale.control.reconcile import GATEWAY_CONDITION, Observed, reconcile
from kvscale.planner.routing_advice import gateway_advice
from kvscale.planner.search import PlanRequest, plan
from kvscale.sizing.workload import Slo, Workload
from tests.unit.test_reconcile import CAT, NOW, POOLS, RES, SETTINGS, condition_of, deployed

# Long prompts, short outputs, a p99 TTFT: behind a random router a prompt often lands on a
# replica busy with another's prefill (planner: 4 x H100 behind a Service, 3 behind a gateway).
LONG = Workload(8000, 100, 8.0)
LONG_SLO = Slo(2.0, 0.05, 99.0)
LONG_SPEC: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b"},
    "workload": {"inputTokens": 8000, "outputTokens": 100, "requestsPerSecond": 8},
    "slo": {"timeToFirstToken": "2s", "timePerOutputToken": "50ms", "percentile": 99},
    "hardware": {"gpuTypes": ["H100-SXM"]},
}


def _request(workload: Workload, slo: Slo, least_loaded: bool = False) -> PlanRequest:
    return PlanRequest(
        model=CAT.model("llama-3.1-8b"), workload=workload, slo=slo, gpus=("H100-SXM",), least_loaded=least_loaded
    )


def test_long_prompts_behind_a_service_are_advised_the_gateways_own_plan() -> None:
    service = plan(CAT, _request(LONG, LONG_SLO))
    advice = gateway_advice(CAT, service)
    assert advice is not None
    gateway = plan(CAT, _request(LONG, LONG_SLO, least_loaded=True)).chosen
    assert gateway is not None and service.chosen is not None
    # The advice is exactly what planning behind a gateway on that GPU type gives.
    assert advice.gateway_replicas == gateway.prediction.replicas < service.chosen.prediction.replicas
    assert advice.service_usd_per_hour == service.chosen.prediction.cost_usd_per_hour
    assert advice.saving >= 0.2
    message = advice.message("do X")
    assert f"{advice.gateway_replicas} replica(s)" in message and message.endswith("do X")


def test_no_advice_for_short_chat_or_a_plan_already_behind_a_gateway() -> None:
    chat = plan(CAT, _request(Workload(512, 256, 10.0), Slo(0.5, 0.05, 95.0)))
    assert chat.chosen is not None and gateway_advice(CAT, chat) is None
    assert gateway_advice(CAT, plan(CAT, _request(LONG, LONG_SLO, least_loaded=True))) is None
    # The threshold decides: a saving of 25% is not advised when 99% is asked for.
    service = plan(CAT, _request(LONG, LONG_SLO))
    assert gateway_advice(CAT, service, min_saving=0.99) is None


def test_plan_prints_and_serializes_the_gateway_beside_the_service_plan() -> None:
    args = ["plan", "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--ttft", "2s", "--tpot", "50ms"]
    args += ["--percentile", "99", "--rps", "8", "--input", "8000", "--output", "100"]
    args += ["--disaggregation", "off"]  # the gateway beside aggregated replicas is the subject
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "gateway beside it:" in text.output and "--routing gateway" in text.output
    out = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    beside = out["chosen"]["gateway_beside"]
    assert beside["replicas"] < out["chosen"]["replicas"] and beside["saving"] >= 0.2
    behind = json.loads(CliRunner().invoke(app, [*args, "--json", "--routing", "gateway"]).output)
    assert "gateway_beside" not in behind["chosen"] and behind["chosen"]["replicas"] == beside["replicas"]


def test_the_operator_advises_once_and_not_behind_a_pool() -> None:
    first = deployed(LONG_SPEC)
    state, reason, message = condition_of(first.status, GATEWAY_CONDITION)
    assert (state, reason) == ("True", "FewerReplicasBehindGateway")
    assert "spec.routing.inferencePool" in message
    assert [e.reason for e in first.events].count(GATEWAY_CONDITION) == 1
    # A re-plan keeps the condition and does not repeat the Event.
    again = reconcile(
        read_spec(LONG_SPEC), replace(RES, generation=2), first.status, Observed(POOLS), CAT, SETTINGS, now=NOW
    )
    assert condition_of(again.status, GATEWAY_CONDITION)[0] == "True"
    assert GATEWAY_CONDITION not in [e.reason for e in again.events]
    # Behind a pool the plan already assumes the gateway: the advice goes.
    pooled = {**LONG_SPEC, "routing": {"inferencePool": {}}}
    behind = reconcile(
        read_spec(pooled), replace(RES, generation=3), again.status, Observed(POOLS), CAT, SETTINGS, now=NOW
    )
    assert not any(c.type == GATEWAY_CONDITION for c in behind.status.conditions)
    assert not any(c.type == GATEWAY_CONDITION for c in deployed().status.conditions)
