"""Topic reconciliation: make the cluster's topic match the Topic resource's spec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import certificates, managed, planning
from . import names as n
from .admin import AdminClient, AdminError, Partition, Topic
from .cluster import Emit, admin_url
from .conditions import get_condition, set_condition
from .kube import Kube
from .spec import SpecError, parse


@dataclass(frozen=True)
class TopicSpec:
    cluster: str
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str]


def topic_spec(body: dict[str, Any]) -> TopicSpec:
    spec = body.get("spec") or {}
    return TopicSpec(
        cluster=spec["cluster"],
        name=spec.get("topicName") or body["metadata"]["name"],
        partitions=int(spec["partitions"]),
        replication_factor=int(spec.get("replicationFactor", 3)),
        config={
            k: str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in (spec.get("config") or {}).items()
        },
    )


class TopicProblem(Exception):
    """The topic cannot be made to match its spec; `reason` becomes the condition's."""

    def __init__(self, reason: str, message: str, retry: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry = retry


def _reason(e: AdminError) -> str:
    if e.unreachable:
        return "ClusterUnreachable"
    if e.error_name:  # INVALID_REPLICATION_FACTOR -> InvalidReplicationFactor
        return "".join(w.capitalize() for w in e.error_name.split("_"))
    return f"AdminError{e.status}"


class TopicReconciler:
    def __init__(self, kube: Kube, emit: Emit, admin_timeout_s: float = 10.0) -> None:
        self.kube = kube
        self.emit = emit
        self.admin_timeout_s = admin_timeout_s

    async def _admin(
        self, body: dict[str, Any], ts: TopicSpec
    ) -> tuple[AdminClient, int, dict[str, Any]]:
        """The cluster's admin API, its rebalance throttle (bytes/s), and the MQCluster."""
        ns = body["metadata"].get("namespace") or "default"
        cluster = await self.kube.get_custom(n.CLUSTERS, ns, ts.cluster)
        if cluster is None:
            raise TopicProblem(
                "ClusterNotFound", f"MQCluster '{ts.cluster}' does not exist in namespace '{ns}'"
            )
        try:
            cspec = parse(cluster)
        except SpecError as e:
            raise TopicProblem("ClusterInvalid", f"MQCluster '{ts.cluster}': {e}") from None
        auth = await certificates.admin_auth(self.kube, cspec)
        admin = AdminClient(admin_url(cluster, cspec), self.admin_timeout_s, auth)
        return admin, cspec.throttle_bytes_per_sec, cluster

    async def reconcile(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create, grow or reconfigure the topic; returns the new status."""
        old = body.get("status") or {}
        generation = body["metadata"].get("generation")
        conds = list(old.get("conditions") or [])
        try:
            ts = topic_spec(body)
            admin, throttle, cluster = await self._admin(body, ts)
            # Recorded before it is made: deleting the Topic removes it (managed.py).
            await managed.record(
                self.kube, cluster, managed.TOPIC, ts.name, body["metadata"]["name"]
            )
            async with admin:
                topic = await self._ensure(admin, ts)
                moving = await self._replication(admin, ts, topic, throttle, conds)
        except TopicProblem as e:
            if not _same_problem(conds, e.reason, e.message):
                self.emit("Warning", e.reason, e.message)
            conds = set_condition(conds, "Ready", False, e.reason, e.message, generation)
            return {**old, "observedGeneration": generation, "conditions": conds}
        conds = set_condition(
            conds,
            "Ready",
            True,
            "Reconciled",
            f"topic '{ts.name}' has {len(topic.partitions)} partitions",
            generation,
        )
        if moving:
            msg = f"moving {moving} partitions to replication factor {ts.replication_factor}"
            conds = set_condition(
                conds, "Progressing", True, "ReplicationFactorChanging", msg, generation
            )
        elif get_condition(conds, "Progressing"):
            conds = set_condition(conds, "Progressing", False, "Reconciled", "", generation)
        if old.get("conditions") and not _ready(old["conditions"]):
            self.emit("Normal", "Ready", f"topic '{ts.name}' matches its spec")
        return {
            "topicName": ts.name,
            "topicId": topic.topic_id,
            "partitions": len(topic.partitions),
            "replicationFactor": topic.replication_factor,
            "reassigningPartitions": moving,
            **planning.isr_health(topic),
            "observedGeneration": generation,
            "conditions": conds,
        }

    async def _ensure(self, admin: AdminClient, ts: TopicSpec) -> Topic:
        """Create the topic, or grow it and set its configs; returns it as it now is."""
        try:
            topic = await admin.topic(ts.name)
            if topic is None:
                topic = await admin.create_topic(
                    ts.name, ts.partitions, ts.replication_factor, ts.config
                )
                self.emit("Normal", "Created", f"created topic '{ts.name}'")
            else:
                have = len(topic.partitions)
                if have < ts.partitions:
                    topic = await admin.alter_topic(ts.name, partitions=ts.partitions)
                    self.emit(
                        "Normal", "PartitionsIncreased", f"partitions {have} -> {ts.partitions}"
                    )
                elif have > ts.partitions:
                    raise TopicProblem(
                        "PartitionsCannotDecrease",
                        f"topic '{ts.name}' has {have} partitions; spec asks for "
                        f"{ts.partitions}, and partitions cannot be removed",
                    )
                changes: dict[str, str | None] = {
                    k: v for k, v in ts.config.items() if topic.configs.get(k) != v
                }
                changes |= {k: None for k in topic.configs if k not in ts.config}
                if changes:
                    topic = await admin.alter_topic(ts.name, configs=changes)
                    self.emit("Normal", "ConfigChanged", f"configs set: {sorted(changes)}")
        except AdminError as e:
            raise TopicProblem(_reason(e), e.message) from None
        return topic

    async def _replication(
        self,
        admin: AdminClient,
        ts: TopicSpec,
        topic: Topic,
        throttle: int,
        conds: list[dict[str, Any]],
    ) -> int:
        """Move replicas until every partition has the spec's replication factor; returns
        how many partitions of the topic are still moving."""
        rf = ts.replication_factor
        try:
            reassigning = await admin.reassignments()
            moving = [r for r in reassigning if r["topic"] == ts.name]
            if moving:
                return len(moving)
            off = [p for p in topic.partitions if len(p.replicas) - len(p.removing) != rf]
            if not off:
                was = get_condition(conds, "Progressing") or {}
                if was.get("status") == "True" and was.get("reason") == "ReplicationFactorChanging":
                    if not reassigning:  # another move would still want the throttle
                        await admin.clear_throttle()
                    self.emit(
                        "Normal",
                        "ReplicationFactorChanged",
                        f"every partition of '{ts.name}' has {rf} replicas",
                    )
                return 0
            moves = await self._plan(admin, topic, off, rf)
            await admin.reassign(moves, throttle)
        except AdminError as e:
            raise TopicProblem(_reason(e), e.message) from None
        self.emit(
            "Normal",
            "ReplicationFactorChanging",
            f"moving {len(moves)} partitions of '{ts.name}' to {rf} replicas",
        )
        return len(moves)

    async def _plan(
        self, admin: AdminClient, topic: Topic, off: list[Partition], rf: int
    ) -> planning.Moves:
        brokers = (await admin.cluster()).get("brokers", [])
        racks = {
            b["id"]: b.get("rack")
            for b in brokers
            if not b.get("fenced") and not b.get("shutting_down")
        }
        if rf > len(racks):
            raise TopicProblem(
                "InvalidReplicationFactor",
                f"replication factor {rf} is more than the {len(racks)} live brokers",
            )
        if rf < topic.min_insync:
            raise TopicProblem(
                "ReplicationFactorBelowMinInsync",
                f"replication factor {rf} is below min.insync.replicas {topic.min_insync}: "
                "acks=all writes would fail; lower min.insync.replicas first",
            )
        load = planning.replica_counts(
            planning.all_partitions(await admin.topics(internal=True)), racks
        )
        return planning.change_replication(off, rf, racks, load)


def _ready(conditions: list[dict[str, Any]]) -> bool:
    return (get_condition(conditions, "Ready") or {}).get("status") == "True"


def _same_problem(conditions: list[dict[str, Any]], reason: str, message: str) -> bool:
    """Already reported: the timer retries quietly instead of an Event every pass."""
    c = get_condition(conditions, "Ready") or {}
    return c.get("reason") == reason and c.get("message") == message
