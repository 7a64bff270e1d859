"""Produce: validate batch headers and CRCs, check idempotent sequences, append.

No record is decoded: the bytes the client sent are what lands in the log. With
acks=all the answer waits until the ISR has the batches (the high watermark passes
them), and is refused up front when the ISR is smaller than min.insync.replicas. That
wait is handed back to the listener as a Deferred answer, so the connection's next
Produce is appended while this one replicates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from kio.schema.errors import ErrorCode

from straitmq.security.acls import TOPIC, TRANSACTIONAL_ID, WRITE

from ..partition_write import PartitionWrite, PartitionWriter
from ..records import ATTR_TRANSACTIONAL
from .context import Deferred, RequestContext

log = logging.getLogger("straitmq.produce")


class _Refused:
    """A partition's answer when the principal may not WRITE the topic."""

    pending = False
    error_code = ErrorCode.topic_authorization_failed
    base_offset = -1
    log_start_offset = -1
    error_message = None
    record_errors: tuple = ()


class _NoTransactionalId(_Refused):
    """Transactional batches from a request without a transactional id (Kafka refuses
    the whole request so)."""

    error_code = ErrorCode.transactional_id_authorization_failed


def _has_transactional_records(req: Any) -> bool:
    """Kafka's ProduceRequest.hasTransactionalRecords, from each partition's first batch
    header (the attributes' low byte is at 22): no record is read."""
    return any(
        pd.records is not None and len(pd.records) > 22 and pd.records[22] & ATTR_TRANSACTIONAL
        for topic in req.topic_data
        for pd in topic.partition_data
    )


async def handle_produce(
    writer: PartitionWriter, ctx: RequestContext, req: Any
) -> dict | Deferred | None:
    acks = req.acks
    responses = []
    writes = []
    txn = getattr(req, "transactional_id", None)
    txn_ok = not txn or ctx.allowed(WRITE, TRANSACTIONAL_ID, txn)
    refused: type[_Refused] = _Refused
    if not txn and _has_transactional_records(req):
        txn_ok, refused = False, _NoTransactionalId
    for topic in req.topic_data:
        parts: list[tuple[int, PartitionWrite | type[_Refused]]] = []
        # Checked once per topic (a cached decision), never per record.
        if not txn_ok or not ctx.allowed(WRITE, TOPIC, topic.name):
            parts = [(pd.index, refused) for pd in topic.partition_data]
            responses.append((topic.name, parts))
            continue
        for pd in topic.partition_data:
            w = writer.begin(topic.name, pd.index, memoryview(pd.records or b""), acks)
            writes.append(w)
            parts.append((pd.index, w))
        responses.append((topic.name, parts))
    if acks == 0:
        failed = next((w for _, parts in responses for _, w in parts if w.error_code), None)
        if failed is not None:
            # Kafka's rule: an acks=0 client gets no answer, so a refused write closes
            # the connection; the client sees that, refreshes metadata and reconnects.
            log.debug(
                "closing connection: acks=0 produce refused",
                extra={"client": ctx.client_host, "error": ErrorCode(failed.error_code).name},
            )
            if ctx.security is not None:
                ctx.security.close_after_reply = True
        return None
    pending = [w.replicated(req.timeout.total_seconds()) for w in writes if w.pending]
    if pending:
        return Deferred(_answer_after(pending, responses))
    return _answer(responses)


async def _answer_after(pending: list[Coroutine[Any, Any, None]], responses: list) -> dict:
    await asyncio.gather(*pending)
    return _answer(responses)


def _answer(responses: list) -> dict:
    return {
        "responses": [
            {
                "name": name,
                "partition_responses": [
                    {
                        "index": index,
                        "error_code": w.error_code,
                        "base_offset": w.base_offset,
                        "log_append_time": None,
                        "log_start_offset": w.log_start_offset,
                        "record_errors": [
                            {"batch_index": i, "batch_index_error_message": why}
                            for i, why in w.record_errors
                        ],
                        "error_message": w.error_message,
                    }
                    for index, w in parts
                ],
            }
            for name, parts in responses
        ],
        "throttle_time": 0,
    }
