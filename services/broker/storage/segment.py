"""One log segment: `<baseOffset>.log` holding batches as received, plus sparse indexes.

The offset index maps (relative offset -> file position) every `index_interval` bytes;
the time index maps (max timestamp so far -> relative offset) at the same points. Both
live in memory as arrays and are appended to `.index` / `.timeindex` files; a segment
that was not closed cleanly gets them rebuilt by the recovery scan.

The `.log` file's descriptor comes from the broker's bounded cache (`handles.py`): it may
be closed between two uses and reopened on the next. Index files are opened only for
the moment of an append.
"""

from __future__ import annotations

import errno
import os
import struct
from array import array
from bisect import bisect_right
from collections.abc import Iterator

from straitmq.invariants import broken

from ..records import HEADER_SIZE, BatchInfo, check_crc, parse_header
from . import txn_index
from .flusher import close_in_background
from .handles import FileHandles
from .txn_index import TXN_INDEX, AbortedTxn

_LEN = struct.Struct(">qi")
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_SCAN_CHUNK = 1 << 20


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class Segment:
    __slots__ = (
        "_bytes_since_index",
        "_create",
        "_fd",
        "_gone",
        "_pending_index",
        "_pending_time",
        "_pinned",
        "aborted",
        "base_offset",
        "created_ms",
        "directory",
        "handles",
        "index_interval",
        "index_offsets",
        "index_positions",
        "max_timestamp",
        "next_offset",
        "size",
        "tail",
        "time_offsets",
        "time_stamps",
    )

    def __init__(
        self,
        directory: str,
        base_offset: int,
        index_interval: int,
        now_ms: int,
        handles: FileHandles,
        tail: str = "",
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        # ".cleaned": a segment the log cleaner is writing, beside the one it replaces.
        self.tail = tail
        self._pinned = -1
        self.index_interval = index_interval
        self.handles = handles
        self._fd = -1
        self._gone = False
        self._create = True  # the first open may create the file, later ones must not
        self.size = os.fstat(self.fd).st_size
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.created_ms = now_ms
        self.index_offsets = array("i")
        self.index_positions = array("q")
        self.time_stamps = array("q")
        self.time_offsets = array("i")
        self._bytes_since_index = 0
        self._pending_index = bytearray()
        self._pending_time = bytearray()
        # The aborted transactions whose ABORT marker is in this segment (`.txnindex`),
        # in marker order; loaded by `load_txn_index`.
        self.aborted: list[AbortedTxn] = []

    def path(self, suffix: str) -> str:
        return os.path.join(self.directory, segment_name(self.base_offset, suffix) + self.tail)

    @property
    def fd(self) -> int:
        """The `.log` file's descriptor: use it at once, ask again after an await."""
        if self._pinned >= 0:
            return self._pinned
        return self.handles.fd(self)

    def retire(self) -> None:
        """Swapped out by the log cleaner: delete the files, but keep one descriptor of
        the old `.log` so that a fetch still sending a range of it sends the old bytes.
        Reopening by path would find the cleaned file under the same name, with other
        batches at those positions. `unpin` lets go of it later."""
        pinned = os.dup(self.fd)
        self.delete()
        self._pinned = pinned

    def unpin(self) -> None:
        fd, self._pinned = self._pinned, -1
        if fd >= 0:
            os.close(fd)

    def _open_file(self) -> int:
        if self._gone:
            raise FileNotFoundError(errno.ENOENT, "segment closed or deleted", self.path(".log"))
        flags = os.O_RDWR | (os.O_CREAT if self._create else 0)
        fd = os.open(self.path(".log"), flags, 0o644)
        self._create = False
        return fd

    def adopt(self, handles: FileHandles) -> None:
        """Move to another cache (a log loaded in a worker thread joins the broker's)."""
        self.handles.release(self)
        self.handles = handles

    # -- writing -------------------------------------------------------------------

    def append(self, pieces: list, batches: list[BatchInfo], total: int) -> None:
        # Checked before the write: a log whose offsets went wrong must not reach disk.
        # Gaps are allowed (a compacted log, and its followers, keep a rewritten batch's
        # offsets), going back is not.
        expected = self.next_offset
        for b in batches:
            if b.base_offset < expected or b.last_offset_delta < 0:
                broken(
                    "a batch is appended at or after the log end and offsets only grow",
                    segment=self.path(".log"),
                    log_end=expected,
                    base_offset=b.base_offset,
                    last_offset_delta=b.last_offset_delta,
                )
            expected = b.base_offset + b.last_offset_delta + 1
        written = os.pwritev(self.fd, pieces, self.size)
        if written != total:  # a short write on a regular file means the disk is full
            os.ftruncate(self.fd, self.size)
            raise OSError(f"short write to {self.path('.log')}: {written} of {total} bytes")
        pos = self.size
        for b in batches:
            self._note_batch(b.base_offset, b.last_offset_delta, b.max_timestamp, pos, b.size)
            pos += b.size
        self.size = pos

    def _note_batch(self, base: int, last_delta: int, max_ts: int, pos: int, size: int) -> None:
        if self._bytes_since_index >= self.index_interval or not self.index_offsets:
            rel = base - self.base_offset
            self.index_offsets.append(rel)
            self.index_positions.append(pos)
            self._pending_index += _OFFSET_ENTRY.pack(rel, pos)
            self._bytes_since_index = 0
            if max_ts > self.max_timestamp:
                self.time_stamps.append(max_ts)
                self.time_offsets.append(rel)
                self._pending_time += _TIME_ENTRY.pack(max_ts, rel)
        self._bytes_since_index += size
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
        self.next_offset = base + last_delta + 1

    # -- aborted transactions ---------------------------------------------------------

    def add_aborted(self, entry: AbortedTxn) -> None:
        """Written at once (one small append, on ABORT markers only): a crash keeps it
        with the marker, and a torn log tail drops it again at load."""
        txn_index.append(self.path(TXN_INDEX), entry)
        self.aborted.append(entry)

    def load_txn_index(self) -> None:
        self.aborted = txn_index.read(self.path(TXN_INDEX)) or []
        self._trim_aborted()

    def set_aborted(self, entries: list[AbortedTxn]) -> None:
        if entries != self.aborted:
            txn_index.rewrite(self.path(TXN_INDEX), entries)
            self.aborted = entries

    def _trim_aborted(self) -> None:
        """Entries whose marker is not in the segment (cut by a truncation or a torn
        tail) go."""
        end = self.next_offset
        if self.aborted and self.aborted[-1].last_offset >= end:
            self.set_aborted([e for e in self.aborted if e.last_offset < end])

    def flush_indexes(self) -> None:
        # Rare (roll, fsync, close), so the index files are not kept open.
        for suffix, pending in (
            (".index", self._pending_index),
            (".timeindex", self._pending_time),
        ):
            if pending:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
                fd = self.handles.open(self.path(suffix), flags)
                try:
                    written = os.write(fd, pending)
                finally:
                    os.close(fd)
                if written != len(pending):
                    raise OSError(errno.ENOSPC, f"short write to {self.path(suffix)}")
                pending.clear()

    def fsync(self) -> None:
        self.flush_indexes()
        os.fsync(self.fd)

    # -- reading -------------------------------------------------------------------

    def _batch_at(self, pos: int) -> tuple[int, int, int] | None:
        """(base_offset, size, last_offset) of the batch at `pos`, or None at the end."""
        if pos + HEADER_SIZE > self.size:
            return None
        head = os.pread(self.fd, 27, pos)
        base, length = _LEN.unpack_from(head, 0)
        (last_delta,) = struct.unpack_from(">i", head, 23)
        return base, length + 12, base + last_delta

    def position_of(self, offset: int) -> int | None:
        """File position of the first batch whose last offset is >= `offset`."""
        i = bisect_right(self.index_offsets, offset - self.base_offset) - 1
        pos = self.index_positions[i] if i >= 0 else 0
        while True:
            found = self._batch_at(pos)
            if found is None:
                return None
            _base, size, last = found
            if last >= offset:
                return pos
            pos += size

    def end_of_range(self, start: int, max_bytes: int) -> int:
        """Largest batch-aligned end <= start + max_bytes; the first batch always goes
        whole (KIP-74), so a consumer can make progress past a large batch."""
        limit = start + max_bytes
        if limit >= self.size:
            return self.size
        first = self._batch_at(start)
        if first is None:
            return start
        pos = start + first[1]
        if pos >= limit:
            return pos
        i = bisect_right(self.index_positions, limit) - 1
        if i >= 0 and self.index_positions[i] > pos:
            pos = self.index_positions[i]
        while True:
            found = self._batch_at(pos)
            if found is None or pos + found[1] > limit:
                return pos
            pos += found[1]

    def batches_from(self, pos: int) -> Iterator[tuple[int, int, int, int]]:
        """(position, size, base_offset, max_timestamp) of each batch from `pos` on."""
        for p, size, head in self.headers_from(pos):
            info = parse_header(head, 0, 0)
            yield p, size, info.base_offset, info.max_timestamp

    def headers_from(self, pos: int) -> Iterator[tuple[int, int, bytes]]:
        """(position, size, 61-byte header) of each batch from `pos` on; records unread."""
        while pos + HEADER_SIZE <= self.size:
            head = os.pread(self.fd, HEADER_SIZE, pos)
            size = _LEN.unpack_from(head, 0)[1] + 12
            yield pos, size, head
            pos += size

    def last_header(self) -> bytes | None:
        """Header of the last batch (found through the index), or None if empty."""
        if not self.size:
            return None
        pos = self.position_of(self.next_offset - 1)
        return None if pos is None else os.pread(self.fd, HEADER_SIZE, pos)

    def time_position(self, timestamp: int) -> int:
        i = bisect_right(self.time_stamps, timestamp - 1) - 1
        if i < 0:
            return 0
        found = self.position_of(self.base_offset + self.time_offsets[i])
        return found if found is not None else 0

    # -- recovery --------------------------------------------------------------------

    def recover(self, max_batch_bytes: int) -> int:
        """Scan every batch, check its CRC, rebuild indexes, cut a torn or corrupt tail.

        Returns how many bytes were truncated.
        """
        self.index_offsets = array("i")
        self.index_positions = array("q")
        self.time_stamps = array("q")
        self.time_offsets = array("i")
        self._bytes_since_index = 0
        self.max_timestamp = -1
        self.next_offset = self.base_offset
        file_size = os.fstat(self.fd).st_size
        pos = 0
        buf = b""
        buf_start = 0
        expected = self.base_offset
        while pos < file_size:
            if pos + HEADER_SIZE > buf_start + len(buf):
                buf = os.pread(self.fd, max(_SCAN_CHUNK, HEADER_SIZE), pos)
                buf_start = pos
                if len(buf) < HEADER_SIZE:
                    break
            rel = pos - buf_start
            _base, length = _LEN.unpack_from(buf, rel)
            size = length + 12
            if length < HEADER_SIZE - 12 or size > max(max_batch_bytes, _SCAN_CHUNK) * 2:
                break
            if pos + size > file_size:
                break
            if rel + size > len(buf):
                buf = os.pread(self.fd, max(_SCAN_CHUNK, size), pos)
                buf_start = pos
                rel = 0
            if buf[rel + 16] != 2 or not check_crc(buf, rel, size):
                break
            info = parse_header(buf, rel, size)
            if info.base_offset < expected:
                break
            self._note_batch(
                info.base_offset, info.last_offset_delta, info.max_timestamp, pos, size
            )
            expected = info.base_offset + info.last_offset_delta + 1
            pos += size
        truncated = file_size - pos
        if truncated:
            os.ftruncate(self.fd, pos)
        self.size = pos
        self._rewrite_indexes()
        self._trim_aborted()
        return truncated

    def load_indexes(self) -> bool:
        """Load index files of a closed segment; False if they look wrong."""
        try:
            data = self._read_file(".index")
            tdata = self._read_file(".timeindex")
        except FileNotFoundError:
            return False
        if len(data) % 8 or len(tdata) % 12 or not data:
            return False
        for rel, pos in _OFFSET_ENTRY.iter_unpack(data):
            self.index_offsets.append(rel)
            self.index_positions.append(pos)
        for ts, rel in _TIME_ENTRY.iter_unpack(tdata):
            self.time_stamps.append(ts)
            self.time_offsets.append(rel)
        if self.index_positions[-1] >= self.size and self.size:
            return False
        # The last batch gives next_offset and (with the time index) the max timestamp.
        last = None
        for pos, size, base, max_ts in self.batches_from(self.index_positions[-1]):
            last = (pos, size, base)
            self.max_timestamp = max(self.max_timestamp, max_ts)
        if last is None:
            return False
        found = self._batch_at(last[0])
        assert found is not None
        self.next_offset = found[2] + 1
        if self.time_stamps:
            self.max_timestamp = max(self.max_timestamp, self.time_stamps[-1])
        return True

    def _read_file(self, suffix: str) -> bytes:
        fd = self.handles.open(self.path(suffix), os.O_RDONLY)
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read()
        finally:
            os.close(fd)

    def _rewrite_indexes(self) -> None:
        self._pending_index = bytearray(
            b"".join(
                _OFFSET_ENTRY.pack(r, p)
                for r, p in zip(self.index_offsets, self.index_positions, strict=True)
            )
        )
        self._pending_time = bytearray(
            b"".join(
                _TIME_ENTRY.pack(t, r)
                for t, r in zip(self.time_stamps, self.time_offsets, strict=True)
            )
        )
        for suffix in (".index", ".timeindex"):
            try:
                os.unlink(self.path(suffix))
            except FileNotFoundError:
                pass
        self.flush_indexes()

    def truncate_to(self, offset: int) -> None:
        """Drop the batch holding `offset` and every later one, so the segment ends at a
        batch boundary <= `offset`; indexes, next offset and max timestamp are rebuilt
        by a rescan (rare: follower truncation after a leader change)."""
        pos = self.position_of(offset)
        if pos is None:
            return
        os.ftruncate(self.fd, pos)
        self.size = pos
        self.recover(1 << 31)

    def close(self) -> None:
        """Flush the indexes and let go of the file for good (a later use fails)."""
        if self._gone:
            return
        try:
            self.flush_indexes()
        finally:
            self._gone = True
            self.handles.release(self)

    def abandon(self) -> None:
        """Let go of the file without writing the pending index entries: its folder is
        about to be deleted whole."""
        self._pending_index.clear()
        self._pending_time.clear()
        self.close()

    def delete(self) -> None:
        self._pending_index.clear()  # nothing to keep: a full disk must not stop a delete
        self._pending_time.clear()
        # A descriptor of our own keeps the file's blocks until the flusher thread closes
        # it: freeing a GiB segment's blocks at the unlink would hold the event loop.
        keep = _hold(self._fd, self.path(".log"))
        self.close()
        self.aborted = []
        try:
            self._unlink_files()
        finally:
            if keep >= 0:
                close_in_background(keep, self.path(".log"))

    def _unlink_files(self) -> None:
        for suffix in (".log", ".index", ".timeindex", TXN_INDEX):
            try:
                os.unlink(self.path(suffix))
            except FileNotFoundError:
                pass


def _hold(fd: int, path: str) -> int:
    """Another descriptor of the file (a duplicate of `fd` if open, else `path` opened
    read-only), or -1 if none can be had (gone already, or no descriptor left: then the
    unlink frees the blocks itself)."""
    try:
        return os.dup(fd) if fd >= 0 else os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
