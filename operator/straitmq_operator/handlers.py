"""kopf wiring: one reconcile loop (a kopf daemon) per MQCluster, Topic and User.

A daemon serializes every pass for its object, so a scale and a rolling restart can never
race each other. It wakes at once when the object's spec or annotations change (not on
its own status writes), and otherwise re-runs on a timer: often while work is in
progress, rarely when all is well (that pass corrects drift).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from straitmq.telemetry.operator_metrics import OperatorMetrics
from straitmq.telemetry.provider import Telemetry

from . import names as n
from .cluster import ClusterReconciler
from .conditions import set_condition
from .kube import Kube, api_client, explain
from .topic import TopicProblem, TopicReconciler
from .user import UserProblem, UserReconciler

log = logging.getLogger("straitmq.operator")

BUSY_INTERVAL_S = float(os.environ.get("STRAITMQ_OPERATOR_BUSY_INTERVAL_S", "3"))
IDLE_INTERVAL_S = float(os.environ.get("STRAITMQ_OPERATOR_IDLE_INTERVAL_S", "30"))
# The ClusterRole (get nodes) bound to rack-aware broker pods; the Helm chart creates it.
RACK_CLUSTER_ROLE = os.environ.get("STRAITMQ_RACK_CLUSTER_ROLE") or None

_wake: dict[str, asyncio.Event] = {}
_seen: dict[str, tuple[Any, ...]] = {}
_state: dict[str, Any] = {}


def kube() -> Kube:
    if "kube" not in _state:
        _state["kube"] = Kube(api_client())
    return _state["kube"]


def metrics() -> OperatorMetrics:
    if "metrics" not in _state:
        pod = os.environ.get("POD_NAME") or os.uname().nodename
        _state["metrics"] = OperatorMetrics(Telemetry("straitmq-operator", instance_id=pod))
    return _state["metrics"]


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Progress and the last-handled spec go to annotations: the CRDs' structural schemas
    # would prune kopf's default `status.kopf` field.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="kopf.straitmq.io"
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.straitmq.io", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "straitmq.io/finalizer"
    # Events are ours (reasons and messages a user can act on); kopf's own INFO lines
    # ("Handler succeeded") would bury them.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 30


def _ref(body: Mapping[str, Any]) -> str:
    """Kind/namespace/name, as the operator's log lines name an object."""
    meta = body["metadata"]
    return "/".join(x for x in (body.get("kind"), meta.get("namespace"), meta["name"]) if x)


def _emitter(body: kopf.Body) -> Any:
    def emit(type_: str, reason: str, message: str) -> None:
        log.info("event", extra={"object": _ref(body), "reason": reason, "detail": message})
        kopf.event(body, type=type_, reason=reason, message=message)

    return emit


def _changed(uid: str, body: kopf.Body) -> bool:
    """True when what a user edits changed; status writes do not count."""
    meta = body.get("metadata", {})
    key = (
        meta.get("generation"),
        tuple(sorted((meta.get("annotations") or {}).items())),
        meta.get("deletionTimestamp"),
    )
    changed = _seen.get(uid) != key
    _seen[uid] = key
    return changed


@kopf.on.event(n.GROUP, n.VERSION, n.CLUSTERS)
@kopf.on.event(n.GROUP, n.VERSION, n.TOPICS)
@kopf.on.event(n.GROUP, n.VERSION, n.USERS)
def wake(uid: str, body: kopf.Body, **_: Any) -> None:
    if _changed(uid, body) and uid in _wake:
        _wake[uid].set()


async def _sleep(uid: str, seconds: float) -> None:
    event = _wake.setdefault(uid, asyncio.Event())
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass
    event.clear()


def _busy(status: dict[str, Any]) -> bool:
    conds = status.get("conditions") or []
    return any(
        (c["type"] == "Progressing" and c["status"] == "True")
        or (c["type"] == "Ready" and c["status"] != "True")
        for c in conds
    )


async def _loop(
    kind: str, plural: str, body: kopf.Body, uid: str, stopped: Any, reconcile: Any
) -> None:
    ns, name = body["metadata"].get("namespace"), body["metadata"]["name"]
    _wake.setdefault(uid, asyncio.Event())
    try:
        while not stopped:
            current = await kube().get_custom(plural, ns, name)
            if current is None or current["metadata"].get("deletionTimestamp"):
                return
            status = current.get("status") or {}
            try:
                with metrics().reconcile(kind):
                    status = await reconcile(current)
            except Exception as e:  # any failure: an Event, a condition, and a retry
                why = explain(e)
                log.exception("reconcile failed", extra={"object": _ref(current), "error": why})
                kopf.exception(body, reason="ReconcileError", message=why)
                status = _error_status(status, current, why)
            await kube().patch_status(plural, ns, name, status)
            await _sleep(uid, BUSY_INTERVAL_S if _busy(status) else IDLE_INTERVAL_S)
    finally:
        _wake.pop(uid, None)
        _seen.pop(uid, None)


def _error_status(status: dict[str, Any], body: dict[str, Any], msg: str) -> dict[str, Any]:
    gen = body["metadata"].get("generation")
    conds = set_condition(
        list(status.get("conditions") or []), "Ready", False, "ReconcileError", msg, gen
    )
    if body.get("kind") == "MQCluster":
        conds = set_condition(conds, "Degraded", True, "ReconcileError", msg, gen)
    return {**status, "conditions": conds}


@kopf.daemon(n.GROUP, n.VERSION, n.CLUSTERS, cancellation_timeout=5.0)
async def cluster_daemon(body: kopf.Body, uid: str, stopped: Any, **_: Any) -> None:
    reconciler = ClusterReconciler(kube(), _emitter(body), rack_cluster_role=RACK_CLUSTER_ROLE)
    await _loop("MQCluster", n.CLUSTERS, body, uid, stopped, reconciler.reconcile)


@kopf.on.delete(n.GROUP, n.VERSION, n.CLUSTERS)
async def cluster_deleted(body: kopf.Body, **_: Any) -> None:
    # Everything namespaced goes with the owner references; the rack binding cannot.
    if await ClusterReconciler(kube(), _emitter(body)).delete(dict(body)):
        log.info("rack binding deleted", extra={"object": _ref(body)})


@kopf.daemon(n.GROUP, n.VERSION, n.TOPICS, cancellation_timeout=5.0)
async def topic_daemon(body: kopf.Body, uid: str, stopped: Any, **_: Any) -> None:
    reconciler = TopicReconciler(kube(), _emitter(body))
    await _loop("Topic", n.TOPICS, body, uid, stopped, reconciler.reconcile)


@kopf.on.delete(n.GROUP, n.VERSION, n.TOPICS)
async def topic_deleted(body: kopf.Body, **_: Any) -> None:
    reconciler = TopicReconciler(kube(), _emitter(body))
    try:
        with metrics().reconcile("Topic"):
            outcome = await reconciler.delete(dict(body))
    except TopicProblem as e:
        # kopf keeps the finalizer and retries; the Event says why it is stuck.
        raise kopf.TemporaryError(f"{e.reason}: {e.message}", delay=10) from None
    log.info("topic deleted", extra={"object": _ref(body), "outcome": outcome})


@kopf.daemon(n.GROUP, n.VERSION, n.USERS, cancellation_timeout=5.0)
async def user_daemon(body: kopf.Body, uid: str, stopped: Any, **_: Any) -> None:
    reconciler = UserReconciler(kube(), _emitter(body))
    await _loop("User", n.USERS, body, uid, stopped, reconciler.reconcile)


@kopf.on.delete(n.GROUP, n.VERSION, n.USERS)
async def user_deleted(body: kopf.Body, **_: Any) -> None:
    reconciler = UserReconciler(kube(), _emitter(body))
    try:
        with metrics().reconcile("User"):
            outcome = await reconciler.delete(dict(body))
    except UserProblem as e:
        # kopf keeps the finalizer and retries; the Event says why it is stuck.
        raise kopf.TemporaryError(f"{e.reason}: {e.message}", delay=10) from None
    log.info("user deleted", extra={"object": _ref(body), "outcome": outcome})
