"""Informers: list once, then watch, keeping one small entry per object in memory.

The operator's view of GPU nodes, GPU-holding pods and its own Deployments and pods comes
from these, so a reconcile reads memory instead of listing every pod in the cluster. Each
informer is a thread running the Kubernetes client's list + watch with server-side field and
label selectors (kopf's indexes see every object of a kind and pre-populate in time
quadratic in their count: 5,000 pods took minutes), relisting when the watch expires (410).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kvscale.api import LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY
from kvscale.control import leader_worker_set as lws
from kvscale.control.children import KINDS, ChildKind, ChildView, instance_of
from kvscale.control.inventory import EnginePod, NodeGpus, PodGpus, engine_pod, node_entry, pod_entry
from kvscale.control.reconcile import DeploymentView
from kvscale.operator.k8s import raw_get
from kvscale.sizing.catalog import Catalog

V = TypeVar("V")
log = logging.getLogger("kvscale.operator")
WATCH_TIMEOUT_S = 240  # the server ends each watch after this; the informer resumes from its version
RETRY_S = 2.0
OPTIONAL_RETRY_S = 30.0  # how often an informer of an optional kind looks for its API again
INFORMERS = (
    "nodes",
    "gpu-pods",
    "engine-pods",
    "deployments",
    "leaderworkersets",
    *(f"children-{k.plural}" for k in KINDS),
)
Entry = Callable[[Mapping[str, Any]], "tuple[Hashable, V] | None"]


class Informer(Generic[V]):
    """One kind of object, selected server-side, as {object uid: (key, entry)}."""

    def __init__(
        self, name: str, list_fn: Callable[..., Any], entry: Entry[V], optional: bool = False, **selectors: str
    ) -> None:
        """`optional`: a kind whose API may not be served (a CRD not installed, or not readable):
        the informer then counts as synced and empty, and looks again every OPTIONAL_RETRY_S."""
        self.name, self.list_fn, self.entry, self.selectors = name, list_fn, entry, selectors
        self.optional = optional
        self.served = True  # False while an optional kind's API answers 404 (or 403)
        self._items: dict[str, tuple[Hashable, V]] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self.lists = 0  # initial lists and relists, for the benchmark

    # -- reading --------------------------------------------------------------------------

    def values(self) -> list[V]:
        with self._lock:
            return [v for _, v in self._items.values()]

    def get(self, key: Hashable) -> list[V]:
        with self._lock:
            return [v for k, v in self._items.values() if k == key]

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    # -- the loop -------------------------------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _put(self, obj: Mapping[str, Any], items: dict[str, tuple[Hashable, V]]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        made = self.entry(obj)
        if made is None:
            items.pop(uid, None)
        else:
            items[uid] = made

    def _list(self) -> str:
        response = self.list_fn(**self.selectors, _preload_content=False)
        body = json.loads(response.data)
        items: dict[str, tuple[Hashable, V]] = {}
        for obj in body.get("items") or []:
            self._put(obj, items)
        with self._lock:
            self._items = items
        self.served = True
        self.lists += 1
        self._synced.set()
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    def _events(self, version: str) -> Iterator[dict[str, Any]]:
        def unannotated(**kwargs: Any) -> Any:  # no docstring: the watch yields raw dicts
            return self.list_fn(**kwargs)

        yield from watch.Watch().stream(
            unannotated, resource_version=version, timeout_seconds=WATCH_TIMEOUT_S, **self.selectors
        )

    def _unserved(self, status: int) -> None:
        """An optional kind's API is not served (404) or not readable (403): synced and empty."""
        if self.served:
            why = "not installed" if status == 404 else "forbidden"
            log.info(
                "Informer %s: the API is %s (HTTP %d); looking again every %.0fs",
                self.name,
                why,
                status,
                OPTIONAL_RETRY_S,
            )
        with self._lock:
            self._items = {}
        self.served = False
        self._synced.set()

    def _apply(self, event: dict[str, Any]) -> None:
        obj = event.get("raw_object") or event.get("object") or {}
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        with self._lock:
            if event.get("type") == "DELETED":
                self._items.pop(uid, None)
            elif event.get("type") in ("ADDED", "MODIFIED"):
                self._put(obj, self._items)

    def _run(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                version = version or self._list()
                for event in self._events(version):
                    self._apply(event)
                    version = str(
                        ((event.get("raw_object") or {}).get("metadata") or {}).get("resourceVersion") or version
                    )
                    if self._stop.is_set():
                        return
            except ApiException as exc:
                if self.optional and exc.status in (403, 404) and not version:
                    self._unserved(int(exc.status))
                    self._stop.wait(OPTIONAL_RETRY_S)
                    continue
                if exc.status != 410:
                    log.warning("Informer %s: %s; retrying in %.0fs", self.name, exc.reason, RETRY_S)
                    time.sleep(RETRY_S)  # back off before listing again
                version = None  # expired or failed: relist
            except Exception as exc:  # a dropped connection: resume from the last version
                log.warning("Informer %s: %s; retrying in %.0fs", self.name, exc, RETRY_S)
                time.sleep(RETRY_S)  # back off before watching again


class Merged(Informer[V]):
    """Several informers of one kind read as one: a kind watched namespace by namespace (the
    operator's Role is granted only in its watched namespaces)."""

    def __init__(self, name: str, parts: list[Informer[V]]) -> None:
        super().__init__(name, lambda **_: None, lambda _: None)
        self.parts = parts

    def values(self) -> list[V]:
        return [v for part in self.parts for v in part.values()]

    def get(self, key: Hashable) -> list[V]:
        return [v for part in self.parts for v in part.get(key)]

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(part.wait_synced(max(0.0, deadline - time.monotonic())) for part in self.parts)

    def start(self) -> None:
        for part in self.parts:
            part.start()

    def stop(self) -> None:
        for part in self.parts:
            part.stop()


def scoped(
    name: str,
    namespaces: tuple[str, ...],
    make: Callable[[str | None], Informer[V]],
) -> Informer[V]:
    """One informer across all namespaces, or one per watched namespace, merged."""
    if not namespaces:
        return make(None)
    return Merged(name, [make(ns) for ns in namespaces])


@dataclass(frozen=True)
class Inventory:
    """The operator's watched view of the cluster."""

    nodes: Informer[NodeGpus]
    gpu_pods: Informer[PodGpus]
    engine_pods: Informer[EnginePod]
    deployments: Informer[DeploymentView]
    leader_worker_sets: Informer[DeploymentView]  # optional: empty where the LWS CRD is not installed
    children: tuple[Informer[ChildView], ...] = ()  # one per owned kind (children.KINDS)

    @property
    def all(self) -> tuple[Informer[Any], ...]:
        return (self.nodes, self.gpu_pods, self.engine_pods, self.deployments, self.leader_worker_sets, *self.children)

    def children_of(self, namespace: str, name: str) -> list[ChildView]:
        """Every labelled object of an owned kind that names this InferenceService as its instance."""
        return [v for informer in self.children for v in informer.get((namespace, name))]

    def start(self, timeout_s: float) -> list[str]:
        """Starts every informer; the names of those not synced within `timeout_s`."""
        for informer in self.all:
            informer.start()
        deadline = time.monotonic() + timeout_s
        return [i.name for i in self.all if not i.wait_synced(max(0.0, deadline - time.monotonic()))]

    def stop(self) -> None:
        for informer in self.all:
            informer.stop()


def _keyed(
    make: Callable[[Mapping[str, Any]], V | None], key: Callable[[V], Hashable]
) -> Callable[[Mapping[str, Any]], tuple[Hashable, V] | None]:
    def entry(obj: Mapping[str, Any]) -> tuple[Hashable, V] | None:
        value = make(obj)
        return None if value is None else (key(value), value)

    return entry


def _deployment(obj: Mapping[str, Any]) -> tuple[Hashable, DeploymentView]:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace", ""), meta.get("name", "")), DeploymentView.of(obj)


def _leader_worker_set(obj: Mapping[str, Any]) -> tuple[Hashable, DeploymentView] | None:
    """Keyed by the InferenceService (its instance label): the set itself is named <service>-lws."""
    meta = obj.get("metadata") or {}
    instance = (meta.get("labels") or {}).get(LABEL_INSTANCE)
    if not instance:
        return None
    return (meta.get("namespace", ""), instance), DeploymentView.of(obj)


def lister(api: client.ApiClient, kind: ChildKind, namespace: str | None = None) -> Callable[..., Any]:
    """A list (and, with watch=True, watch) call for any owned kind across namespaces (or in
    one), answering the raw response as the typed clients' `_preload_content=False` does."""

    def list_fn(**kwargs: Any) -> Any:
        query = [(_camel(k), v) for k, v in kwargs.items() if not k.startswith("_") and v is not None]
        return raw_get(api, kind.path(namespace), query, kwargs.get("_request_timeout"))

    return list_fn


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _child(kind: ChildKind) -> Callable[[Mapping[str, Any]], tuple[Hashable, ChildView]]:
    def entry(obj: Mapping[str, Any]) -> tuple[Hashable, ChildView]:
        view = ChildView.of(obj, kind)
        return (view.namespace, instance_of(obj)), view

    return entry


def child_informers(api: client.ApiClient, namespaces: tuple[str, ...] = ()) -> tuple[Informer[ChildView], ...]:
    """One informer per owned kind (per watched namespace, when given), selecting kvscale's
    labelled objects server-side."""
    managed = f"{LABEL_MANAGED_BY}={MANAGED_BY}"

    def one(kind: ChildKind) -> Callable[[str | None], Informer[ChildView]]:
        def make(ns: str | None) -> Informer[ChildView]:
            name = f"children-{kind.plural}" + (f"-{ns}" if ns else "")
            return Informer(name, lister(api, kind, ns), _child(kind), optional=kind.optional, label_selector=managed)

        return make

    return tuple(scoped(f"children-{k.plural}", namespaces, one(k)) for k in KINDS)


def inventory(api: client.ApiClient, catalog: Catalog, namespaces: tuple[str, ...] = ()) -> Inventory:
    """The watches: nodes and pods cluster-wide (GPUs held in any namespace are not free), the
    operator's own workloads and children across namespaces, or only in `namespaces`."""
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    resources = {g.resource_name for g in catalog.gpus.values()}
    managed = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
    bound = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
    return Inventory(
        nodes=Informer("nodes", core.list_node, _keyed(lambda n: node_entry(catalog, n), lambda e: e.name)),
        gpu_pods=Informer(
            "gpu-pods",
            core.list_pod_for_all_namespaces,
            _keyed(lambda p: pod_entry(p, resources), lambda e: e.node_name),
            field_selector=bound,
        ),
        engine_pods=Informer("engine-pods", core.list_pod_for_all_namespaces, engine_pod, label_selector=managed),
        deployments=scoped(
            "deployments",
            namespaces,
            lambda ns: Informer(
                "deployments" + (f"-{ns}" if ns else ""),
                functools.partial(apps.list_namespaced_deployment, ns)
                if ns
                else apps.list_deployment_for_all_namespaces,
                _deployment,
                label_selector=managed,
            ),
        ),
        leader_worker_sets=scoped(
            "leaderworkersets",
            namespaces,
            lambda ns: Informer(
                "leaderworkersets" + (f"-{ns}" if ns else ""),
                functools.partial(custom.list_namespaced_custom_object, lws.GROUP, lws.VERSION, ns, lws.PLURAL)
                if ns
                else functools.partial(custom.list_cluster_custom_object, lws.GROUP, lws.VERSION, lws.PLURAL),
                _leader_worker_set,
                optional=True,
                label_selector=managed,
            ),
        ),
        children=child_informers(api, namespaces),
    )
