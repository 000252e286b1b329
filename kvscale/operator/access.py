"""What the operator may read, checked against the API server's own authorizer, and a refusal
that never ends the process.

kopf retries a refused request (403) along its `error_backoffs` (1, 1, 2, 3, 5, 8, 13, 21 s:
nine attempts in 54 s; kopf/_cogs/clients/api.py `request`), then raises; a watcher that
raises ends kopf's orchestrator (`aiotasks.reraise` in kopf/_core/reactor/orchestration.py),
so one unreadable kind (GPUBudgets under a namespaced Role) stopped the whole operator.
`RetryForever` keeps retrying every failed request at a capped backoff instead, and the
checker below says what is missing: a SelfSubjectAccessReview per verb (any authenticated
user may create one: the bootstrap ClusterRole system:basic-user grants it,
https://kubernetes.io/docs/reference/access-authn-authz/authorization/#checking-api-access),
re-checked with backoff while refused, so access granted later is picked up without a restart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kubernetes import client

from kvscale.api import GROUP
from kvscale.api.models import InferenceServiceStatus
from kvscale.control.reconcile import Event, Resource
from kvscale.control.status import condition, with_conditions, without_condition

log = logging.getLogger("kvscale.operator")
RETRY_CAP_S = 60.0  # a refused or failing request is retried at least this often, forever
FIRST_BACKOFFS_S = (1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0)  # kopf's own, continued
RECHECK_S = 60.0  # access granted is looked at again this often (RBAC can be revoked)
BUDGETS = "gpubudgets"
WATCH_CONDITION = "BudgetsWatched"  # on InferenceServices, present (False) only while GPUBudgets cannot be watched
CLUSTER_ROLE_FIX = (
    "grant them in a ClusterRole (a namespaced Role cannot grant a cluster-scoped kind): the chart does in "
    "every mode (charts/kvscale/files/rbac-cluster-rules.yaml), by hand see deploy/rbac/operator.yaml"
)


class RetryForever:
    """kopf's `settings.networking.error_backoffs`: its first delays, then RETRY_CAP_S without end.
    Re-iterable (kopf iterates it once per request); never Sized, so kopf numbers attempts
    without a total."""

    def __iter__(self) -> Iterator[float]:
        yield from FIRST_BACKOFFS_S
        while True:
            yield RETRY_CAP_S


@dataclass(frozen=True)
class Need:
    """Verbs on one resource the operator's watches need, in one namespace or cluster-wide."""

    resource: str
    verbs: tuple[str, ...]
    namespace: str | None = None  # None: cluster-wide
    group: str = GROUP
    subresource: str = ""
    fix: str = CLUSTER_ROLE_FIX
    affects: str = ""  # what stops working while refused

    def describe(self, verbs: tuple[str, ...] | None = None) -> str:
        kind = f"{self.resource}.{self.group}" if self.group else self.resource
        kind += f"/{self.subresource}" if self.subresource else ""
        where = f"in namespace {self.namespace}" if self.namespace else "cluster-wide"
        return f"{', '.join(verbs or self.verbs)} {kind} {where}"


def needs(namespaces: tuple[str, ...]) -> tuple[Need, ...]:
    """GPUBudgets (cluster-scoped: the watch and the budget timer's writes) and InferenceServices
    where the operator watches them."""
    budgets = "GPUBudgets are not enforced"
    role = "grant them in the Role of that namespace (the chart's operator.watchNamespaces makes one)"
    services = tuple(
        Need(
            "inferenceservices",
            ("list", "watch", "patch"),
            ns,
            fix=role,
            affects="its InferenceServices are not handled",
        )
        for ns in namespaces
    ) or (
        Need(
            "inferenceservices",
            ("list", "watch", "patch"),
            fix=CLUSTER_ROLE_FIX,
            affects="InferenceServices are not handled",
        ),
    )
    return (
        Need(BUDGETS, ("list", "watch", "patch"), affects=budgets),
        Need(BUDGETS, ("patch",), subresource="status", affects="GPUBudget status is not written"),
        *services,
    )


Denials = tuple[tuple[Need, tuple[str, ...]], ...]  # each need refused, with the verbs refused


def message(denials: Denials) -> str:
    """What is refused and what stops working, then how to grant it (one sentence per fix)."""
    by_fix: dict[str, list[str]] = {}
    for need, verbs in denials:
        by_fix.setdefault(need.fix, []).append(f"{need.describe(verbs)} ({need.affects})")
    return "; ".join(f"the operator may not {' nor '.join(parts)}: {fix}" for fix, parts in by_fix.items())


def budget_message(denials: Denials) -> str | None:
    """What the InferenceServices a GPUBudget may govern are told; None when budgets are readable."""
    refused = tuple(d for d in denials if d[0].resource == BUDGETS)
    return message(refused) if refused else None


Review = Callable[[Need, str], bool]  # may this process do `verb` on the need's resource?


def reviewer(api: client.ApiClient) -> Review:
    """A SelfSubjectAccessReview per verb: the API server's authorizer answers, as for the request."""
    authorization = client.AuthorizationV1Api(api)

    def allowed(need: Need, verb: str) -> bool:
        attributes = client.V1ResourceAttributes(
            group=need.group,
            resource=need.resource,
            subresource=need.subresource or None,
            verb=verb,
            namespace=need.namespace,
        )
        review = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
        )
        return bool(authorization.create_self_subject_access_review(review).status.allowed)

    return allowed


def check(review: Review, wanted: tuple[Need, ...]) -> Denials:
    out = []
    for need in wanted:
        refused = tuple(v for v in need.verbs if not review(need, v))
        if refused:
            out.append((need, refused))
    return tuple(out)


def next_backoff(previous_s: float | None) -> float:
    """The wait before checking again while refused: 2 s, doubling to RETRY_CAP_S."""
    return 2.0 if previous_s is None else min(RETRY_CAP_S, previous_s * 2)


class Access:
    """The refusals last seen, shared with the handlers (which put them in conditions)."""

    def __init__(self) -> None:
        self.denials: Denials = ()
        self.checked = False

    def update(self, denials: Denials) -> None:
        """Records a check; one log line when what is refused changes."""
        if denials != self.denials:
            if denials:
                log.warning("Access refused, retrying with backoff: %s", message(denials))
            elif self.checked:
                log.info("Access granted: every watch the operator needs is allowed again")
        self.denials, self.checked = denials, True

    @property
    def budgets(self) -> str | None:
        return budget_message(self.denials)


async def watch(access: Access, review: Review, wanted: tuple[Need, ...]) -> None:
    """Checks now, then again with backoff while refused (RECHECK_S while allowed), until cancelled.
    A failed check (the API server away) keeps the last answer."""
    backoff: float | None = None  # while refused; None while allowed
    while True:
        try:
            access.update(await asyncio.to_thread(check, review, wanted))
        except Exception as exc:  # a check that fails says nothing about access
            log.warning("Access check failed: %s", exc)
        backoff = next_backoff(backoff) if access.denials or not access.checked else None
        await asyncio.sleep(RECHECK_S if backoff is None else backoff)


def budgets_watched(
    status: InferenceServiceStatus, res: Resource, refused: str | None, now: dt.datetime | None = None
) -> tuple[InferenceServiceStatus, tuple[Event, ...]] | None:
    """A service's status while the operator may not watch GPUBudgets (`refused` says what is
    missing and how to grant it): any budget may govern it, and none is enforced. None when
    nothing changes; the condition goes (with a Normal Event) once budgets are readable again."""
    before = next((c for c in status.conditions if c.type == WATCH_CONDITION), None)
    if refused is None:
        if before is None:
            return None
        return without_condition(status, WATCH_CONDITION), (
            Event("Normal", WATCH_CONDITION, "GPUBudgets are watched again: budgets apply"),
        )
    new = condition(status, WATCH_CONDITION, False, "Forbidden", refused, res.generation, now)
    if before is not None and before.status == new.status and before.message == new.message:
        return None
    return with_conditions(status, new), (Event("Warning", "Forbidden", new.message),)
