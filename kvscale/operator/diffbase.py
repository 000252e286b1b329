"""kopf's diff base as a digest: what kopf keeps of the last handled spec, in an annotation.

kopf stores the "essence" of the object it last handled (spec, labels, annotations) to tell a
real change from a status write. Stored whole, it is a second copy of the spec in the object's
annotations, which may hold 256 KiB in all (with `kubectl apply`'s last-applied-configuration, a
third copy): a spec of ~130 KiB (a long config.json) then left the operator unable to write
status or its finalizer, and `kubectl delete` hung. The handlers are level-based (they read the
whole spec, never kopf's per-field diff), so a digest tells kopf all it needs: whether the spec
changed. The annotation stays ~150 bytes whatever the spec holds.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, cast

import kopf


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def digested(essence: dict[str, Any]) -> dict[str, Any]:
    """The essence with each top-level part replaced by its digest (`spec` stays a key, so
    kopf's update handler on field `spec` still fires exactly when the spec changes)."""
    return {key: {"sha256": _digest(value)} for key, value in essence.items()}


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff base, holding digests instead of the spec itself."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        essence = super().build(body=body, extra_fields=extra_fields)
        return cast(Any, digested(dict(essence)))
