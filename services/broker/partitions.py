"""The partition replicas this broker holds, kept in step with the metadata image.

A replica is the leader (it appends, tracks its followers' log ends and moves the high
watermark) or a follower (a fetcher copies the leader's log). Which one, and at which
leader epoch, is what the metadata image says; `PartitionManager.sync` applies it.

Long-polling fetches park a future in `waiters`; appends and high-watermark moves wake
them. acks=all produces wait in `hw_waiters` until the high watermark passes them. Each
of these has a bound (MAX_PARKED_FETCHES, MAX_HW_WAITERS, MAX_LOW_WATERMARK_WAITERS).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from straitmq.metadata.image import MetadataImage, PartitionImage, TopicImage
from straitmq.metadata.topic_config import effective

from straitmq.tasks import settle

from .loop_slice import LoopSlice
from .records import BatchInfo
from .replication.core import FOLLOWER, GREW, LEADER, FollowerState, ReplicaCore
from .storage.epochs import LeaderEpochCache
from .storage.flusher import remove_tree_in_background
from .storage.handles import FileHandles
from .storage.log import LogConfig, PartitionLog

log = logging.getLogger("straitmq.broker")

__all__ = ["FOLLOWER", "LEADER", "FollowerState", "Partition", "PartitionManager"]
PREOPEN_CHUNK = 256  # logs loaded per worker-thread hop at startup
# Epoch checkpoints written per turn of the event loop after a leader change of many
# partitions (one small file each): the listener keeps answering in between.
EPOCH_WRITE_SLICE_S = 0.01
# A metadata change naming more topics than this (a broker's leaderships moving at
# once, a burst of creations) is applied to the replicas SYNC_SLICE_S at a time.
SYNC_INLINE_TOPICS = 20
SYNC_SLICE_S = 0.02
# The retention walk over every led partition: at most this much of it per loop turn.
RETENTION_SLICE_S = 0.005
RETENTION_SEGMENTS_PER_TURN = 8
# Bounds on what waits on one partition (each entry is one request in flight; without a
# bound their number follows the connections, and a wake-up walks them all):
# - fetches parked on it (a sessionless Fetch, a ShareFetch; a fetch session parks once,
#   on the session): past it a fetch is not parked, it waits out its max wait on its
#   timer alone and answers with what is there then, as at any timeout. Not at once: a
#   consumer fetches again at once after an empty answer, and the refused would spin.
MAX_PARKED_FETCHES = 1024
# - acks=all writes waiting for the high watermark (at most server.MAX_PIPELINED per
#   connection): past it a write is answered at once as not confirmed in time
#   (REQUEST_TIMED_OUT: retriable; an idempotent producer's retry is deduplicated).
MAX_HW_WAITERS = 4096
# - DeleteRecords waiting for every replica's log start: past it REQUEST_TIMED_OUT.
MAX_LOW_WATERMARK_WAITERS = 256


def log_config_for(topic: TopicImage, broker_defaults: dict[str, str]) -> LogConfig:
    c = effective({**broker_defaults, **topic.configs})
    policy = {p.strip() for p in c.get("cleanup.policy", "delete").split(",")}
    return LogConfig(
        segment_bytes=int(c["segment.bytes"]),
        segment_ms=int(c["segment.ms"]),
        retention_ms=int(c["retention.ms"]),
        retention_bytes=int(c["retention.bytes"]),
        max_message_bytes=int(c["max.message.bytes"]),
        index_interval_bytes=int(c["index.interval.bytes"]),
        flush_messages=int(c["flush.messages"]),
        flush_ms=int(c["flush.ms"]),
        delete="delete" in policy,
        compact="compact" in policy,
        min_cleanable_dirty_ratio=float(c.get("min.cleanable.dirty.ratio", "0.5")),
        min_compaction_lag_ms=int(c.get("min.compaction.lag.ms", "0")),
        max_compaction_lag_ms=int(c.get("max.compaction.lag.ms", str(2**63 - 1))),
        delete_retention_ms=int(c.get("delete.retention.ms", str(24 * 3600 * 1000))),
    )


def _now() -> float:
    return time.monotonic()


class Partition(ReplicaCore):
    """A replica: the replication core's state and decisions (replication/core.py) plus
    the log, the futures waiting on the high watermark and the fetch-session wake-ups."""

    __slots__ = (
        "epoch_writes",
        "hw_waiters",
        "log",
        "low_watermark_waiters",
        "on_change",
        "on_write_state",
        "waiters",
        "write_error",
    )

    def __init__(self, topic: str, index: int, plog: PartitionLog, node_id: int) -> None:
        super().__init__(topic, index, node_id)
        self.log = plog
        self.waiters: set[asyncio.Future[None]] = set()
        self.hw_waiters: list[tuple[int, int, asyncio.Future[bool]]] = []
        # DeleteRecords answers waiting for every replica's log start: (offset, future,
        # whether a broker is alive).
        self.low_watermark_waiters: list[
            tuple[int, asyncio.Future[None], Callable[[int], bool]]
        ] = []
        # Told of every append, high watermark, log start or role change: the fetch
        # sessions holding this partition mark it dirty.
        self.on_change: Callable[[Partition], None] | None = None
        # Takes the epoch checkpoint a new leadership leaves unwritten (None: write it
        # at once, as tools and tests without an event loop do).
        self.epoch_writes: Callable[[LeaderEpochCache], None] | None = None
        # Why the last leader append failed on the disk (None: it did not): said once
        # when writes start failing and once when they work again, and told to
        # `on_write_state` (the manager reports the partition to the controller).
        self.write_error: str | None = None
        self.on_write_state: Callable[[Partition], None] | None = None

    # -- role changes (from the metadata image) ----------------------------------------

    def update(self, p: PartitionImage, min_isr: int) -> str | None:  # type: ignore[override]
        """Apply the image's view; returns "leader"/"follower" when the role or leader
        epoch changed (the caller then starts or moves the replica fetcher)."""
        outcome = ReplicaCore.update(self, p, min_isr, self.log.log_end_offset, _now())
        if outcome == LEADER:
            # Waits of an earlier leadership end here, also when this broker leads again
            # without having seen itself follow (an epoch's offsets are its own).
            self.fail_hw_waiters()
            epochs = self.log.epochs
            later = self.epoch_writes
            if (
                epochs.assign(self.leader_epoch, self.epoch_start_offset, persist=later is None)
                and later is not None
            ):
                later(epochs)
            self.maybe_advance_hw()
            self._wake()
            return LEADER
        if outcome == FOLLOWER:
            self.fail_hw_waiters()
            self._wake()
            return FOLLOWER
        if self.role == LEADER:
            self.maybe_advance_hw()
            if outcome == GREW:
                # A new follower (a reassignment) may have named this partition in
                # its fetch session before this leader knew it: its position went
                # unrecorded, and an idle partition would never be named again.
                # Waking marks it dirty, so the session's stored position counts.
                self._wake()
        return None

    # -- leader side -------------------------------------------------------------------

    def append(self, data: memoryview, batches: list[BatchInfo]) -> int:
        """Append as the leader (Produce, WriteTxnMarkers, and the group and transaction
        coordinators' own records alike). An OSError (a full disk) is raised after the
        partition is marked as failing, whichever of them wrote."""
        if self.followers:
            self.before_append(self.log.log_end_offset)
        try:
            base = self.log.append(data, batches, self.leader_epoch)
        except OSError as e:
            self._write_state(f"storage error: {e}")
            raise
        if self.write_error is not None:
            self._write_state(None)
        self.maybe_advance_hw()
        self._wake()
        return base

    def _write_state(self, error: str | None) -> None:
        if (error is None) == (self.write_error is None):
            self.write_error = error
            return
        where = f"{self.topic}-{self.index}"
        if error is None:
            log.warning("appends to the log work again", extra={"partition": where})
        else:
            log.error(
                "cannot append to the log: writes to this partition get KAFKA_STORAGE_ERROR "
                "(reported to the controller, which moves its leadership to an in-sync "
                "replica)",
                extra={"partition": where, "error": error},
            )
        self.write_error = error
        if self.on_write_state is not None:
            self.on_write_state(self)

    def maybe_advance_hw(self) -> None:
        if self.advance_hw(self.log.log_end_offset):
            hw = self.high_watermark
            self.log.producers.high_watermark_moved(hw)
            waiters = self.hw_waiters
            while waiters and waiters[0][0] <= hw:
                _, _, fut = heapq.heappop(waiters)
                if not fut.done():
                    fut.set_result(True)
            self._wake()

    def on_follower_fetch(  # type: ignore[override]
        self,
        replica: int,
        fetch_offset: int,
        session: Any = None,
        log_start: int = -1,
        incarnation: str | None = None,
    ) -> bool:
        """Record a follower's fetch (see ReplicaCore.on_follower_fetch). False if this
        leader does not know the replica (yet): nothing was recorded."""
        known, start_moved = ReplicaCore.on_follower_fetch(
            self,
            replica,
            fetch_offset,
            self.log.log_end_offset,
            _now(),
            session,
            log_start,
            incarnation,
        )
        if not known:
            return False
        if start_moved:
            self.check_low_watermark()
        self.maybe_advance_hw()
        return True

    def caught_up_at(self, f: FollowerState, leo: int | None = None) -> float:
        return ReplicaCore.caught_up_at(self, f, self.log.log_end_offset if leo is None else leo)

    def isr_change(  # type: ignore[override]
        self,
        lag_max_s: float,
        alive: Callable[[int], bool],
        incarnation: Callable[[int], str | None] | None = None,
    ) -> list[int] | None:
        """The ISR this leader should propose now, or None."""
        return ReplicaCore.isr_change(
            self, _now(), self.log.log_end_offset, lag_max_s, alive, incarnation
        )

    async def wait_for_hw(
        self, offset: int, within_s: float, leader_epoch: int | None = None
    ) -> bool:
        """True once the high watermark reaches `offset` in `leader_epoch` (the epoch
        the write was appended in; None: the current one, for a caller that appended
        without yielding since). False on timeout, or if this replica stops leading in
        that epoch: the write may or may not survive then. A wait that starts after the
        epoch moved on fails at once: the log may have been cut and refilled by another
        leader meanwhile, and a high watermark past `offset` would vouch for other
        records (found by tests/test_txn_history.py: a Produce answered after its broker
        lost the leadership and won it back acknowledged a write that was gone)."""
        if leader_epoch is not None and leader_epoch != self.leader_epoch:
            return False
        if self.role != LEADER:
            return False
        if self.high_watermark >= offset:
            return True
        if len(self.hw_waiters) >= MAX_HW_WAITERS:
            return False  # not confirmed: the caller answers REQUEST_TIMED_OUT
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        heapq.heappush(self.hw_waiters, (offset, id(fut), fut))
        # A timer that answers False, not asyncio.wait_for: that costs a second future,
        # a callback and a cancellation path for every acks=all Produce.
        timer = loop.call_later(within_s, settle, fut, False)  # not confirmed in time
        try:
            return await fut
        finally:
            timer.cancel()

    def low_watermark(self, alive: Callable[[int], bool]) -> int:
        """The lowest log start over this leader and its followers on live brokers
        (Kafka's lowWatermarkIfLeader); a follower that has not fetched yet counts as
        unknown (-1). What DeleteRecords waits for."""
        low = self.log.log_start_offset
        for r, f in self.followers.items():
            if alive(r):
                low = min(low, f.log_start_offset)
        return low

    async def wait_low_watermark(
        self, offset: int, within_s: float, alive: Callable[[int], bool]
    ) -> bool:
        """True once every live replica's log start reached `offset` (checked on each
        follower fetch that reports a new one); False on timeout, and at once when
        MAX_LOW_WATERMARK_WAITERS wait already."""
        if len(self.low_watermark_waiters) >= MAX_LOW_WATERMARK_WAITERS:
            return self.low_watermark(alive) >= offset
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.low_watermark_waiters.append((offset, fut, alive))
        self.check_low_watermark()
        try:
            await asyncio.wait_for(fut, within_s)
            return True
        except TimeoutError:
            return False
        finally:
            self.low_watermark_waiters = [w for w in self.low_watermark_waiters if w[1] is not fut]

    def check_low_watermark(self) -> None:
        for offset, fut, alive in self.low_watermark_waiters:
            if not fut.done() and self.low_watermark(alive) >= offset:
                fut.set_result(None)

    def fail_hw_waiters(self) -> None:
        for _, _, fut in self.hw_waiters:
            if not fut.done():
                fut.set_result(False)
        self.hw_waiters.clear()

    # -- follower side -----------------------------------------------------------------

    def append_replicated(self, data: memoryview, batches: list[BatchInfo], hw: int) -> None:
        if batches:
            self.log.append_replicated(data, batches)
        self.set_follower_hw(hw)
        self._wake()

    def set_follower_hw(self, leader_hw: int) -> None:
        hw = self.follower_hw(leader_hw, self.log.log_end_offset)
        self.log.producers.high_watermark_moved(hw)

    def park(self, fut: asyncio.Future[None]) -> bool:
        """Park a fetch's future until the next change; False (not parked) past
        MAX_PARKED_FETCHES."""
        if len(self.waiters) >= MAX_PARKED_FETCHES:
            return False
        self.waiters.add(fut)
        return True

    def _wake(self) -> None:
        if self.waiters:
            for fut in self.waiters:
                if not fut.done():
                    fut.set_result(None)
            self.waiters.clear()
        if self.on_change is not None:
            self.on_change(self)


class PartitionManager:
    def __init__(
        self,
        data_dir: str,
        broker_defaults: dict[str, str],
        node_id: int,
        max_open_files: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.broker_defaults = broker_defaults
        self.node_id = node_id
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._by_topic: dict[str, set[int]] = {}
        self.topic_ids: dict[str, object] = {}
        # Replicas the image gives this broker whose log cannot be opened or created
        # (no descriptors, no disk): requests for them get KAFKA_STORAGE_ERROR with this
        # reason, and every sync tries again.
        self.unavailable: dict[tuple[str, int], str] = {}
        # Partitions this broker leads whose appends fail (a full disk): reported to the
        # controller with `unavailable`, which leads them from another in-sync replica,
        # as Kafka does once a log directory fails. Forgotten once not leading.
        self.write_failed: set[tuple[str, int]] = set()
        # Every segment file of every log, open or not, under one bound.
        self.handles = FileHandles(max_open_files)
        # Called with (partition, role) when a replica becomes leader or follower, and
        # with (partition, "") when it goes away.
        self.role_listeners: list[Callable[[Partition, str], None]] = []
        self.change_listener: Callable[[Partition], None] | None = None
        # Logs opened off the event loop at startup (see preopen), taken over by sync.
        self._preopened: dict[tuple[str, int], tuple[str, PartitionLog]] = {}
        # New replicas whose logs a worker thread is creating (see _create_logs): file
        # creation for thousands of partitions at once must not stall the listener.
        self._creating: dict[tuple[str, int], tuple[str, str, LogConfig]] = {}
        self._creator: asyncio.Task | None = None
        self._image: MetadataImage | None = None
        self._failed_create: set[tuple[str, int]] = set()
        self._chunk_done: asyncio.Future[None] | None = None  # resolved after each chunk
        self._swept = False
        self._epochs_unwritten: dict[int, LeaderEpochCache] = {}  # by id, in arrival order
        self._sync_pending: dict[str, None] = {}  # topics sync_soon has still to apply
        self._syncer: asyncio.Task | None = None
        self._epoch_writer: asyncio.Task | None = None
        os.makedirs(data_dir, exist_ok=True)

    @staticmethod
    def dir_name(topic: str, index: int) -> str:
        return f"{topic}-{index}"

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def leader_of(self, topic: str, index: int) -> Partition | None:
        p = self.partitions.get((topic, index))
        return p if p is not None and p.is_leader else None

    def sync(self, image: MetadataImage, topics: set[str] | None = None) -> None:
        """Open, configure, re-role and delete replicas so they match the image: every
        topic, or only `topics` (the ones the latest records named). A replica whose log
        cannot be opened is left out and listed in `unavailable`; the rest still follow
        the image, so what the broker serves always matches what it applied."""
        self._image = image
        if topics is None:
            self._sync_pending.clear()  # every topic follows the image now
        names = set(image.topics) | set(self._by_topic) if topics is None else set(topics)
        # Then try the unavailable ones again, after the drops above freed what they held.
        retry = {t for t, _ in self.unavailable} - names
        for name in [*names, *retry]:
            self._sync_topic(name, image.topics.get(name))
        # Preloaded logs of the synced topics that the image no longer gives us (those of
        # other topics wait for theirs: a first sync in slices may not have reached them).
        self._close_preopened(None if topics is None else names)
        if topics is None and not self._swept:  # a partial sync may run before the first
            self._sweep()

    async def sync_all(self, image: MetadataImage) -> None:
        """sync(image) over every topic, a slice of the event loop at a time: a restarted
        broker takes up tens of thousands of replicas, and its heartbeats, the metadata
        log and its health endpoints are answered meanwhile. Returns when every topic
        pending then has followed the image."""
        loop = asyncio.get_running_loop()
        everything = [*image.topics, *self._by_topic, *(t for t, _ in self.unavailable)]
        self._pend(loop, image, everything)
        while self._sync_pending:
            syncer = self._syncer
            assert syncer is not None
            await asyncio.wait(
                {self._next_chunk(loop), syncer}, return_when=asyncio.FIRST_COMPLETED
            )
            if syncer.done() and self._sync_pending:
                syncer.result()  # it failed: say why
                self._start_syncer(loop)
        self._close_preopened(None)
        if not self._swept:
            self._sweep()

    def _close_preopened(self, topics: set[str] | None) -> None:
        if topics is None:
            stale = list(self._preopened)
        else:
            stale = [key for key in self._preopened if key[0] in topics]
        for key in stale:
            self._preopened.pop(key)[1].close()

    def sync_soon(self, image: MetadataImage, topics: set[str]) -> None:
        """sync(image, topics), but a change naming many topics is applied a slice of
        the event loop at a time, so the listener keeps answering while a broker takes
        over thousands of leaderships. Until its turn a replica keeps its previous
        role: a request for it gets what it got a moment before (NOT_LEADER_OR_FOLLOWER
        for a leadership not taken yet, which clients retry; a deposed leader's acks=all
        writes cannot complete, as its ISR fetches from the new leader)."""
        loop = _running_loop()
        if loop is None or (len(topics) <= SYNC_INLINE_TOPICS and not self._sync_pending):
            self.sync(image, topics)
            return
        self._pend(loop, image, topics)

    def _pend(
        self, loop: asyncio.AbstractEventLoop, image: MetadataImage, names: Iterable[str]
    ) -> None:
        """Queue `names` for the slicing syncer, starting it if it is not running."""
        self._image = image
        for name in names:
            self._sync_pending[name] = None
        self._start_syncer(loop)

    def _start_syncer(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._syncer is None or self._syncer.done():
            self._syncer = loop.create_task(self._sync_slices())

    def _next_chunk(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """Resolved after the next slice of syncing or chunk of created logs."""
        if self._chunk_done is None or self._chunk_done.done():
            self._chunk_done = loop.create_future()
        return self._chunk_done

    async def _sync_slices(self) -> None:
        def one(name: str, _: None) -> None:
            assert self._image is not None
            self._sync_topic(name, self._image.topics.get(name))

        def slice_done() -> None:  # wakes created(), which waits on these topics too
            if self._chunk_done is not None and not self._chunk_done.done():
                self._chunk_done.set_result(None)

        await _in_slices(self._sync_pending, one, SYNC_SLICE_S, slice_done)

    def _sync_topic(self, name: str, t: TopicImage | None) -> None:
        me = self.node_id
        part: Partition | None
        for index in sorted(self._by_topic.get(name, ())):
            part = self.partitions[(name, index)]
            p = t.partitions[index] if t is not None and index < len(t.partitions) else None
            if (
                p is None
                or t is None
                or t.topic_id != self.topic_ids.get(name)
                or (me not in p.replicas)
            ):
                self._drop(part)
        for key in [k for k in self.unavailable if k[0] == name]:
            del self.unavailable[key]
        if t is None:
            self.topic_ids.pop(name, None)
            return
        self.topic_ids[name] = t.topic_id
        cfg = log_config_for(t, self.broker_defaults)
        min_isr = int(effective({**self.broker_defaults, **t.configs})["min.insync.replicas"])
        for i, p in enumerate(t.partitions):
            if me not in p.replicas:
                continue
            part = self.partitions.get((name, i))
            if part is None and self._defer_new(t, i, cfg):
                continue
            if part is None:
                try:
                    plog = self._open_log(t, i, cfg)
                except OSError as e:
                    self.unavailable[(name, i)] = f"cannot open the log: {e}"
                    log.warning(
                        "replica unavailable: cannot open its log",
                        extra={"topic": name, "partition": i, "error": str(e)},
                    )
                    continue
                part = Partition(name, i, plog, me)
                part.on_change = self.change_listener
                part.on_write_state = self._write_state_changed
                part.epoch_writes = self._write_epochs_later
                self.partitions[(name, i)] = part
                self._by_topic.setdefault(name, set()).add(i)
            else:
                part.log.config = cfg
            try:
                role = part.update(p, min_isr)
                if role == FOLLOWER and part.write_error is not None:
                    part.write_error = None  # a follower's appends report nothing
                    self._write_state_changed(part)
                if role:
                    for cb in self.role_listeners:
                        cb(part, role)
            except OSError as e:
                # The role is taken in memory; only its epoch checkpoint (or a group
                # load) failed. Appends retry the checkpoint and fail with a storage
                # error until it is written.
                log.warning(
                    "replica took its role but could not write to its log directory",
                    extra={"topic": name, "partition": i, "error": str(e)},
                )

    def _write_epochs_later(self, epochs: LeaderEpochCache) -> None:
        loop = _running_loop()
        if loop is None:
            epochs.flush()  # no loop (tools, tests): at once
            return
        self._epochs_unwritten[id(epochs)] = epochs
        if self._epoch_writer is None or self._epoch_writer.done():
            self._epoch_writer = loop.create_task(self._write_epochs())

    async def _write_epochs(self) -> None:
        def one(_: int, epochs: LeaderEpochCache) -> None:
            try:
                epochs.flush()
            except FileNotFoundError:
                pass  # the replica was deleted meanwhile
            except OSError as e:
                # The in-memory epochs serve; a crash before a later write rebuilds
                # them from the batches. Appends still fail while the disk does.
                log.warning(
                    "could not write a leader epoch checkpoint",
                    extra={"path": epochs.path, "error": str(e)},
                )

        await _in_slices(self._epochs_unwritten, one, EPOCH_WRITE_SLICE_S)

    def _defer_new(self, t: TopicImage, index: int, cfg: LogConfig) -> bool:
        """A replica with no log open yet is created (or opened) in a worker thread, then joins
        through sync; until then requests for it get NOT_LEADER_OR_FOLLOWER (retriable,
        as while Kafka's broker becomes leader). Needs a running event loop."""
        key = (t.name, index)
        if key in self._creating:
            return True
        if key in self._preopened or key in self._failed_create:
            return False
        path = os.path.join(self.data_dir, self.dir_name(t.name, index))
        loop = _running_loop()
        if loop is None:
            return False  # tools and tests that drive sync without a loop open inline
        # No check for an existing directory here (a stat per replica on the loop): the
        # ones loaded at startup are preopened, and the worker opens any other in place.
        self._creating[key] = (path, str(t.topic_id), cfg)
        if self._creator is None or self._creator.done():
            self._creator = loop.create_task(self._create_logs())
        return True

    async def created(self, topic: str, within_s: float) -> None:
        """Return once this broker's new replicas of `topic` have their logs (or could
        not get them), or after `within_s`: a topic is usable here the moment its
        creation is answered."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while topic in self._sync_pending or any(key[0] == topic for key in self._creating):
            left = deadline - loop.time()
            if left <= 0:
                return
            await asyncio.wait({self._next_chunk(loop)}, timeout=left)

    async def _create_logs(self) -> None:
        while self._creating:
            chunk = list(self._creating.items())[:PREOPEN_CHUNK]
            todo = [(key, path, topic_id, cfg) for key, (path, topic_id, cfg) in chunk]
            made, failed = await asyncio.to_thread(_make_logs, todo)
            for key, _ in chunk:
                self._creating.pop(key, None)
            for key, topic_id, plog in made:
                self._preopened[key] = (topic_id, plog)
            if self._chunk_done is not None and not self._chunk_done.done():
                self._chunk_done.set_result(None)
            if self._image is None:
                continue
            # One that failed here is tried inline by this sync, which reports it (and
            # the 5 s retry of unavailable replicas goes on from there), never in a loop.
            self._failed_create = failed
            try:
                self.sync(self._image, {key[0] for key, _ in chunk})
            finally:
                self._failed_create = set()
            # A replica that went away meanwhile (topic deleted, moved) leaves no files.
            for key, (path, _, _) in chunk:
                if key not in self.partitions and key not in self._creating:
                    p = self._image.partition(*key)
                    if p is None or self.node_id not in p.replicas:
                        remove_later(path)

    def _open_log(self, t: TopicImage, index: int, cfg: LogConfig) -> PartitionLog:
        pre = self._preopened.pop((t.name, index), None)
        if pre is not None and pre[0] == str(t.topic_id):
            plog = pre[1]
            plog.config = cfg
            plog.adopt(self.handles)
            return plog
        if pre is not None:
            pre[1].close()
        path = os.path.join(self.data_dir, self.dir_name(t.name, index))
        self._check_owner(path, str(t.topic_id))
        return PartitionLog(path, cfg, self.handles)

    def _sweep(self) -> None:
        """Once, after the first sync: delete partition directories of replicas this
        broker no longer holds (later removals delete their own, see _drop)."""
        # Those still being opened or created by the worker are wanted too.
        wanted = {
            self.dir_name(t, i)
            for keys in (self.partitions, self.unavailable, self._creating, self._preopened)
            for t, i in keys
        }
        for name in os.listdir(self.data_dir):
            path = os.path.join(self.data_dir, name)
            if (
                name not in wanted
                and os.path.isdir(path)
                and os.path.exists(os.path.join(path, ".topic-id"))
            ):
                remove_later(path)
        self._swept = True

    def _drop(self, part: Partition) -> None:
        for cb in self.role_listeners:
            cb(part, "")
        part.role = ""
        part.fail_hw_waiters()
        part._wake()
        del self.partitions[(part.topic, part.index)]
        self.write_failed.discard((part.topic, part.index))
        indexes = self._by_topic.get(part.topic)
        if indexes is not None:
            indexes.discard(part.index)
            if not indexes:
                del self._by_topic[part.topic]
        try:
            part.log.abandon()
        except OSError as e:  # its files go anyway
            log.warning("closing a removed replica's log failed", extra={"error": str(e)})
        remove_later(part.log.directory)

    async def preopen(self, image: MetadataImage) -> None:
        """Open the logs this broker already holds for the image's replicas in a worker
        thread, a chunk at a time: recovering a large torn segment after a crash scans and
        checks it, and the event loop keeps answering (liveness, the quorum) meanwhile.
        Each log is loaded with a small cache of its own (the shared one belongs to the
        event loop's thread) and joins the shared one in sync."""
        me = self.node_id
        todo: list[tuple[tuple[str, int], str, str, LogConfig]] = []
        pacer = LoopSlice(SYNC_SLICE_S)
        for t in list(image.topics.values()):
            if pacer.due():  # 100,000 paths to make
                await pacer.pause()
            cfg = log_config_for(t, self.broker_defaults)
            for i, p in enumerate(t.partitions):
                key = (t.name, i)
                if me not in p.replicas or key in self.partitions or key in self._preopened:
                    continue
                path = os.path.join(self.data_dir, self.dir_name(t.name, i))
                todo.append((key, path, str(t.topic_id), cfg))
        # Chunks, not one thread hop per log: 100,000 small logs load several times
        # faster, and a chunk of small logs takes tens of milliseconds.
        for n in range(0, len(todo), PREOPEN_CHUNK):
            for key, topic_id, loaded in await asyncio.to_thread(
                _load_logs, todo[n : n + PREOPEN_CHUNK]
            ):
                self._preopened[key] = (topic_id, loaded)

    @staticmethod
    def _check_owner(path: str, topic_id: str) -> None:
        """A directory left by a deleted topic of the same name must not be reused."""
        marker = os.path.join(path, ".topic-id")
        if os.path.exists(marker):
            with open(marker) as f:
                if f.read().strip() != topic_id:
                    remove_later(path)
        os.makedirs(path, exist_ok=True)
        if not os.path.exists(marker):
            tmp = marker + ".tmp"
            with open(tmp, "w") as f:
                f.write(topic_id)
            os.replace(tmp, marker)  # never a half-written marker (a full disk)

    def _write_state_changed(self, part: Partition) -> None:
        if part.write_error is None:
            self.write_failed.discard((part.topic, part.index))
        else:
            self.write_failed.add((part.topic, part.index))

    def storage_error(self, topic: str, index: int) -> str | None:
        """Why this broker cannot serve a replica the image gives it, or None."""
        return self.unavailable.get((topic, index))

    def offline(self) -> Iterator[tuple[str, int]]:
        """What the controller should lead elsewhere: replicas whose log cannot be
        opened, then those this broker leads whose appends fail."""
        yield from self.unavailable
        yield from self.write_failed

    async def apply_retention(self) -> int:
        """Delete the segments beyond retention of every partition this broker leads, at
        most RETENTION_SLICE_S of it per turn of the event loop (a walk over 100,000
        partitions, and segment deletes, each a few system calls)."""
        # Followers follow the leader's log start instead (see the replica fetcher).
        deleted = 0
        pacer = LoopSlice(RETENTION_SLICE_S, check_every=64)
        for key in list(self.partitions):
            if pacer.due():
                await pacer.pause()
            p = self.partitions.get(key)
            # A few segments a turn: each delete is a few system calls (unlinks, and a
            # close when the flusher's queue is full) and a log may have hundreds due.
            while p is not None and p.is_leader and not p.log.closed:
                n = p.log.apply_retention(limit=RETENTION_SEGMENTS_PER_TURN)
                if n:
                    deleted += n
                    p._wake()  # the log start moved: fetch sessions carry it to followers
                if n < RETENTION_SEGMENTS_PER_TURN:
                    break
                await pacer.pause()
                p = self.partitions.get(key)  # removed meanwhile: nothing more to do
        return deleted

    def close(self) -> None:
        if self._creator is not None:
            self._creator.cancel()
        if self._epoch_writer is not None:
            self._epoch_writer.cancel()
        if self._syncer is not None:
            self._syncer.cancel()
        for epochs in self._epochs_unwritten.values():
            try:
                epochs.flush()
            except OSError:
                pass  # rebuilt from the batches at the next start
        self._epochs_unwritten.clear()
        for p in self.partitions.values():
            p.fail_hw_waiters()
            try:
                p.log.close()
            except OSError as e:
                log.warning("closing a log failed", extra={"dir": p.log.directory, "error": str(e)})
        for _, plog in self._preopened.values():
            plog.close()
        self._preopened.clear()
        self.handles.close_all()


def remove_later(path: str) -> None:
    """Delete a removed replica's folder in the flusher thread (thousands of files for a
    large log: hundreds of milliseconds of unlinks on the loop otherwise). Renamed first,
    in one system call, as Kafka renames a deleted log `<name>.<id>-delete`: a replica of
    the same name may be created at once, and a restart's sweep deletes what is left."""
    doomed = f"{path}.{uuid.uuid4().hex}-delete"
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("cannot rename a removed replica's folder", extra={"error": str(e)})
        shutil.rmtree(path, ignore_errors=True)
        return
    remove_tree_in_background(doomed)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop, or None when tools and tests drive the manager without one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _in_slices(
    pending: dict[Any, Any],
    each: Callable[[Any, Any], None],
    slice_s: float,
    after_slice: Callable[[], None] | None = None,
) -> None:
    """Take `pending`'s items in insertion order (more may arrive meanwhile), at most
    `slice_s` of work per turn of the event loop."""
    pacer = LoopSlice(slice_s)
    while pending:  # at least one item per turn, however short the slice
        key = next(iter(pending))
        each(key, pending.pop(key))
        if not pending or pacer.due():
            if after_slice is not None:
                after_slice()
            await pacer.pause()


def _make_logs(
    todo: list[tuple[tuple[str, int], str, str, LogConfig]],
) -> tuple[list[tuple[tuple[str, int], str, PartitionLog]], set[tuple[str, int]]]:
    """Create new replicas' logs in a worker thread, each with a private cache closed
    after it (as `_load_logs`); and the keys that failed (sync retries those inline and
    reports them)."""
    made, failed = [], set()
    handles = FileHandles(4)
    for key, path, topic_id, cfg in todo:
        try:
            PartitionManager._check_owner(path, topic_id)
            made.append((key, topic_id, PartitionLog(path, cfg, handles)))
        except OSError:
            failed.add(key)
        finally:
            handles.close_all()
    return made, failed


def _load_logs(
    todo: list[tuple[tuple[str, int], str, str, LogConfig]],
) -> list[tuple[tuple[str, int], str, PartitionLog]]:
    """Load the logs whose directory belongs to the expected topic id, in a worker
    thread, with a private cache whose files are closed after each log (so the worker
    never holds more than a few descriptors). A directory that is missing or another
    topic's is skipped (sync decides); one that fails to load is logged and left to
    sync, which reports it."""
    out = []
    handles = FileHandles(4)
    for key, path, topic_id, cfg in todo:
        try:
            with open(os.path.join(path, ".topic-id")) as f:
                if f.read().strip() != topic_id:
                    continue
        except OSError:
            continue  # nothing here yet (or a deleted topic's)
        try:
            plog = PartitionLog(path, cfg, handles)
        except OSError as e:
            log.warning("could not open a log at startup", extra={"path": path, "error": str(e)})
            continue
        finally:
            handles.close_all()
        out.append((key, topic_id, plog))
    return out
