"""Idempotent-producer sequence tracking for one partition.

Per producer id the broker keeps the epoch and the last five batches it appended, as
Kafka does (max.in.flight.requests.per.connection <= 5): a retried batch that matches
one of them is answered with its original offset instead of being written twice, and a
batch that leaves a gap is refused with OUT_OF_ORDER_SEQUENCE_NUMBER.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from .records import BatchInfo

DEDUP_WINDOW = 5


@dataclass(slots=True)
class CachedBatch:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[CachedBatch] = field(default_factory=lambda: deque(maxlen=DEDUP_WINDOW))
    last_timestamp: int = 0

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


class ProducerStateTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

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

    def record(self, b: BatchInfo) -> None:
        """Note an appended batch (also used when replaying the log at startup)."""
        if b.producer_id < 0:
            return
        entry = self.producers.get(b.producer_id)
        if entry is None or entry.epoch != b.producer_epoch:
            entry = ProducerEntry(b.producer_epoch)
            self.producers[b.producer_id] = entry
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

    def to_json(self, now_ms: int, expiration_ms: int) -> list:
        return [
            [
                pid,
                e.epoch,
                [
                    [c.first_seq, c.last_seq, c.base_offset, c.last_offset, c.timestamp]
                    for c in e.batches
                ],
            ]
            for pid, e in self.producers.items()
            if now_ms - e.last_timestamp < expiration_ms
        ]

    def load_json(self, data: list) -> None:
        for pid, epoch, batches in data:
            entry = ProducerEntry(epoch)
            for c in batches:
                entry.batches.append(CachedBatch(*c))
                entry.last_timestamp = max(entry.last_timestamp, c[4])
            self.producers[pid] = entry
