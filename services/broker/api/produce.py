"""Produce: validate batch headers and CRCs, check idempotent sequences, append.

No record is decoded: the bytes the client sent are what lands in the log. With
acks=all the answer waits until the ISR has the batches (the high watermark passes
them), and is refused up front when the ISR is smaller than min.insync.replicas. That
wait is handed back to the listener as a Deferred answer, so the connection's next
Produce is appended while this one replicates.

A transactional producer's first write to a partition in a transaction waits for the
transaction's coordinator (KIP-890): Produce up to v11 comes from transactions v1
clients, whose partition is verified to be in the transaction; v12 from v2 clients,
whose partition the coordinator adds. The handler awaits that before appending, so the
connection's later requests keep their order behind it.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Coroutine
from typing import Any

from kio.schema.errors import ErrorCode

from straitmq.security.acls import TOPIC, TRANSACTIONAL_ID, WRITE

from ..partition_write import PartitionWrite, PartitionWriter
from ..records import ATTR_TRANSACTIONAL
from ..transactions.verification import TxnVerifier
from .context import Deferred, RequestContext

log = logging.getLogger("straitmq.produce")


class _Refused:
    """A partition's answer when the principal may not WRITE the topic."""

    pending = False
    error_code: int = ErrorCode.topic_authorization_failed
    base_offset = -1
    log_start_offset = -1
    error_message: str | None = None
    record_errors: tuple = ()


class _NoTransactionalId(_Refused):
    """Transactional batches from a request without a transactional id (Kafka refuses
    the whole request so)."""

    error_code = ErrorCode.transactional_id_authorization_failed


class _Unverified(_Refused):
    """A transactional write the coordinator did not confirm (KIP-890)."""

    def __init__(self, code: int, message: str | None) -> None:
        self.error_code = code
        self.error_message = message


# The coordinator's passing troubles, answered as NOT_ENOUGH_REPLICAS, which every
# client retries without a metadata refresh (Kafka's choice: older clients do not retry
# the coordinator's own errors on a Produce).
_RETRIABLE = frozenset(
    {
        ErrorCode.concurrent_transactions,
        ErrorCode.network_exception,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
    }
)
_PID_EPOCH = struct.Struct(">qh")  # a batch header's producer id and epoch, at 43


def _unverified(code: int) -> _Unverified:
    if code == ErrorCode.invalid_txn_state:
        return _Unverified(code, "Partition was not added to the transaction")
    if code in _RETRIABLE:
        why = ErrorCode(code).name
        return _Unverified(
            ErrorCode.not_enough_replicas,
            f"Unable to verify the partition has been added to the transaction ({why})",
        )
    return _Unverified(code, None)


async def _verify(
    writer: PartitionWriter,
    verifier: TxnVerifier,
    txn: str,
    req: Any,
    allowed: set[str],
    add: bool,
) -> dict[tuple[str, int], Any]:
    """Per partition of a transactional request: the (producer id, epoch, token) its
    write hands to `begin`, or the refusal to answer; partitions whose transaction is
    open here already are left out."""
    tokens: dict[tuple[str, int], tuple[int, int, int]] = {}
    producer: tuple[int, int] | None = None
    for topic in req.topic_data:
        if topic.name not in allowed:
            continue  # refused anyway: nothing is added to the transaction for it
        for pd in topic.partition_data:
            data = pd.records
            if data is None or len(data) < 61 or not data[22] & ATTR_TRANSACTIONAL:
                continue
            pid, epoch = _PID_EPOCH.unpack_from(data, 43)
            if producer is not None and producer != (pid, epoch):
                # Kafka: one transactional request, one producer (InvalidPidMapping).
                return {
                    (t.name, p.index): _Unverified(ErrorCode.invalid_producer_id_mapping, None)
                    for t in req.topic_data
                    for p in t.partition_data
                }
            producer = (pid, epoch)
            token = writer.start_verification(topic.name, pd.index, pid, epoch)
            if token is not None:
                tokens[(topic.name, pd.index)] = (pid, epoch, token)
    if not tokens or producer is None:
        return {}
    codes = await verifier.verify(txn, producer[0], producer[1], list(tokens), add)
    out: dict[tuple[str, int], Any] = {}
    for tp, verified in tokens.items():
        code = codes.get(tp, ErrorCode.network_exception)
        if code:
            writer.end_verification(tp[0], tp[1], verified[0], verified[2])
            out[tp] = _unverified(code)
        else:
            out[tp] = verified
    return out


def _has_transactional_records(req: Any) -> bool:
    """Kafka's ProduceRequest.hasTransactionalRecords, from each partition's first batch
    header (the attributes' low byte is at 22): no record is read."""
    return any(
        pd.records is not None and len(pd.records) > 22 and pd.records[22] & ATTR_TRANSACTIONAL
        for topic in req.topic_data
        for pd in topic.partition_data
    )


async def handle_produce(
    writer: PartitionWriter, verifier: TxnVerifier, ctx: RequestContext, req: Any
) -> dict | Deferred | None:
    acks = req.acks
    responses = []
    writes = []
    txn = getattr(req, "transactional_id", None)
    txn_ok = not txn or ctx.allowed(WRITE, TRANSACTIONAL_ID, txn)
    refused: type[_Refused] = _Refused
    if not txn and _has_transactional_records(req):
        txn_ok, refused = False, _NoTransactionalId
    # Checked once per topic (a cached decision), never per record.
    allowed = (
        {t.name for t in req.topic_data if ctx.allowed(WRITE, TOPIC, t.name)} if txn_ok else set()
    )
    verified: dict[tuple[str, int], Any] = {}
    add = ctx.version >= 12  # a v2 producer: its partitions are added here, always
    if txn and allowed and (add or verifier.verifying()):
        verified = await _verify(writer, verifier, txn, req, allowed, add)
    for topic in req.topic_data:
        parts: list[tuple[int, PartitionWrite | _Refused | type[_Refused]]] = []
        if topic.name not in allowed:
            parts = [(pd.index, refused) for pd in topic.partition_data]
            responses.append((topic.name, parts))
            continue
        for pd in topic.partition_data:
            v = verified.get((topic.name, pd.index)) if verified else None
            if isinstance(v, _Unverified):
                parts.append((pd.index, v))
                continue
            w = writer.begin(topic.name, pd.index, memoryview(pd.records or b""), acks, v)
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
    # Writes the high watermark covers already (a leader alone in its ISR) are answered
    # here; only the others wait, in a task of the listener's.
    waiting = [w for w in writes if not w.replicated_now()]
    if waiting:
        within_s = req.timeout.total_seconds()
        if len(waiting) == 1:
            return Deferred(_answer_after_one(waiting[0].replicated(within_s), responses))
        return Deferred(_answer_after([w.replicated(within_s) for w in waiting], responses))
    return _answer(responses)


async def _answer_after_one(pending: Coroutine[Any, Any, None], responses: list) -> dict:
    await pending  # one partition waiting (the common case): no gather, no task for it
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
