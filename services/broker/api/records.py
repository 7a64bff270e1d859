"""DeleteRecords (API key 21): move partitions' log start forward, as Kafka does.

`kafka-delete-records.sh` and Admin.deleteRecords send it to each partition's leader.
The leader moves its logical log start (checkpointed, see storage/log.py), deletes the
segments that now lie wholly below it, and wakes its long-polling fetchers so followers
see the new start in their next fetch answer and move theirs. The answer waits until
every replica on a live broker reports a log start at or past the offset in its fetches
(Kafka's low watermark), so no follower that could be elected still serves the records.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from straitmq.security.acls import DELETE as ACL_DELETE
from straitmq.security.acls import TOPIC

from ..storage.log import OffsetOutOfRange
from .context import RequestContext

if TYPE_CHECKING:
    from ..views import LocalReplicas

log = logging.getLogger("straitmq.broker")

HIGH_WATERMARK = -1  # DeleteRecordsRequest.HIGH_WATERMARK: delete everything committed
INVALID_LOW_WATERMARK = -1


def _delete_on_leader(
    replicas: LocalReplicas, topic: str, index: int, offset: int
) -> tuple[int, int]:
    """(error, low watermark) for one partition (Kafka's deleteRecordsOnLeader)."""
    t = replicas.image.topics.get(topic)
    if t is not None and t.internal:
        return ErrorCode.invalid_topic_exception, INVALID_LOW_WATERMARK
    part, error = replicas.leader(topic, index)
    if error:
        return error, INVALID_LOW_WATERMARK
    assert part is not None
    target = part.high_watermark if offset == HIGH_WATERMARK else offset
    # Only committed records can go: above the high watermark is out of range, as in
    # Kafka's maybeIncrementLogStartOffset.
    if target < 0 or target > part.high_watermark:
        return ErrorCode.offset_out_of_range, INVALID_LOW_WATERMARK
    plog = part.log
    if target > plog.log_start_offset:
        try:
            dropped = plog.advance_start(target)
        except OffsetOutOfRange:  # the high watermark is never above the log end
            return ErrorCode.offset_out_of_range, INVALID_LOW_WATERMARK
        except OSError as e:
            log.warning(
                "DeleteRecords could not move the log start",
                extra={"topic": topic, "partition": index, "error": str(e)},
            )
            return ErrorCode.kafka_storage_error, INVALID_LOW_WATERMARK
        log.info(
            "log start moved by DeleteRecords",
            extra={
                "topic": topic,
                "partition": index,
                "log_start": target,
                "segments_deleted": dropped,
            },
        )
        # Parked fetches answer now: consumers below the start get OFFSET_OUT_OF_RANGE
        # and followers learn the new log start from the answer.
        part._wake()
    return ErrorCode.none, max(target, plog.log_start_offset)


async def handle_delete_records(replicas: LocalReplicas, ctx: RequestContext, req: Any) -> dict:
    # A partition named twice counts once, with its last offset (Kafka collects the
    # request into a map); the answer names it once.
    wanted: dict[str, dict[int, int]] = {}
    for t in req.topics:
        for p in t.partitions:
            wanted.setdefault(t.name, {})[p.partition_index] = p.offset
    within_s = max(0.0, req.timeout.total_seconds())

    def alive(bid: int) -> bool:  # the image the broker holds at each check
        return replicas.image.broker_alive(bid)

    async def one(name: str, index: int, offset: int) -> dict:
        error: int
        if not ctx.allowed(ACL_DELETE, TOPIC, name):
            error = ErrorCode.topic_authorization_failed
            return {
                "partition_index": index,
                "low_watermark": INVALID_LOW_WATERMARK,
                "error_code": error,
            }
        error, target = _delete_on_leader(replicas, name, index, offset)
        low = INVALID_LOW_WATERMARK
        if not error:
            part = replicas.partitions.get(name, index)
            assert part is not None
            if not await part.wait_low_watermark(target, within_s, alive):
                error = ErrorCode.request_timed_out
            elif replicas.partitions.get(name, index) is not part or not part.is_leader:
                error = ErrorCode.not_leader_or_follower  # leadership moved meanwhile
            else:
                low = part.low_watermark(alive)
        return {"partition_index": index, "low_watermark": low, "error_code": error}

    topics = []
    for name, parts in wanted.items():
        results = await asyncio.gather(*(one(name, i, off) for i, off in parts.items()))
        topics.append({"name": name, "partitions": list(results)})
    return {"throttle_time": 0, "topics": topics}
