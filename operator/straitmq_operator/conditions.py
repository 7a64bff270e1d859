"""Status conditions: Ready, Progressing, Degraded (the Kubernetes API conventions)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .names import PAUSE_ANNOTATION


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


def paused(body: dict[str, Any]) -> bool:
    """The pause annotation (straitmq.io/pause-reconciliation: "true") is on `body`."""
    value = ((body.get("metadata") or {}).get("annotations") or {}).get(PAUSE_ANNOTATION)
    return str(value).strip().lower() == "true"


def paused_status(body: dict[str, Any]) -> dict[str, Any]:
    """The status of a paused object: as the last pass left it, plus the condition.

    observedGeneration stays the last one acted on, so a spec changed while paused shows
    as not observed; the condition's observedGeneration is the generation seen paused."""
    old = dict(body.get("status") or {})
    generation = (body.get("metadata") or {}).get("generation")
    msg = f"{PAUSE_ANNOTATION} is true: the operator changes nothing until it is removed"
    pending = old.get("observedGeneration")
    if pending is not None and generation is not None and pending != generation:
        msg += f" (generation {generation} not applied yet; {pending} is)"
    conds = set_condition(
        list(old.get("conditions") or []), "ReconciliationPaused", True, "Paused", msg, generation
    )
    conds = set_condition(conds, "Progressing", False, "ReconciliationPaused", msg, generation)
    out = {**old, "conditions": conds}
    if body.get("kind") == "MQCluster":
        out["phase"] = "Paused"
    return out


def unpaused(status: dict[str, Any]) -> dict[str, Any]:
    """`status` without the ReconciliationPaused condition (Strimzi removes it too)."""
    conds = [c for c in status.get("conditions") or [] if c.get("type") != "ReconciliationPaused"]
    return {**status, "conditions": conds}
