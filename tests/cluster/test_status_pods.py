"""Issue 39, LOW, against the real API server: `kvscale status` shows the InferenceService's own
Events only (a Warning about its Service, which has the same name, is not its), the replica
bounds with their defaults, and an engine pod's container failure by cause (a missing Secret
showed only as 0/N ready)."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path

from kubernetes import client
from typer.testing import CliRunner

from kvscale.api import labels
from kvscale.api.models import ScalingSpec
from kvscale.cli import app
from tests.cluster.harness import Cluster
from tests.cluster.processes import Operator
from tests.cluster.test_operator import SAMPLES, create, wait_phase

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
SECRET = 'secret "hf-token-missing" not found'


def test_status_shows_its_own_events_and_container_failures(
    operator: Operator, cluster: Cluster, api: client.ApiClient, namespace: str
) -> None:
    body = copy.deepcopy(SAMPLES["llama-3.1-8b-chat"])
    body["spec"]["scaling"].pop("maxReplicas", None)  # a bound left out: its default is shown
    name = body["metadata"]["name"]
    create(api, namespace, body)
    wait_phase(api, namespace, name, "Ready", operator)
    core = client.CoreV1Api(api)
    now = dt.datetime.now(dt.UTC)
    # Kubernetes' own noise about the Service of the same name.
    core.create_namespaced_event(
        namespace,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{name}.noise"),
            involved_object=client.V1ObjectReference(kind="Service", name=name, namespace=namespace),
            reason="FailedToUpdateEndpoint",
            message="endpoint noise",
            type="Warning",
            first_timestamp=now,
            last_timestamp=now,
        ),
    )
    # An engine pod whose container waits on a missing Secret: on a node no kubelet (and no kwok)
    # runs, so the status written here stays as the kubelet would have written it. Not adopted by
    # the Deployment's ReplicaSet (no pod-template-hash).
    pod = core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"{name}-broken", labels=labels(name)),
            spec=client.V1PodSpec(
                node_name="no-such-node", containers=[client.V1Container(name="engine", image="busybox")]
            ),
        ),
    )
    core.patch_namespaced_pod_status(
        pod.metadata.name,
        namespace,
        {
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [
                    {
                        "name": "engine",
                        "image": "busybox",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "CreateContainerConfigError", "message": SECRET}},
                    }
                ],
            }
        },
    )
    live = ["--kubeconfig", str(cluster.kubeconfig), "-n", namespace]
    out = runner.invoke(app, ["status", name, *live])
    assert out.exit_code == 0, out.output
    assert "endpoint noise" not in out.stdout and "FailedToUpdateEndpoint" not in out.stdout
    assert "Normal Planned" in out.stdout  # its own Events are still there
    default_max = ScalingSpec.model_fields["max_replicas"].default
    assert f"replicas 1..{default_max}" in out.stdout.splitlines()[1]
    pods = next(line for line in out.stdout.splitlines() if line.startswith("Pods:"))
    assert pods.startswith("Pods:     2 (")
    assert f"1 pod(s), e.g. {name}-broken, 0 restarts: engine CreateContainerConfigError: {SECRET}" in out.stdout
    data = runner.invoke(app, ["status", name, *live, "--json"]).stdout
    assert "CreateContainerConfigError" in data and "endpoint noise" not in data
