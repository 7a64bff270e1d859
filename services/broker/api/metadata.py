"""Metadata and DescribeCluster: answered from the metadata image."""

from __future__ import annotations

from typing import Any

from straitmq.controller.local_controller import ControllerError

from .context import RequestContext

UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
INVALID_TOPIC_EXCEPTION = 17


def _broker_entry(ctx: RequestContext, key: str = "node_id") -> dict:
    cfg = ctx.broker.config
    return {
        key: cfg.node_id,
        "host": cfg.advertised_host,
        "port": cfg.advertised_port,
        "rack": cfg.rack,
    }


def topic_entry(ctx: RequestContext, name: str) -> dict:
    broker = ctx.broker
    topic = broker.image.topics.get(name)
    if topic is None:
        return {
            "error_code": UNKNOWN_TOPIC_OR_PARTITION,
            "name": name,
            "topic_id": None,
            "is_internal": False,
            "partitions": [],
        }
    node = broker.config.node_id
    parts = []
    for i in range(topic.partitions):
        p = broker.partitions.get(name, i)
        parts.append(
            {
                "error_code": 0 if p else LEADER_NOT_AVAILABLE,
                "partition_index": i,
                "leader_id": node if p else -1,
                "leader_epoch": p.leader_epoch if p else -1,
                "replica_nodes": [node],
                "isr_nodes": [node],
                "offline_replicas": [],
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
    for name in names:
        if name not in broker.image.topics and req.topics is not None:
            if allow_auto and broker.config.auto_create_topics:
                try:
                    broker.controller.create_topic(
                        name,
                        broker.config.num_partitions,
                        broker.config.default_replication_factor,
                        {},
                    )
                except ControllerError as e:
                    topics.append(
                        {"error_code": e.code, "name": name, "topic_id": None, "partitions": []}
                    )
                    continue
        topics.append(topic_entry(ctx, name))
    return {
        "throttle_time": 0,
        "brokers": [_broker_entry(ctx)],
        "cluster_id": broker.image.cluster_id,
        "controller_id": broker.config.node_id,
        "topics": topics,
    }


async def handle_describe_cluster(ctx: RequestContext, req: Any) -> dict:
    return {
        "throttle_time": 0,
        "error_code": 0,
        "error_message": None,
        "cluster_id": ctx.broker.image.cluster_id,
        "controller_id": ctx.broker.config.node_id,
        "brokers": [_broker_entry(ctx, "broker_id")],
        "include_cluster_authorized_operations": False,
    }
