"""Partition log: append, read ranges, roll, indexes, retention, reopen, producer state."""

from __future__ import annotations

import os
import threading

from conftest import record_batch
from straitmq.broker.record_codec import build_batch, decode_batch
from straitmq.broker.records import validate_batches
from straitmq.broker.storage.log import LogConfig, PartitionLog


def _append(plog: PartitionLog, values: list[bytes], ts: int = 1_700_000_000_000) -> int:
    batch = build_batch([(None, v, []) for v in values], ts)
    view = memoryview(batch)
    return plog.append(view, validate_batches(view, 1 << 20), leader_epoch=0)


def _read_all(plog: PartitionLog, start: int = 0) -> list[tuple[int, bytes]]:
    out = []
    for raw in plog.batches(start, plog.log_end_offset):
        out += [(rec.offset, rec.value) for rec in decode_batch(raw) if rec.offset >= start]
    reached = out[-1][0] + 1 if out else start
    assert reached == plog.log_end_offset, f"no data at {reached}"
    return out


def test_append_read_roll_and_reopen(tmp_path):
    cfg = LogConfig(segment_bytes=2000, index_interval_bytes=200)
    plog = PartitionLog(str(tmp_path / "p"), cfg)
    expected = []
    for i in range(100):
        vals = [f"v{i}-{j}".encode() for j in range(3)]
        base = _append(plog, vals)
        assert base == i * 3
        expected += [(base + j, v) for j, v in enumerate(vals)]
    assert plog.log_end_offset == 300
    assert len(plog.segments) > 3, "segment.bytes should have rolled the log"
    assert _read_all(plog) == expected
    # Reads starting in the middle of a batch return that batch.
    assert _read_all(plog, 151)[0] == (151, b"v50-1")
    plog.close()

    reopened = PartitionLog(str(tmp_path / "p"), cfg)
    assert reopened.log_end_offset == 300
    assert _read_all(reopened) == expected
    assert _append(reopened, [b"after"]) == 300


def test_max_bytes_is_batch_aligned_and_first_batch_whole(tmp_path):
    plog = PartitionLog(str(tmp_path / "p"), LogConfig(index_interval_bytes=100))
    for i in range(20):
        _append(plog, [b"x" * 100, f"{i}".encode()])
    one = plog.read(0, 10, plog.log_end_offset)
    assert one is not None
    first_size = int.from_bytes(os.pread(one.fd, 12, 0)[8:12], "big") + 12
    assert one.size == first_size, "a too-small max_bytes still returns one whole batch"
    some = plog.read(0, first_size * 3 + 5, plog.log_end_offset)
    assert some is not None and some.size == first_size * 3
    # The high watermark bounds what is visible.
    bounded = plog.read(0, 1 << 20, 4)
    assert bounded is not None and bounded.size == first_size * 2


def test_retention_by_bytes_and_time(tmp_path):
    cfg = LogConfig(segment_bytes=500, retention_bytes=1500)
    plog = PartitionLog(str(tmp_path / "p"), cfg)
    for _ in range(40):
        _append(plog, [b"y" * 100])
    before = len(plog.segments)
    assert plog.apply_retention() > 0
    assert len(plog.segments) < before
    assert plog.size_bytes - plog.segments[0].size < 1500
    assert plog.log_start_offset > 0
    assert _read_all(plog, plog.log_start_offset)[0][0] == plog.log_start_offset

    old = PartitionLog(str(tmp_path / "q"), LogConfig(segment_bytes=300, retention_ms=1000))
    for i in range(10):
        _append(old, [b"z" * 100], ts=1000 + i)
    now_ms = 1000 + 10 + 5000
    old.apply_retention(now_ms)
    assert len(old.segments) == 1, "all but the active segment were past retention.ms"


def test_offset_for_timestamp(tmp_path):
    plog = PartitionLog(str(tmp_path / "p"), LogConfig(segment_bytes=400, index_interval_bytes=50))
    for i in range(30):
        _append(plog, [f"t{i}".encode()], ts=10_000 + i * 10)
    assert plog.offset_for_timestamp(10_000) == (0, 10_000)
    assert plog.offset_for_timestamp(10_125) == (13, 10_130)
    assert plog.offset_for_timestamp(10_290) == (29, 10_290)
    assert plog.offset_for_timestamp(99_999) is None


def test_producer_state_survives_reopen(tmp_path):
    from straitmq.broker.producer_state import DuplicateBatch

    path = str(tmp_path / "p")
    plog = PartitionLog(path, LogConfig(segment_bytes=600))

    def idem_batch(seq: int) -> memoryview:
        return memoryview(record_batch([f"s{seq}".encode()], (77, 0, seq), 1_700_000_000_000))

    for seq in range(12):
        view = idem_batch(seq)
        batches = validate_batches(view, 1 << 20)
        plog.producers.check(batches)
        plog.append(view, batches, 0)
    # Simulate a crash: no close(), so no final producer snapshot.
    plog.handles.close_all()
    reopened = PartitionLog(path, LogConfig(segment_bytes=600))
    dup = validate_batches(idem_batch(11), 1 << 20)
    try:
        reopened.producers.check(dup)
        raise AssertionError("a retried batch must be recognised after a restart")
    except DuplicateBatch as d:
        assert d.cached.base_offset == 11
    nxt = validate_batches(idem_batch(12), 1 << 20)
    reopened.producers.check(nxt)


def _txn(pid: int, seq: int, value: bytes) -> bytes:
    """A transactional batch of one record (attributes bit 4 set, CRC recomputed)."""
    import struct

    from crc32c import crc32c

    data = bytearray(record_batch([value], (pid, 0, seq), 1_700_000_000_000))
    struct.pack_into(">h", data, 21, 0x10)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


def test_txn_index_goes_with_its_segment(tmp_path):
    """An ABORT marker's `.txnindex` entry lives in its segment's file: retention deletes
    it with the segment, a truncation below the marker removes it."""
    from straitmq.broker.records import end_txn_marker, replicated_batches

    path = str(tmp_path / "p")
    plog = PartitionLog(path, LogConfig(segment_bytes=250, retention_bytes=0))
    for i in range(3):
        view = memoryview(_txn(9, i, b"t%d" % i))
        plog.append(view, validate_batches(view, 1 << 20), 0)
        marker = memoryview(end_txn_marker(9, 0, False, 0, 1_700_000_000_000))
        plog.append(marker, replicated_batches(marker), 0)
    indexes = sorted(n for n in os.listdir(path) if n.endswith(".txnindex"))
    assert len(indexes) >= 2
    assert [e.first_offset for s in plog.segments for e in s.aborted] == [0, 2, 4]
    plog.roll()
    plog.apply_retention()
    assert len(plog.segments) == 1
    assert not [n for n in os.listdir(path) if n.endswith(".txnindex")]
    assert plog.aborted_transactions(0, plog.log_end_offset) == []


def test_producer_snapshot_of_an_older_broker_loads(tmp_path):
    """Snapshots written before transactions hold [pid, epoch, batches] per producer."""
    import orjson

    path = str(tmp_path / "p")
    plog = PartitionLog(path, LogConfig())
    view = memoryview(record_batch([b"a"], (5, 2, 0)))  # now: not expired at the snapshot
    plog.append(view, validate_batches(view, 1 << 20), 0)
    plog.close()
    (snap,) = [n for n in os.listdir(path) if n.endswith(".snapshot")]
    with open(os.path.join(path, snap), "rb") as f:
        data = orjson.loads(f.read())
    with open(os.path.join(path, snap), "wb") as f:
        f.write(orjson.dumps([entry[:3] for entry in data]))
    again = PartitionLog(path, LogConfig())
    entry = again.producers.producers[5]
    assert entry.epoch == 2 and entry.last_seq() == 0 and entry.txn_first == -1
    assert again.last_stable_offset(again.log_end_offset) == again.log_end_offset
    again.close()


def test_a_rolled_segment_is_fsynced_off_the_calling_thread(tmp_path, monkeypatch):
    """The roll's fsync (up to a segment of dirty pages) runs in the flusher thread, not
    on the event loop that appends; it syncs the rolled segment's file, and a clean close
    waits for it."""
    from straitmq.broker.storage import flusher

    synced: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((threading.current_thread().name, os.fstat(fd).st_ino))
        real_fsync(fd)

    monkeypatch.setattr(flusher.os, "fsync", fsync)
    plog = PartitionLog(str(tmp_path / "p"), LogConfig(segment_bytes=2000))
    while len(plog.segments) < 3:
        _append(plog, [b"x" * 300])
    rolled = [os.stat(s.path(".log")).st_ino for s in plog.segments[:-1]]
    plog.close()  # waits for the flusher
    assert [ino for _, ino in synced] == rolled
    assert all(name.startswith("segment-flush") for name, _ in synced)
    assert threading.current_thread().name not in {name for name, _ in synced}


def test_a_deleted_segments_blocks_are_freed_off_the_calling_thread(tmp_path, monkeypatch):
    """Retention unlinks a segment on the event loop, but the last descriptor of its .log
    (whose close frees the blocks: tens of ms for a GiB) is closed in the flusher thread."""
    from straitmq.broker.storage import flusher

    freed: list[tuple[str, int]] = []  # closes of files already unlinked: these free them
    real_close = os.close

    def close(fd: int) -> None:
        st = os.fstat(fd)
        if st.st_nlink == 0:
            freed.append((threading.current_thread().name, st.st_ino))
        real_close(fd)

    plog = PartitionLog(str(tmp_path / "p"), LogConfig(segment_bytes=500, retention_bytes=600))
    for _ in range(20):
        _append(plog, [b"y" * 100])
    assert flusher.drain(30)  # the rolls' fsyncs, before counting closes
    inodes = {os.stat(s.path(".log")).st_ino for s in plog.segments[:-1]}
    monkeypatch.setattr(flusher.os, "close", close)
    # Fewer than the flusher's queue holds (past it, a close is done inline instead).
    deleted = plog.apply_retention(limit=flusher.MAX_PENDING // 2)
    assert deleted == flusher.MAX_PENDING // 2
    assert flusher.drain(30)
    monkeypatch.undo()
    assert len(freed) == deleted and {ino for _, ino in freed} <= inodes
    assert all(name.startswith("segment-flush") for name, _ in freed)
    plog.close()


def test_retention_deletes_at_most_the_limit_per_call(tmp_path):
    """The broker's retention walk takes a few segments per loop turn (limit), calling
    again until fewer than the limit were due."""
    plog = PartitionLog(str(tmp_path / "p"), LogConfig(segment_bytes=500, retention_bytes=600))
    for _ in range(40):
        _append(plog, [b"y" * 100])
    due = len(plog.segments)
    calls = []
    while (n := plog.apply_retention(limit=3)) == 3:
        calls.append(n)
    calls.append(n)
    assert len(calls) > 2 and all(c <= 3 for c in calls)
    assert plog.size_bytes - plog.segments[0].size < 600 and len(plog.segments) < due
    plog.close()
