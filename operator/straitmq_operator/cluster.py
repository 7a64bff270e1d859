"""MQCluster reconciliation: one level-triggered pass, run again every few seconds.

A pass reads what is (StatefulSets, pods, the cluster's admin API), decides the next
safe step (grow, move partitions, shrink, restart one pod), takes it, and returns the
status. Nothing is remembered between passes except what the status records, so an
operator restart picks up where the last one stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from straitmq.admin_client import AdminAuth

from . import certificates, listeners, managed, planning, quorum, render, upgrade
from . import names as n
from .admin import AdminClient, AdminError, Topic
from .conditions import get_condition, set_condition
from .kube import Kube, ordinal, pod_ready
from .spec import ClusterSpec, SpecError, Storage, parse

log = logging.getLogger("straitmq.operator.cluster")

# emit(type "Normal"|"Warning", reason, message): an Event on the MQCluster.
Emit = Callable[[str, str, str], None]

RBAC = "rbac.authorization.k8s.io/v1"


class RackUnavailable(Exception):
    """The spec asks for rack awareness that this install cannot give."""


class StorageImmutable(Exception):
    """The spec changes the storage of existing StatefulSets, which Kubernetes refuses."""


def admin_url(body: dict[str, Any], spec: ClusterSpec) -> str:
    override = (body.get("metadata", {}).get("annotations") or {}).get(n.ADMIN_URL_ANNOTATION)
    if override:
        return override
    scheme = "https" if spec.http_secured else "http"
    return f"{scheme}://{n.bootstrap_service(spec.name)}.{spec.namespace}.svc:{spec.http_port}"


def controller_url(body: dict[str, Any], spec: ClusterSpec, i: int) -> str:
    """Controller pod i's own quorum API: its pod DNS name (where the brokers and the
    other voters reach it too), unless the controller-urls annotation names another."""
    raw = (body.get("metadata", {}).get("annotations") or {}).get(n.CONTROLLER_URLS_ANNOTATION)
    if raw:
        try:
            urls = orjson.loads(raw)
        except orjson.JSONDecodeError:
            urls = None
        if isinstance(urls, dict) and isinstance(urls.get(str(i)), str):
            return urls[str(i)]
    scheme = "https" if spec.http_secured else "http"
    host = n.pod_dns(spec.name, n.CONTROLLER, i, spec.namespace)
    return f"{scheme}://{host}:{spec.controller_port}"


def manual_roll(body: dict[str, Any]) -> bool:
    """The manual-rolling-update annotation is on this pod or MQCluster."""
    value = ((body.get("metadata") or {}).get("annotations") or {}).get(n.ROLL_ANNOTATION)
    return str(value).strip().lower() == "true"


def restart_due(pod: dict[str, Any], revision: str | None) -> bool:
    """A pod to restart in a roll: of an older revision, or asked for by annotation."""
    if pod["metadata"].get("deletionTimestamp"):
        return False  # on its way out already
    labels = pod["metadata"].get("labels") or {}
    return labels.get("controller-revision-hash") != revision or manual_roll(pod)


def other_scheme(url: str) -> str:
    """`url` with http and https swapped."""
    scheme, sep, rest = url.partition("://")
    return ("http" if scheme == "https" else "https") + sep + rest


@dataclass
class Observed:
    """What the cluster's admin API said this pass; None fields: it could not be asked."""

    cluster: dict[str, Any] | None = None
    topics: list[Topic] | None = None
    reassigning: list[dict[str, Any]] = field(default_factory=list)
    quorum: dict[str, Any] | None = None
    features: dict[str, Any] | None = None  # GET /api/v1/features (None: 0.1.0, or unknown)
    error: str | None = None

    def lagging_voters(self, max_lag: int = 100) -> list[int] | None:
        """Voters unreachable or behind the quorum leader; None: the quorum is unknown."""
        if self.quorum is None:
            return None
        return [
            v["node_id"]
            for v in self.quorum.get("voters", [])
            if not v.get("reachable") or v.get("lag") is None or v["lag"] > max_lag
        ]

    @property
    def reachable(self) -> bool:
        return self.cluster is not None and self.topics is not None

    def live_brokers(self) -> set[int]:
        """Registered, unfenced, not shutting down."""
        if self.cluster is None:
            return set()
        return {
            b["id"]
            for b in self.cluster.get("brokers", [])
            if not b.get("fenced") and not b.get("shutting_down")
        }


@dataclass
class Pass:
    """The decisions of one pass, turned into status at the end."""

    phase: str = "Ready"
    progressing: tuple[str, str] | None = None  # (reason, message)
    degraded: tuple[str, str] | None = None
    scaling: dict[str, Any] | None = None
    rolling: dict[str, Any] | None = None
    # The controller quorum's next step (quorum.plan); None: the cluster is being made.
    quorum_step: quorum.Step | None = None
    quorum_error: str | None = None  # why the step's call was refused
    addresses: listeners.Addresses | None = None  # the external listeners'
    version: upgrade.Plan | None = None  # the version roll's step this pass (None: not asked)
    finalize_error: str | None = None
    # The FinalizeAffectsClients condition (upgrade.finalize_impact); None: not known.
    finalize_impact: tuple[bool, str, str] | None = None


class ClusterReconciler:
    def __init__(
        self,
        kube: Kube,
        emit: Emit,
        admin_timeout_s: float = 10.0,
        rack_cluster_role: str | None = None,
    ) -> None:
        self.kube = kube
        self.emit = emit
        self.admin_timeout_s = admin_timeout_s
        # The ClusterRole (get nodes) that rack-aware broker pods are bound to; None: this
        # install does not offer rack awareness.
        self.rack_cluster_role = rack_cluster_role

    async def reconcile(self, body: dict[str, Any]) -> dict[str, Any]:
        """One pass; returns the new status (the caller writes it)."""
        meta = body["metadata"]
        old = body.get("status") or {}
        generation = meta.get("generation")
        try:
            spec = parse(body)
            await self._rack_binding(spec)
        except (SpecError, RackUnavailable) as e:
            reason = type(e).__name__ if isinstance(e, RackUnavailable) else "InvalidSpec"
            return self._refused(old, generation, reason, str(e), always_emit=True)

        sts_name = n.statefulset(spec.name, n.BROKER)
        sts = await self.kube.get("apps/v1", "StatefulSet", spec.namespace, sts_name)
        current = sts["spec"]["replicas"] if sts else None
        ctl_name = n.statefulset(spec.name, n.CONTROLLER)
        ctl_sts = await self.kube.get("apps/v1", "StatefulSet", spec.namespace, ctl_name)
        ctl_current = ctl_sts["spec"]["replicas"] if ctl_sts else None
        if spec.first_voters is None:
            # The status does not say how many controllers the cluster was made with:
            # one made before it was kept had 3; a new one starts with the spec's.
            spec = replace(spec, first_voters=3 if ctl_sts else spec.controllers)
        want = spec.brokers
        async with AsyncExitStack() as stack:
            admin, seen = await self._connect(body, spec, stack)
            p = Pass()
            ctl_replicas = spec.controllers
            if ctl_current is not None:
                p.quorum_step = await self._plan_quorum(body, spec, seen, ctl_current)
                ctl_replicas = p.quorum_step.replicas
            if current is None:
                replicas = want
                p.phase = "Creating"
                p.progressing = (
                    "Creating",
                    f"creating {spec.controllers} controllers and {want} brokers",
                )
            elif want > current:
                replicas = want
                p.scaling = {"adding": list(range(current, want)), "removing": []}
            elif want < current:
                replicas = await self._scale_down(admin, spec, seen, current, p)
            else:
                replicas = current
                prev = (old.get("scaling") or {}).get("adding") or []
                if prev:
                    p.scaling = {"adding": [b for b in prev if b < want], "removing": []}
            # Apply answers with the stored object, status included: the StatefulSets
            # as they are now, with no second read.
            # The brokers that have (or are about to have) pods: those being drained
            # keep their listener Services and certificates until the shrink, which
            # removes them in the same pass.
            shrinking = current is not None and replicas < current
            brokers = replicas if shrinking else max(replicas, current or 0)
            p.addresses = await self._listeners(spec, brokers)
            if current is not None and replicas > current:
                waiting = listeners.unknown(p.addresses, range(current, replicas))
                if waiting:  # new brokers start once they know what to advertise
                    replicas = current
                    p.phase = "ScalingUp"
                    p.progressing = (
                        "ScalingUp",
                        f"waiting for the addresses of the new brokers on listeners {waiting}",
                    )
            if spec.needs_certificates:  # before the pods that mount them
                await certificates.ensure(
                    self.kube,
                    spec,
                    brokers,
                    self.emit,
                    addresses=p.addresses,
                    controllers=max(ctl_replicas, ctl_current or 0),
                )
            sets: dict[str, dict[str, Any]] = {}
            refused: str | None = None
            for obj in render.objects(spec, replicas, p.addresses, brokers, ctl_replicas):
                try:
                    stored = await self.kube.apply(obj)
                except ApiException as e:
                    refusal = await self._storage_refusal(spec, obj, e)
                    if refusal is None:
                        raise
                    refused = str(refusal)  # that StatefulSet stays as it is
                    continue
                if obj["kind"] == "StatefulSet":
                    sets[obj["metadata"]["labels"]["app.kubernetes.io/component"]] = stored
            if refused is not None:
                # One refused field stops what depends on the spec (scaling, rolls), not
                # unrelated work: deleted Topics and Users are still removed.
                if seen.reachable:
                    await self._sweep(admin, body)
                return self._refused(old, generation, "StorageImmutable", refused)
            if p.scaling and p.scaling.get("adding"):
                await self._spread(admin, spec, seen, want, p)
            if p.quorum_step is not None:
                await self._change_quorum(admin, body, spec, p)
            quorum_busy = p.quorum_step is not None and p.quorum_step.changing
            if p.phase in ("Ready", "Creating") and current is not None and not quorum_busy:
                # No restart while voters change: each would cost the quorum a member.
                await self._roll(body, spec, seen, p, sets)
            await self._finalize(admin, body, spec, seen, p)
            if seen.reachable:
                await self._finalize_impact(spec, seen, p)
                await self._sweep(admin, body)
        return self._status(spec, old, generation, seen, p, replicas, sets)

    async def _listeners(self, spec: ClusterSpec, brokers: int) -> listeners.Addresses:
        """Each broker's own Service and the external listeners' Services and Ingresses,
        for brokers 0..brokers-1 (and none for listeners or brokers gone), and the
        addresses they got."""
        stored: dict[str, dict[str, Any]] = {}
        listener = f"{n.selector_string(spec.name, n.LISTENER_COMPONENT)},{n.LISTENER_LABEL}"
        wanted = [
            (
                "Service",
                n.selector_string(spec.name, n.BROKER_SERVICE_COMPONENT),
                render.broker_services(spec, brokers),
            ),
            ("Service", listener, listeners.services(spec, brokers)),
            ("Ingress", listener, listeners.ingresses(spec, brokers)),
        ]
        api = {"Service": "v1", "Ingress": "networking.k8s.io/v1"}
        for kind, selector, objs in wanted:
            for obj in objs:
                stored[obj["metadata"]["name"]] = await self.kube.apply(obj)
            keep = {o["metadata"]["name"] for o in objs}
            try:
                found = await self.kube.list_objects(api[kind], kind, spec.namespace, selector)
            except ApiException as e:
                # An install whose RBAC has no ingresses runs clusters without them.
                if e.status == 403 and not objs:
                    continue
                raise
            for old in found:
                name = old["metadata"]["name"]
                if name not in keep:
                    await self.kube.delete(api[kind], kind, spec.namespace, name)
                    log.info("deleted %s %s: its listener or broker is gone", kind, name)
        if not spec.external:
            return listeners.Addresses()
        pods = await self.kube.list_pods(spec.namespace, n.selector_string(spec.name, n.BROKER))
        host_ips = {
            ordinal(x): x["status"]["hostIP"] for x in pods if (x.get("status") or {}).get("hostIP")
        }
        return listeners.resolve(spec, brokers, stored, host_ips)

    async def _connect(
        self, body: dict[str, Any], spec: ClusterSpec, stack: AsyncExitStack
    ) -> tuple[AdminClient, Observed]:
        """The cluster's admin API and what it says. A change of spec.http_secured rolls
        the brokers from plain http to https with client certificates (or back); until
        each is restarted it answers the other scheme, so when the spec's cannot be
        reached that one is tried too, and the pass can still check the cluster before
        restarting the next pod."""
        url = admin_url(body, spec)
        auth = await certificates.admin_auth(self.kube, spec)
        admin = await stack.enter_async_context(AdminClient(url, self.admin_timeout_s, auth))
        seen = await self._observe(admin)
        if seen.reachable:
            return admin, seen
        if (
            not spec.http_secured
            and await self.kube.get(
                "v1", "Secret", spec.namespace, n.operator_certs_secret(spec.name)
            )
            is None
        ):
            return admin, seen  # never secured: nothing to fall back to
        old_auth = await certificates.admin_auth(self.kube, spec, not spec.http_secured)
        old = await stack.enter_async_context(
            AdminClient(other_scheme(url), self.admin_timeout_s, old_auth)
        )
        old_seen = await self._observe(old)
        return (old, old_seen) if old_seen.reachable else (admin, seen)

    def _refused(
        self,
        old: dict[str, Any],
        generation: int | None,
        reason: str,
        message: str,
        always_emit: bool = False,
    ) -> dict[str, Any]:
        """A spec the operator cannot carry out: Degraded, with a Warning Event."""
        conds = list(old.get("conditions") or [])
        seen = get_condition(conds, "Degraded") or {}
        if always_emit or (seen.get("reason"), seen.get("message")) != (reason, message):
            self.emit("Warning", reason, message)
        conds = set_condition(conds, "Ready", False, reason, message, generation)
        conds = set_condition(conds, "Degraded", True, reason, message, generation)
        return {**old, "phase": "Degraded", "conditions": conds}

    async def _storage_refusal(
        self, spec: ClusterSpec, obj: dict[str, Any], e: ApiException
    ) -> StorageImmutable | None:
        """A StatefulSet the API server refused because its volume claims would change.

        Kubernetes forbids changing a StatefulSet's volumeClaimTemplates, so a storage
        edit on an existing MQCluster cannot be applied; None: refused for another reason.
        """
        if obj["kind"] != "StatefulSet" or e.status != 422:
            return None
        meta = obj["metadata"]
        stored = await self.kube.get("apps/v1", "StatefulSet", meta["namespace"], meta["name"])
        if stored is None:
            return None
        have = _claim_storage(stored)
        want = _claim_storage(obj)
        if have is None or want is None:
            return None
        name = meta["name"]
        path = f"spec.{meta['labels']['app.kubernetes.io/component']}s.storage"
        if _quantity(have.size) != _quantity(want.size):
            change = f"from {have.size} to {want.size}"
            undo = f"revert {path}.size to {have.size}"
        elif have.storage_class != want.storage_class:
            change = f"from class {have.storage_class or '(default)'} to " + (
                want.storage_class or "(default)"
            )
            undo = (
                f"revert {path}.class to {have.storage_class}"
                if have.storage_class
                else f"remove {path}.class"
            )
        else:
            return None
        return StorageImmutable(
            f"the storage of an existing MQCluster cannot be changed in place (Kubernetes does "
            f"not allow StatefulSet {name}'s volume claims to change {change}): {undo}; to grow "
            f"the volumes, resize each PersistentVolumeClaim data-{name}-N instead if its "
            f"StorageClass allows volume expansion"
        )

    async def _rack_binding(self, spec: ClusterSpec) -> None:
        """Bind the broker pods' service account to the node reader, or unbind it."""
        name = n.rack_binding(spec.namespace, spec.name)
        if not spec.rack_topology_key:
            # Without a node-reader role this install never made one (nor may read them).
            if self.rack_cluster_role:
                if await self.kube.get(RBAC, "ClusterRoleBinding", None, name) is not None:
                    await self.kube.delete(RBAC, "ClusterRoleBinding", None, name)
            return
        if not self.rack_cluster_role:
            raise RackUnavailable(
                "spec.brokers.rack.topologyKey needs rack awareness, which this operator "
                "install does not offer (STRAITMQ_RACK_CLUSTER_ROLE is unset; the Helm chart "
                "sets it unless rbac.rackAwareness is false)"
            )
        try:
            await self.kube.apply(render.rack_binding(spec, self.rack_cluster_role))
        except Exception as e:
            if getattr(e, "status", None) != 403:
                raise
            raise RackUnavailable(
                f"the operator may not bind ClusterRole {self.rack_cluster_role} to the broker "
                f"pods (HTTP 403): it needs create/patch on clusterrolebindings and the bind "
                f"verb on that ClusterRole"
            ) from None

    async def delete(self, body: dict[str, Any]) -> bool:
        """On MQCluster deletion: what owner references cannot clean up."""
        meta = body["metadata"]
        name = n.rack_binding(meta.get("namespace") or "default", meta["name"])
        return await self.kube.delete(RBAC, "ClusterRoleBinding", None, name)

    async def _observe(self, admin: AdminClient) -> Observed:
        seen = Observed()
        try:
            seen.cluster = await admin.cluster()
            seen.topics = await admin.topics(internal=True)
            seen.reassigning = await admin.reassignments()
        except AdminError as e:
            seen.cluster = seen.topics = None
            seen.error = e.message
            return seen
        try:
            seen.quorum = await admin.quorum()
        except AdminError:  # only controller restarts need it; they wait without it
            seen.quorum = None
        try:
            seen.features = await admin.features()
        except AdminError:  # release 0.1.0 has no feature levels to report
            seen.features = None
        return seen

    async def _sweep(self, admin: AdminClient, body: dict[str, Any]) -> None:
        """Remove what deleted Topics and Users left in the cluster (managed.py)."""
        try:
            await managed.sweep(self.kube, admin, body, self.emit)
        except AdminError as e:  # the record keeps it: the next pass tries again
            log.warning(
                "could not remove a deleted resource's topic or user", extra={"error": e.message}
            )

    # -- scaling ---------------------------------------------------------------------

    async def _scale_down(
        self, admin: AdminClient, spec: ClusterSpec, seen: Observed, current: int, p: Pass
    ) -> int:
        """Drain brokers [want, current) and return the replicas to keep for now."""
        want = spec.brokers
        removing = list(range(want, current))
        p.scaling = {"adding": [], "removing": removing}
        if not seen.reachable:
            p.phase = "Draining"
            p.progressing = ("Draining", f"waiting for the admin API: {seen.error}")
            return current
        assert seen.topics is not None
        blocker = planning.blocking_topic(seen.topics, want)
        if blocker is not None:
            msg = (
                f"refusing to scale brokers {current} -> {want}: topic '{blocker.name}' has "
                f"replicationFactor {blocker.replication_factor}, more than {want} brokers"
            )
            p.phase = "Degraded"
            p.degraded = ("ScaleDownRefused", msg)
            p.scaling = None
            self.emit("Warning", "ScaleDownRefused", msg)
            return current
        partitions = planning.all_partitions(seen.topics)
        if seen.reassigning:
            p.phase = "Draining"
            p.scaling |= {"partitionsMoving": len(seen.reassigning)}
            p.progressing = (
                "Draining",
                f"moving {len(seen.reassigning)} partitions off brokers {removing}",
            )
            return current
        staying = sorted(b for b in seen.live_brokers() if b < want)
        holding = [x for x in partitions if set(removing) & set(x.replicas)]
        if not holding:
            await self._clear_throttle(admin)
            self.emit("Normal", "ScaledDown", f"brokers {removing} hold no replicas; shrinking")
            return want
        max_rf = max(len(x.replicas) for x in holding)
        if len(staying) < max_rf:
            p.phase = "Draining"
            p.progressing = (
                "Draining",
                f"waiting for brokers to stay: {len(staying)} of {want} are live, "
                f"partitions need {max_rf}",
            )
            return current
        moves = planning.drain(partitions, set(removing), staying)
        await admin.reassign(moves, spec.throttle_bytes_per_sec)
        self.emit(
            "Normal",
            "Draining",
            f"moving {len(moves)} partitions off brokers {removing} before scaling down",
        )
        p.phase = "Draining"
        p.scaling |= {"partitionsToMove": len(moves), "partitionsMoving": len(moves)}
        p.progressing = ("Draining", f"moving {len(moves)} partitions off brokers {removing}")
        return current

    async def _spread(
        self, admin: AdminClient, spec: ClusterSpec, seen: Observed, want: int, p: Pass
    ) -> None:
        """After a scale up: once the new brokers are Ready, move replicas onto them."""
        assert p.scaling is not None
        adding = p.scaling["adding"]
        p.phase = "ScalingUp"
        pods = await self.kube.list_pods(spec.namespace, n.selector_string(spec.name, n.BROKER))
        ready_pods = {ordinal(x) for x in pods if pod_ready(x)}
        live = seen.live_brokers()
        waiting = [b for b in adding if b not in ready_pods or b not in live]
        if waiting or not seen.reachable:
            why = seen.error if not seen.reachable else f"brokers {waiting} not Ready yet"
            p.progressing = ("ScalingUp", f"waiting: {why}")
            return
        if seen.reassigning:
            p.scaling |= {"partitionsMoving": len(seen.reassigning)}
            p.progressing = (
                "ScalingUp",
                f"moving {len(seen.reassigning)} partitions onto brokers {adding}",
            )
            return
        assert seen.topics is not None
        brokers = sorted(b for b in live if b < want)
        moves = planning.spread_onto(planning.all_partitions(seen.topics), set(adding), brokers)
        if not moves:
            await self._clear_throttle(admin)
            self.emit("Normal", "ScaledUp", f"brokers {adding} hold their share of replicas")
            p.phase = "Ready"
            p.scaling = None
            return
        await admin.reassign(moves, spec.throttle_bytes_per_sec)
        self.emit("Normal", "Rebalancing", f"moving {len(moves)} partitions onto {adding}")
        p.scaling |= {"partitionsToMove": len(moves), "partitionsMoving": len(moves)}
        p.progressing = ("ScalingUp", f"moving {len(moves)} partitions onto brokers {adding}")

    async def _clear_throttle(self, admin: AdminClient) -> None:
        try:
            await admin.clear_throttle()
        except AdminError as e:  # the next move sets it again; only the leftover differs
            log.warning("could not clear the replication throttle", extra={"error": e.message})

    # -- the controller quorum ---------------------------------------------------------

    async def _plan_quorum(
        self, body: dict[str, Any], spec: ClusterSpec, seen: Observed, sts_replicas: int
    ) -> quorum.Step:
        """The quorum's next step (quorum.plan). The controller pods' own /api/v1/quorum
        is asked only while the voter set is not the one the spec asks for (or a new
        storage shows beside it): an idle cluster costs no call per pod."""
        pods: dict[int, quorum.ControllerPod] = {}
        if quorum.wants_pod_status(seen.quorum, spec.controllers):
            listed = await self.kube.list_pods(
                spec.namespace, n.selector_string(spec.name, n.CONTROLLER)
            )
            auth = await certificates.admin_auth(self.kube, spec)
            alive = [x for x in listed if not x["metadata"].get("deletionTimestamp")]
            answers = await asyncio.gather(
                *(
                    self._controller_status(controller_url(body, spec, ordinal(x)), auth)
                    for x in alive
                )
            )
            pods = {
                ordinal(x): quorum.ControllerPod(ordinal(x), pod_ready(x), st)
                for x, st in zip(alive, answers, strict=True)
            }
        return quorum.plan(spec.controllers, sts_replicas, seen.quorum, pods)

    async def _controller_status(self, url: str, auth: AdminAuth | None) -> dict[str, Any] | None:
        try:
            async with AdminClient(url, min(self.admin_timeout_s, 5.0), auth) as client:
                return await client.quorum()
        except AdminError:
            return None

    async def _change_quorum(
        self, admin: AdminClient, body: dict[str, Any], spec: ClusterSpec, p: Pass
    ) -> None:
        """Carry out the step's change (one per pass), and say what is in progress."""
        step = p.quorum_step
        assert step is not None
        timeout_s = max(1.0, self.admin_timeout_s - 2.0)  # answered before the client gives up
        if step.action == quorum.ADD:
            assert step.ordinal is not None
            url = controller_url(body, spec, step.ordinal)
            try:
                await admin.add_voter(url, timeout_s)
            except AdminError as e:  # refused or timed out: the next pass sees and retries
                p.quorum_error = e.message
            else:
                self.emit("Normal", "VoterAdded", f"controller {step.node_id} is a voter")
        elif step.action == quorum.REMOVE:
            assert step.node_id is not None
            try:
                await admin.remove_voter(step.node_id, step.directory_id, timeout_s)
            except AdminError as e:
                p.quorum_error = e.message
            else:
                which = f" (directory {step.directory_id})" if step.directory_id else ""
                self.emit(
                    "Normal",
                    "VoterRemoved",
                    f"voter {step.node_id}{which} removed: {step.reason}",
                )
        if step.action == quorum.UNMANAGED and spec.controllers != len(step.voters):
            p.degraded = ("QuorumUnmanaged", step.reason)
            if p.phase == "Ready":
                p.phase = "Degraded"
        elif step.changing:
            msg = step.reason + (f" (refused: {p.quorum_error})" if p.quorum_error else "")
            if p.progressing is None:
                p.progressing = ("ChangingQuorum", msg)
            if p.quorum_error:
                log.warning("voter change refused", extra={"error": p.quorum_error})

    # -- rolling restarts -------------------------------------------------------------

    async def _roll(
        self,
        body: dict[str, Any],
        spec: ClusterSpec,
        seen: Observed,
        p: Pass,
        sets: dict[str, dict[str, Any]],
    ) -> None:
        """Restart one pod if everything is healthy: controllers, then brokers. A pod is
        due when its revision is not the StatefulSet's, or when a person asked for it
        (the manual-rolling-update annotation on the pod, or on the MQCluster for all)."""
        old = body.get("status") or {}
        if manual_roll(body):
            await self._mark_all_pods(spec)
            await self.kube.remove_annotation(
                n.CLUSTERS, spec.namespace, spec.name, n.ROLL_ANNOTATION
            )
            self.emit("Normal", "ManualRollingUpdate", "restarting every pod, one at a time")
        for sts in sets.values():
            st = sts.get("status") or {}
            if st.get("observedGeneration", 0) < sts["metadata"].get("generation", 0):
                return  # the StatefulSet controller has not computed the new revision yet
        if await self._version_roll(body, spec, seen, p, sets):
            return
        waiting: list[str] = []
        for component in (n.CONTROLLER, n.BROKER):
            sts = sets[component]
            st = sts.get("status") or {}
            pods = await self.kube.list_pods(
                spec.namespace, n.selector_string(spec.name, component)
            )
            moved = self._moved(spec, seen, p, pods) if component == n.BROKER else set()
            outdated = sorted(
                (
                    x
                    for x in pods
                    if restart_due(x, st.get("updateRevision")) or x["metadata"]["name"] in moved
                ),
                key=ordinal,
            )
            not_ready = [x["metadata"]["name"] for x in pods if not pod_ready(x)]
            if len(pods) < sts["spec"]["replicas"]:
                not_ready.append(f"{sts['spec']['replicas'] - len(pods)} pods to be created")
            if not outdated:
                waiting += not_ready
                continue
            names = [x["metadata"]["name"] for x in outdated]
            pending = p.addresses.pending(sts["spec"]["replicas"]) if p.addresses else []
            if component == n.BROKER and pending:
                # As Strimzi does: no broker restarts until every address is known, so
                # that each restarts once, advertising its real address.
                p.progressing = ("Rolling", f"waiting for the addresses of listeners {pending}")
                return
            p.phase = "Rolling"
            p.rolling = {"component": component, "pending": names}
            if not_ready or waiting:  # a controller still coming back holds brokers too
                p.progressing = ("Rolling", f"waiting for {waiting + not_ready} to be Ready")
                return
            victim = self._pick_victim(component, outdated, seen, p)
            if victim is None:
                return
            name = victim["metadata"]["name"]
            manual = manual_roll(victim)
            await self.kube.delete_pod(spec.namespace, name)
            why = "as its manual-rolling-update annotation asks" if manual else "for the new spec"
            self.emit("Normal", "RollingRestart", f"restarted {name} {why}")
            p.progressing = ("Rolling", f"restarted {name}; {len(names) - 1} to go")
            return
        prev = old.get("rollingRestart")
        if prev and waiting:
            # The last restarted pod is not back yet: the roll is still running (not a
            # Degraded cluster), and says what it waits for.
            p.phase = "Rolling"
            p.rolling = {"component": prev.get("component"), "pending": []}
            p.progressing = ("Rolling", f"waiting for {waiting} to be Ready")

    async def _version_roll(
        self,
        body: dict[str, Any],
        spec: ClusterSpec,
        seen: Observed,
        p: Pass,
        sets: dict[str, dict[str, Any]],
    ) -> bool:
        """A change of image (spec.version or spec.image): restart one pod in the order
        upgrade.plan gives, or wait, or pause. True: the version roll owns this pass's
        restarts (the ordinary roll keeps out)."""
        old = (body.get("status") or {}).get("version")
        pods: list[upgrade.Pod] = []
        for component in (n.CONTROLLER, n.BROKER):
            for x in await self.kube.list_pods(
                spec.namespace, n.selector_string(spec.name, component)
            ):
                containers = (x.get("spec") or {}).get("containers") or []
                main = next((c for c in containers if c.get("name") == component), None)
                pods.append(
                    upgrade.Pod(
                        name=x["metadata"]["name"],
                        component=component,
                        ordinal=ordinal(x),
                        image=(main or {}).get("image"),
                        ready=pod_ready(x),
                        deleting=bool(x["metadata"].get("deletionTimestamp")),
                    )
                )
        expected = sum(s["spec"]["replicas"] for s in sets.values())
        plan = upgrade.plan(
            spec.image,
            spec.reported_version,
            pods,
            self._health(seen, pods),
            old,
            body["metadata"].get("generation"),
            time.time(),
            upgrade.Settings(spec.upgrade_step_timeout_s, spec.upgrade_min_ready_s),
            expected,
        )
        p.version = plan
        if plan.action == upgrade.RESTART:
            assert plan.pod is not None
            await self.kube.delete_pod(spec.namespace, plan.pod)
            self.emit("Normal", "VersionRoll", f"restarted {plan.pod}: {plan.message}")
        if plan.action in (upgrade.PAUSE, upgrade.HOLD):
            if plan.action == upgrade.PAUSE:
                self.emit("Warning", "UpgradePaused", f"{plan.reason}: {plan.message}")
                log.warning("version roll paused", extra={"reason": plan.reason})
            p.phase = "Degraded"
            p.degraded = ("UpgradePaused", f"{plan.reason}: {plan.message}")
        elif plan.rolling:
            p.phase = "Rolling"
            p.progressing = ("VersionRoll", plan.message)
            component = n.BROKER if plan.pod and "-broker-" in plan.pod else n.CONTROLLER
            p.rolling = {
                "component": component,
                "pending": [x.name for x in pods if x.image != spec.image and not x.deleting],
            }
        return plan.rolling

    def _health(self, seen: Observed, pods: list[upgrade.Pod]) -> upgrade.Health:
        """What the version roll needs to know of the cluster (upgrade.Health)."""
        if not seen.reachable or seen.quorum is None:
            return upgrade.Health(False, seen.error or "quorum status unknown")
        assert seen.cluster is not None and seen.topics is not None
        voters = {v["node_id"] for v in seen.quorum.get("voters", [])}
        lagging = set(seen.lagging_voters() or [])
        live = {
            b["id"]: b.get("incarnation")
            for b in seen.cluster.get("brokers", [])
            if not b.get("fenced") and not b.get("shutting_down")
        }
        unsafe = {}
        for x in pods:
            if x.component == n.BROKER:
                topic = planning.restart_would_break_min_isr(seen.topics, x.node_id)
                if topic is not None:
                    unsafe[x.node_id] = topic.name
        return upgrade.Health(
            True,
            active_controller=seen.cluster.get("controller"),
            voters=frozenset(voters),
            caught_up=frozenset(voters - lagging),
            live_brokers=live,
            under_replicated=seen.cluster.get("under_replicated_partitions", 0),
            under_min_isr=planning.under_min_isr(seen.topics),
            unsafe_brokers=unsafe,
        )

    async def _finalize(
        self, admin: AdminClient, body: dict[str, Any], spec: ClusterSpec, seen: Observed, p: Pass
    ) -> None:
        """spec.upgrade.finalizeFeatures auto: raise straitmq.metadata.version once every
        pod has run the new image for finalizeAfterSeconds (manual: never; `strait
        features upgrade` does it)."""
        status = p.version.status if p.version is not None else None
        if status is None:
            status = (body.get("status") or {}).get("version")
        if not upgrade.finalize_due(
            spec.finalize_features, status, time.time(), spec.finalize_after_s
        ):
            return
        updates = upgrade.levels_to_finalize(seen.features)
        if not updates:
            return
        try:
            seen.features = await admin.update_features(updates)
        except AdminError as e:
            p.finalize_error = e.message
            before = ((body.get("status") or {}).get("version") or {}).get("finalizeError")
            if before != e.message:
                self.emit("Warning", "FinalizeRefused", f"finalizing {updates}: {e.message}")
            return
        self.emit("Normal", "FeaturesFinalized", f"finalized {updates}")

    async def _finalize_impact(self, spec: ClusterSpec, seen: Observed, p: Pass) -> None:
        """Which clients finalizing would affect, from every broker's own client list:
        asked only while there is something to finalize (an idle cluster costs no call)."""
        views: dict[int, list[dict[str, Any]]] = {}
        missing: list[str] = []
        if upgrade.levels_to_finalize(seen.features) and seen.cluster is not None:
            auth = await certificates.admin_auth(self.kube, spec)
            scheme = "https" if spec.http_secured else "http"

            async def ask(b: dict[str, Any]) -> None:
                url = f"{scheme}://{b['host']}:{b['http_port']}"
                try:
                    async with AdminClient(url, min(self.admin_timeout_s, 5.0), auth) as c:
                        views[b["id"]] = (await c.get("/api/v1/clients"))["clients"]
                except AdminError as e:
                    missing.append(f"broker {b['id']} not asked: {e.message}")

            await asyncio.gather(*(ask(b) for b in seen.cluster.get("brokers", [])))
        if seen.features is not None:  # release 0.1.0 has no levels to finalize
            p.finalize_impact = upgrade.finalize_impact(seen.features, views, sorted(missing))

    async def _mark_all_pods(self, spec: ClusterSpec) -> None:
        """The MQCluster's roll request, moved onto each pod: each restart then takes it
        away with the pod, so an operator restart mid-roll restarts no pod twice."""
        for component in (n.CONTROLLER, n.BROKER):
            for pod in await self.kube.list_pods(
                spec.namespace, n.selector_string(spec.name, component)
            ):
                if pod["metadata"].get("deletionTimestamp") or manual_roll(pod):
                    continue
                await self.kube.annotate_pod(
                    spec.namespace, pod["metadata"]["name"], n.ROLL_ANNOTATION, "true"
                )

    def _moved(
        self, spec: ClusterSpec, seen: Observed, p: Pass, pods: list[dict[str, Any]]
    ) -> set[str]:
        """Ready broker pods registered with another address on an external listener
        than the one they should advertise now (a node port, load balancer or override
        changed): each must restart to read its new one."""
        if not spec.external or p.addresses is None or seen.cluster is None:
            return set()
        registered = {b["id"]: b.get("endpoints") or {} for b in seen.cluster.get("brokers", [])}
        out = set()
        for pod in pods:
            b = ordinal(pod)
            have = registered.get(b)
            if have is None or not pod_ready(pod):
                continue
            for x in spec.external:
                want = (p.addresses.brokers.get(x.name) or {}).get(b)
                got = have.get(x.broker_listener)
                if want is not None and got is not None and list(got) != list(want):
                    out.add(pod["metadata"]["name"])
        return out

    def _pick_victim(
        self, component: str, outdated: list[dict], seen: Observed, p: Pass
    ) -> dict | None:
        if not seen.reachable:
            p.progressing = ("Rolling", f"waiting for the admin API: {seen.error}")
            return None
        assert seen.topics is not None and seen.cluster is not None
        under = planning.under_min_isr(seen.topics)
        if under:
            p.progressing = ("Rolling", f"waiting: {under} partitions are under min ISR")
            return None
        # Every voter in step with the leader before any restart: a voter restart could
        # otherwise leave the quorum without a majority, and a broker restart must not
        # start while the last restarted controller is still catching up (its pod can be
        # Ready before it serves the quorum).
        lagging = seen.lagging_voters()
        if lagging is None or lagging:
            why = "quorum status unknown" if lagging is None else f"voters {lagging} behind"
            p.progressing = ("Rolling", f"waiting: {why}")
            return None
        if component == n.CONTROLLER:
            # The active controller last: each restart of it costs an election.
            active = seen.cluster.get("controller")
            return sorted(
                outdated,
                key=lambda x: (n.CONTROLLER_ID_BASE + ordinal(x) == active, -ordinal(x)),
            )[0]
        live = seen.live_brokers()
        for pod in sorted(outdated, key=lambda x: -ordinal(x)):
            b = ordinal(pod)
            if b not in live and len(live) > 0:
                return pod  # not serving anything: restarting it cannot hurt
            topic = planning.restart_would_break_min_isr(seen.topics, b)
            if topic is None:
                return pod
            p.progressing = (
                "Rolling",
                f"waiting: restarting broker {b} would take topic '{topic.name}' below "
                f"min.insync.replicas={topic.min_insync}",
            )
        return None

    # -- status -----------------------------------------------------------------------

    def _status(
        self,
        spec: ClusterSpec,
        old: dict[str, Any],
        generation: int | None,
        seen: Observed,
        p: Pass,
        replicas: int,
        sets: dict[str, dict[str, Any]],
    ) -> dict[str, Any]:
        st = sets[n.BROKER].get("status") or {}
        ready = st.get("readyReplicas", 0)
        ctl_set = sets[n.CONTROLLER]
        ctl_ready = (ctl_set.get("status") or {}).get("readyReplicas", 0)
        ctl_pods = (ctl_set.get("spec") or {}).get("replicas", spec.controllers)
        # The controllers that must run: the quorum's voters. A pod being added (not a
        # voter yet) or on its way out is the change in progress, not a fault.
        ctl_need = min(ctl_pods, spec.controllers)
        step = p.quorum_step
        if step is not None and step.changing and step.voters:
            ctl_need = min(ctl_need, len(step.voters))
        status: dict[str, Any] = {
            "observedGeneration": generation,
            "brokers": {
                "replicas": st.get("replicas", 0),
                "ready": ready,
                "registered": sorted(seen.live_brokers()),
                "selector": n.selector_string(spec.name, n.BROKER),
            },
            "controllers": self._controllers_status(spec, ctl_pods, ctl_ready, p, old, seen.quorum),
            "scaling": p.scaling,
            "rollingRestart": p.rolling,
        }
        offline = under = under_min = 0
        if seen.reachable:
            assert seen.cluster is not None and seen.topics is not None
            offline = seen.cluster.get("offline_partitions", 0)
            under = seen.cluster.get("under_replicated_partitions", 0)
            under_min = planning.under_min_isr(seen.topics)
            status |= {
                "activeController": seen.cluster.get("controller"),
                "offlinePartitions": offline,
                "underReplicatedPartitions": under,
                "underMinIsrPartitions": under_min,
            }
        if p.phase == "Creating" or (p.phase == "Ready" and not seen.reachable):
            first = old.get("phase") in (None, "Creating")
            p.phase = "Creating" if first else "Degraded"
            why = seen.error or "starting"
            if p.phase == "Degraded":
                p.degraded = ("AdminUnreachable", why)
            else:
                p.progressing = ("Creating", f"waiting for the cluster: {why}")
        if p.phase == "Ready" and (ready < spec.brokers or ctl_ready < ctl_need):
            p.phase = "Creating" if old.get("phase") in (None, "Creating") else "Degraded"
            msg = f"{ready}/{spec.brokers} brokers and {ctl_ready}/{ctl_need} controllers Ready"
            if p.phase == "Creating":
                p.progressing = ("Creating", msg)
            else:
                p.degraded = ("PodsNotReady", msg)
        if p.phase in ("Rolling", "ScalingUp", "Draining") and ready == 0 and spec.brokers:
            # A roll or a scale in progress does not explain every broker being down.
            p.phase = "Degraded"
            p.degraded = ("NoBrokersReady", f"0/{spec.brokers} brokers Ready")
        if p.phase == "Ready" and (offline or under_min):
            p.phase = "Degraded"
            p.degraded = (
                "PartitionsUnavailable",
                f"{offline} offline and {under_min} under-min-ISR partitions",
            )
        status["phase"] = p.phase
        version = p.version.status if p.version is not None else old.get("version")
        if version is not None:
            status["version"] = upgrade.complete({**version, "finalizeError": p.finalize_error})
        if seen.features is not None:
            status["features"] = upgrade.finalized(seen.features)
        if spec.external and p.addresses is not None:
            status["listeners"] = listeners.status(spec, replicas, p.addresses)
        elif old.get("listeners"):
            status["listeners"] = None  # a merge patch: removes what the last pass wrote
        conds = list(old.get("conditions") or [])
        ready_msg = (
            f"{ready} brokers and {ctl_ready} controllers Ready, "
            f"{under} under-replicated partitions"
        )
        # Ready: clients are served. A scale or a roll in progress does not change that.
        enough = ready >= min(replicas, spec.brokers)
        serving = seen.reachable and not offline and ctl_ready >= ctl_need and enough
        reason = p.phase if serving or p.phase != "Ready" else "NotServing"
        conds = set_condition(conds, "Ready", bool(serving), reason, ready_msg, generation)
        prog = p.progressing or ("Reconciled", "nothing in progress")
        conds = set_condition(conds, "Progressing", p.progressing is not None, *prog, generation)
        deg = p.degraded or ("AsExpected", "no problems seen")
        conds = set_condition(conds, "Degraded", p.degraded is not None, *deg, generation)
        if p.version is not None:
            held = p.version.action in (upgrade.PAUSE, upgrade.HOLD)
            held_why = (
                (p.version.reason, p.version.message)
                if held
                else ("NotPaused", "no version roll is paused")
            )
            conds = set_condition(conds, "UpgradePaused", held, *held_why, generation)
        if p.finalize_impact is not None:
            conds = set_condition(conds, "FinalizeAffectsClients", *p.finalize_impact, generation)
        status["conditions"] = conds
        if old.get("phase") != p.phase:
            self.emit("Normal", f"Phase{p.phase}", f"phase {old.get('phase')} -> {p.phase}")
        return status

    def _controllers_status(
        self,
        spec: ClusterSpec,
        pods: int,
        ready: int,
        p: Pass,
        old: dict[str, Any],
        seen_quorum: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """status.controllers: the pods, the voter set with directory ids, and the change
        in progress. initialVoters (the first voter set's size) is kept for good: it is
        what the pods' static --voters name."""
        # Every key always written: the status is merge-patched, so a key left out
        # would keep its last value (None deletes it).
        out: dict[str, Any] = {
            "replicas": pods,
            "ready": ready,
            "initialVoters": spec.initial_voters,
            "leader": (seen_quorum or {}).get("leader_id"),
            "message": None,
            "change": None,
        }
        step = p.quorum_step
        if step is None or (step.action == quorum.WAIT and not step.voters):
            prev = old.get("controllers") or {}  # not seen this pass: the last known set
            for key in ("voters", "leader"):
                if prev.get(key) is not None:
                    out[key] = prev[key]
            if step is not None:
                out["message"] = step.reason
            return out
        out["voters"] = [{"id": v["id"], "directoryId": v.get("directory_id")} for v in step.voters]
        out["message"] = step.reason
        if step.changing:
            out["change"] = {
                "action": step.action,
                "nodeId": step.node_id,
                "directoryId": step.directory_id,
                "refused": p.quorum_error,
            }
        return out


def _claim_storage(sts: dict[str, Any]) -> Storage | None:
    """The size and class of a StatefulSet's data volume claim template."""
    templates = (sts.get("spec") or {}).get("volumeClaimTemplates") or []
    claim = next((t for t in templates if (t.get("metadata") or {}).get("name") == "data"), None)
    if claim is None:
        return None
    cspec = claim.get("spec") or {}
    size = ((cspec.get("resources") or {}).get("requests") or {}).get("storage")
    return Storage(size=str(size), storage_class=cspec.get("storageClassName") or None)


def _quantity(text: str) -> Any:
    try:
        return parse_quantity(text)
    except ValueError:
        return text
