"""Producer state of one partition: idempotent sequences and transactions (KIP-98).

Per producer id the broker keeps the epoch and the last five batches it appended, as
Kafka does (max.in.flight.requests.per.connection <= 5): a retried batch that matches
one of them is answered with its original offset instead of being written twice, and a
batch that leaves a gap is refused with OUT_OF_ORDER_SEQUENCE_NUMBER.

Transactions (Kafka's ProducerStateManager / ProducerAppendInfo): a producer's first
transactional batch after its last marker opens its transaction at that batch's offset;
the COMMIT or ABORT marker closes it. The first offset of the earliest open transaction
bounds the last stable offset; a closed one keeps bounding it until the high watermark
passes its marker (Kafka's unreplicated transactions), so that read_committed never
sees a transaction whose outcome could still be lost with the leader.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from .records import ATTR_CONTROL, ATTR_TRANSACTIONAL, BatchInfo

DEDUP_WINDOW = 5


@dataclass(slots=True)
class CachedBatch:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    timestamp: int


class CompletedTxn(NamedTuple):
    """A transaction its marker closed: [first_offset, last_offset], the marker last."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[CachedBatch] = field(default_factory=lambda: deque(maxlen=DEDUP_WINDOW))
    last_timestamp: int = 0
    coordinator_epoch: int = -1
    txn_first: int = -1  # first offset of the open transaction, -1: none

    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


class DuplicateBatch(Exception):
    def __init__(self, cached: CachedBatch) -> None:
        super().__init__("duplicate batch")
        self.cached = cached


class SequenceError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


_tokens = itertools.count(1)


class ProducerStateTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        # producer id -> first offset of its open transaction (few at a time).
        self.ongoing: dict[int, int] = {}
        # producer id -> the token of a verification with its coordinator in flight
        # (KIP-890's verification guard): a marker in the meantime voids it.
        self.verifying: dict[int, int] = {}
        # Closed transactions whose marker the high watermark has not passed yet:
        # (marker offset, first offset), in marker order.
        self.unreplicated: deque[tuple[int, int]] = deque()

    def check(self, batches: list[BatchInfo]) -> None:
        """Raise DuplicateBatch or SequenceError before anything is written.

        Requests carry one batch per partition from idempotent clients; several batches
        of one producer in one request are checked as a chain.
        """
        pending: dict[int, tuple[int, int]] = {}
        for b in batches:
            if b.producer_id < 0:
                continue
            entry = self.producers.get(b.producer_id)
            if entry is not None and entry.txn_first >= 0 and not b.attributes & ATTR_TRANSACTIONAL:
                raise SequenceError(
                    ErrorCode.invalid_txn_state,
                    f"producer {b.producer_id} wrote a non-transactional batch inside its "
                    "open transaction",
                )
            chained = pending.get(b.producer_id)
            if chained is not None:
                epoch, last = chained
            elif entry is None:
                epoch, last = b.producer_epoch, -1
            else:
                if b.producer_epoch < entry.epoch:
                    raise SequenceError(
                        ErrorCode.invalid_producer_epoch,
                        f"producer {b.producer_id} epoch {b.producer_epoch} is older "
                        f"than {entry.epoch}",
                    )
                if b.producer_epoch == entry.epoch:
                    for cached in entry.batches:
                        if cached.first_seq == b.base_sequence and (
                            cached.last_seq == b.last_sequence
                        ):
                            raise DuplicateBatch(cached)
                    epoch, last = entry.epoch, entry.last_seq()
                else:
                    epoch, last = b.producer_epoch, -1
            expected = (last + 1) % 2**31
            if b.base_sequence != expected:
                raise SequenceError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {b.producer_id}: sequence {b.base_sequence}, expected {expected}",
                )
            pending[b.producer_id] = (epoch, b.last_sequence)

    def start_verification(self, producer_id: int, epoch: int) -> int | None:
        """Before a transactional write: None if the producer's transaction is already
        open here at this epoch, else a token to hand back after the coordinator
        confirmed the partition is in the transaction (KIP-890)."""
        entry = self.producers.get(producer_id)
        if entry is not None and entry.txn_first >= 0 and entry.epoch == epoch:
            return None
        token = self.verifying[producer_id] = next(_tokens)
        return token

    def check_verified(self, producer_id: int, epoch: int, token: int) -> None:
        """The write of a verified producer: refused if its transaction ended meanwhile
        (a marker voided the token), as a late write must not open a new one."""
        entry = self.producers.get(producer_id)
        if entry is not None and entry.txn_first >= 0 and entry.epoch == epoch:
            return
        if self.verifying.get(producer_id) != token:
            raise SequenceError(
                ErrorCode.invalid_txn_state,
                "the transaction ended while the partition was being verified",
            )

    def end_verification(self, producer_id: int, token: int) -> None:
        if self.verifying.get(producer_id) == token:
            del self.verifying[producer_id]

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int, tv: int) -> None:
        """Kafka's checks before a marker is appended (ProducerAppendInfo.appendEndTxnMarker):
        an older producer epoch (with transactions v2, also the same one, unless that is a
        retry of a marker already written) is INVALID_PRODUCER_EPOCH, an older coordinator
        epoch TRANSACTION_COORDINATOR_FENCED."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch or (tv >= 2 and epoch == entry.epoch and entry.txn_first >= 0):
            raise SequenceError(
                ErrorCode.invalid_producer_epoch,
                f"marker epoch {epoch} of producer {producer_id} is older than {entry.epoch}",
            )
        if entry.coordinator_epoch > coordinator_epoch:
            raise SequenceError(
                ErrorCode.transaction_coordinator_fenced,
                f"marker coordinator epoch {coordinator_epoch} is older than "
                f"{entry.coordinator_epoch}",
            )

    def record(self, b: BatchInfo, marker: tuple[bool, int] | None = None) -> CompletedTxn | None:
        """Note an appended batch (also when replaying the log at startup, and on
        followers); `marker` is a control batch's (commit, coordinator epoch). Returns the
        transaction a marker closed, if it had data here."""
        if b.producer_id < 0:
            return None
        if b.attributes & ATTR_CONTROL:
            return self._record_marker(b, marker)
        entry = self.producers.get(b.producer_id)
        if entry is None or entry.epoch != b.producer_epoch:
            # A new epoch ends what the old one left open only through its marker; the
            # coordinator always writes it, so an open transaction carries over here.
            old = entry
            entry = ProducerEntry(b.producer_epoch)
            if old is not None:
                entry.coordinator_epoch = old.coordinator_epoch
                entry.txn_first = old.txn_first
            self.producers[b.producer_id] = entry
        if b.attributes & ATTR_TRANSACTIONAL and entry.txn_first < 0:
            entry.txn_first = b.base_offset
            self.ongoing[b.producer_id] = b.base_offset
            self.verifying.pop(b.producer_id, None)
        entry.batches.append(
            CachedBatch(
                b.base_sequence,
                b.last_sequence,
                b.base_offset,
                b.base_offset + b.last_offset_delta,
                b.max_timestamp,
            )
        )
        entry.last_timestamp = max(entry.last_timestamp, b.max_timestamp)
        return None

    def _record_marker(self, b: BatchInfo, marker: tuple[bool, int] | None) -> CompletedTxn | None:
        if marker is None:  # an empty control batch: its transaction was cleaned away
            return None
        commit, coordinator_epoch = marker
        self.verifying.pop(b.producer_id, None)
        entry = self.producers.get(b.producer_id)
        if entry is None:
            entry = ProducerEntry(b.producer_epoch)
            self.producers[b.producer_id] = entry
        elif entry.epoch != b.producer_epoch:
            entry.epoch = b.producer_epoch  # a bumped epoch starts its sequences at 0
            entry.batches.clear()
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = max(entry.last_timestamp, b.max_timestamp)
        first, entry.txn_first = entry.txn_first, -1
        if first < 0:
            return None
        self.ongoing.pop(b.producer_id, None)
        self.unreplicated.append((b.base_offset, first))
        return CompletedTxn(b.producer_id, first, b.base_offset, not commit)

    def stable_offset_after(self, txn: CompletedTxn) -> int:
        """The LSO an aborted transaction's index entry records (Kafka's
        ProducerStateManager.lastStableOffset(completedTxn)): the first offset of the
        earliest other open transaction, else just past the marker."""
        others = [f for pid, f in self.ongoing.items() if pid != txn.producer_id]
        return min(others) if others else txn.last_offset + 1

    def high_watermark_moved(self, high_watermark: int) -> None:
        """Closed transactions whose marker the high watermark passed stop bounding the
        LSO (Kafka's onHighWatermarkUpdated)."""
        unrep = self.unreplicated
        while unrep and unrep[0][0] < high_watermark:
            unrep.popleft()

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the earliest transaction whose outcome a read_committed
        reader may not see yet: open, or closed by a marker at or above the high
        watermark. None when there is none."""
        self.high_watermark_moved(high_watermark)
        unrep = self.unreplicated
        first = min(self.ongoing.values()) if self.ongoing else None
        for _marker, f in unrep:
            if first is None or f < first:
                first = f
        return first

    def to_json(self, now_ms: int, expiration_ms: int) -> list:
        # A producer inside a transaction never expires (Kafka's rule too): its first
        # offset bounds the LSO until its marker comes.
        return [
            [
                pid,
                e.epoch,
                [
                    [c.first_seq, c.last_seq, c.base_offset, c.last_offset, c.timestamp]
                    for c in e.batches
                ],
                e.coordinator_epoch,
                e.txn_first,
                e.last_timestamp,
            ]
            for pid, e in self.producers.items()
            if now_ms - e.last_timestamp < expiration_ms or e.txn_first >= 0
        ]

    def load_json(self, data: list) -> None:
        # Snapshots written before transactions hold [pid, epoch, batches] only.
        for pid, epoch, batches, *txn in data:
            entry = ProducerEntry(epoch)
            for c in batches:
                entry.batches.append(CachedBatch(*c))
                entry.last_timestamp = max(entry.last_timestamp, c[4])
            if txn:
                entry.coordinator_epoch, entry.txn_first, last_ts = txn[:3]
                entry.last_timestamp = max(entry.last_timestamp, last_ts)
                if entry.txn_first >= 0:
                    self.ongoing[pid] = entry.txn_first
            self.producers[pid] = entry
