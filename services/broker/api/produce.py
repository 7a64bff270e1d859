"""Produce: validate batch headers and CRCs, check idempotent sequences, append.

No record is decoded: the bytes the client sent are what lands in the log.
"""

from __future__ import annotations

from typing import Any

from ..producer_state import DuplicateBatch, SequenceError
from ..records import InvalidRecords, validate_batches
from .context import RequestContext

UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REQUIRED_ACKS = 21
KAFKA_STORAGE_ERROR = 56


async def handle_produce(ctx: RequestContext, req: Any) -> dict | None:
    broker = ctx.broker
    acks = req.acks
    responses = []
    metrics = broker.metrics
    for topic in req.topic_data:
        parts = []
        tconf = broker.image.topics.get(topic.name)
        for pd in topic.partition_data:
            out = {
                "index": pd.index,
                "error_code": 0,
                "base_offset": -1,
                "log_append_time": None,
                "log_start_offset": -1,
                "record_errors": [],
                "error_message": None,
            }
            parts.append(out)
            if acks not in (0, 1, -1):
                out["error_code"] = INVALID_REQUIRED_ACKS
                continue
            partition = broker.partitions.get(topic.name, pd.index)
            if partition is None or tconf is None:
                out["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
                continue
            data = memoryview(pd.records or b"")
            try:
                batches = validate_batches(data, partition.log.config.max_message_bytes)
                partition.log.producers.check(batches)
                base = partition.append(data, batches)
            except DuplicateBatch as dup:
                out["base_offset"] = dup.cached.base_offset
                out["log_start_offset"] = partition.log.log_start_offset
                continue
            except (InvalidRecords, SequenceError) as e:
                out["error_code"] = e.code
                out["error_message"] = str(e)
                metrics.request_errors[(0, e.code)] += 1
                continue
            except OSError as e:
                out["error_code"] = KAFKA_STORAGE_ERROR
                out["error_message"] = f"storage error: {e}"
                continue
            out["base_offset"] = base
            out["log_start_offset"] = partition.log.log_start_offset
            metrics.bytes_in[topic.name] += len(data)
            metrics.messages_in[topic.name] += sum(b.record_count for b in batches)
        responses.append({"name": topic.name, "partition_responses": parts})
    if acks == 0:
        return None
    # Single node: acks=all is satisfied by the leader alone (ISR = {this broker}).
    return {"responses": responses, "throttle_time": 0}
