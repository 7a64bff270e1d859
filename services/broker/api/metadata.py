"""Metadata and DescribeCluster: answered from the metadata image.

Clients see the live (unfenced) brokers, each partition's leader, leader epoch,
replicas, ISR and offline replicas, exactly as the committed metadata says. The
"controller" clients see is a live broker: KRaft clusters hide the quorum from clients.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kio.schema.errors import ErrorCode
from straitmq.controller.errors import ControllerError
from straitmq.metadata.image import NO_LEADER, MetadataImage

from straitmq.protocol.build import build, nested_schema
from straitmq.protocol.codec import response_schema

from ..security.acls import CLUSTER, CLUSTER_NAME, CREATE, DESCRIBE, TOPIC
from ..security.listeners import endpoint_for
from .context import RequestContext


class TopicEntities:
    """Each topic's Metadata answer as a built kio entity, per response version, reused
    until a record changes the topic or any broker: a client that asks for thousands of
    topics (librdkafka asks for every topic it knows) costs a lookup per unchanged one."""

    def __init__(self) -> None:
        self.image: MetadataImage | None = None
        self.entries: dict[tuple[int, str], tuple[tuple[int, int], Any]] = {}

    def get(self, ctx: RequestContext, name: str) -> Any:
        image = ctx.broker.image
        if self.image is not image or len(self.entries) > 4 * len(image.topics) + 1000:
            self.image, self.entries = image, {}  # a snapshot replaced it, or churn
        key = (ctx.version, name)
        stamp = (image.topic_versions.get(name, 0), image.brokers_version)
        hit = self.entries.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        entity = build(nested_schema(response_schema(3, ctx.version), "topics"),
                       topic_entry(ctx, name))  # fmt: skip
        self.entries[key] = (stamp, entity)
        return entity


def _brokers(ctx: RequestContext, key: str = "node_id") -> list[dict]:
    """The live brokers' endpoints on the listener this client came in on; brokers
    without that listener are left out, as Kafka does."""
    live = []
    for b in sorted(ctx.broker.image.brokers.values(), key=lambda b: b.id):
        ep = endpoint_for(b, ctx.listener) if not b.fenced else None
        if ep is not None:
            live.append({key: b.id, "host": ep[0], "port": ep[1], "rack": b.rack})
    if not live:
        # Never zero brokers (librdkafka takes that as a partial response and stalls):
        # when the image shows every broker fenced, this one still answers.
        c = ctx.broker.config
        host, port = c.advertised_host, c.advertised_port
        for ln in ctx.broker.listeners:
            if ln.name == ctx.listener:
                host, port = ln.spec.advertised_host, ln.spec.advertised_port
        live = [{key: c.node_id, "host": host, "port": port, "rack": c.rack}]
    return live


def _controller_id(ctx: RequestContext) -> int:
    live = [b.id for b in ctx.broker.image.live_brokers()]
    return ctx.broker.node_id if ctx.broker.node_id in live or not live else min(live)


def topic_entry(ctx: RequestContext, name: str) -> dict:
    image = ctx.broker.image
    topic = image.topics.get(name)
    if topic is None:
        return {
            "error_code": ErrorCode.unknown_topic_or_partition,
            "name": name,
            "topic_id": None,
            "is_internal": False,
            "partitions": [],
        }
    parts = []
    for i, p in enumerate(topic.partitions):
        offline = [r for r in p.replicas if (b := image.brokers.get(r)) is None or b.fenced]
        parts.append(
            {
                "error_code": ErrorCode.leader_not_available if p.leader == NO_LEADER else 0,
                "partition_index": i,
                "leader_id": p.leader,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": p.replicas,
                "isr_nodes": p.isr,
                "offline_replicas": offline,
            }
        )
    return {
        "error_code": 0,
        "name": name,
        "topic_id": topic.topic_id,
        "is_internal": topic.internal,
        "partitions": parts,
    }


async def handle_metadata(ctx: RequestContext, req: Any) -> dict:
    broker = ctx.broker
    if req.topics is None:
        names = list(broker.image.topics)
    else:
        names = [t.name for t in req.topics if t.name is not None]
    allow_auto = getattr(req, "allow_auto_topic_creation", True)
    topics = []
    if req.topics is not None and any(t.name is None for t in req.topics):
        # v10+ asks by topic id (librdkafka does for the ids of a KIP-848 assignment).
        # Kafka answers UNKNOWN_TOPIC_ID for an id it does not know or the principal
        # may not DESCRIBE (so the answer does not tell which ids exist).
        for t in req.topics:
            if t.name is not None:
                continue
            name = broker.image.topic_name(getattr(t, "topic_id", None))
            if name is not None and ctx.allowed(DESCRIBE, TOPIC, name):
                topics.append(broker.metadata_answers.get(ctx, name))
            else:
                topics.append({"error_code": ErrorCode.unknown_topic_id, "name": None,
                               "topic_id": t.topic_id, "is_internal": False,
                               "partitions": []})  # fmt: skip
    for name in names:
        # Kafka: all topics lists only those the principal may DESCRIBE; a named topic
        # it may not is TOPIC_AUTHORIZATION_FAILED, whether it exists or not.
        if not ctx.allowed(DESCRIBE, TOPIC, name):
            if req.topics is not None:
                topics.append(_refused(name))
            continue
        if name not in broker.image.topics and req.topics is not None:
            if allow_auto and broker.config.auto_create_topics:
                if not ctx.cluster_allowed(CREATE) and not ctx.allowed(CREATE, TOPIC, name):
                    topics.append(_refused(name))
                    continue
                try:
                    await broker.control("create_topic", {"name": name})
                except ControllerError as e:
                    if e.code != ErrorCode.topic_already_exists:  # a concurrent create won
                        topics.append(
                            {"error_code": e.code, "name": name, "topic_id": None, "partitions": []}
                        )
                        continue
        if name in broker.image.topics:
            topics.append(broker.metadata_answers.get(ctx, name))
        else:
            topics.append(topic_entry(ctx, name))
    out = {
        "throttle_time": 0,
        "brokers": _brokers(ctx),
        "cluster_id": broker.image.cluster_id,
        "controller_id": _controller_id(ctx),
        "topics": topics,
    }
    if getattr(req, "include_topic_authorized_operations", False):  # v8+
        # The cached entities are shared by every principal: the bits go on a copy.
        out["topics"] = [
            dataclasses.replace(
                t, topic_authorized_operations=ctx.authorized_operations(TOPIC, t.name)
            )
            if not isinstance(t, dict) and t.error_code == 0
            else t
            for t in topics
        ]
    if getattr(req, "include_cluster_authorized_operations", False):  # v8-10
        out["cluster_authorized_operations"] = ctx.authorized_operations(CLUSTER, CLUSTER_NAME)
    return out


def _refused(name: str) -> dict:
    return {"error_code": ErrorCode.topic_authorization_failed, "name": name,
            "topic_id": None, "is_internal": False, "partitions": []}  # fmt: skip


async def handle_describe_cluster(ctx: RequestContext, req: Any) -> dict:
    return {
        "throttle_time": 0,
        "error_code": 0,
        "error_message": None,
        "cluster_id": ctx.broker.image.cluster_id,
        "controller_id": _controller_id(ctx),
        "brokers": _brokers(ctx, "broker_id"),
        **(
            {"cluster_authorized_operations": ctx.authorized_operations(CLUSTER, CLUSTER_NAME)}
            if req.include_cluster_authorized_operations
            else {}
        ),
    }
