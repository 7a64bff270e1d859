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
from ..records import HEADER_SIZE, LOG_OVERHEAD, BatchInfo, assign_offsets, parse_header
from .segment import Segment, segment_name

log = logging.getLogger("straitmq.storage")

SNAPSHOT_SUFFIX = ".snapshot"


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


@dataclass(slots=True)
class ReadSlice:
    fd: int
    position: int
    size: int


def _now_ms() -> int:
    return int(time.time() * 1000)


class PartitionLog:
    def __init__(self, directory: str, config: LogConfig) -> None:
        self.directory = directory
        self.config = config
        os.makedirs(directory, exist_ok=True)
        self.segments: list[Segment] = []
        self.bases: list[int] = []
        self.producers = ProducerStateTable()
        self._unflushed_messages = 0
        self._last_flush_ms = _now_ms()
        self._load()

    # -- startup ---------------------------------------------------------------------

    def _load(self) -> None:
        bases = sorted(
            int(name[:-4]) for name in os.listdir(self.directory) if name.endswith(".log")
        )
        now = _now_ms()
        for i, base in enumerate(bases):
            seg = Segment(self.directory, base, self.config.index_interval_bytes, now)
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
            self.segments.append(seg)
        if not self.segments:
            self.segments.append(Segment(self.directory, 0, self.config.index_interval_bytes, now))
        self.bases = [s.base_offset for s in self.segments]
        self._load_producer_state()

    def _snapshots(self) -> list[int]:
        return sorted(
            int(n[: -len(SNAPSHOT_SUFFIX)])
            for n in os.listdir(self.directory)
            if n.endswith(SNAPSHOT_SUFFIX)
        )

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
        i = max(0, bisect_right(self.bases, start) - 1)
        for seg in self.segments[i:]:
            pos = seg.position_of(start) if seg.base_offset < start else 0
            if pos is None:
                continue
            for p, size, base, _max_ts in seg.batches_from(pos):
                info = parse_header(os.pread(seg.fd, HEADER_SIZE, p), 0, size)
                info.base_offset = base
                self.producers.record(info)

    def write_producer_snapshot(self) -> None:
        offset = self.log_end_offset
        path = os.path.join(self.directory, segment_name(offset, SNAPSHOT_SUFFIX))
        data = self.producers.to_json(_now_ms(), self.config.producer_id_expiration_ms)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(orjson.dumps(data))
        os.replace(tmp, path)
        for old in self._snapshots()[:-2]:
            os.unlink(os.path.join(self.directory, segment_name(old, SNAPSHOT_SUFFIX)))

    # -- offsets ---------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base_offset

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
        pieces = assign_offsets(data, batches, base, leader_epoch)
        active.append(pieces, batches, total)
        for b in batches:
            self.producers.record(b)
        self._unflushed_messages += sum(b.last_offset_delta + 1 for b in batches)
        if (
            self._unflushed_messages >= self.config.flush_messages
            or now - self._last_flush_ms >= self.config.flush_ms
        ):
            self.flush()
        return base

    def roll(self) -> Segment:
        old = self.segments[-1]
        old.fsync()
        seg = Segment(
            self.directory, self.log_end_offset, self.config.index_interval_bytes, _now_ms()
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
                return ReadSlice(seg.fd, pos, end - pos)
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
        """(offset, timestamp) of the first record with timestamp >= `timestamp`."""
        from ..record_codec import decode_batch

        for seg in self.segments:
            if seg.max_timestamp < timestamp:
                continue
            for pos, size, _base, max_ts in seg.batches_from(seg.time_position(timestamp)):
                if max_ts >= timestamp:
                    for rec in decode_batch(os.pread(seg.fd, size, pos)):
                        if rec.timestamp >= timestamp:
                            return rec.offset, rec.timestamp
        return None

    # -- retention ----------------------------------------------------------------------

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Delete whole segments beyond retention.ms / retention.bytes; returns how many."""
        now = now_ms if now_ms is not None else _now_ms()
        deleted = 0
        while len(self.segments) > 1:
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
            deleted += 1
        if deleted:
            for old in self._snapshots():
                if old < self.log_start_offset and len(self._snapshots()) > 1:
                    os.unlink(os.path.join(self.directory, segment_name(old, SNAPSHOT_SUFFIX)))
        return deleted

    def drop_segments_before(self, offset: int) -> int:
        """Delete whole segments that end at or before `offset` (never the active one)."""
        dropped = 0
        while len(self.segments) > 1 and self.segments[0].next_offset <= offset:
            self.segments.pop(0).delete()
            self.bases.pop(0)
            dropped += 1
        return dropped

    def close(self) -> None:
        self.write_producer_snapshot()
        for seg in self.segments:
            seg.close()

    def delete(self) -> None:
        for seg in self.segments:
            seg.delete()
        for name in os.listdir(self.directory):
            os.unlink(os.path.join(self.directory, name))
        os.rmdir(self.directory)
