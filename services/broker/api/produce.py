"""Produce: validate batch headers and CRCs, check idempotent sequences, append.

No record is decoded: the bytes the client sent are what lands in the log. With
acks=all the answer waits until the ISR has the batches (the high watermark passes
them), and is refused up front when the ISR is smaller than min.insync.replicas.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from ..producer_state import DuplicateBatch, SequenceError
from ..records import InvalidRecords, validate_batches
from .context import RequestContext

UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
INVALID_REQUIRED_ACKS = 21
KAFKA_STORAGE_ERROR = 56


async def _await_replication(
    out: dict, partition: Any, end: int, within_s: float, errors: Counter
) -> None:
    if not await partition.wait_for_hw(end, within_s):
        out["error_code"] = REQUEST_TIMED_OUT if partition.is_leader else NOT_LEADER_OR_FOLLOWER
        out["error_message"] = "the in-sync replicas did not confirm the write in time"
        errors[(0, out["error_code"])] += 1
    elif len(partition.isr) < partition.min_isr:
        out["error_code"] = NOT_ENOUGH_REPLICAS_AFTER_APPEND
        out["error_message"] = (
            f"written, but the ISR shrank to {len(partition.isr)} below "
            f"min.insync.replicas={partition.min_isr}"
        )
        errors[(0, NOT_ENOUGH_REPLICAS_AFTER_APPEND)] += 1


async def handle_produce(ctx: RequestContext, req: Any) -> dict | None:
    broker = ctx.broker
    acks = req.acks
    responses = []
    waits = []
    within_s = req.timeout.total_seconds()
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
                metrics.request_errors[(0, INVALID_REQUIRED_ACKS)] += 1
                continue
            partition = broker.partitions.get(topic.name, pd.index)
            if tconf is None or not 0 <= pd.index < len(tconf.partitions):
                out["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
                metrics.request_errors[(0, UNKNOWN_TOPIC_OR_PARTITION)] += 1
                continue
            if partition is None or not partition.is_leader:
                out["error_code"] = NOT_LEADER_OR_FOLLOWER
                metrics.request_errors[(0, NOT_LEADER_OR_FOLLOWER)] += 1
                continue
            if acks == -1 and len(partition.isr) < partition.min_isr:
                out["error_code"] = NOT_ENOUGH_REPLICAS
                out["error_message"] = (
                    f"ISR {partition.isr} is smaller than min.insync.replicas="
                    f"{partition.min_isr}"
                )
                metrics.request_errors[(0, NOT_ENOUGH_REPLICAS)] += 1
                continue
            data = memoryview(pd.records or b"")
            try:
                batches = validate_batches(data, partition.log.config.max_message_bytes)
                partition.log.producers.check(batches)
                base = partition.append(data, batches)
            except DuplicateBatch as dup:
                out["base_offset"] = dup.cached.base_offset
                out["log_start_offset"] = partition.log.log_start_offset
                if acks == -1:
                    end = dup.cached.base_offset + 1
                    waits.append(
                        _await_replication(out, partition, end, within_s, metrics.request_errors)
                    )
                continue
            except (InvalidRecords, SequenceError) as e:
                out["error_code"] = e.code
                out["error_message"] = str(e)
                metrics.request_errors[(0, e.code)] += 1
                continue
            except OSError as e:
                out["error_code"] = KAFKA_STORAGE_ERROR
                out["error_message"] = f"storage error: {e}"
                metrics.request_errors[(0, KAFKA_STORAGE_ERROR)] += 1
                continue
            out["base_offset"] = base
            out["log_start_offset"] = partition.log.log_start_offset
            metrics.bytes_in[topic.name] += len(data)
            metrics.messages_in[topic.name] += sum(b.record_count for b in batches)
            if acks == -1:
                end = partition.log.log_end_offset
                waits.append(
                    _await_replication(out, partition, end, within_s, metrics.request_errors)
                )
        responses.append({"name": topic.name, "partition_responses": parts})
    if acks == 0:
        return None
    if waits:
        await asyncio.gather(*waits)
    return {"responses": responses, "throttle_time": 0}
