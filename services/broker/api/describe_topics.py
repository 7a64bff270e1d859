"""DescribeTopicPartitions (API key 75, KIP-966): topics and partitions, paged.

Kafka 4.x's Admin.describeTopics (and so `kafka-topics.sh --describe`) asks this API
when the broker lists it, and Metadata otherwise; through Metadata the tool cannot know
the eligible leader replicas and prints `Elr: N/A`. Answered from the metadata image as
Kafka's KRaftMetadataCache does: topics in name order from the cursor on, at most
`response_partition_limit` partitions per answer (capped by Kafka's
max.request.partition.size.limit default, 2000), and `next_cursor` where it stopped.

StraitMQ has no ELR (KIP-966's eligible leader replicas): both ELR lists are empty,
which is what a Kafka cluster with ELR off answers (the tool prints `Elr: `).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from straitmq.metadata.image import MetadataImage
from straitmq.metadata.topic_config import topic_name_problem

from straitmq.security.acls import DESCRIBE, TOPIC

from .context import RequestContext

if TYPE_CHECKING:
    from ..metadata_view import MetadataView

MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000  # Kafka's max.request.partition.size.limit default
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")  # Kafka's Topic.isInternal
ZERO_UUID = uuid.UUID(int=0)


def _partitions(image: MetadataImage, name: str, start: int, limit: int) -> tuple[list, int]:
    """The answers for partitions [start, start + limit) of topic `name`, and the index to
    continue from (-1 when the topic is done)."""
    topic = image.topics[name]
    upper = min(len(topic.partitions), start + limit)
    out = []
    for i in range(start, upper):
        p = topic.partitions[i]
        offline = [r for r in p.replicas if (b := image.brokers.get(r)) is None or b.fenced]
        leader = image.brokers.get(p.leader)
        out.append(
            {
                "error_code": 0,
                "partition_index": i,
                # A leader on a fenced or unknown broker is no leader (Kafka's alive
                # endpoint check).
                "leader_id": p.leader if leader is not None and not leader.fenced else -1,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": p.replicas,
                "isr_nodes": p.isr,
                "eligible_leader_replicas": [],
                "last_known_elr": [],
                "offline_replicas": offline,
            }
        )
    return out, (upper if upper < len(topic.partitions) else -1)


def _missing(name: str) -> dict:
    if topic_name_problem(name) is None:
        error = ErrorCode.unknown_topic_or_partition
    else:
        error = ErrorCode.invalid_topic_exception
    return {
        "error_code": error,
        "name": name,
        "topic_id": ZERO_UUID,
        "is_internal": name in INTERNAL_TOPICS,
        "partitions": [],
    }


def _refused(req: Any, error: int) -> dict:
    """Kafka's getErrorResponse: every requested topic with the error, nothing else."""
    topics = [
        {
            "error_code": error,
            "name": t.name,
            "topic_id": ZERO_UUID,
            "is_internal": False,
            "partitions": [],
        }
        for t in req.topics
    ]
    return {"throttle_time": 0, "topics": topics, "next_cursor": None}


async def handle_describe_topic_partitions(
    metadata: MetadataView, ctx: RequestContext, req: Any
) -> dict:
    image = metadata.image
    cursor = req.cursor
    after = cursor.topic_name if cursor is not None else ""
    every = not req.topics
    # A name given twice is answered once (Kafka collects them in a set).
    names = {n for n in image.topics} if every else {t.name for t in req.topics}
    names = {n for n in names if n >= after}
    if cursor is not None and (cursor.partition_index < 0 or (not every and after not in names)):
        # The cursor topic must be among the requested ones, at a valid partition.
        return _refused(req, ErrorCode.invalid_request)
    remaining = max(min(MAX_REQUEST_PARTITION_SIZE_LIMIT, req.response_partition_limit), 1)
    topics: list[dict] = []
    next_cursor = None
    for name in sorted(names):
        if remaining <= 0:
            # Every partition of the previous topics went out: go on from this one.
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        if not ctx.allowed(DESCRIBE, TOPIC, name):
            if not every:  # named: refused; listing everything: left out (Kafka)
                topics.append(
                    {**_missing(name), "error_code": ErrorCode.topic_authorization_failed}
                )
            continue
        topic = image.topics.get(name)
        if topic is None:
            if not every:
                topics.append(_missing(name))
            continue
        start = cursor.partition_index if cursor is not None and name == after else 0
        parts, resume = _partitions(image, name, start, remaining)
        topics.append(
            {
                "error_code": 0,
                "name": name,
                "topic_id": topic.topic_id,
                "is_internal": topic.internal,
                "partitions": parts,
                "topic_authorized_operations": ctx.authorized_operations(TOPIC, name),
            }
        )
        if resume != -1:
            next_cursor = {"topic_name": name, "partition_index": resume}
            break
        remaining -= len(parts)
    return {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor}
