"""The partition side of transactions (KIP-98): WriteTxnMarkers and DescribeProducers.

The transaction coordinator sends WriteTxnMarkers to each partition leader once a
transaction's outcome is decided; the leader appends one control batch per partition
(see `PartitionWriter.append_marker`) and answers when the ISR has it. A marker on a
`__consumer_offsets` partition also completes the transaction's offset commits
(`on_offsets_marker`, the group coordinator's part, Kafka's onTransactionCompleted).
DescribeProducers lists a partition's producer state for `kafka-transactions
describe-producers`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from straitmq.security.acls import CLUSTER_ACTION, READ, TOPIC

from ..groups.offsets import OFFSETS_TOPIC
from .context import Deferred, RequestContext

if TYPE_CHECKING:
    from ..partition_write import PartitionWrite, PartitionWriter
    from ..views import LocalReplicas

# Kafka appends markers with the broker's request.timeout.ms (30 s by default) to wait
# for the ISR; the coordinator retries a partition that timed out.
MARKER_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class PartitionTxnDeps:
    writer: PartitionWriter
    replicas: LocalReplicas
    # (offsets partition, producer id, committed): called once a marker on a
    # `__consumer_offsets` partition is in the ISR.
    on_offsets_marker: Callable[[int, int, bool], None]


class _Refused:
    pending = False
    error_code = ErrorCode.cluster_authorization_failed


async def handle_write_txn_markers(
    deps: PartitionTxnDeps, ctx: RequestContext, req: Any
) -> dict | Deferred:
    # An inter-broker API: CLUSTER_ACTION on the cluster, as Kafka asks of it; without
    # it every partition gets CLUSTER_AUTHORIZATION_FAILED.
    allowed = ctx.cluster_allowed(CLUSTER_ACTION)
    now_ms = int(time.time() * 1000)
    answers: list[tuple[Any, list[tuple[str, list[tuple[int, Any]]]]]] = []
    pending: list[Coroutine[Any, Any, None]] = []
    for m in req.markers:
        tv = getattr(m, "transaction_version", 0)
        topics = []
        for t in m.topics:
            parts: list[tuple[int, Any]] = []
            for index in t.partition_indexes:
                if not allowed:
                    parts.append((index, _Refused))
                    continue
                w = deps.writer.append_marker(
                    t.name,
                    index,
                    m.producer_id,
                    m.producer_epoch,
                    m.transaction_result,
                    m.coordinator_epoch,
                    tv,
                    now_ms,
                )
                if w.pending:
                    pending.append(w.replicated(MARKER_TIMEOUT_S))
                parts.append((index, w))
            topics.append((t.name, parts))
        answers.append((m, topics))
    if pending:
        return Deferred(_after(deps, pending, answers))
    return _answer(deps, answers)


async def _after(
    deps: PartitionTxnDeps, pending: list[Coroutine[Any, Any, None]], answers: list
) -> dict:
    await asyncio.gather(*pending)
    return _answer(deps, answers)


def _answer(deps: PartitionTxnDeps, answers: list) -> dict:
    for m, topics in answers:
        for name, parts in topics:
            if name != OFFSETS_TOPIC:
                continue
            for index, w in parts:
                if not w.error_code:
                    deps.on_offsets_marker(index, m.producer_id, m.transaction_result)
    return {
        "markers": [
            {
                "producer_id": m.producer_id,
                "topics": [
                    {
                        "name": name,
                        "partitions": [
                            {"partition_index": index, "error_code": _code(w)} for index, w in parts
                        ],
                    }
                    for name, parts in topics
                ],
            }
            for m, topics in answers
        ]
    }


def _code(w: PartitionWrite | type[_Refused]) -> int:
    return w.error_code


async def handle_describe_producers(deps: PartitionTxnDeps, ctx: RequestContext, req: Any) -> dict:
    """Each partition's active producers in this broker's replica, leader or follower,
    as Kafka answers (`kafka-transactions find-hanging --broker-id` asks every replica a
    broker holds). READ on the topic."""
    topics = []
    for t in req.topics:
        ok = ctx.allowed(READ, TOPIC, t.name)
        parts = []
        for index in t.partition_indexes:
            out: dict[str, Any] = {
                "partition_index": index,
                "error_code": 0,
                "error_message": None,
                "active_producers": [],
            }
            parts.append(out)
            if not ok:
                out["error_code"] = ErrorCode.topic_authorization_failed
                continue
            partition, error = deps.replicas.leader(t.name, index)
            if (
                partition is None
                or partition.log is None
                or error
                in (
                    ErrorCode.unknown_topic_or_partition,
                    ErrorCode.kafka_storage_error,
                )
            ):
                out["error_code"] = error or ErrorCode.not_leader_or_follower
                continue
            out["active_producers"] = [
                {
                    "producer_id": pid,
                    "producer_epoch": e.epoch,
                    "last_sequence": e.last_seq(),
                    "last_timestamp": e.last_timestamp if e.last_timestamp > 0 else -1,
                    "coordinator_epoch": e.coordinator_epoch,
                    "current_txn_start_offset": e.txn_first,
                }
                for pid, e in partition.log.producers.producers.items()
            ]
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
