"""The kinds of object an InferenceService owns, and pure checks on them: which child is
missing, edited outside kvscale, or someone else's object under the child's name.

Adding a kind the operator owns is one entry in `KINDS`: the informers watch it (by the labels
every child carries), the status tick re-applies it when it is deleted or edited, and the
ownership check keeps kvscale from taking an object of that name it does not own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvscale.api import LABEL_INSTANCE
from kvscale.control import inference_pool
from kvscale.control import leader_worker_set as lws


@dataclass(frozen=True)
class ChildKind:
    """A kind the operator owns. `compare_spec`: whether the status tick reverts edits to what
    kvscale applied in `spec` (the Deployment's drift is its own check: replicas, image, args;
    the API server rewrites its quantities). `named_as_owner`: the child has the
    InferenceService's name, so an existing object of that name must be kvscale's before it is
    applied (an InferencePool may be a foreign one to join instead; reconcile decides that).
    `optional`: an API that may not be served (a CRD not installed, or no RBAC granted)."""

    kind: str
    group: str  # "" for the core API
    version: str
    plural: str
    compare_spec: bool = True
    named_as_owner: bool = True
    optional: bool = False
    suffix: str = ""  # the child's name is the InferenceService's and this

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path of the collection (all namespaces, or one), or of one object."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        scoped = f"{base}/namespaces/{namespace}" if namespace else base
        return f"{scoped}/{self.plural}" + (f"/{name}" if name else "")


KINDS: tuple[ChildKind, ...] = (
    ChildKind("Deployment", "apps", "v1", "deployments", compare_spec=False),  # drift: reconcile.drift
    ChildKind("Service", "", "v1", "services"),
    ChildKind("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets"),
    ChildKind(lws.KIND, lws.GROUP, lws.VERSION, lws.PLURAL, compare_spec=False, optional=True, suffix=lws.NAME_SUFFIX),
    ChildKind(
        inference_pool.KIND,
        inference_pool.GROUP,
        inference_pool.VERSION,
        inference_pool.PLURAL,
        named_as_owner=False,
        optional=True,
    ),
)
BY_KIND = {k.kind: k for k in KINDS}


@dataclass(frozen=True)
class ChildView:
    """One object of an owned kind as the API server holds it: whose it is and its spec (for
    kinds whose spec is compared)."""

    kind: str
    namespace: str
    name: str
    owner_uids: tuple[str, ...] = ()
    spec: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any], kind: ChildKind) -> ChildView:
        meta = obj.get("metadata") or {}
        owners = tuple(str(r.get("uid", "")) for r in meta.get("ownerReferences") or [])
        return cls(
            kind.kind,
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
            owners,
            dict(obj.get("spec") or {}) if kind.compare_spec else None,
        )

    def owned_by(self, uid: str) -> bool:
        return bool(uid) and uid in self.owner_uids


def child_name(kind: str, owner: str) -> str:
    """The name of the owner's child of `kind` (the InferenceService's own, or with a suffix)."""
    return owner + (BY_KIND[kind].suffix if kind in BY_KIND else "")


def instance_of(obj: Mapping[str, Any]) -> str:
    """The InferenceService a labelled child belongs to (its instance label)."""
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_INSTANCE, ""))


def find(views: Iterable[ChildView], kind: str, name: str) -> ChildView | None:
    return next((v for v in views if v.kind == kind and v.name == name), None)


def key(body: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of a child body."""
    return str(body["kind"]), str(body["metadata"]["name"])


def covers(applied: Any, live: Any) -> bool:
    """Whether `live` still holds every value kvscale applied. Extra fields (defaults the API
    server adds, list entries another manager owns) do not count: a server-side apply would not
    remove them either, so reverting could never settle."""
    if isinstance(applied, Mapping):
        return isinstance(live, Mapping) and all(k in live and covers(v, live[k]) for k, v in applied.items())
    if isinstance(applied, list):
        return isinstance(live, list) and all(any(covers(a, b) for b in live) for a in applied)
    return bool(applied == live)


@dataclass(frozen=True)
class ChildCheck:
    """What the status tick found against what kvscale applied: bodies to re-apply (missing or
    edited) and objects of a child's name that are not kvscale's."""

    missing: tuple[dict[str, Any], ...] = ()
    edited: tuple[dict[str, Any], ...] = ()
    foreign: tuple[ChildView, ...] = ()

    @property
    def reapply(self) -> tuple[dict[str, Any], ...]:
        return self.missing + self.edited


def check(applied: Iterable[Mapping[str, Any]], seen: Iterable[ChildView], owner_uid: str) -> ChildCheck:
    """Each applied child against the object of its kind and name (None: not there)."""
    views = tuple(seen)
    missing, edited, foreign = [], [], []
    for body in applied:
        kind, name = key(body)
        view = find(views, kind, name)
        if view is None:
            missing.append(dict(body))
        elif not view.owned_by(owner_uid):
            foreign.append(view)
        elif view.spec is not None and not covers(body.get("spec") or {}, view.spec):
            edited.append(dict(body))
    return ChildCheck(tuple(missing), tuple(edited), tuple(foreign))


def foreign(bodies: Iterable[Mapping[str, Any]], seen: Iterable[ChildView], owner_uid: str) -> tuple[ChildView, ...]:
    """The objects that hold a name-as-owner child's name and are not kvscale's for this owner."""
    views = tuple(seen)
    out = []
    for body in bodies:
        kind, name = key(body)
        if not BY_KIND.get(kind, ChildKind(kind, "", "", "")).named_as_owner:
            continue
        view = find(views, kind, name)
        if view is not None and not view.owned_by(owner_uid):
            out.append(view)
    return tuple(out)


def describe(views: Iterable[ChildView]) -> str:
    return ", ".join(f"{v.kind} {v.namespace}/{v.name}" for v in views)


def conflict_message(views: Iterable[ChildView]) -> str:
    return (
        f"{describe(views)} already exists and is not owned by this InferenceService: kvscale leaves it untouched "
        "and deploys nothing; rename the InferenceService, or delete that object if it is a leftover"
    )
