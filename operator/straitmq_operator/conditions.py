"""Status conditions: Ready, Progressing, Degraded (the Kubernetes API conventions)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new list with `type_` set; lastTransitionTime moves only when status flips."""
    value = "True" if status else "False"
    old = next((c for c in conditions if c.get("type") == type_), None)
    cond = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": old["lastTransitionTime"]
        if old and old.get("status") == value and old.get("lastTransitionTime")
        else now(),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return [c for c in conditions if c.get("type") != type_] + [cond]


def get_condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)
