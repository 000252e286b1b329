"""Reading the live cluster for the CLI (`kvscale status`, `kvscale manifests --diff`): one client
from the kubeconfig (or in-cluster config), objects read as the API server's own JSON, API errors
turned into messages that name what was asked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from kvscale.cli.common import EXIT_INFEASIBLE, fail

KubeconfigOpt = Annotated[
    Path | None,
    typer.Option("--kubeconfig", help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)."),
]
NamespaceOpt = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Namespace (default: the kubeconfig context's, else default)."),
]

REQUEST_TIMEOUT_S = 15.0
# apiVersion, kind -> the collection's URL path segment (plural) for the objects kvscale reads.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "Service"): "services",
    ("apps/v1", "Deployment"): "deployments",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepools",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkersets",
    ("kvscale.io/v1alpha1", "InferenceService"): "inferenceservices",
}


class Live:
    """A connection to the cluster of a kubeconfig and its default namespace."""

    def __init__(self, kubeconfig: Path | None) -> None:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        path = str(kubeconfig) if kubeconfig is not None else None
        if path is not None and not Path(path).is_file():
            fail(f"--kubeconfig {path}: no such file")
        self.namespace = "default"
        try:
            self.api = config.new_client_from_config(config_file=path)
            _, active = config.list_kube_config_contexts(config_file=path)
            self.namespace = (active or {}).get("context", {}).get("namespace") or "default"
        except (ConfigException, OSError) as kube_error:
            if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config()
                self.api = client.ApiClient()
                ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                if ns_file.is_file():
                    self.namespace = ns_file.read_text().strip() or "default"
            else:
                fail(f"no cluster to talk to (kubeconfig or in-cluster config): {kube_error}")

    def _get_json(
        self, path: str, query: list[tuple[str, str]], what: str, refusal_ok: bool = False
    ) -> dict[str, Any] | None:
        """GET `path` as JSON; None on 404 (and on 401/403 with `refusal_ok`: something extra to
        show, not what the command is for); other refusals and an unreachable server end the command."""
        import json

        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as TransportError

        try:
            method, url, headers, body, post = self.api.param_serialize(
                "GET",
                path,
                query_params=query,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(method, url, headers, body, post, _request_timeout=REQUEST_TIMEOUT_S)
            response.read()
        except ApiException as exc:
            fail(f"cannot read {what}: {exc.status} {exc.reason}", EXIT_INFEASIBLE)
        except TransportError as exc:
            fail(f"cannot reach the cluster's API server: {exc}", EXIT_INFEASIBLE)
        if response.status == 404:
            return None
        if response.status in (401, 403):
            if refusal_ok:
                return None
            fail(f"not allowed to read {what}: {response.status} {response.reason}")
        if not 200 <= response.status < 300:
            fail(f"the API server refused to read {what}: {response.status} {response.reason}", EXIT_INFEASIBLE)
        return dict(json.loads(response.data))

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as the API server returns it (camelCase JSON), or None when absent."""
        plural = PLURALS[(api_version, kind)]
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        return self._get_json(f"{base}/namespaces/{namespace}/{plural}/{name}", [], f"{kind} {namespace}/{name}")

    def serves(self, api_version: str, kind: str) -> bool:
        """Whether the API server serves `kind` at `api_version` (its discovery document lists the
        resource): False where its CRD is not installed."""
        plural = PLURALS[(api_version, kind)]
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        data = self._get_json(base, [], f"the API server's discovery of {api_version}")
        return any(r.get("name") == plural for r in (data or {}).get("resources") or [])

    def events(self, namespace: str, name: str, limit: int = 5, kind: str | None = None) -> list[dict[str, Any]]:
        """The latest Events about `name` in `namespace` (of `kind` only, when given: the Service and
        its Endpoints share an InferenceService's name), newest last."""
        selector = f"involvedObject.name={name}" + (f",involvedObject.kind={kind}" if kind else "")
        data = self._get_json(
            f"/api/v1/namespaces/{namespace}/events",
            [("fieldSelector", selector)],
            f"the Events of {namespace}/{name}",
        )
        items = list((data or {}).get("items") or [])

        def when(event: dict[str, Any]) -> str:
            return str(
                event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
            )

        return sorted(items, key=when)[-limit:]

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]] | None:
        """The pods under `label_selector`; None where this user may not list pods."""
        data = self._get_json(
            f"/api/v1/namespaces/{namespace}/pods",
            [("labelSelector", label_selector)],
            f"the pods of {namespace} ({label_selector})",
            refusal_ok=True,
        )
        return None if data is None else list(data.get("items") or [])
