"""kopf wiring: one reconcile loop per MQCluster, Topic and User.

A loop serializes every pass for its object, so a scale and a rolling restart can never
race each other. It wakes at once when the object's spec or annotations change (not on
its own status writes), an idle MQCluster's also when its pods or StatefulSets change
(a pod down shows in its status at once, not at the next timer), and otherwise re-runs
on a timer: often while work is in progress, rarely when all is well (that pass corrects
drift).

The loops are asyncio tasks started from watch events, not kopf daemons: kopf puts a
finalizer on every object a daemon runs for, and a finalizer only comes off while the
operator runs. Without one, deleting a namespace (or a Topic, a User, an MQCluster)
finishes whether or not the operator is there; what deleting one must do in the
cluster is done by the MQCluster's passes instead (managed.py, and the rack binding
below). kopf drops its old finalizer from objects that still carry one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from straitmq.telemetry.operator_metrics import OperatorMetrics
from straitmq.telemetry.provider import Telemetry

from . import names as n
from .cluster import ClusterReconciler
from .conditions import get_condition, paused, paused_status, set_condition, unpaused
from .kube import Kube, api_client, explain, pod_ready
from .topic import TopicReconciler
from .user import UserReconciler

log = logging.getLogger("straitmq.operator")

BUSY_INTERVAL_S = float(os.environ.get("STRAITMQ_OPERATOR_BUSY_INTERVAL_S", "3"))
IDLE_INTERVAL_S = float(os.environ.get("STRAITMQ_OPERATOR_IDLE_INTERVAL_S", "30"))
# The ClusterRole (get nodes) bound to rack-aware broker pods; the Helm chart creates it.
RACK_CLUSTER_ROLE = os.environ.get("STRAITMQ_RACK_CLUSTER_ROLE") or None

_wake: dict[str, asyncio.Event] = {}
_seen: dict[str, tuple[Any, ...]] = {}
_state: dict[str, Any] = {}
_nudge: dict[str, asyncio.Event] = {}  # pods or StatefulSets of an MQCluster changed
_loops: dict[str, asyncio.Task[None]] = {}  # object uid -> its reconcile loop
_clusters: dict[tuple[str, str], str] = {}  # (namespace, MQCluster name) -> uid


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


async def _sleep(uid: str, seconds: float, nudgeable: bool = False) -> None:
    """Until the timer, a change of the object, or (`nudgeable`) a change of its pods.

    Pods nudge only an idle loop: while work is in progress the busy timer paces it, so
    a roll never decides its next restart on a view of the cluster taken the instant
    after its last one (the restarted node not yet seen gone, let alone back)."""
    event = _wake.setdefault(uid, asyncio.Event())
    nudge = _nudge.setdefault(uid, asyncio.Event())
    waits = [asyncio.ensure_future(event.wait())]
    if nudgeable:
        waits.append(asyncio.ensure_future(nudge.wait()))
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    event.clear()
    nudge.clear()


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
            if paused(current):
                # Nothing is read or changed: the status only says so. The annotation's
                # removal wakes the loop, and that pass applies what changed meanwhile.
                new = paused_status(current)
                if get_condition(status.get("conditions") or [], "ReconciliationPaused") is None:
                    _emitter(body)("Normal", "ReconciliationPaused", "reconciliation paused")
                if new != status:
                    await kube().patch_status(plural, ns, name, new)
                await _sleep(uid, IDLE_INTERVAL_S)
                continue
            try:
                with metrics().reconcile(kind):
                    status = unpaused(await reconcile(current))
            except Exception as e:  # any failure: an Event, a condition, and a retry
                why = explain(e)
                log.exception("reconcile failed", extra={"object": _ref(current), "error": why})
                kopf.exception(body, reason="ReconcileError", message=why)
                status = unpaused(_error_status(status, current, why))
            await kube().patch_status(plural, ns, name, status)
            busy = _busy(status)
            await _sleep(uid, BUSY_INTERVAL_S if busy else IDLE_INTERVAL_S, nudgeable=not busy)
    finally:
        _wake.pop(uid, None)
        _nudge.pop(uid, None)
        _seen.pop(uid, None)


def _error_status(status: dict[str, Any], body: dict[str, Any], msg: str) -> dict[str, Any]:
    gen = body["metadata"].get("generation")
    conds = set_condition(
        list(status.get("conditions") or []), "Ready", False, "ReconcileError", msg, gen
    )
    if body.get("kind") == "MQCluster":
        conds = set_condition(conds, "Degraded", True, "ReconcileError", msg, gen)
    return {**status, "conditions": conds}


def _cluster_uid(namespace: str | None, name: str | None) -> str | None:
    return _clusters.get((namespace or "default", name or ""))


def _note_change(uid: str, key: tuple[Any, ...]) -> bool:
    changed = _seen.get(uid) != key
    _seen[uid] = key
    return changed


async def _on_event(
    kind: str, plural: str, make: Any, type: str | None, uid: str, body: kopf.Body
) -> None:
    """Start the object's loop on first sight; wake it when what a user edits changed."""
    meta = body.get("metadata", {})
    if kind == "MQCluster" and type != "DELETED":
        _clusters[(meta.get("namespace") or "default", meta["name"])] = uid
    if type == "DELETED":
        _seen.pop(uid, None)
        if uid in _wake:  # the loop sees it gone and ends
            _wake[uid].set()
        if kind == "MQCluster":
            _clusters.pop((meta.get("namespace") or "default", meta["name"]), None)
            await _delete_rack_binding(body)
        else:  # its cluster's pass removes it from the cluster (managed.py)
            _wake_cluster(meta.get("namespace"), (body.get("spec") or {}).get("cluster"))
        return
    task = _loops.get(uid)
    if task is None or task.done():
        _seen.pop(uid, None)
        _changed(uid, body)
        _loops[uid] = asyncio.create_task(_supervise(kind, plural, body, uid, make))
    elif _changed(uid, body) and uid in _wake:
        _wake[uid].set()


def _wake_cluster(namespace: str | None, name: str | None, nudge: bool = False) -> None:
    """Wake an MQCluster's loop; `nudge`: only if it is idle (see _sleep)."""
    uid = _cluster_uid(namespace, name)
    events = _nudge if nudge else _wake
    if uid is not None and uid in events:
        events[uid].set()


async def _supervise(kind: str, plural: str, body: kopf.Body, uid: str, make: Any) -> None:
    """Run the loop until the object is gone; an error outside a pass (the API server
    away) restarts it after a pause."""
    try:
        while True:
            try:
                await _loop(kind, plural, body, uid, False, make(body))
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning(
                    "reconcile loop failed", extra={"object": _ref(body), "error": explain(e)}
                )
                await _sleep(uid, BUSY_INTERVAL_S)
    finally:
        _loops.pop(uid, None)


@kopf.on.event(n.GROUP, n.VERSION, n.CLUSTERS)
async def cluster_event(type: str | None, uid: str, body: kopf.Body, **_: Any) -> None:
    def make(b: kopf.Body) -> Any:
        return ClusterReconciler(kube(), _emitter(b), rack_cluster_role=RACK_CLUSTER_ROLE).reconcile

    await _on_event("MQCluster", n.CLUSTERS, make, type, uid, body)


@kopf.on.event(n.GROUP, n.VERSION, n.TOPICS)
async def topic_event(type: str | None, uid: str, body: kopf.Body, **_: Any) -> None:
    def make(b: kopf.Body) -> Any:
        return TopicReconciler(kube(), _emitter(b)).reconcile

    await _on_event("Topic", n.TOPICS, make, type, uid, body)


@kopf.on.event(n.GROUP, n.VERSION, n.USERS)
async def user_event(type: str | None, uid: str, body: kopf.Body, **_: Any) -> None:
    def make(b: kopf.Body) -> Any:
        return UserReconciler(kube(), _emitter(b)).reconcile

    await _on_event("User", n.USERS, make, type, uid, body)


@kopf.on.event("v1", "pods", labels={"app.kubernetes.io/managed-by": n.FIELD_MANAGER})
def pod_event(type: str | None, uid: str, body: kopf.Body, **_: Any) -> None:
    """A broker or controller pod went, came, turned (not) Ready, or was annotated."""
    meta = body.get("metadata", {})
    key = (
        type == "DELETED",
        meta.get("deletionTimestamp"),
        (meta.get("annotations") or {}).get(n.ROLL_ANNOTATION),
        pod_ready(dict(body)),
    )
    if type == "DELETED":
        _seen.pop(uid, None)
    if _note_change(uid, key) or type == "DELETED":
        _wake_cluster(
            meta.get("namespace"),
            (meta.get("labels") or {}).get("app.kubernetes.io/instance"),
            nudge=True,
        )


@kopf.on.event(
    "apps", "v1", "statefulsets", labels={"app.kubernetes.io/managed-by": n.FIELD_MANAGER}
)
def statefulset_event(type: str | None, uid: str, body: kopf.Body, **_: Any) -> None:
    """Its status (ready replicas, revisions) feeds the MQCluster's."""
    st = body.get("status") or {}
    key = tuple(
        st.get(k)
        for k in (
            "observedGeneration",
            "replicas",
            "readyReplicas",
            "updatedReplicas",
            "currentRevision",
            "updateRevision",
        )
    )
    if type == "DELETED":
        _seen.pop(uid, None)
    if _note_change(uid, key) or type == "DELETED":
        meta = body.get("metadata", {})
        _wake_cluster(
            meta.get("namespace"),
            (meta.get("labels") or {}).get("app.kubernetes.io/instance"),
            nudge=True,
        )


async def _delete_rack_binding(body: kopf.Body) -> None:
    # Everything namespaced goes with the owner references; the cluster-scoped rack
    # binding cannot (and startup sweeps those whose MQCluster went while we were away).
    try:
        if await ClusterReconciler(kube(), _emitter(body)).delete(dict(body)):
            log.info("rack binding deleted", extra={"object": _ref(body)})
    except Exception as e:  # the next startup's sweep tries again
        log.warning(
            "could not delete a rack binding", extra={"object": _ref(body), "error": explain(e)}
        )


@kopf.on.startup()
async def sweep_rack_bindings(**_: Any) -> None:
    """Rack bindings whose MQCluster was deleted while the operator was not running."""
    if not RACK_CLUSTER_ROLE:
        return  # this install never makes them (nor may list them)
    try:
        bindings = await kube().list_rack_bindings()
    except Exception as e:
        log.warning("could not list rack bindings", extra={"error": explain(e)})
        return
    for b in bindings:
        labels = b["metadata"].get("labels") or {}
        ns = labels.get(n.CLUSTER_NAMESPACE_LABEL)
        name = labels.get("app.kubernetes.io/instance")
        if not ns or not name:
            continue
        try:
            if await kube().get_custom(n.CLUSTERS, ns, name) is not None:
                continue
            await kube().delete(
                "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None, b["metadata"]["name"]
            )
        except Exception as e:
            if isinstance(e, ApiException) and e.status == 403:
                continue  # a namespace this operator does not watch: not its own
            log.warning(
                "rack binding left", extra={"binding": b["metadata"]["name"], "error": explain(e)}
            )
            continue
        log.info("stale rack binding deleted", extra={"binding": b["metadata"]["name"]})


@kopf.on.cleanup()
async def stop_loops(**_: Any) -> None:
    tasks = list(_loops.values())
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
