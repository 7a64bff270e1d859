"""The transaction coordinator's shell: `__transaction_state`, the markers, the timers.

The leader of a `__transaction_state` partition coordinates the transactional ids that
hash to it (as the group coordinator does with `__consumer_offsets`). It replays the
partition when it becomes leader, writes every transition there before applying it
(`state.TransactionStateMachine` decides), sends the COMMIT/ABORT markers of a finished
transaction to the leaders of its partitions (WriteTxnMarkers, over the inter-broker
listener, retried until each partition has its marker or is gone), aborts transactions
past their timeout and forgets ids idle for transactional.id.expiration.ms. A new
leader finishes the markers its predecessor was writing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import orjson
from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId, TopicName
from kio.schema.write_txn_markers.v2 import request as wtm
from kio.static.primitive import i8, i16, i32

from straitmq.invariants import broken
from straitmq.tasks import cancel_and_wait

from ..metadata_view import MetadataView
from ..partitions import LEADER, Partition, PartitionManager
from ..record_codec import build_batch, decode_batch
from ..records import validate_batches
from ..security.listeners import Listener
from .channel import InterBrokerChannel
from .state import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    ONGOING,
    PREPARE_COMMIT,
    Answer,
    Decision,
    TransactionStateMachine,
    Transition,
    TxnMetadata,
)

log = logging.getLogger("straitmq.transactions")

TXN_TOPIC = "__transaction_state"
MARKER_RETRY_S = 0.2
WRITE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class TxnSettings:
    partitions: int  # transaction.state.log.num.partitions
    replication_factor: int  # transaction.state.log.replication.factor
    segment_bytes: int  # transaction.state.log.segment.bytes
    max_timeout_ms: int  # transaction.max.timeout.ms
    id_expiration_ms: int  # transactional.id.expiration.ms
    abort_check_interval_ms: int  # transaction.abort.timed.out.transaction.cleanup.interval.ms


@dataclass(slots=True)
class TxnStats:
    """For /metrics."""

    committed: int = 0
    aborted: int = 0
    timed_out: int = 0
    markers_written: int = 0
    marker_seconds: float = 0.0  # summed from EndTxn (or a timeout) to the outcome written


def partition_for(tid: str, partitions: int) -> int:
    return zlib.crc32(tid.encode()) % partitions


class TransactionCoordinator:
    def __init__(
        self,
        node_id: int,
        settings: TxnSettings,
        partitions: PartitionManager,
        metadata: MetadataView,
        listener: Listener,
        next_producer_id: Callable[[], Awaitable[int]],
        create_topic: Callable[[dict], Awaitable[None]],
    ) -> None:
        self.node_id = node_id
        self.settings = settings
        self.partitions = partitions
        self.metadata = metadata
        self._listener = listener
        self._next_producer_id = next_producer_id
        self._create_topic = create_topic
        self.core = TransactionStateMachine(settings.max_timeout_ms)
        self.owned: dict[int, int] = {}  # txn-state partition -> coordinator epoch
        self._markers: dict[str, asyncio.Task[None]] = {}
        self.channel = InterBrokerChannel(node_id, metadata, listener, "txn-markers")
        self._task: asyncio.Task[None] | None = None
        self.stats = TxnStats()
        self._denied_warned = -1e9

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._timers())

    async def stop(self) -> None:
        await cancel_and_wait([self._task, *self._markers.values()])
        self._task = None
        self._markers.clear()
        self.channel.close()

    # -- where an id lives ----------------------------------------------------------------

    def partition_for(self, tid: str) -> int:
        return partition_for(tid, self.settings.partitions)

    def owns(self, tid: str) -> bool:
        return self.partition_for(tid) in self.owned

    def coordinator_of(self, tid: str) -> int | None:
        """The broker id leading the id's partition, None if none (or no topic yet)."""
        p = self.metadata.image.partition(TXN_TOPIC, self.partition_for(tid))
        return p.leader if p is not None and p.leader >= 0 else None

    async def ensure_topic(self) -> bool:
        if TXN_TOPIC in self.metadata.image.topics:
            return True
        s = self.settings
        await self._create_topic(
            {
                "name": TXN_TOPIC,
                "partitions": s.partitions,
                "replication_factor": s.replication_factor,
                "configs": {
                    "cleanup.policy": "compact",
                    "segment.bytes": str(s.segment_bytes),
                    "min.insync.replicas": str(min(2, s.replication_factor)),
                },
                "internal": True,
            }
        )
        return TXN_TOPIC in self.metadata.image.topics

    # -- leadership of __transaction_state partitions -------------------------------------------

    def on_role(self, part: Partition, role: str) -> None:
        if part.topic != TXN_TOPIC:
            return
        index = part.index
        if role == LEADER:
            self._unload(index)
            plog = part.log
            for raw in plog.batches(plog.log_start_offset, plog.log_end_offset):
                for rec in decode_batch(raw):
                    if rec.key is None:
                        continue
                    tid = orjson.loads(rec.key)["t"]
                    value = None if rec.value is None else orjson.loads(rec.value)
                    self.core.replay(tid, value)
            self.owned[index] = part.leader_epoch
            # Markers the previous coordinator was writing are ours to finish.
            for m in self.core.in_flight():
                if self.partition_for(m.transactional_id) == index:
                    self._send_markers(m)
        else:
            self._unload(index)

    def _unload(self, index: int) -> None:
        self.owned.pop(index, None)
        mine = {tid for tid in self.core.txns if self.partition_for(tid) == index}
        for tid in mine:
            task = self._markers.pop(tid, None)
            if task is not None:
                task.cancel()
        self.core.unload(mine)

    # -- running decisions -----------------------------------------------------------------

    async def run(self, decision: Decision) -> Answer:
        """Answer at once, or write the transition, apply it and answer."""
        if isinstance(decision, Answer):
            return decision
        ok = await self._write(decision)
        if not ok:
            return Answer(ErrorCode.not_coordinator)
        if decision.markers:
            self._send_markers(decision.after)
        return decision.answer

    async def add_or_verify(
        self,
        tid: str,
        producer_id: int,
        epoch: int,
        partitions: set[tuple[str, int]],
        verify_only: bool,
        tv: int,
    ) -> dict[tuple[str, int], int]:
        """AddPartitionsToTxn for partitions already checked: verified (KIP-890 part 1)
        or added (v1 clients, and v2's partition leaders), a code per partition."""
        if not self.owns(tid):
            return dict.fromkeys(partitions, ErrorCode.not_coordinator)
        if verify_only:
            return self.core.verify(tid, producer_id, epoch, partitions)
        decision = self.core.add_partitions(tid, producer_id, epoch, partitions, _now(), tv)
        a = await self.run(decision)
        return dict.fromkeys(partitions, a.error)

    async def _write(self, t: Transition) -> bool:
        m = t.after
        index = self.partition_for(m.transactional_id)
        part = self.partitions.leader_of(TXN_TOPIC, index)
        if part is None or index not in self.owned:
            return False
        self.core.begin(t)
        try:
            durable = await _write_record(part, m.transactional_id, m.to_json())
        except asyncio.CancelledError:
            self.core.abandon(t)
            raise
        except OSError as e:
            # A full disk: the client is told NOT_COORDINATOR and retries, as Kafka maps a
            # failed transaction log append (a fault run found it closing the connection).
            self.core.abandon(t)
            log.warning("cannot write a transaction's state", extra={"error": str(e)})
            return False
        except Exception as e:  # the append raises OSError only; the wait nothing
            broken(
                "a transaction's state record is written or fails on the disk",
                transactional_id=m.transactional_id,
                error=f"{type(e).__name__}: {e}",
            )
        if not durable or self.owned.get(index) is None:
            self.core.abandon(t)
            return False
        self.core.apply(t)
        return True

    async def tombstone(self, tid: str) -> None:
        index = self.partition_for(tid)
        part = self.partitions.leader_of(TXN_TOPIC, index)
        if part is None:
            return
        if await _write_record(part, tid, None):
            self.core.replay(tid, None)

    # -- markers -----------------------------------------------------------------------------

    def _send_markers(self, m: TxnMetadata) -> None:
        tid = m.transactional_id
        if tid in self._markers and not self._markers[tid].done():
            return
        self._markers[tid] = asyncio.get_running_loop().create_task(self._markers_then_complete(m))

    async def _markers_then_complete(self, m: TxnMetadata) -> None:
        tid = m.transactional_id
        started = time.monotonic()
        commit = m.state == PREPARE_COMMIT
        left = set(m.partitions)
        while left:
            left = await self._write_markers(m, commit, left)
            if left:
                await asyncio.sleep(MARKER_RETRY_S)
            if not self.owns(tid):
                return  # the next coordinator finishes them
        while True:
            done = self.core.complete(tid, _now())
            if done is None:
                return
            if await self._write(done):
                break
            if not self.owns(tid):
                return
            await asyncio.sleep(MARKER_RETRY_S)
        self.stats.marker_seconds += time.monotonic() - started
        if done.after.state == COMPLETE_COMMIT:
            self.stats.committed += 1
        elif done.after.state == COMPLETE_ABORT:
            self.stats.aborted += 1
        self._markers.pop(tid, None)

    async def _write_markers(
        self, m: TxnMetadata, commit: bool, partitions: set[tuple[str, int]]
    ) -> set[tuple[str, int]]:
        """One round: the partitions still without their marker afterwards."""
        image = self.metadata.image
        by_leader: dict[int, list[tuple[str, int]]] = {}
        left: set[tuple[str, int]] = set()
        for topic, index in partitions:
            p = image.partition(topic, index)
            if p is None:
                continue  # the topic was deleted: nothing to mark
            if p.leader < 0:
                left.add((topic, index))
                continue
            by_leader.setdefault(p.leader, []).append((topic, index))
        epoch = self.owned.get(self.partition_for(m.transactional_id), -1)
        results = await asyncio.gather(
            *(self._markers_to(b, m, commit, epoch, tps) for b, tps in by_leader.items())
        )
        for r in results:
            left |= r
        self.stats.markers_written += sum(len(v) for v in by_leader.values()) - len(
            left & {tp for v in by_leader.values() for tp in v}
        )
        return left

    async def _markers_to(
        self, broker: int, m: TxnMetadata, commit: bool, epoch: int, tps: list[tuple[str, int]]
    ) -> set[tuple[str, int]]:
        topics: dict[str, list[int]] = {}
        for t, p in tps:
            topics.setdefault(t, []).append(p)
        req = wtm.WriteTxnMarkersRequest(
            markers=(
                wtm.WritableTxnMarker(
                    producer_id=ProducerId(m.producer_id),
                    producer_epoch=i16(m.producer_epoch),
                    transaction_result=commit,
                    topics=tuple(
                        wtm.WritableTxnMarkerTopic(
                            name=TopicName(t), partition_indexes=tuple(i32(p) for p in ps)
                        )
                        for t, ps in topics.items()
                    ),
                    coordinator_epoch=i32(epoch),
                    transaction_version=i8(m.tv),
                ),
            )
        )
        resp = await self.channel.call(broker, 27, 2, req)
        if resp is None:
            return set(tps)
        left: set[tuple[str, int]] = set()
        answered: set[tuple[str, int]] = set()
        for marker in resp.markers:
            for t in marker.topics:
                for p in t.partitions:
                    tp = (t.name, p.partition_index)
                    answered.add(tp)
                    if p.error_code == ErrorCode.unknown_topic_or_partition:
                        continue  # gone: nothing to mark
                    if p.error_code == ErrorCode.cluster_authorization_failed:
                        left.add(tp)
                        self._warn_denied(broker)
                    elif p.error_code != ErrorCode.none:
                        left.add(tp)
                        log.debug(
                            "transaction marker not written yet",
                            extra={
                                "partition": f"{t.name}-{p.partition_index}",
                                "error": p.error_code,
                            },
                        )
        return left | (set(tps) - answered)

    def _warn_denied(self, broker: int) -> None:
        """Markers refused for want of CLUSTER_ACTION: transactions hang until an
        operator grants it, so say so (at most once a minute)."""
        now = time.monotonic()
        if now - self._denied_warned >= 60:
            self._denied_warned = now
            log.warning(
                "broker %s refused transaction markers: the inter-broker listener's "
                "principal needs CLUSTER_ACTION on the cluster; transactions stay open "
                "until it has it",
                broker,
                extra={"listener": self._listener.name},
            )

    # -- timers ------------------------------------------------------------------------------

    async def _timers(self) -> None:
        while True:
            await asyncio.sleep(self.settings.abort_check_interval_ms / 1000)
            try:
                await self.abort_timed_out()
                for tid in self.core.expired(_now(), self.settings.id_expiration_ms):
                    if self.owns(tid):
                        await self.tombstone(tid)
            except OSError as e:  # a tombstone's append met a full disk: the next round
                log.warning("transaction timers: cannot write", extra={"error": str(e)})
            except Exception as e:  # a bug: the rest decides in memory
                broken(
                    "the transaction timers fail only on the disk",
                    error=f"{type(e).__name__}: {e}",
                )

    async def abort_timed_out(self) -> int:
        n = 0
        for t in self.core.timed_out(_now()):
            if not self.owns(t.after.transactional_id):
                continue
            log.info(
                "aborting a transaction past its timeout",
                extra={"transactional_id": t.after.transactional_id},
            )
            if await self._write(t):
                self.stats.timed_out += 1
                self._send_markers(t.after)
                n += 1
        return n

    # -- views -------------------------------------------------------------------------------

    def ongoing(self) -> int:
        return sum(m.state == ONGOING for m in self.core.txns.values())

    def transactions(self) -> Iterable[TxnMetadata]:
        return list(self.core.txns.values())


async def _write_record(part: Partition, tid: str, value: dict | None) -> bool:
    """One record of `__transaction_state` (None: a tombstone), appended as the leader;
    True once the ISR has it."""
    key = orjson.dumps({"t": tid})
    batch = build_batch([(key, None if value is None else orjson.dumps(value), [])], _now())
    view = memoryview(batch)
    epoch = part.leader_epoch
    end = part.append(view, validate_batches(view, len(batch))) + 1
    return await part.wait_for_hw(end, WRITE_TIMEOUT_S, epoch)


def _now() -> int:
    return int(time.time() * 1000)
