"""A partition's log: ordered segments, append, read ranges, roll, retention, recovery.

Durability: by default the log relies on replication and the OS page cache, as Kafka
does: an acknowledged write has reached the kernel (pwritev), so it survives a crash of
the broker process (kill -9) but not of the machine. `flush.messages` / `flush.ms`
(topic configs, Kafka's names) add fsync for those who need it on a single node.
"""

from __future__ import annotations

import logging
import os
import time
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from ..producer_state import ProducerStateTable
from ..record_codec import decode_batch
from ..records import (
    ATTR_CONTROL,
    LOG_OVERHEAD,
    BatchInfo,
    assign_offsets,
    batch_leader_epoch,
    parse_header,
    parse_marker,
)
from .compaction import CLEANED, SEGMENT_SUFFIXES, SWAP, CleanedGroup, SegmentFile
from .epochs import LeaderEpochCache
from .flusher import drain, flush_in_background
from .handles import FileHandles
from .segment import Segment, segment_name
from .txn_index import TXN_INDEX, AbortedTxn, collect

log = logging.getLogger("straitmq.storage")

SNAPSHOT_SUFFIX = ".snapshot"
# The logical log start (Kafka's logStartOffset), when it sits above the first segment's
# base: DeleteRecords, or a follower copying its leader's. Kafka keeps one
# log-start-offset-checkpoint per log directory, written every minute; here it is one
# small file per partition, rewritten at each move (moves are rare: DeleteRecords and
# the followers that copy it), so a restart never shows deleted records again.
LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
# The log cleaner's first dirty offset (Kafka's cleaner-offset-checkpoint, per partition
# here as the log start's): everything below it was cleaned at least once.
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"


@dataclass(slots=True)
class LogConfig:
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    max_message_bytes: int = 1048588
    index_interval_bytes: int = 4096
    flush_messages: int = 2**63 - 1
    flush_ms: int = 2**63 - 1
    producer_id_expiration_ms: int = 24 * 3600 * 1000
    # cleanup.policy: "delete" (retention), "compact" (the cleaner), or both.
    delete: bool = True
    compact: bool = False
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    delete_retention_ms: int = 24 * 3600 * 1000


@dataclass(slots=True)
class ReadSlice:
    """A byte range of a segment file, sent later (sendfile): the descriptor is asked
    for at each use, since the bounded cache may close and reopen it in between."""

    segment: Segment
    position: int
    size: int

    @property
    def fd(self) -> int:
        return self.segment.fd


class UnexpectedAppendOffset(Exception):
    """Replicated batches do not start at this log's end (Kafka's
    UnexpectedAppendOffsetException): the follower must truncate or reset first."""

    def __init__(self, expected: int, first_offset: int, last_offset: int) -> None:
        super().__init__(
            f"replicated batches start at offset {first_offset} (last {last_offset}) "
            f"but the log ends at {expected}"
        )
        self.expected = expected
        self.first_offset = first_offset
        self.last_offset = last_offset


class OffsetOutOfRange(ValueError):
    """Truncation below the log start, or a log start beyond the log end."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class PartitionLog:
    def __init__(
        self, directory: str, config: LogConfig, handles: FileHandles | None = None
    ) -> None:
        self.directory = directory
        self.config = config
        # A log of its own (tests, tools) gets a small private cache.
        self.handles = handles if handles is not None else FileHandles(8)
        os.makedirs(directory, exist_ok=True)
        self.segments: list[Segment] = []
        self.bases: list[int] = []
        self.producers = ProducerStateTable()
        self.epochs = LeaderEpochCache(directory)
        self._unflushed_messages = 0
        self._last_flush_ms = _now_ms()
        # Kafka's logStartOffset: >= the first segment's base, <= the log end. Reads,
        # ListOffsets and fetches below it see nothing (OFFSET_OUT_OF_RANGE).
        self.log_start_offset = 0
        self.closed = False
        self.retired: list[Segment] = []  # swapped out by the cleaner, still pinned
        self._load()

    # -- startup ---------------------------------------------------------------------

    def _load(self) -> None:
        self._finish_swaps()
        names = os.listdir(self.directory)
        bases = sorted(int(name[:-4]) for name in names if name.endswith(".log"))
        with_txn_index = {name[:20] for name in names if name.endswith(TXN_INDEX)}
        now = _now_ms()
        for i, base in enumerate(bases):
            seg = Segment(self.directory, base, self.config.index_interval_bytes, now, self.handles)
            last = i == len(bases) - 1
            if not last and seg.size and seg.load_indexes():
                seg.created_ms = now
            else:
                cut = seg.recover(self.config.max_message_bytes)
                if cut:
                    log.warning(
                        "recovered segment by truncating a torn tail",
                        extra={"segment": seg.path(".log"), "bytes": cut},
                    )
            if segment_name(base, "") in with_txn_index:
                seg.load_txn_index()
            self.segments.append(seg)
        if not self.segments:
            self.segments.append(
                Segment(self.directory, 0, self.config.index_interval_bytes, now, self.handles)
            )
        self.bases = [s.base_offset for s in self.segments]
        self.log_start_offset = min(
            max(self._read_start_checkpoint(), self.segments[0].base_offset),
            self.log_end_offset,
        )
        # Snapshots above the end describe a history that was cut (truncate_to or a torn
        # tail); once the log grows past them again they would be taken for the new one.
        self._delete_snapshots_above(self.log_end_offset)
        self._load_producer_state()
        self._load_epochs()
        # A crash between the checkpoint and the deletion it announced leaves segments
        # wholly below the start: they go now (followers run no retention of their own).
        self.drop_segments_before(self.log_start_offset)

    def _finish_swaps(self) -> None:
        """A crash inside the cleaner's swap (Kafka's LogLoader does the same): `.cleaned`
        files were never swapped in and go. `<base>.log.swap` is renamed last, so once it
        exists the cleaned segment was whole: the segments it covers go and it takes
        their place; index `.swap` files without it go."""
        names = set(os.listdir(self.directory))
        swapped = {n[:20] for n in names if n.endswith(".log" + SWAP)}
        for name in names:
            if name.endswith(CLEANED) or (name.endswith(SWAP) and name[:20] not in swapped):
                _unlink(os.path.join(self.directory, name))
        for base in sorted(int(b) for b in swapped):
            seg = Segment(
                self.directory, base, self.config.index_interval_bytes, 0, self.handles, SWAP
            )
            seg.recover(self.config.max_message_bytes)
            end = seg.next_offset
            seg.close()
            for name in os.listdir(self.directory):
                if name.endswith(".log") and base < int(name[:20]) < end:
                    for suffix in SEGMENT_SUFFIXES:
                        _unlink(os.path.join(self.directory, segment_name(int(name[:20]), suffix)))
            for suffix in SEGMENT_SUFFIXES[::-1]:  # .log last, as in _swap_group
                src = os.path.join(self.directory, segment_name(base, suffix) + SWAP)
                if os.path.exists(src):
                    os.replace(src, os.path.join(self.directory, segment_name(base, suffix)))
            log.warning("finished a log cleaner swap cut short", extra={"segment": base})

    def _load_epochs(self) -> None:
        """Make the epoch cache agree with the log: the checkpoint may be ahead of a log
        that was truncated (or whose tail was torn), behind one whose rename was lost in
        a machine crash, or missing (logs written before the cache existed)."""
        loaded = self.epochs.load()
        end = self.log_end_offset
        if loaded:
            self.epochs.truncate_from_end(end)
            self.epochs.truncate_from_start(self.log_start_offset)
        last = self._last_batch_epoch()
        if last > self.epochs.latest_epoch or (not loaded and last >= 0):
            self.epochs.replace(self._scan_epochs())
            log.warning(
                "rebuilt the leader epoch cache from the log",
                extra={"directory": self.directory, "epochs": len(self.epochs.entries)},
            )

    def _last_batch_epoch(self) -> int:
        for seg in reversed(self.segments):
            head = seg.last_header()
            if head is not None:
                return batch_leader_epoch(head, 0)
        return -1

    def _scan_epochs(self) -> list[tuple[int, int]]:
        """(epoch, start offset) from every batch header; records are never read."""
        entries: list[tuple[int, int]] = []
        latest = -1
        for seg in self.segments:
            for _pos, _size, head in seg.headers_from(0):
                epoch = batch_leader_epoch(head, 0)
                if epoch > latest:
                    entries.append((epoch, int.from_bytes(head[:8], "big", signed=True)))
                    latest = epoch
        return entries

    def _snapshots(self) -> list[int]:
        return sorted(
            int(n[: -len(SNAPSHOT_SUFFIX)])
            for n in os.listdir(self.directory)
            if n.endswith(SNAPSHOT_SUFFIX)
        )

    def _delete_snapshots_above(self, offset: int) -> None:
        for snap in self._snapshots():
            if snap > offset:
                os.unlink(os.path.join(self.directory, segment_name(snap, SNAPSHOT_SUFFIX)))

    def _load_producer_state(self) -> None:
        """Latest producer snapshot at or below the end, then replay the batches after it."""
        start = self.log_start_offset
        for offset in reversed(self._snapshots()):
            if offset <= self.log_end_offset:
                path = os.path.join(self.directory, segment_name(offset, SNAPSHOT_SUFFIX))
                try:
                    with open(path, "rb") as f:
                        self.producers.load_json(orjson.loads(f.read()))
                    start = offset
                    break
                except (OSError, orjson.JSONDecodeError, ValueError, TypeError):
                    log.warning("ignoring unreadable producer snapshot", extra={"path": path})
        # The replay also rewrites the aborted-transaction entries of what it replays,
        # exactly as the appends made them: a crash may have lost or torn some.
        i = max(0, bisect_right(self.bases, start) - 1)
        for seg in self.segments[i:]:
            pos = seg.position_of(start) if seg.base_offset < start else 0
            if pos is None:
                continue
            aborted = [e for e in seg.aborted if e.last_offset < start]
            for p, size, head in seg.headers_from(pos):
                info = parse_header(head, 0, size)
                marker = None
                if info.attributes & ATTR_CONTROL:
                    marker = parse_marker(os.pread(seg.fd, size, p))
                done = self.producers.record(info, marker)
                if done is not None and done.aborted:
                    lso = self.producers.stable_offset_after(done)
                    aborted.append(
                        AbortedTxn(done.producer_id, done.first_offset, done.last_offset, lso)
                    )
            seg.set_aborted(aborted)

    def write_producer_snapshot(self) -> None:
        offset = self.log_end_offset
        path = os.path.join(self.directory, segment_name(offset, SNAPSHOT_SUFFIX))
        data = self.producers.to_json(_now_ms(), self.config.producer_id_expiration_ms)
        tmp = path + ".tmp"
        fd = self.handles.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(data))
        os.replace(tmp, path)
        for old in self._snapshots()[:-2]:
            os.unlink(os.path.join(self.directory, segment_name(old, SNAPSHOT_SUFFIX)))

    def _read_start_checkpoint(self) -> int:
        """The checkpointed log start, or -1 (missing or unreadable: the first segment's
        base then, as before any DeleteRecords)."""
        path = os.path.join(self.directory, LOG_START_CHECKPOINT)
        try:
            with open(path, "rb") as f:
                return int(f.read().strip() or b"-1")
        except FileNotFoundError:
            return -1
        except (OSError, ValueError) as e:
            log.warning(
                "ignoring unreadable log start checkpoint", extra={"path": path, "error": str(e)}
            )
            return -1

    def _write_start_checkpoint(self) -> None:
        """tmp + rename, no fsync (as the leader epoch checkpoint: the log is not fsynced
        either, and a follower relearns the start from its leader)."""
        path = os.path.join(self.directory, LOG_START_CHECKPOINT)
        tmp = path + ".tmp"
        data = b"%d\n" % self.log_start_offset
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(f"short write to {tmp}")
        finally:
            os.close(fd)
        os.replace(tmp, path)

    # -- offsets ---------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- append ------------------------------------------------------------------------

    def append(self, data: memoryview, batches: list[BatchInfo], leader_epoch: int) -> int:
        """Append validated batches; returns the base offset of the first one."""
        total = sum(b.size for b in batches)
        active = self.segments[-1]
        now = _now_ms()
        if active.size and (
            active.size + total > self.config.segment_bytes
            or now - active.created_ms > self.config.segment_ms
        ):
            active = self.roll()
        base = self.log_end_offset
        if leader_epoch > self.epochs.latest_epoch:
            # Checkpoint before the data: a crash leaves it ahead of the log (trimmed at
            # load), never behind it.
            self.epochs.assign(leader_epoch, base)
        pieces = assign_offsets(data, batches, base, leader_epoch)
        active.append(pieces, batches, total)
        self._note_producers(data, batches, active)
        # Inlined _after_append: this is the produce hot path.
        self._unflushed_messages += sum(b.last_offset_delta + 1 for b in batches)
        if (
            self._unflushed_messages >= self.config.flush_messages
            or now - self._last_flush_ms >= self.config.flush_ms
        ):
            self.flush()
        return base

    def append_replicated(self, data: memoryview, batches: list[BatchInfo]) -> None:
        """Follower append: batches fetched from the leader, stored byte for byte.

        Offsets and leader epochs were set by the leader; `batches` come from
        `records.replicated_batches(data)` (framing, magic, CRC, contiguous offsets) and
        must lie back to back in `data`. The first must start at the log end offset, else
        UnexpectedAppendOffset (truncate_to / reset_to first). One pwrite, no per-record
        work: only header fields feed the indexes, producer state and epoch cache.
        """
        if not batches:
            return
        first, last = batches[0], batches[-1]
        end = self.log_end_offset
        if (
            first.base_offset < end <= first.base_offset + first.last_offset_delta
            and end == self.log_start_offset
            and self.segments[0].size == 0
            and len(self.segments) == 1
        ):
            # An empty follower log reset to a leader's log start that DeleteRecords put
            # inside a batch: the leader sends that whole batch. Start the log at the
            # batch's base and keep the log start (Kafka's
            # appendRecordsToFollowerOrFutureReplica does the same).
            start = self.log_start_offset
            self.reset_to(first.base_offset)
            self.log_start_offset = start
            self._write_start_checkpoint()
            end = first.base_offset
        # A gap before the first batch is a compacted leader's (the batches that held
        # those offsets were cleaned away); an overlap means this log must truncate.
        if first.base_offset < end:
            raise UnexpectedAppendOffset(
                end, first.base_offset, last.base_offset + last.last_offset_delta
            )
        if self.epochs.latest_start >= end:
            # An epoch this replica assigned when it became leader but never wrote to:
            # nothing backs it, and left in place it would hide the leader's epochs here.
            self.epochs.truncate_from_end(end)
        start = first.position
        expected_pos, expected_offset = start, end
        for b in batches:
            if b.position != expected_pos or b.base_offset < expected_offset:
                raise ValueError(
                    f"replicated batch at offset {b.base_offset} (position {b.position}) does "
                    f"not follow offset {expected_offset} (position {expected_pos})"
                )
            expected_pos += b.size
            expected_offset = b.base_offset + b.last_offset_delta + 1
        total = expected_pos - start
        active = self.segments[-1]
        now = _now_ms()
        if active.size and (
            active.size + total > self.config.segment_bytes
            or now - active.created_ms > self.config.segment_ms
        ):
            active = self.roll()
        latest = self.epochs.latest_epoch
        for b in batches:
            epoch = batch_leader_epoch(data, b.position)
            if epoch > latest:
                self.epochs.assign(epoch, b.base_offset)  # before the data, as in append
                latest = epoch
            elif epoch < latest:
                log.warning(
                    "replicated batch has an older leader epoch than the cache",
                    extra={"offset": b.base_offset, "epoch": epoch, "latest": latest},
                )
        active.append([data[start:expected_pos]], batches, total)
        self._note_producers(data, batches, active)
        self._after_append(batches, now)

    def _note_producers(self, data: memoryview, batches: list[BatchInfo], seg: Segment) -> None:
        """Producer state from the appended batches (header fields only, but for the one
        record of a transaction marker); an ABORT marker's transaction goes to the
        segment's `.txnindex`, as Kafka's UnifiedLog.append does."""
        producers = self.producers
        for b in batches:
            if b.producer_id < 0:
                continue
            if not b.attributes & ATTR_CONTROL:
                producers.record(b)
                continue
            marker = parse_marker(data[b.position : b.position + b.size])
            done = producers.record(b, marker)
            if done is not None and done.aborted:
                lso = producers.stable_offset_after(done)
                seg.add_aborted(
                    AbortedTxn(done.producer_id, done.first_offset, done.last_offset, lso)
                )

    # -- transactions ------------------------------------------------------------------

    def last_stable_offset(self, high_watermark: int) -> int:
        """Kafka's LSO: the first offset of the earliest transaction whose outcome is not
        yet known below the high watermark, bounded by it."""
        first = self.producers.first_unstable_offset(high_watermark)
        return high_watermark if first is None or first >= high_watermark else first

    def aborted_transactions(self, fetch_offset: int, upper: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [fetch_offset, upper) (Kafka's
        collectAbortedTxns): from the segment holding `fetch_offset` on, until an entry's
        LSO shows no later one can overlap. Only the in-memory indexes are read."""
        out: list[AbortedTxn] = []
        i = max(0, bisect_right(self.bases, fetch_offset) - 1)
        for seg in self.segments[i:]:
            if seg.aborted and collect(seg.aborted, fetch_offset, upper, out):
                break
        return out

    def upper_bound_of(self, sl: ReadSlice) -> int:
        """The first offset after a read slice: the next batch's base in its segment, or
        the segment's end."""
        seg = sl.segment
        end = sl.position + sl.size
        if end < seg.size:
            head = os.pread(sl.fd, 8, end)
            if len(head) == 8:
                return int.from_bytes(head, "big", signed=True)
        return seg.next_offset

    def _after_append(self, batches: list[BatchInfo], now: int) -> None:
        """flush.messages / flush.ms."""
        self._unflushed_messages += sum(b.last_offset_delta + 1 for b in batches)
        if (
            self._unflushed_messages >= self.config.flush_messages
            or now - self._last_flush_ms >= self.config.flush_ms
        ):
            self.flush()

    def roll(self) -> Segment:
        old = self.segments[-1]
        # Its fsync goes to the flusher thread (flusher.py): on the loop it stalled every
        # partition for as long as the disk took.
        old.flush_indexes()
        flush_in_background(os.dup(old.fd), old.path(".log"))
        seg = Segment(
            self.directory,
            self.log_end_offset,
            self.config.index_interval_bytes,
            _now_ms(),
            self.handles,
        )
        self.segments.append(seg)
        self.bases.append(seg.base_offset)
        self.write_producer_snapshot()
        return seg

    def flush(self) -> None:
        self.segments[-1].fsync()
        self._unflushed_messages = 0
        self._last_flush_ms = _now_ms()

    # -- read --------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, upper: int) -> ReadSlice | None:
        """A batch-aligned file range starting at the batch holding `offset`.

        Only one segment per call, as Kafka does. `upper` (the high watermark) bounds
        what is visible. Returns None when there is nothing at or after `offset`.
        """
        if offset >= upper:
            return None
        i = bisect_right(self.bases, offset) - 1
        i = max(i, 0)
        while i < len(self.segments):
            seg = self.segments[i]
            pos = seg.position_of(offset)
            if pos is not None:
                end = seg.end_of_range(pos, max_bytes)
                if upper < seg.next_offset:
                    hw_pos = seg.position_of(upper)
                    if hw_pos is not None:
                        end = min(end, hw_pos)
                if end <= pos:
                    return None
                return ReadSlice(seg, pos, end - pos)
            i += 1
        return None

    def read_bytes(self, offset: int, max_bytes: int, upper: int) -> bytes:
        sl = self.read(offset, max_bytes, upper)
        return os.pread(sl.fd, sl.size, sl.position) if sl else b""

    def batches(self, offset: int, upper: int, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """Whole batches from the one holding `offset` up to `upper`, read a chunk at a time.

        For the paths that look inside records (offset replay, REST); fetch uses `read`.
        """
        while offset < upper:
            data = self.read_bytes(offset, chunk_bytes, upper)
            if not data:
                return
            pos = 0
            while pos < len(data):
                info = parse_header(data, pos, 0)
                size = int.from_bytes(data[pos + 8 : pos + 12], "big") + LOG_OVERHEAD
                yield data[pos : pos + size]
                offset = info.base_offset + info.last_offset_delta + 1
                pos += size

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after the log start with
        timestamp >= `timestamp`."""
        start = self.log_start_offset
        for seg in self.segments:
            if seg.max_timestamp < timestamp or seg.next_offset <= start:
                continue
            first = seg.time_position(timestamp)
            if seg.base_offset < start:
                first = max(first, seg.position_of(start) or 0)
            for pos, size, _base, max_ts in seg.batches_from(first):
                if max_ts >= timestamp:
                    for rec in decode_batch(os.pread(seg.fd, size, pos)):
                        if rec.timestamp >= timestamp and rec.offset >= start:
                            return rec.offset, rec.timestamp
        return None

    def max_timestamp_offset(self) -> tuple[int, int, int] | None:
        """(offset, timestamp, batch leader epoch) of the record with the largest
        timestamp (the first such record on a tie), for ListOffsets MAX_TIMESTAMP (-3).

        Segments keep their largest timestamp, so only the batch headers of the one
        segment holding it are read, and only the one batch holding it is decoded. A
        record below the log start is not answered (Kafka's would be); if the largest
        timestamp is only there, this finds nothing."""
        start = self.log_start_offset
        best: Segment | None = None
        for seg in self.segments:
            if (
                seg.next_offset > start
                and seg.size
                and (best is None or seg.max_timestamp > best.max_timestamp)
            ):
                best = seg
        if best is None or best.max_timestamp < 0:
            return None
        target = best.max_timestamp
        pos0 = best.position_of(start) or 0 if best.base_offset < start else 0
        for pos, size, _base, max_ts in best.batches_from(pos0):
            if max_ts == target:
                raw = os.pread(best.fd, size, pos)
                for rec in decode_batch(raw):
                    if rec.timestamp == target and rec.offset >= start:
                        return rec.offset, rec.timestamp, batch_leader_epoch(raw, 0)
        return None

    # -- retention ----------------------------------------------------------------------

    def apply_retention(self, now_ms: int | None = None, limit: int | None = None) -> int:
        """Delete whole segments beyond retention.ms / retention.bytes; returns how many.
        limit: at most about that many in this call (the caller calls again)."""
        now = now_ms if now_ms is not None else _now_ms()
        # Segments wholly below the log start go first (Kafka's
        # deleteLogStartOffsetBreachedSegments): DeleteRecords moved the start past them.
        deleted = self.drop_segments_before(self.log_start_offset)
        while self.config.delete and len(self.segments) > 1 and (limit is None or deleted < limit):
            oldest = self.segments[0]
            too_old = (
                self.config.retention_ms >= 0
                and oldest.max_timestamp >= 0
                and now - oldest.max_timestamp > self.config.retention_ms
            )
            too_big = (
                self.config.retention_bytes >= 0
                and self.size_bytes - oldest.size >= self.config.retention_bytes
            )
            if not (too_old or too_big):
                break
            oldest.delete()
            self.segments.pop(0)
            self.bases.pop(0)
            self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
            deleted += 1
        if deleted:
            for old in self._snapshots():
                if old < self.log_start_offset and len(self._snapshots()) > 1:
                    os.unlink(os.path.join(self.directory, segment_name(old, SNAPSHOT_SUFFIX)))
            self.epochs.truncate_from_start(self.log_start_offset)
        return deleted

    def drop_segments_before(self, offset: int) -> int:
        """Delete whole segments that end at or before `offset` (never the active one)."""
        dropped = 0
        while len(self.segments) > 1 and self.segments[0].next_offset <= offset:
            self.segments.pop(0).delete()
            self.bases.pop(0)
            dropped += 1
        if dropped:
            self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
            self.epochs.truncate_from_start(self.log_start_offset)
        return dropped

    # -- replication: follower log maintenance ------------------------------------------

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch answer for `epoch`: see LeaderEpochCache.end_offset_for."""
        return self.epochs.end_offset_for(epoch, self.log_end_offset)

    def advance_start(self, offset: int) -> int:
        """Move the log start up to `offset` (Kafka's maybeIncrementLogStartOffset): a
        leader's DeleteRecords, or a follower following its leader's log start. The start
        may fall inside a segment, even inside a batch: it is checkpointed, reads below it
        are refused by the callers, and whole segments that end at or before it are
        deleted now (the rest go with retention once their end passes it). A lower
        offset changes nothing. Returns how many segments were deleted.

        Raises OffsetOutOfRange if `offset` is beyond the log end: then the follower has
        nothing the leader still keeps and must `reset_to(offset)` instead.
        """
        if offset > self.log_end_offset:
            raise OffsetOutOfRange(
                f"log start {offset} is beyond the log end {self.log_end_offset}; use reset_to"
            )
        if offset <= self.log_start_offset:
            return 0
        self.log_start_offset = offset
        # Before the segments go: a crash in between keeps the new start, never a
        # start that points at deleted files.
        self._write_start_checkpoint()
        dropped = self.drop_segments_before(offset)
        self.epochs.truncate_from_start(offset)
        return dropped

    def truncate_to(self, offset: int) -> int:
        """Cut the log so it ends at `offset` (Kafka's truncateTo); returns the new log end.

        `offset` should be a batch boundary; if it falls inside a batch, that whole batch
        goes too and the returned end is its base offset (< `offset`). At or beyond the
        log end nothing is cut, but epochs starting at or after the end are still dropped
        (a leader that assigned its epoch and then lost leadership before appending).
        Raises OffsetOutOfRange below the log start. The log takes appends at once.
        """
        if offset < self.log_start_offset:
            raise OffsetOutOfRange(
                f"cannot truncate to {offset}, below the log start {self.log_start_offset}"
            )
        if offset >= self.log_end_offset:
            self.epochs.truncate_from_end(self.log_end_offset)
            return self.log_end_offset
        # Latest segments first: a crash part-way leaves a shorter but whole log.
        while len(self.segments) > 1 and self.segments[-1].base_offset > offset:
            self.segments.pop().delete()
            self.bases.pop()
        active = self.segments[-1]
        active.truncate_to(offset)
        active.fsync()
        end = self.log_end_offset
        if end < self.log_start_offset:
            # The cut batch held the log start (as Kafka's truncateTo lowers
            # logStartOffset): nothing below the new end was deleted, nothing is left
            # between it and the old start.
            self.log_start_offset = max(end, self.segments[0].base_offset)
            self._write_start_checkpoint()
        # After the data (a crash leaves the checkpoint ahead, which load trims).
        self.epochs.truncate_from_end(end)
        self._delete_snapshots_above(end)
        self.producers = ProducerStateTable()
        self._load_producer_state()
        self._unflushed_messages = 0
        if end < offset:
            log.info(
                "truncation offset fell inside a batch; cut before it",
                extra={"requested": offset, "end": end},
            )
        return end

    def reset_to(self, offset: int) -> None:
        """Delete everything and start empty at `offset` (Kafka's truncateFullyAndStartAt):
        for a follower whose log has nothing the leader still keeps."""
        # Latest segments first, as in truncate_to.
        for seg in reversed(self.segments):
            seg.delete()
        for snap in self._snapshots():
            os.unlink(os.path.join(self.directory, segment_name(snap, SNAPSHOT_SUFFIX)))
        self.epochs.clear()
        self.producers = ProducerStateTable()
        seg = Segment(
            self.directory, offset, self.config.index_interval_bytes, _now_ms(), self.handles
        )
        self.segments = [seg]
        self.bases = [offset]
        self.log_start_offset = offset
        # The first segment's base is the start now; an old checkpoint may be above it.
        try:
            os.unlink(os.path.join(self.directory, LOG_START_CHECKPOINT))
        except FileNotFoundError:
            pass
        self._unflushed_messages = 0
        self._last_flush_ms = _now_ms()

    def adopt(self, handles: FileHandles) -> None:
        """Use `handles` from now on (a log loaded in a worker thread joins the event
        loop's cache; its files are closed and reopen on first use)."""
        if handles is self.handles:
            return
        for seg in self.segments:
            seg.adopt(handles)
        self.handles = handles

    # -- compaction ----------------------------------------------------------------------

    def read_cleaner_checkpoint(self) -> tuple[int, int | None]:
        """(first dirty offset, earliest delete horizon of the tombstones kept or None).

        The first dirty offset is 0 when never cleaned or unreadable, at least the log
        start (what lies below it is gone anyway) and at most the log end."""
        path = os.path.join(self.directory, CLEANER_CHECKPOINT)
        first_dirty, horizon = 0, None
        try:
            with open(path, "rb") as f:
                fields = f.read().split()
            first_dirty = int(fields[0]) if fields else 0
            horizon = int(fields[1]) if len(fields) > 1 and fields[1] != b"-" else None
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            log.warning(
                "ignoring unreadable cleaner checkpoint", extra={"path": path, "error": str(e)}
            )
        return min(max(first_dirty, self.log_start_offset), self.log_end_offset), horizon

    def write_cleaner_checkpoint(self, first_dirty: int, horizon_ms: int | None = None) -> None:
        """tmp + rename, no fsync (a lost checkpoint only means cleaning again)."""
        path = os.path.join(self.directory, CLEANER_CHECKPOINT)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"%d %s\n" % (first_dirty, b"-" if horizon_ms is None else b"%d" % horizon_ms))
        os.replace(tmp, path)

    def closed_segments(self) -> list[Segment]:
        """Every segment but the active one: what the cleaner may read."""
        return self.segments[:-1]

    def segment_files(self, segments: list[Segment]) -> tuple[SegmentFile, ...]:
        for seg in segments:
            seg.flush_indexes()  # the worker reads the files, not our memory
        return tuple(SegmentFile(s.base_offset, s.next_offset, s.size) for s in segments)

    def swap_cleaned(
        self, read: tuple[SegmentFile, ...], groups: list[CleanedGroup]
    ) -> list[Segment] | None:
        """Put cleaned segments in place of those they were made from, if the log still
        holds those segments unchanged (retention, a truncation or a reset may have
        deleted some meanwhile; then the cleaned files go and False is returned).

        The swap is Kafka's: `.cleaned` files are renamed `.swap` (the `.log` last: once
        it is there, a restart completes the swap), the old segments are deleted, the
        `.swap` files take their names. A fetch sending a range of an old segment goes
        on reading its bytes (`Segment.retire`); every later read finds the new ones.
        Returns the retired segments (for `unpin_retired`), None if nothing was swapped."""
        by_base = {s.base_offset: s for s in self.segments[:-1]}
        sizes = {f.base_offset: f for f in read}
        ok = not self.closed and all(
            (seg := by_base.get(b)) is not None
            and seg.size == sizes[b].size
            and seg.next_offset == sizes[b].next_offset
            for g in groups
            for b in g.replaces
        )
        if not ok:
            for g in groups:
                for suffix in SEGMENT_SUFFIXES:
                    _unlink(
                        os.path.join(self.directory, segment_name(g.base_offset, suffix) + CLEANED)
                    )
            return None
        retired: list[Segment] = []
        for g in groups:
            retired += self._swap_group(g, [by_base[b] for b in g.replaces])
        self.bases = [s.base_offset for s in self.segments]
        self.retired += retired
        return retired

    def _swap_group(self, group: CleanedGroup, old: list[Segment]) -> list[Segment]:
        d, base = self.directory, group.base_offset
        for suffix in SEGMENT_SUFFIXES[::-1]:  # .log last: the commit point
            src = os.path.join(d, segment_name(base, suffix) + CLEANED)
            if os.path.exists(src):
                os.replace(src, os.path.join(d, segment_name(base, suffix) + SWAP))
        for seg in old:
            seg.retire()
        for suffix in SEGMENT_SUFFIXES[::-1]:
            src = os.path.join(d, segment_name(base, suffix) + SWAP)
            if os.path.exists(src):
                os.replace(src, os.path.join(d, segment_name(base, suffix)))
        new = Segment(d, base, self.config.index_interval_bytes, _now_ms(), self.handles)
        if not (new.size and new.load_indexes()):
            new.recover(self.config.max_message_bytes)
        new.load_txn_index()
        new.created_ms = old[-1].created_ms
        i = self.segments.index(old[0])
        self.segments[i : i + len(old)] = [new]
        return old

    def unpin_retired(self, segments: list[Segment] | None = None) -> None:
        """Let go of swapped-out segments' descriptors (`segments`, or all): a while after
        the swap, once the fetches that were sending from them are done."""
        for seg in list(self.retired if segments is None else segments):
            seg.unpin()
            if seg in self.retired:
                self.retired.remove(seg)

    def close(self) -> None:
        self.closed = True
        self.unpin_retired()
        try:
            self.write_producer_snapshot()
        finally:
            for seg in self.segments:
                seg.close()
            drain()  # rolled segments are fsynced before a clean stop ends

    def abandon(self) -> None:
        """Let go of every file and write nothing (no producer snapshot, no index entries,
        no wait for the flusher, as close does): the replica is removed and its folder
        deleted next. All of it is cheap enough for the event loop."""
        self.closed = True
        self.unpin_retired()
        for seg in self.segments:
            seg.abandon()

    def delete(self) -> None:
        self.closed = True
        self.unpin_retired()
        for seg in self.segments:
            seg.delete()
        for name in os.listdir(self.directory):
            os.unlink(os.path.join(self.directory, name))
        os.rmdir(self.directory)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
