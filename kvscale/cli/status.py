"""`kvscale status NAME`: one InferenceService as the operator sees it, in one screen: the spec's
target, the plan, what is observed, the last decision, the conditions and the latest Events (read
live from the cluster of the kubeconfig)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape

from kvscale.cli.common import JsonOpt, console, fail, print_json
from kvscale.cli.live import KubeconfigOpt, Live, NamespaceOpt
from kvscale.cli.root import app

if TYPE_CHECKING:
    from kvscale.api.models import InferenceServiceStatus, PlanStatus


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}".rstrip("0").rstrip(".")


def _excluded(types: list[str], status: InferenceServiceStatus, now: dt.datetime | None) -> str:
    """The GPU types the plan leaves out, and until when (the GPUTypesExcluded condition)."""
    from kvscale.control import exclusions

    found = next((c for c in status.conditions if c.type == exclusions.CONDITION), None)
    until = exclusions.until_in(found.message if found is not None else None)
    if until is None:
        return (
            f"Excluded: {', '.join(types)} (no expiry recorded: an operator with KVSCALE_GPU_EXCLUSION_TTL "
            "plans with them again at its next status tick)"
        )
    left = (until - (now or dt.datetime.now(dt.UTC))).total_seconds()
    when = f"in {_span(left)}" if left > 0 else "due now"
    return (
        f"Excluded: {', '.join(types)} until {until.strftime('%Y-%m-%dT%H:%M:%SZ')} ({when}; pods found no "
        "free GPUs of the type), then planned with again"
    )


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f}m" if seconds >= 120 else f"{seconds:.0f}s"


# Waiting reasons of a container that is on its way (not a failure to show).
STARTING = frozenset({"ContainerCreating", "PodInitializing"})


def container_problems(pods: list[dict[str, Any]]) -> list[str]:
    """What keeps the engine pods from serving, from their containers' states (pure): a container
    waiting for a reason other than being created (a missing Secret: CreateContainerConfigError;
    ErrImagePull, ImagePullBackOff, CrashLoopBackOff), with its last exit and restarts. Pods of
    one cause are counted together, the first one named."""
    found: dict[str, list[str]] = {}
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name", "?")
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue  # going away: not what keeps the service from serving
        st = pod.get("status") or {}
        for c in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
            state, last = c.get("state") or {}, (c.get("lastState") or {}).get("terminated") or {}
            waiting = state.get("waiting") or {}
            if not waiting or waiting.get("reason") in STARTING:
                continue
            reason = waiting.get("reason", "Waiting")
            cause = f"{c.get('name')} {reason}"
            if waiting.get("message") and reason != "CrashLoopBackOff":  # that one's names the pod: the exit says why
                cause += f": {waiting['message']}"
            if last:
                cause += f" (last exit {last.get('exitCode', '?')} {last.get('reason', '')}".rstrip() + ")"
            found.setdefault(cause, []).append(f"{name}, {int(c.get('restartCount') or 0)} restarts")
    return [f"{len(where)} pod(s), e.g. {where[0]}: {cause}" for cause, where in found.items()]


def pod_state(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod as `status --json` shows it: name, phase, node and each container's state."""
    st = pod.get("status") or {}
    containers = []
    for c in st.get("containerStatuses") or []:
        state = c.get("state") or {}
        kind = next(iter(state), None)
        detail = state.get(kind) or {} if kind else {}
        last = (c.get("lastState") or {}).get("terminated") or {}
        containers.append(
            {
                "name": c.get("name"),
                "ready": bool(c.get("ready")),
                "state": kind,
                "reason": detail.get("reason"),
                "message": detail.get("message"),
                "restarts": int(c.get("restartCount") or 0),
                "last_exit_code": last.get("exitCode"),
            }
        )
    return {
        "name": (pod.get("metadata") or {}).get("name"),
        "phase": st.get("phase"),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "containers": containers,
    }


def _pool_lines(plan: PlanStatus) -> list[str]:
    """A disaggregated plan (status.plan.prefill / decode): each pool, then the service's predictions."""
    p, d = plan.prefill, plan.decode
    assert p is not None and d is not None  # the caller looked
    return [
        f"Plan:     disaggregated, {plan.gpus_total or p.gpus + d.gpus} GPUs, ${plan.cost_per_hour:.2f}/h; KV transfer "
        f"{_num(plan.kv_transfer_ms, 1)} ms per request",
        f"          prefill {p.replicas} x {p.tensor_parallel} {p.gpu_type} ({p.precision}), chunk budget "
        f"{p.max_num_batched_tokens} tokens, {_num(p.rate_per_worker)} req/s per worker ({p.deployment})",
        f"          decode  {d.replicas} x {d.tensor_parallel} {d.gpu_type} ({d.precision}), max batch {d.max_batch}, "
        f"{_num(d.rate_per_worker)} req/s per worker ({d.deployment})",
        f"          predicted TTFT {plan.predicted_ttft}, TPOT {plan.predicted_tpot} at the planned load",
    ]


def status_lines(
    obj: dict[str, Any],
    events: list[dict[str, Any]],
    now: dt.datetime | None = None,
    pods: list[dict[str, Any]] | None = None,
) -> list[str]:
    """The screen, line by line (plain text; pure, for tests: `now` is when it is read). `pods`:
    the engine pods, when read (None: not readable)."""

    from kvscale.api.models import InferenceServiceStatus, ScalingSpec

    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    status = InferenceServiceStatus.model_validate(obj.get("status") or {})
    slo, workload = spec.get("slo") or {}, spec.get("workload") or {}
    scaling = spec.get("scaling") or {}
    # The spec's defaults where it leaves a bound out (the API server stores the spec as written).
    bounds = {k: ScalingSpec.model_fields[k].default for k in ("min_replicas", "max_replicas")}
    generation, seen = meta.get("generation"), status.observed_generation
    behind = "" if seen is None or seen == generation else f" (status of generation {seen}, spec at {generation})"
    lines = [
        f"{meta.get('name')} in {meta.get('namespace')}: {status.phase or 'no status yet'}, "
        f"mode {scaling.get('mode', 'auto')}{behind}",
        f"  model {(spec.get('model') or {}).get('name') or '(architecture)'}; SLO p{slo.get('percentile', 95)} "
        f"TTFT <= {slo.get('timeToFirstToken', '-')}, TPOT <= {slo.get('timePerOutputToken', '-')}"
        + (f", p99 ITL <= {slo['maxInterTokenLatency']}" if slo.get("maxInterTokenLatency") else "")
        + "; "
        f"spec workload {workload.get('requestsPerSecond', '-')} req/s, {workload.get('inputTokens', '-')} in / "
        f"{workload.get('outputTokens', '-')} out; replicas {scaling.get('minReplicas', bounds['min_replicas'])}.."
        f"{scaling.get('maxReplicas', bounds['max_replicas'])}",
    ]
    plan = status.plan
    if plan is None:
        lines.append("Plan:     none yet (see the Planned condition)")
    elif plan.mode == "disaggregated" and plan.prefill is not None and plan.decode is not None:
        lines += _pool_lines(plan)
    else:
        shape = (
            f"{plan.replicas} x {plan.tensor_parallel * plan.pipeline_parallel * plan.data_parallel} {plan.gpu_type}"
        )
        if plan.data_parallel > 1:
            shape += f" (data-parallel attention x{plan.data_parallel})"
        if plan.nodes > 1:
            shape += f" over {plan.nodes} nodes (TP {plan.tensor_parallel} x PP {plan.pipeline_parallel})"
        lines += [
            f"Plan:     {shape} ({plan.precision}), max batch {plan.max_batch}, chunk budget "
            f"{plan.max_num_batched_tokens or '-'} tokens, context {plan.max_context_tokens}, ${plan.cost_per_hour:.2f}/h",
            f"          predicted TTFT {plan.predicted_ttft}, TPOT {plan.predicted_tpot}"
            + (f", p99 ITL {plan.predicted_itl_p99}" if plan.predicted_itl_p99 else "")
            + " at the planned load; "
            f"{_num(plan.rate_per_replica)} req/s per replica; limited by {plan.limited_by}; "
            f"MBU {_pct(plan.mbu)}, MFU {_pct(plan.mfu)}",
        ]
        if plan.workload is not None:
            w = plan.workload
            lines.append(
                f"          planned for {_num(w.requests_per_second)} req/s, {w.input_tokens} in / {w.output_tokens} "
                f"out ({w.source})"
            )
        if plan.excluded_gpu_types:
            lines.append(_excluded(plan.excluded_gpu_types, status, now))
    observed = status.observed
    if observed is None or (observed.ttft is None and observed.tpot is None and observed.requests_per_second is None):
        metrics = next((c for c in status.conditions if c.type == "MetricsAvailable"), None)
        why = (
            f"MetricsAvailable {metrics.status}: {metrics.message or metrics.reason}"
            if metrics is not None
            else "no MetricsAvailable condition: the operator reads no Prometheus (KVSCALE_PROMETHEUS_URL) or not yet"
        )
        lines.append(f"Observed: nothing yet ({why})")
    else:
        lines.append(
            f"Observed: TTFT {observed.ttft or '-'} (target {slo.get('timeToFirstToken', '-')}), TPOT "
            f"{observed.tpot or '-'} (target {slo.get('timePerOutputToken', '-')}), "
            f"{_num(observed.requests_per_second)} req/s, queue {_num(observed.queue, 1)}, "
            f"KV cache {_pct(observed.kv_cache_usage)}"
        )
    capacity = status.capacity
    if capacity is not None:
        where = (
            f"simulated on {capacity.requests} observed requests at {capacity.measured_at}"
            if capacity.source == "simulated"
            else "the model's"
        )
        beside = f"the model's {_num(capacity.analytic)}"
        if capacity.simulated is not None and capacity.source != "simulated":
            beside += (
                f", simulated {_num(capacity.simulated)} on {capacity.requests} requests at {capacity.measured_at}"
            )
        lines.append(
            f"Capacity: {_num(capacity.requests_per_second_per_replica)} req/s per replica ({where}; {beside})"
            + (f": {capacity.message}" if capacity.message else "")
        )
    holding = status.holding  # only with KVSCALE_HOLDING=tuned
    if holding is not None:
        since = f", since {holding.chosen_at}" if holding.chosen_at else ""
        lines.append(f"Holding:  {holding.settings} ({holding.source}{since}): {holding.message}")
    lines.append(
        f"Decision: replicas {_num(status.replicas)} (ready {_num(status.ready_replicas)}), desired "
        f"{_num(status.desired_replicas)}; last scaled {status.last_scale_time or 'never'}"
        + (f": {status.last_scale_reason}" if status.last_scale_reason else "")
    )
    if pods is None:
        lines.append("Pods:     not readable (this user may not list pods)")
    elif pods:
        ready = sum(
            1
            for p in pods
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        )
        problems = container_problems(pods)
        lines.append(f"Pods:     {len(pods)} ({ready} ready)" + ("" if problems else "; no container failing"))
        lines += [f"  {p}" for p in problems]
    lines.append("Conditions:")
    for c in status.conditions:
        lines.append(f"  {c.type:<17} {c.status:<7} {c.reason}" + (f": {c.message}" if c.message else ""))
    if events:
        lines.append(f"Events (latest {len(events)}):")
        for e in events:
            when = e.get("lastTimestamp") or e.get("eventTime") or ""
            lines.append(f"  {when} {e.get('type', '')} {e.get('reason', '')}: {e.get('message', '')}")
    return lines


@app.command()
def status(
    name: Annotated[str, typer.Argument(help="The InferenceService's name.")],
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One InferenceService in one screen: its target, the plan, what is observed, the last scaling
    decision, the conditions and the latest Events (read from the cluster of the kubeconfig)."""
    live = Live(kubeconfig)
    ns = namespace or live.namespace
    obj = live.get("kvscale.io/v1alpha1", "InferenceService", ns, name)
    if obj is None and not live.serves("kvscale.io/v1alpha1", "InferenceService"):
        fail(
            "the InferenceService CRD (inferenceservices.kvscale.io) is not installed in this cluster; install "
            "it with `kubectl apply -f crds/` from a kvscale checkout, or with the Helm chart "
            "(`helm install kvscale charts/kvscale`, crds.install=true by default)"
        )
    if obj is None:
        fail(f"InferenceService {ns}/{name} not found; list them with `kubectl get kvis -n {ns}` (or pass -n)")
    events = live.events(ns, name, kind="InferenceService")  # not the Service's or its Endpoints' of the same name
    from kvscale.api import selector as default_selector

    selector = ((obj.get("status") or {}).get("selector")) or default_selector(name)
    pods = live.pods(ns, selector)
    if as_json:
        print_json(
            {
                "name": name,
                "namespace": ns,
                "spec": obj.get("spec") or {},
                "status": obj.get("status") or {},
                "events": [
                    {k: e.get(k) for k in ("type", "reason", "message", "lastTimestamp", "count")} for e in events
                ],
                "pods": None if pods is None else [pod_state(p) for p in pods],
                "container_problems": None if pods is None else container_problems(pods),
            }
        )
        return
    try:
        lines = status_lines(obj, events, pods=pods)
    except ValidationError as exc:
        fail(f"InferenceService {ns}/{name}: its status cannot be read ({exc.error_count()} problem(s)): {exc}")
    for line in lines:
        console.print(escape(line), soft_wrap=True)
