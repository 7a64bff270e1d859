"""One partition-level write: validate, append as leader, wait for the ISR, answer.

Kafka's Produce and the REST produce both go through `PartitionWriter.begin` and
`PartitionWrite.replicated`, so they refuse, store and acknowledge exactly alike:
unknown partitions, non-leaders, min.insync.replicas with acks=all, invalid batches,
producer sequences, storage errors, and the ISR confirming the write in time.
"""

from __future__ import annotations

from collections.abc import Callable

from kio.schema.errors import ErrorCode
from straitmq.metadata.image import MetadataImage

from .metrics import BrokerMetrics
from .partitions import Partition, PartitionManager
from .producer_state import DuplicateBatch, SequenceError
from .records import (
    BatchInfo,
    InvalidRecords,
    end_txn_marker,
    replicated_batches,
    validate_batches,
)
from .storage.batch_filter import first_keyless, keyless_indexes


class PartitionWrite:
    """The outcome of one write; `replicated` completes it for acks=all."""

    __slots__ = (
        "_api",
        "_end",
        "_epoch",
        "_errors",
        "_partition",
        "base_offset",
        "error_code",
        "error_message",
        "log_start_offset",
        "record_errors",
    )

    def __init__(self, errors: dict, api: int = 0) -> None:
        self._api = api  # the API key the error counters are kept under
        self.error_code = 0
        self.error_message: str | None = None
        self.record_errors: list[tuple[int, str]] = []  # (index in the batch, why)
        self.base_offset = -1
        self.log_start_offset = -1
        self._errors = errors  # the broker's request error counters, keyed (api, code)
        self._partition: Partition | None = None
        self._end = -1  # wait until the high watermark reaches this (acks=all)
        self._epoch = -1  # in the leader epoch the write was appended in

    def fail(
        self,
        code: int,
        message: str | None = None,
        record_errors: list[tuple[int, str]] | None = None,
    ) -> PartitionWrite:
        self.error_code = code
        self.error_message = message
        self.record_errors = record_errors or []
        self._errors[(self._api, int(code))] += 1
        return self

    @property
    def pending(self) -> bool:
        return self._partition is not None

    def replicated_now(self) -> bool:
        """acks=all without waiting: True, with the outcome `replicated` would give,
        when the high watermark covers the write already (a leader alone in its ISR
        does at once); False if it must wait. Spares the answer a task of its own."""
        partition = self._partition
        if partition is None:
            return True
        if partition.high_watermark < self._end or partition.leader_epoch != self._epoch:
            return False  # `replicated` waits (or fails: a leadership moved meanwhile)
        self._partition = None
        self._settled(partition)
        return True

    async def replicated(self, within_s: float) -> None:
        """acks=all: wait until the in-sync replicas have the write."""
        partition = self._partition
        if partition is None:
            return
        self._partition = None
        if not await partition.wait_for_hw(self._end, within_s, self._epoch):
            if partition.is_leader and partition.leader_epoch == self._epoch:
                self.fail(
                    ErrorCode.request_timed_out,
                    "the in-sync replicas did not confirm the write in time",
                )
            else:
                self.fail(
                    ErrorCode.not_leader_or_follower,
                    "this broker stopped leading the partition before the write was confirmed",
                )
        else:
            self._settled(partition)

    def _settled(self, partition: Partition) -> None:
        """The high watermark passed the write: it is acknowledged, unless the ISR shrank
        below min.insync.replicas meanwhile."""
        if partition.under_min_isr():
            self.fail(
                ErrorCode.not_enough_replicas_after_append,
                f"written, but the ISR shrank to {len(partition.isr)} below "
                f"min.insync.replicas={partition.min_isr}",
            )


class PartitionWriter:
    """Appends as the leader for every producer of this broker (Kafka's and REST)."""

    def __init__(
        self,
        metrics: BrokerMetrics,
        partitions: PartitionManager,
        image: Callable[[], MetadataImage],
        serving: Callable[[], bool],
    ) -> None:
        self.metrics = metrics
        self.partitions = partitions
        self._image = image
        self._serving = serving  # a broker that is leaving (or not up yet) writes nothing

    def _leader(self, w: PartitionWrite, topic: str, index: int, acks: int) -> Partition | None:
        """This broker's leader replica for a write, or None with `w` failed."""
        meta = self._image().topics.get(topic)
        if meta is None or not 0 <= index < len(meta.partitions):
            w.fail(ErrorCode.unknown_topic_or_partition)
            return None
        partition = self.partitions.get(topic, index)
        if partition is None and (reason := self.partitions.storage_error(topic, index)):
            w.fail(ErrorCode.kafka_storage_error, reason)
            return None
        if partition is None or not partition.is_leader or not self._serving():
            w.fail(ErrorCode.not_leader_or_follower)
            return None
        if acks == -1 and partition.under_min_isr():
            w.fail(
                ErrorCode.not_enough_replicas,
                f"ISR {partition.isr} is smaller than min.insync.replicas={partition.min_isr}",
            )
            return None
        return partition

    def start_verification(
        self, topic: str, index: int, producer_id: int, epoch: int
    ) -> int | None:
        """A transactional producer's write to a partition this broker leads: a token if
        the coordinator must first confirm the partition is in the transaction (none is
        open here for the producer at this epoch), else None (nothing to verify, or not
        the leader: `begin` refuses that)."""
        partition = self.partitions.get(topic, index)
        if partition is None or not partition.is_leader:
            return None
        return partition.log.producers.start_verification(producer_id, epoch)

    def end_verification(self, topic: str, index: int, producer_id: int, token: int) -> None:
        partition = self.partitions.get(topic, index)
        if partition is not None:
            partition.log.producers.end_verification(producer_id, token)

    def begin(
        self,
        topic: str,
        index: int,
        data: memoryview,
        acks: int,
        verified: tuple[int, int, int] | None = None,
    ) -> PartitionWrite:
        """Validate and append one partition's batches as its leader. With acks=all the
        result is `pending` until `replicated` has waited for the ISR. `verified`: the
        (producer id, epoch, token) of a verification the coordinator confirmed."""
        metrics = self.metrics
        w = PartitionWrite(metrics.request_errors)
        if acks not in (0, 1, -1):
            return w.fail(ErrorCode.invalid_required_acks)
        partition = self._leader(w, topic, index, acks)
        if partition is None:
            return w
        try:
            config = partition.log.config
            batches = validate_batches(data, config.max_message_bytes)
            if config.compact:  # the only per-record check, and only for compacted topics
                refuse_keyless(data, batches, topic, index)
            if verified is not None:
                partition.log.producers.check_verified(*verified)
            partition.log.producers.check(batches)
            w.base_offset = partition.append(data, batches)
            end = partition.log.log_end_offset
            metrics.bytes_in[topic] += len(data)
            metrics.messages_in[topic] += sum(b.record_count for b in batches)
        except DuplicateBatch as dup:  # answered with the first write's offset
            w.base_offset = dup.cached.base_offset
            end = dup.cached.last_offset + 1
        except InvalidRecords as e:
            return w.fail(e.code, str(e), e.record_errors)
        except SequenceError as e:
            return w.fail(e.code, str(e))
        except OSError as e:  # the partition reports itself (Partition.append)
            return w.fail(ErrorCode.kafka_storage_error, partition.write_error or str(e))
        w.log_start_offset = partition.log.log_start_offset
        if acks == -1:
            w._partition = partition
            w._end = end
            w._epoch = partition.leader_epoch
        return w

    def append_marker(
        self,
        topic: str,
        index: int,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        transaction_version: int,
        now_ms: int,
    ) -> PartitionWrite:
        """WriteTxnMarkers for one partition: a control batch with the COMMIT or ABORT
        marker, appended as the leader and acknowledged once the ISR has it (Kafka
        appends markers with acks=all). `pending` until `replicated` has waited."""
        w = PartitionWrite(self.metrics.request_errors, api=27)
        partition = self._leader(w, topic, index, -1)
        if partition is None:
            return w
        data = memoryview(
            end_txn_marker(producer_id, producer_epoch, commit, coordinator_epoch, now_ms)
        )
        try:
            partition.log.producers.check_marker(
                producer_id, producer_epoch, coordinator_epoch, transaction_version
            )
            w.base_offset = partition.append(data, replicated_batches(data))
        except SequenceError as e:
            return w.fail(e.code, str(e))
        except OSError as e:  # the partition reports itself (Partition.append)
            return w.fail(ErrorCode.kafka_storage_error, partition.write_error or str(e))
        w.log_start_offset = partition.log.log_start_offset
        w._partition = partition
        w._end = partition.log.log_end_offset
        w._epoch = partition.leader_epoch
        return w


def refuse_keyless(data: memoryview, batches: list[BatchInfo], topic: str, index: int) -> None:
    """Kafka's rule for compacted topics: a record without a key cannot be compacted, so
    the whole batch is refused with INVALID_RECORD and, per record, its index in the
    batch (LogValidator.validateKey's words and RecordValidationException's summary)."""
    for b in batches:
        batch = data[b.position : b.position + b.size]
        try:
            if first_keyless(batch) is None:
                continue
            indexes = keyless_indexes(batch)
        except ValueError as e:
            raise InvalidRecords(ErrorCode.corrupt_message, f"corrupt record batch: {e}") from e
        why = (
            f"Compacted topic cannot accept message without key in topic partition {topic}-{index}"
        )
        errors = [(i, why) for i in indexes]
        shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
        raise InvalidRecords(
            ErrorCode.invalid_record,
            f"One or more records have been rejected due to {len(errors)} record errors in "
            f"total, and only showing the first three errors at most: [{shown}]",
            errors,
        )
