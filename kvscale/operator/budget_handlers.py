"""kopf handlers of GPUBudgets: the book follows every budget (create, change, delete), and
a timer per budget writes its status (allocated, wanted, each governed service's grant)."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import kopf
from pydantic import ValidationError

from kvscale.api import GROUP, VERSION
from kvscale.api.budget import BUDGET_PLURAL, budget_spec_error, parse_budget_spec
from kvscale.operator.budget import BudgetBook, budget_status

log = logging.getLogger("kvscale.operator")
TTL_TICKS = 3  # a service's want older than this many scale intervals (and a minute) no longer counts
TTL_MIN_S = 60.0


class _HasSettings(Protocol):
    @property
    def settings(self) -> Any: ...


def budget_ttl_s(rt: _HasSettings) -> float:
    return max(TTL_MIN_S, TTL_TICKS * float(rt.settings.scale_interval_s))


def budget_handlers(registry: kopf.OperatorRegistry, book: BudgetBook, interval_s: float) -> None:
    @kopf.on.event(GROUP, VERSION, BUDGET_PLURAL, registry=registry)
    def budget_event(event: Any, name: str, spec: Any, **_: Any) -> None:
        if event.get("type") == "DELETED":
            book.set_budget(name, None)
            return
        try:
            book.set_budget(name, parse_budget_spec(dict(spec or {})))
        except ValidationError as exc:
            book.set_budget(name, None)  # a malformed budget governs nothing (its timer says why)
            log.warning("GPUBudget %s is not usable: %s", name, budget_spec_error(exc))

    @kopf.timer(GROUP, VERSION, BUDGET_PLURAL, id="budget-status", interval=interval_s, registry=registry)
    def budget_tick(name: str, spec: Any, meta: Any, status: Any, patch: kopf.Patch, **_: Any) -> None:
        generation = meta.get("generation")
        try:
            parse_budget_spec(dict(spec or {}))
        except ValidationError as exc:
            message = budget_spec_error(exc)
            patch.status["conditions"] = [  # a merge patch: the whole list
                {"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": message[:1000]}
            ]
            return
        if name not in book.specs:
            return
        new = budget_status(book, name, time.time(), max(TTL_MIN_S, TTL_TICKS * interval_s), generation)
        new["conditions"] = [
            {"type": "Ready", "status": "True", "reason": "Allocating", "message": "allocating every scale interval"}
        ]
        for key, value in new.items():
            if (status or {}).get(key) != value:  # only what changed: nothing at rest
                patch.status[key] = value
