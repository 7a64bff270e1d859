"""One cleaning of one partition's log: what the log cleaner's worker runs.

Kafka's `Cleaner.doClean`, on files only, so that it can run in another process:

1. the *offset map*: key -> offset of its latest record, over the dirty part of the log
   (from the checkpointed first dirty offset to the end of what may be cleaned). Memory
   is bounded (`max_map_entries`): when the map is full, this round cleans up to where
   the map got, and the next round goes on from there.
2. the *copy*: every closed segment from the start of the log up to where the map
   ended, in groups that fit one segment, is copied into `<base>.log.cleaned` (with its
   indexes), keeping a record only if no later record of its key is in the map.
   Offsets never change: a rewritten batch keeps its base and last offsets, a batch
   whose records all go is dropped (an idempotent producer's last batch is kept empty,
   so its sequence survives), so a compacted log has gaps.
3. the result names each group's `.cleaned` files; the log swaps them in on the event
   loop (`PartitionLog.swap_cleaned`), which checks that the segments are still those
   this job read.

Tombstones (a key with a null value) are kept for `delete.retention.ms` after their batch
was first cleaned, as Kafka 3+ does it (KIP-534): that cleaning stamps the batch with a
delete horizon (attribute bit 6, the horizon in the base timestamp field), and a later
cleaning after the horizon drops them. Records without a key cannot be compacted and
go (the produce path refuses them on a compacted topic; older data may hold some).

Transactions, as Kafka's cleaner (CleanedTransactionMetadata): the job carries the
aborted transactions of the range (from the `.txnindex` files); their batches never
enter the offset map and are removed. A marker goes once no batch of its transaction
was met in this cleaning (an ABORT's data goes in the cleaning before) and, like a
tombstone, `delete.retention.ms` after the cleaning that first found it removable
(KIP-534: that cleaning stamps its delete horizon); its `.txnindex` entry goes with
it. A producer's last batch stays, emptied, so that its epoch and sequence survive.
Committed transactional data is compacted like any other. Nothing at or past the last
stable offset is cleaned (the caller bounds `clean_end` by it).
"""

from __future__ import annotations

import errno
import os
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..records import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    parse_header,
    parse_marker,
)
from . import txn_index
from .batch_filter import ParsedBatch, map_keys, parse_batch, rebuild_batch
from .handles import FileHandles
from .segment import Segment
from .txn_index import TXN_INDEX, AbortedTxn

CLEANED = ".cleaned"
SWAP = ".swap"
# `.log` first: swaps rename it last (reversed), the point a restart completes them from.
SEGMENT_SUFFIXES = (".log", ".index", ".timeindex", ".txnindex")
_READ_CHUNK = 1 << 20
_WRITE_CHUNK = 1 << 20
# Kafka's index entries hold a 32-bit offset relative to the segment's base.
_MAX_RELATIVE = 2**31 - 1


class CorruptSegment(ValueError):
    """A segment the cleaner cannot read: it stops cleaning that partition and says why."""


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """A closed segment as the worker sees it: its files never change while it exists."""

    base_offset: int
    next_offset: int
    size: int


@dataclass(frozen=True, slots=True)
class CleanJob:
    directory: str
    segments: tuple[SegmentFile, ...]  # every closed segment from the log start on
    first_dirty: int  # offsets below were cleaned before (the checkpoint)
    clean_end: int  # nothing at or after this offset is cleaned (the active segment, lag)
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int  # a group of merged segments stays below this
    index_interval: int
    max_map_entries: int
    io_bytes_per_second: float  # <= 0: unthrottled
    # producer id -> last offset of its last batch in the log: that batch stays, if only
    # empty, so the producer's sequence survives (Kafka's cleaner does the same).
    producer_last_offsets: dict[int, int] = field(default_factory=dict)
    # The aborted transactions overlapping the segments, from their `.txnindex` files:
    # (producer id, first offset, last offset = the ABORT marker's).
    aborted: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    base_offset: int  # the new segment's base: the first replaced segment's
    replaces: tuple[int, ...]  # bases of the segments it replaces, in order
    size: int


@dataclass(slots=True)
class CleanResult:
    groups: list[CleanedGroup]
    map_end: int  # the next cleaning's first dirty offset
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    # The earliest delete horizon of the tombstones kept: once it passes, the log is
    # cleaned again even with nothing dirty, so that they go.
    horizon_ms: int | None = None
    seconds: float = 0.0


class _Throttle:
    """log.cleaner.io.max.bytes.per.second over reads and writes together."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.done = 0

    def account(self, n: int) -> None:
        self.done += n
        if self.rate <= 0:
            return
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0.01:
            time.sleep(ahead)  # a worker's own thread: nothing else waits on it


def _batches(path: str, size: int, throttle: _Throttle) -> Iterator[memoryview]:
    """Every whole batch of a closed `.log` file, read a chunk at a time."""
    try:
        f = open(path, "rb", buffering=0)
    except FileNotFoundError as e:
        raise _Gone(path) from e
    try:
        pos = 0
        buf = b""
        buf_start = 0
        while pos < size:
            rel = pos - buf_start
            if rel + LOG_OVERHEAD > len(buf) or rel + _length(buf, rel) > len(buf):
                want = _READ_CHUNK
                if rel + LOG_OVERHEAD <= len(buf):
                    want = max(want, _length(buf, rel))
                f.seek(pos)
                buf = f.read(min(want, size - pos))
                throttle.account(len(buf))
                buf_start, rel = pos, 0
                if len(buf) < HEADER_SIZE:
                    raise CorruptSegment(f"{path}: batch header cut at position {pos}")
            n = _length(buf, rel)
            if n < HEADER_SIZE or rel + n > len(buf):
                raise CorruptSegment(f"{path}: batch at position {pos} has length {n}")
            yield memoryview(buf)[rel : rel + n]
            pos += n
    finally:
        f.close()


def _length(buf: bytes, rel: int) -> int:
    return int.from_bytes(buf[rel + 8 : rel + 12], "big", signed=True) + LOG_OVERHEAD


class _Gone(Exception):
    """A segment was deleted under the job (retention, truncation): nothing to swap."""


def _parse(batch: memoryview, path: str) -> ParsedBatch:
    try:
        return parse_batch(batch)
    except ValueError as e:
        base = int.from_bytes(batch[:8], "big", signed=True)
        raise CorruptSegment(f"{path}: batch at offset {base}: {e}") from e


def _log_path(directory: str, base: int) -> str:
    return os.path.join(directory, f"{base:020d}.log")


class _Transactions:
    """Which batches belong to aborted transactions, and which markers may go, as the
    batches are met in offset order (Kafka's CleanedTransactionMetadata)."""

    def __init__(self, aborted: tuple[tuple[int, int, int], ...], start: int = -1) -> None:
        # Only transactions whose marker is at or past where the batches start: those
        # closed before it are no one's now.
        self.pending = deque(sorted((a for a in aborted if a[2] >= start), key=lambda a: a[1]))
        # producer id -> [its aborted transaction's last offset, whether a batch was met]
        self.aborted: dict[int, list] = {}
        self.committed: set[int] = set()  # producers with transactional data met
        self.removed_markers: set[int] = set()  # offsets of the ABORT markers that went

    def _reach(self, offset: int) -> None:
        pending = self.pending
        while pending and pending[0][1] <= offset:
            pid, _first, last = pending.popleft()
            self.aborted[pid] = [last, False]

    def batch_aborted(self, producer_id: int, last: int, attributes: int) -> bool:
        self._reach(last)
        if not attributes & ATTR_TRANSACTIONAL:
            return False
        txn = self.aborted.get(producer_id)
        if txn is not None:
            if last <= txn[0]:
                txn[1] = True
                return True
            # Past the transaction's end: its marker was cleaned away before (the index
            # keeps the entry), and this batch is a later transaction's.
            del self.aborted[producer_id]
        self.committed.add(producer_id)
        return False

    def marker_removable(self, producer_id: int, last: int, raw: memoryview) -> bool:
        """A control batch: True if its transaction has no batch left to mark."""
        self._reach(last)
        marker = parse_marker(raw)
        if marker is None:
            return not int.from_bytes(raw[57:61], "big")  # an emptied marker: nothing
        if not marker[0]:
            txn = self.aborted.pop(producer_id, None)
            return txn is None or not txn[1]
        if producer_id in self.committed:
            self.committed.discard(producer_id)
            return False
        return True


def _ids(raw: memoryview) -> tuple[int, int, int]:
    """(producer id, last offset, attributes) from a batch header."""
    h = HEADER.unpack_from(raw, 0)
    return h[9], h[0] + h[6], h[5]


def build_offset_map(job: CleanJob, throttle: _Throttle, result: CleanResult) -> dict[bytes, int]:
    """key -> latest offset over [first_dirty, clean_end), stopping (at a batch edge)
    once `max_map_entries` keys are held; sets `result.map_end`. Records of aborted
    transactions are left out (Kafka's rule: they are never the latest of a key)."""
    offsets: dict[bytes, int] = {}
    txns = _Transactions(job.aborted, job.first_dirty)
    end = job.first_dirty
    for seg in job.segments:
        if seg.next_offset <= job.first_dirty or seg.base_offset >= job.clean_end:
            continue
        path = _log_path(job.directory, seg.base_offset)
        for raw in _batches(path, seg.size, throttle):
            last = int.from_bytes(raw[:8], "big", signed=True) + int.from_bytes(
                raw[23:27], "big", signed=True
            )
            if last < job.first_dirty:
                continue
            if last >= job.clean_end:
                break
            pid, _last, attributes = _ids(raw)
            if attributes & ATTR_CONTROL:  # no keys to map
                txns.marker_removable(pid, last, raw)
                end = last + 1
                continue
            if txns.batch_aborted(pid, last, attributes):
                end = last + 1
                continue
            count = int.from_bytes(raw[57:61], "big", signed=True)
            if len(offsets) + count > job.max_map_entries and offsets:
                result.map_end = end
                return offsets
            try:
                map_keys(raw, offsets)
            except ValueError as e:
                base = int.from_bytes(raw[:8], "big", signed=True)
                raise CorruptSegment(f"{path}: batch at offset {base}: {e}") from e
            end = last + 1
        end = max(end, min(seg.next_offset, job.clean_end))
    result.map_end = end
    return offsets


def group_segments(segments: list[SegmentFile], max_bytes: int) -> list[list[SegmentFile]]:
    """Consecutive segments merged while their sizes fit one segment and their offsets
    fit a 32-bit relative index (Kafka's groupSegmentsBySize)."""
    groups: list[list[SegmentFile]] = []
    for seg in segments:
        g = groups[-1] if groups else None
        if (
            g is not None
            and sum(s.size for s in g) + seg.size <= max_bytes
            and seg.next_offset - 1 - g[0].base_offset <= _MAX_RELATIVE
        ):
            g.append(seg)
        else:
            groups.append([seg])
    return groups


def clean(job: CleanJob) -> CleanResult:
    """Run one cleaning (see the module doc). Raises CorruptSegment on unreadable data;
    returns a result with no groups if a segment went away meanwhile."""
    started = time.monotonic()
    throttle = _Throttle(job.io_bytes_per_second)
    result = CleanResult([], job.first_dirty)
    try:
        offsets = build_offset_map(job, throttle, result)
        latest = sorted(offsets.values())
        to_clean = [s for s in job.segments if s.base_offset < result.map_end]
        # One pass over every segment from the log start: a marker goes only when no
        # batch of its transaction is left anywhere before it.
        txns = _Transactions(job.aborted)
        for group in group_segments(to_clean, job.segment_bytes):
            result.groups.append(_clean_group(job, group, offsets, latest, result, throttle, txns))
    except _Gone:
        remove_cleaned(job.directory)
        return CleanResult([], job.first_dirty)
    except BaseException:
        remove_cleaned(job.directory)
        raise
    result.bytes_read = throttle.done - result.bytes_written
    result.seconds = time.monotonic() - started
    return result


def _clean_group(
    job: CleanJob,
    group: list[SegmentFile],
    offsets: dict[bytes, int],
    latest: list[int],
    result: CleanResult,
    throttle: _Throttle,
    txns: _Transactions,
) -> CleanedGroup:
    base = group[0].base_offset
    for suffix in SEGMENT_SUFFIXES:  # a leftover of a crashed cleaning
        _unlink(os.path.join(job.directory, f"{base:020d}{suffix}{CLEANED}"))
    out = Segment(job.directory, base, job.index_interval, job.now_ms, FileHandles(2), CLEANED)
    # The cleaned segment answers for the aborted transactions of those it replaces.
    aborted: list[AbortedTxn] = []
    for seg in group:
        aborted += (
            txn_index.read(os.path.join(job.directory, f"{seg.base_offset:020d}{TXN_INDEX}")) or []
        )
    pending: list[bytes | memoryview] = []
    infos = []
    pending_bytes = 0
    horizon = job.now_ms + job.delete_retention_ms
    try:
        for seg in group:
            path = _log_path(job.directory, seg.base_offset)
            for raw in _batches(path, seg.size, throttle):
                kept = _filter(raw, path, job, offsets, latest, result, horizon, txns)
                if kept is None:
                    continue
                info = parse_header(kept, 0, len(kept))
                info.position = pending_bytes
                infos.append(info)
                pending.append(kept)
                pending_bytes += len(kept)
                if pending_bytes >= _WRITE_CHUNK:
                    _write(out, pending, infos, pending_bytes, throttle, result)
                    pending, infos, pending_bytes = [], [], 0
        if pending:
            _write(out, pending, infos, pending_bytes, throttle, result)
        # An aborted transaction whose marker went has no data left either: a reader
        # told of it would take the producer's later transactions for it (a client
        # drops a producer's batches from the entry's first offset until it meets an
        # ABORT marker), so its entry goes with the marker.
        out.set_aborted([e for e in aborted if e.last_offset not in txns.removed_markers])
        out.fsync()  # flushed before the swap, as Kafka's cleaner does
        size = out.size
    finally:
        out.close()
    return CleanedGroup(base, tuple(s.base_offset for s in group), size)


def _write(
    out: Segment,
    pieces: list[bytes | memoryview],
    infos: list,
    total: int,
    throttle: _Throttle,
    result: CleanResult,
) -> None:
    out.append(pieces, infos, total)
    throttle.account(total)
    result.bytes_written += total


def _filter(
    raw: memoryview,
    path: str,
    job: CleanJob,
    offsets: dict[bytes, int],
    latest: list[int],
    result: CleanResult,
    horizon: int,
    txns: _Transactions,
) -> bytes | memoryview | None:
    """The batch as it goes into the cleaned segment: unchanged, rewritten, or None."""
    pid, last, attributes = _ids(raw)
    if attributes & ATTR_CONTROL:
        return _filter_marker(raw, path, job, result, horizon, txns)
    if txns.batch_aborted(pid, last, attributes):
        p = _parse(raw, path)
        result.records_read += len(p.records)
        result.records_removed += len(p.records)
        if pid >= 0 and job.producer_last_offsets.get(pid) == last:
            return rebuild_batch(p, [])
        return None
    if _all_superseded(raw, pid, last, job, latest, result.map_end):
        n = int.from_bytes(raw[57:61], "big", signed=True)  # records count
        result.records_read += n
        result.records_removed += n
        return None
    p = _parse(raw, path)
    result.records_read += len(p.records)
    map_end = result.map_end
    past_horizon = p.delete_horizon_ms is not None and job.now_ms >= p.delete_horizon_ms
    kept: list[int] = []
    tombstones = 0
    for i, r in enumerate(p.records):
        if r.offset >= map_end:
            kept.append(i)  # not seen by the map yet: a later round decides
        elif r.key is None:
            continue
        elif offsets.get(r.key, -1) > r.offset:
            continue  # a later record of this key exists
        elif r.tombstone and past_horizon:
            result.tombstones_removed += 1
            continue
        else:
            kept.append(i)
            tombstones += r.tombstone
    result.records_removed += len(p.records) - len(kept)
    # A tombstone's first cleaning starts its delete.retention.ms (KIP-534).
    stamp = horizon if tombstones and p.delete_horizon_ms is None else None
    if tombstones:
        h = stamp if stamp is not None else p.delete_horizon_ms
        if h is not None and (result.horizon_ms is None or h < result.horizon_ms):
            result.horizon_ms = h
    if len(kept) == len(p.records) and stamp is None:
        return raw
    if not kept:
        last = p.base_offset + p.last_offset_delta
        if p.producer_id >= 0 and job.producer_last_offsets.get(p.producer_id) == last:
            return rebuild_batch(p, [])
        return None
    return rebuild_batch(p, kept, delete_horizon_ms=stamp)


def _all_superseded(
    raw: memoryview, pid: int, last: int, job: CleanJob, latest: list[int], map_end: int
) -> bool:
    """Whether every record of a (not aborted, not control) batch goes, read from its
    header alone: most batches of a log being compacted, and decompressing and walking
    them a second time was most of a cleaning's time. For a batch inside
    [first_dirty, map_end) the offset map holds each of its keys, so a record stays only
    if the map keeps its very offset, and `latest` (the map's offsets, sorted) has none
    in the batch. The map pass checked its CRC."""
    base = int.from_bytes(raw[:8], "big", signed=True)
    if base < job.first_dirty or last >= map_end:
        return False
    i = bisect_left(latest, base)
    if i < len(latest) and latest[i] <= last:
        return False
    return not (pid >= 0 and job.producer_last_offsets.get(pid) == last)


def _filter_marker(
    raw: memoryview,
    path: str,
    job: CleanJob,
    result: CleanResult,
    horizon: int,
    txns: _Transactions,
) -> bytes | memoryview | None:
    """A transaction marker: kept while its transaction has data; then stamped with a
    delete horizon (KIP-534), and removed once that has passed."""
    pid, last, _attributes = _ids(raw)
    if not txns.marker_removable(pid, last, raw):
        return raw
    p = _parse(raw, path)
    h = p.delete_horizon_ms
    if h is None:
        if not p.records:
            return raw  # emptied already: the producer's last batch
        if result.horizon_ms is None or horizon < result.horizon_ms:
            result.horizon_ms = horizon
        return rebuild_batch(p, range(len(p.records)), delete_horizon_ms=horizon)
    if job.now_ms < h:
        if result.horizon_ms is None or h < result.horizon_ms:
            result.horizon_ms = h
        return raw
    result.records_removed += len(p.records)
    txns.removed_markers.add(last)
    if job.producer_last_offsets.get(pid) == last:
        return raw if not p.records else rebuild_batch(p, [])
    return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_cleaned(directory: str) -> None:
    """Delete every `.cleaned` file (a cleaning that did not finish)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(CLEANED):
            _unlink(os.path.join(directory, name))


def is_disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)
