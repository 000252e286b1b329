"""Kubernetes I/O for the operator: server-side apply, deletes, scale. Nothing here decides.

API errors become kopf's retry policy at this edge:
- 409 Conflict: retry soon (someone else wrote first);
- 429, 5xx, timeouts, refused connections: retry after a backoff;
- any other 4xx: `Refused`, which the handler turns into a condition, an Event naming what
  was refused, and a PermanentError (no retry until the spec changes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from kvscale.autoscaling.drain import DELETION_COST_ANNOTATION
from kvscale.control import inference_pool
from kvscale.control import leader_worker_set as lws
from kvscale.control.children import BY_KIND, ChildKind, ChildView
from kvscale.control.reconcile import PoolView

FIELD_MANAGER = "kvscale-operator"
CONFLICT_RETRY_S = 1.0
AS_APPLIED_TRIES = 5  # reads of a just-created child whose controller keeps writing its status
_APPLY_PATCH = "application/apply-patch+yaml"


class Foreign(Exception):
    """An object holds a child's name and is not the InferenceService's: nothing was written to it."""

    def __init__(self, view: ChildView) -> None:
        super().__init__(f"{view.kind} {view.namespace}/{view.name} is not owned by this InferenceService")
        self.view = view


class Refused(Exception):
    """The API server refused a request for a reason retrying will not fix (4xx)."""

    def __init__(self, what: str, status: int, detail: str) -> None:
        super().__init__(f"the API server refused {what} (HTTP {status}): {detail}")
        self.what, self.status, self.detail = what, status, detail


def _detail(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)


def _invalid_apply(status: int, exc: ApiException) -> bool:
    """A server-side apply whose body does not fit the object's schema (e.g. a list with two
    entries of one key) is answered HTTP 500, yet retrying cannot fix it."""
    return status == 500 and "failed to create typed patch object" in _detail(exc)


def raw_get(api: client.ApiClient, path: str, query: list[tuple[str, Any]] | None = None, timeout: Any = None) -> Any:
    """GET `path` for any kind (the typed clients know only theirs): the raw urllib3 response,
    as the typed calls give with `_preload_content=False` (a watch streams from it); an
    ApiException for an answer outside 2xx."""
    request = api.param_serialize(
        method="GET",
        resource_path=path,
        query_params=query or [],
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request, _request_timeout=timeout)
    if not 200 <= response.status <= 299:
        response.read()
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response.response


def raw_json(
    api: client.ApiClient, method: str, path: str, body: Any = None, content_type: str = "application/json"
) -> dict[str, Any]:
    """`method` on `path` for any kind, with a JSON body: the answer as JSON; an ApiException
    for an answer outside 2xx."""
    headers = {"Accept": "application/json", "Content-Type": content_type}
    request = api.param_serialize(
        method=method, resource_path=path, header_params=headers, body=body, auth_settings=["BearerToken"]
    )
    response = api.call_api(*request)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise ApiException(status=response.status, reason=response.reason, http_resp=response)
    return dict(json.loads(data or b"{}"))


def owner_uid(obj: Mapping[str, Any]) -> str:
    """The uid of the object's controller owner ("" when it has none)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((str(r.get("uid", "")) for r in refs if r.get("controller")), "")


def _created_by_us(meta: Mapping[str, Any]) -> bool:
    """Whether kvscale's create left its fields as an Update (not yet its applied fields)."""
    return any(
        e.get("manager") == FIELD_MANAGER and e.get("operation") == "Update" for e in meta.get("managedFields") or []
    )


def as_applied(managed: list[dict[str, Any]], manager: str) -> list[dict[str, Any]]:
    """managedFields with `manager`'s Update entry (a create's) turned into its Apply entry, as
    kubectl does when it moves an object to server-side apply (k8s.io/client-go/util/csaupgrade):
    the fields kvscale created are then its applied fields, and a later apply that leaves one out
    removes it (with an Update entry beside the Apply one, it would stay, owned by the create)."""
    out = []
    for entry in managed:
        if entry.get("manager") == manager and entry.get("operation") == "Update" and not entry.get("subresource"):
            entry = {**entry, "operation": "Apply"}
        out.append(entry)
    return out


def new_api_client(connections: int = 8) -> client.ApiClient:
    """A client with `connections` pooled connections: one per worker thread that uses it, so
    no call waits for a connection (urllib3 would open and drop extra ones)."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = connections
    return client.ApiClient(cfg)


class Kube:
    """The operator's Kubernetes writes, with errors mapped to kopf's retry semantics."""

    def __init__(self, api: client.ApiClient, backoff_s: float) -> None:
        self.api = api
        self.backoff_s = backoff_s
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except ApiException as exc:
            status = int(exc.status or 0)
            if status == 409:
                raise kopf.TemporaryError(f"{what}: conflict, retrying", delay=CONFLICT_RETRY_S) from exc
            if (400 <= status < 500 and status != 429) or _invalid_apply(status, exc):
                raise Refused(what, status, _detail(exc)) from exc
            raise kopf.TemporaryError(f"{what}: HTTP {status} {_detail(exc)}", delay=self.backoff_s) from exc
        except (HTTPError, OSError) as exc:
            raise kopf.TemporaryError(f"{what}: {exc}", delay=self.backoff_s) from exc

    def _writer(self, kind: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        writers: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
            "Deployment": (self.apps.patch_namespaced_deployment, self.apps.delete_namespaced_deployment),
            "Service": (self.core.patch_namespaced_service, self.core.delete_namespaced_service),
            "PodDisruptionBudget": (
                self.policy.patch_namespaced_pod_disruption_budget,
                self.policy.delete_namespaced_pod_disruption_budget,
            ),
        }
        return writers[kind]

    def apply(self, obj: dict[str, Any]) -> None:
        """Server-side apply: idempotent, and only the fields kvscale sets are kvscale's. A child
        named after its InferenceService is claimed first (`_claim`): created when there is none,
        applied only when the live object is owned by the InferenceService, never force-applied
        onto another's object (an InferenceService created beside another team's Service of its
        name took that Service over: the informer cache had not seen it yet)."""
        meta = obj["metadata"]
        if obj["kind"] == inference_pool.KIND:
            self._apply_pool(obj)
            return
        kind = BY_KIND.get(obj["kind"])
        if kind is not None and kind.named_as_owner and owner_uid(obj):
            with self.errors(f"{obj['kind']} {meta['namespace']}/{meta['name']}"):
                version = self._claim(kind, obj)
            if version is None:
                return  # created just now, with every field kvscale sets
            obj = {**obj, "metadata": {**meta, "resourceVersion": version}}
        if obj["kind"] == lws.KIND:
            with self.errors(f"{lws.KIND} {meta['namespace']}/{meta['name']}"):
                self.custom.patch_namespaced_custom_object(
                    *self._set_args(meta["namespace"]),
                    meta["name"],
                    obj,
                    field_manager=FIELD_MANAGER,
                    force=True,
                    _content_type=_APPLY_PATCH,
                )
            return
        patch, _ = self._writer(obj["kind"])
        with self.errors(f"{obj['kind']} {meta['namespace']}/{meta['name']}"):
            patch(
                meta["name"],
                meta["namespace"],
                obj,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=_APPLY_PATCH,
            )

    def _claim(self, kind: ChildKind, obj: dict[str, Any]) -> str | None:
        """Makes the child kvscale's or says whose it is: None when it was created here; else the
        live object's resourceVersion, when it is owned by the same InferenceService (the apply
        then carries it as a precondition: an object deleted and re-created by someone else in
        between answers 409 and is looked at again). `Foreign` when another's object holds the
        name."""
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        for _ in range(2):  # a create that lost a race to a delete reads again once
            try:
                live = raw_json(self.api, "GET", kind.path(namespace, name))
            except ApiException as exc:
                if exc.status != 404:
                    raise
            else:
                view = ChildView.of(live, kind)
                if not view.owned_by(owner_uid(obj)):
                    raise Foreign(view)
                if _created_by_us(live["metadata"]):
                    # Its create's fields were not made applied ones yet (a controller kept
                    # writing its status meanwhile): now, before an apply that may leave one out.
                    self._as_applied(kind, live)
                    live = raw_json(self.api, "GET", kind.path(namespace, name))
                return str(live["metadata"]["resourceVersion"])
            try:
                created = raw_json(self.api, "POST", f"{kind.path(namespace)}?fieldManager={FIELD_MANAGER}", obj)
            except ApiException as exc:
                if exc.status != 409:  # 409: someone created it first: whose is it?
                    raise
                continue
            self._as_applied(kind, created)
            return None
        raise ApiException(status=409, reason=f"{kind.kind} {namespace}/{name} changed while it was claimed")

    def _as_applied(self, kind: ChildKind, created: dict[str, Any]) -> None:
        """The create's fields become kvscale's applied fields (see `as_applied`), guarded by the
        resourceVersion; a controller's status write in between (the Deployment controller's,
        at once) changes it, so the live object is read again, a few times. Best effort: left as
        a create's, the fields only outlive a later apply that leaves them out."""
        meta = created["metadata"]
        path = kind.path(meta["namespace"], meta["name"])
        for _ in range(AS_APPLIED_TRIES):
            if not _created_by_us(meta):
                return
            patch = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                {
                    "op": "replace",
                    "path": "/metadata/managedFields",
                    "value": as_applied(meta["managedFields"], FIELD_MANAGER),
                },
            ]
            try:
                raw_json(self.api, "PATCH", path, patch, "application/json-patch+json")
                return
            except ApiException as exc:
                if exc.status not in (409, 422):
                    raise
            try:
                meta = raw_json(self.api, "GET", path)["metadata"]
            except ApiException as exc:
                if exc.status == 404:  # deleted already: the status tick re-creates it
                    return
                raise

    def delete_if_present(self, kind: str, namespace: str, name: str) -> bool:
        """Deletes the InferenceService `name`'s child of `kind` (a LeaderWorkerSet is <name>-lws);
        False when there was none, or the kind's API is not served (its CRD is not installed)."""
        if kind == lws.KIND:
            name = lws.set_name(name)

            def delete(n: str, ns: str) -> Any:
                return self.custom.delete_namespaced_custom_object(*self._set_args(ns), n)

        else:
            _, delete = self._writer(kind)
        with self.errors(f"deleting {kind} {namespace}/{name}"):
            try:
                delete(name, namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
        return True

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ConfigMap as its JSON body; None when there is none (the calibrated profile, read
        as stored: a user's pin or hand edit included)."""
        with self.errors(f"reading ConfigMap {namespace}/{name}"):
            try:
                response = raw_get(self.api, f"/api/v1/namespaces/{namespace}/configmaps/{name}")
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
        found: dict[str, Any] = json.loads(response.data)
        return found

    def write_configmap(self, obj: dict[str, Any], exists: bool) -> None:
        """Create the ConfigMap, or merge-patch it where it exists (RBAC: configmaps create and
        patch, nothing more): a merge patch keeps the labels and annotations users added, the pin
        among them (RFC 7386: keys not in the patch stay)."""
        meta = obj["metadata"]
        with self.errors(f"writing ConfigMap {meta['namespace']}/{meta['name']}"):
            if exists:
                self.core.patch_namespaced_config_map(
                    meta["name"],
                    meta["namespace"],
                    obj,
                    field_manager=FIELD_MANAGER,
                    _content_type="application/merge-patch+json",
                )
            else:
                self.core.create_namespaced_config_map(meta["namespace"], obj, field_manager=FIELD_MANAGER)

    def read(self, kind: ChildKind, namespace: str, name: str) -> ChildView | None:
        """The object of an owned kind by name, whoever owns it; None when there is none."""
        with self.errors(f"reading {kind.kind} {namespace}/{name}"):
            try:
                response = raw_get(self.api, kind.path(namespace, name))
            except ApiException as exc:
                # An optional kind's API may be absent or not granted: then there is none to see.
                if exc.status == 404 or (kind.optional and exc.status == 403):
                    return None
                raise
        return ChildView.of(json.loads(response.data), kind)

    def mark_deletion_costs(self, namespace: str, costs: Mapping[str, int]) -> int:
        """Writes each engine pod's `controller.kubernetes.io/pod-deletion-cost` (a merge patch of
        that one annotation), so the ReplicaSet controller's next scale-down deletes the lowest
        (kvscale.autoscaling.drain). A pod gone meanwhile is skipped. Returns the pods written."""
        written = 0
        for pod, cost in costs.items():
            body = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}}
            with self.errors(f"marking Pod {namespace}/{pod} with its deletion cost"):
                try:
                    self.core.patch_namespaced_pod(pod, namespace, body)
                except ApiException as exc:
                    if exc.status == 404:
                        continue
                    raise
            written += 1
        return written

    def shorten_grace(self, namespace: str, pods: Sequence[str], grace_s: int) -> int:
        """Deletes pods already being deleted again with `grace_s` (at least 1: 0 would remove
        them from the API at once, before the kubelet stops them); the API server keeps the
        shorter of the two. A pod gone meanwhile is skipped. Returns the pods written."""
        body = client.V1DeleteOptions(grace_period_seconds=max(1, grace_s))
        written = 0
        for pod in pods:
            with self.errors(f"shortening Pod {namespace}/{pod}'s grace period to {grace_s}s"):
                try:
                    self.core.delete_namespaced_pod(pod, namespace, body=body)
                except ApiException as exc:
                    if exc.status == 404:
                        continue
                    raise
            written += 1
        return written

    def scale(self, namespace: str, name: str, replicas: int, kind: str = "Deployment") -> None:
        """Through the scale subresource, so only the replica count changes (a LeaderWorkerSet's
        counts groups: its spec.replicas)."""
        body = {"spec": {"replicas": replicas}}
        if kind == lws.KIND:
            with self.errors(f"scaling {lws.KIND} {namespace}/{lws.set_name(name)}"):
                self.custom.patch_namespaced_custom_object_scale(*self._set_args(namespace), lws.set_name(name), body)
            return
        with self.errors(f"scaling Deployment {namespace}/{name}"):
            self.apps.patch_namespaced_deployment_scale(name, namespace, body)

    def _set_args(self, namespace: str) -> tuple[str, str, str, str]:
        return lws.GROUP, lws.VERSION, namespace, lws.PLURAL

    # -- InferencePool (Gateway API inference extension) ---------------------------------

    def _pool_args(self, namespace: str) -> tuple[str, str, str, str]:
        return inference_pool.GROUP, inference_pool.VERSION, namespace, inference_pool.PLURAL

    def pool_api_installed(self) -> bool:
        """Whether the API server serves inferencepools in inference.networking.k8s.io/v1 (its CRD
        is installed). Discovery: every authenticated user may read it, no RBAC rule needed."""
        with self.errors("discovering the InferencePool API"):
            try:
                found = self.custom.get_api_resources(inference_pool.GROUP, inference_pool.VERSION)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
        return any(r.name == inference_pool.PLURAL for r in found.resources or [])

    def pool_view(self, namespace: str, name: str) -> PoolView:
        """The pool of that name, if the API is served; forbidden when RBAC does not allow looking."""
        try:
            if not self.pool_api_installed():
                return PoolView(api_installed=False)
            with self.errors(f"InferencePool {namespace}/{name}"):
                try:
                    existing = self.custom.get_namespaced_custom_object(*self._pool_args(namespace), name)
                except ApiException as exc:
                    if exc.status == 404:
                        return PoolView(api_installed=True)
                    raise
        except Refused as exc:
            if exc.status == 403:
                return PoolView(api_installed=True, forbidden=True)
            raise
        return PoolView(api_installed=True, existing=dict(existing))

    def _apply_pool(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        with self.errors(f"InferencePool {meta['namespace']}/{meta['name']}"):
            self.custom.patch_namespaced_custom_object(
                *self._pool_args(meta["namespace"]),
                meta["name"],
                obj,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=_APPLY_PATCH,
            )

    def prune_pools(self, namespace: str, label_selector: str, owner_uid: str, keep: str | None) -> None:
        """Deletes the pools `owner_uid` owns except `keep` (routing removed or renamed, recommend mode)."""
        if not self.pool_api_installed():
            return
        with self.errors(f"InferencePools in {namespace}"):
            listed = self.custom.list_namespaced_custom_object(
                *self._pool_args(namespace), label_selector=label_selector
            )
            for pool in dict(listed).get("items", []):
                name = pool.get("metadata", {}).get("name")
                if name != keep and inference_pool.owned_by(pool, owner_uid):
                    try:
                        self.custom.delete_namespaced_custom_object(*self._pool_args(namespace), name)
                    except ApiException as exc:
                        if exc.status != 404:
                            raise
