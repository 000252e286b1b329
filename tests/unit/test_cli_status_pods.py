"""Issue 39, LOW: `kvscale status` shows the spec's replica bounds with their defaults (not
`1..-`), and what keeps engine pods from serving, read from their containers' states (a missing
Secret, an image pull error, a crash loop showed only as 0/N ready)."""

from __future__ import annotations

import copy
from typing import Any

from kvscale.api.models import ScalingSpec
from kvscale.cli.status import container_problems, pod_state, status_lines
from tests.unit.test_cli_status import OBJ


def pod(
    name: str,
    *,
    waiting: dict[str, str] | None = None,
    last: dict[str, Any] | None = None,
    restarts: int = 0,
    ready: bool = False,
) -> dict[str, Any]:
    state: dict[str, Any] = {"waiting": waiting} if waiting is not None else {"running": {"startedAt": "t"}}
    status: dict[str, Any] = {
        "name": "engine",
        "ready": ready,
        "restartCount": restarts,
        "state": state,
        "lastState": {"terminated": last} if last else {},
    }
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": "gpu-1"},
        "status": {
            "phase": "Running" if ready else "Pending",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [status],
        },
    }


SECRET = 'secret "hf-token" not found'
PULL = 'Back-off pulling image "vllm/vllm-openai:v9"'
PODS = [
    pod("chat-a", waiting={"reason": "CreateContainerConfigError", "message": SECRET}),
    pod("chat-b", waiting={"reason": "ImagePullBackOff", "message": PULL}),
    pod("chat-c", waiting={"reason": "ImagePullBackOff", "message": PULL}),
    pod(
        "chat-d",
        waiting={
            "reason": "CrashLoopBackOff",
            "message": "back-off 5m0s restarting failed container=engine pod=chat-d",
        },
        last={"exitCode": 1, "reason": "Error"},
        restarts=5,
    ),
    pod("chat-e", waiting={"reason": "ContainerCreating"}),
    pod("chat-f", ready=True),
]


def test_container_failures_are_shown_by_cause() -> None:
    problems = container_problems(PODS)
    assert problems == [
        f"1 pod(s), e.g. chat-a, 0 restarts: engine CreateContainerConfigError: {SECRET}",
        f"2 pod(s), e.g. chat-b, 0 restarts: engine ImagePullBackOff: {PULL}",
        "1 pod(s), e.g. chat-d, 5 restarts: engine CrashLoopBackOff (last exit 1 Error)",
    ]
    lines = status_lines(OBJ, [], pods=PODS)
    at = lines.index("Pods:     6 (1 ready)")
    assert lines[at + 1 : at + 4] == [f"  {p}" for p in problems]


def test_healthy_pods_say_so_and_unreadable_pods_say_why() -> None:
    assert "Pods:     1 (1 ready); no container failing" in status_lines(OBJ, [], pods=[pod("ok", ready=True)])
    assert any(line.startswith("Pods:     not readable") for line in status_lines(OBJ, [], pods=None))
    assert not any(line.startswith("Pods:") for line in status_lines(OBJ, [], pods=[]))


def test_a_bound_left_out_shows_its_default() -> None:
    obj = copy.deepcopy(OBJ)
    obj["spec"]["scaling"] = {}
    default_max = ScalingSpec.model_fields["max_replicas"].default
    assert f"replicas 1..{default_max}" in status_lines(obj, [])[1]


def test_pod_state_for_json() -> None:
    state = pod_state(PODS[3])
    assert state == {
        "name": "chat-d",
        "phase": "Pending",
        "node": "gpu-1",
        "containers": [
            {
                "name": "engine",
                "ready": False,
                "state": "waiting",
                "reason": "CrashLoopBackOff",
                "message": "back-off 5m0s restarting failed container=engine pod=chat-d",
                "restarts": 5,
                "last_exit_code": 1,
            }
        ],
    }
