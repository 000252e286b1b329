"""kopf handlers of GPUBudgets: the book follows every budget (create, change, delete), and
a timer per budget writes its status (allocated, wanted, each governed service's grant)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

import kopf
from pydantic import ValidationError

from kvscale.api import GROUP, VERSION
from kvscale.api.budget import BUDGET_PLURAL, GPUBudgetSpec, budget_spec_error, parse_budget_spec
from kvscale.control.budget import BudgetBook, budget_status

log = logging.getLogger("kvscale.operator")
TTL_TICKS = 3  # a service's want older than this many scale intervals (and a minute) no longer counts
TTL_MIN_S = 60.0


class _HasSettings(Protocol):
    @property
    def settings(self) -> Any: ...


def unknown_types(spec: GPUBudgetSpec, known: tuple[str, ...]) -> str:
    """Why the budget names GPU types the catalog lacks ("" when it names none, or no catalog is given)."""
    unknown = spec.unknown_gpu_types(known) if known else []
    if not unknown:
        return ""
    return (
        f"spec.limits names GPU type(s) {', '.join(unknown)} that the operator's catalog does not know, so they would "
        f"limit nothing: use catalog names ({', '.join(sorted(known))}), or add the GPU with a catalog overlay "
        "(KVSCALE_CATALOG)"
    )


def budget_ttl_s(rt: _HasSettings) -> float:
    return max(TTL_MIN_S, TTL_TICKS * float(rt.settings.scale_interval_s))


def budget_conditions(book: BudgetBook, name: str) -> list[dict[str, str]]:
    """Ready, and Shadowed where a GPU type this budget limits is bounded, for some service it
    selects, by a tighter budget (those GPUs do not count against this budget: without saying so
    a catch-all budget looked as if it held them)."""
    ready = {"type": "Ready", "status": "True", "reason": "Allocating", "message": "allocating every scale interval"}
    shadowed = book.shadowed(name)
    if not shadowed:
        return [ready, {"type": "Shadowed", "status": "False", "reason": "GovernsAllItSelects", "message": ""}]
    listed = ", ".join(f"{key} on {gpu} (by {by})" for key, gpu, by in shadowed[:20])
    more = f" and {len(shadowed) - 20} more" if len(shadowed) > 20 else ""
    message = (
        f"{len(shadowed)} service GPU type(s) this budget limits are bounded by a tighter budget: {listed}{more}; "
        "those GPUs do not count against this budget's limits. Each GPU type of a service is bounded by the "
        "matching budget with the fewest GPUs of that type; a budget that does not limit a type does not govern "
        "it. Narrow this budget's selector (namespaces, matchLabels) to make that explicit"
    )
    return [ready, {"type": "Shadowed", "status": "True", "reason": "TighterBudgetGoverns", "message": message[:1000]}]


def budget_handlers(
    registry: kopf.OperatorRegistry, book: BudgetBook, interval_s: float, known_gpus: Iterable[str] = ()
) -> None:
    """`known_gpus`: the operator's catalog's GPU types (a budget naming another is refused)."""
    known = tuple(known_gpus)

    @kopf.on.event(GROUP, VERSION, BUDGET_PLURAL, registry=registry)
    def budget_event(event: Any, name: str, spec: Any, **_: Any) -> None:
        if event.get("type") == "DELETED":
            book.set_budget(name, None)
            return
        try:
            parsed = parse_budget_spec(dict(spec or {}))
        except ValidationError as exc:
            book.set_budget(name, None)  # a malformed budget governs nothing (its timer says why)
            log.warning("GPUBudget %s is not usable: %s", name, budget_spec_error(exc))
            return
        unknown = unknown_types(parsed, known)
        if unknown:
            book.set_budget(name, None)
            log.warning("GPUBudget %s is not usable: %s", name, unknown)
            return
        book.set_budget(name, parsed)

    @kopf.timer(GROUP, VERSION, BUDGET_PLURAL, id="budget-status", interval=interval_s, registry=registry)
    def budget_tick(name: str, spec: Any, meta: Any, status: Any, patch: kopf.Patch, **_: Any) -> None:
        generation = meta.get("generation")
        try:
            unknown = unknown_types(parse_budget_spec(dict(spec or {})), known)
        except ValidationError as exc:
            patch.status["conditions"] = [  # a merge patch: the whole list
                {"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": budget_spec_error(exc)[:1000]}
            ]
            return
        if unknown:
            patch.status["conditions"] = [
                {"type": "Ready", "status": "False", "reason": "UnknownGPUType", "message": unknown[:1000]}
            ]
            return
        if name not in book.specs:
            return
        new = budget_status(book, name, time.time(), max(TTL_MIN_S, TTL_TICKS * interval_s), generation)
        new["conditions"] = [*budget_conditions(book, name), *new.get("conditions", [])]  # and FloorsKept
        for key, value in new.items():
            if (status or {}).get(key) != value:  # only what changed: nothing at rest
                patch.status[key] = value
