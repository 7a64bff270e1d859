"""Partition log for replication: follower appends, leader epoch cache, truncation,
log start moves and resets, each checked again after reopening the log from disk."""

from __future__ import annotations

import os
import struct
import time
from typing import Any

import pytest
from conftest import record_batch
from straitmq.broker.producer_state import DuplicateBatch
from straitmq.broker.record_codec import decode_batch
from straitmq.broker.records import InvalidRecords, replicated_batches, validate_batches
from straitmq.broker.storage.epochs import CHECKPOINT_NAME, LeaderEpochCache
from straitmq.broker.storage.log import (
    LOG_START_CHECKPOINT,
    LogConfig,
    OffsetOutOfRange,
    PartitionLog,
    UnexpectedAppendOffset,
)

TS = int(time.time() * 1000)  # recent: producer snapshots drop expired producers
PID = 4242
CFG = LogConfig(segment_bytes=300, index_interval_bytes=100)  # 3 batches a segment


def _append(plog: PartitionLog, values: list[bytes], epoch: int, seq: int | None = None) -> int:
    producer = (PID, 0, seq) if seq is not None else None
    view = memoryview(record_batch(values, producer, TS))
    batches = validate_batches(view, 1 << 20)
    plog.producers.check(batches)
    return plog.append(view, batches, epoch)


def _replicate(leader: PartitionLog, follower: PartitionLog, max_bytes: int) -> None:
    """What a fetcher does: read from the follower's end, append exactly those bytes."""
    while follower.log_end_offset < leader.log_end_offset:
        view = memoryview(
            leader.read_bytes(follower.log_end_offset, max_bytes, leader.log_end_offset)
        )
        follower.append_replicated(view, replicated_batches(view))


def _values(plog: PartitionLog) -> list[tuple[int, bytes]]:
    out = []
    for raw in plog.batches(plog.log_start_offset, plog.log_end_offset):
        out += [(rec.offset, rec.value) for rec in decode_batch(raw)]
    reached = out[-1][0] + 1 if out else plog.log_start_offset
    assert reached == plog.log_end_offset
    return out


def _files(plog: PartitionLog, suffixes: tuple[str, ...]) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(plog.directory)):
        if name.endswith(suffixes):
            with open(os.path.join(plog.directory, name), "rb") as f:
                out[name] = f.read()
    return out


def _epoch_of_batches(plog: PartitionLog) -> list[tuple[int, int]]:
    """(base offset, partitionLeaderEpoch) of every batch, read back from the files."""
    return [
        (int.from_bytes(raw[:8], "big"), struct.unpack_from(">i", raw, 12)[0])
        for raw in plog.batches(plog.log_start_offset, plog.log_end_offset)
    ]


def _build(path: str, epochs: list[int]) -> tuple[PartitionLog, list[tuple[int, bytes]]]:
    """A log with one idempotent 2-record batch per entry of `epochs` (sequence 2*i)."""
    plog = PartitionLog(path, CFG)
    expected = []
    for i, epoch in enumerate(epochs):
        values = [f"e{epoch}-{i}a".encode(), f"e{epoch}-{i}b".encode()]
        base = _append(plog, values, epoch, seq=2 * i)
        assert base == 2 * i
        expected += [(base, values[0]), (base + 1, values[1])]
    return plog, expected


def _is_duplicate(plog: PartitionLog, i: int) -> bool:
    """Would a retry of batch number `i` (as built by `_build`) be a duplicate?"""
    view = memoryview(record_batch([b"x", b"y"], (PID, 0, 2 * i), TS))
    try:
        plog.producers.check(validate_batches(view, 1 << 20))
    except DuplicateBatch as d:
        assert d.cached.base_offset == 2 * i
        return True
    return False


# -- leader epoch cache ----------------------------------------------------------------------


def test_end_offset_for_kip279_cases(tmp_path: Any) -> None:
    cache = LeaderEpochCache(str(tmp_path))
    assert cache.end_offset_for(0, 0) == (-1, -1), "empty cache"
    assert cache.assign(1, 5)
    assert cache.assign(3, 10)
    assert not cache.assign(3, 12), "same epoch again is ignored"
    assert not cache.assign(2, 20), "a lower epoch is ignored"
    assert cache.assign(4, 25)
    assert cache.entries == [(1, 5), (3, 10), (4, 25)]
    leo = 40
    assert cache.end_offset_for(4, leo) == (4, 40), "latest epoch ends at the log end"
    assert cache.end_offset_for(3, leo) == (3, 25)
    assert cache.end_offset_for(1, leo) == (1, 10)
    assert cache.end_offset_for(2, leo) == (1, 10), "between known epochs: the one below"
    assert cache.end_offset_for(0, leo) == (0, 5), "below the earliest: its start (Kafka)"
    assert cache.end_offset_for(5, leo) == (-1, -1), "above the latest: undefined"
    assert cache.end_offset_for(-1, leo) == (-1, -1), "undefined epoch"
    with pytest.raises(ValueError):
        cache.assign(6, 24)  # offsets never go backwards
    # An epoch that wrote nothing is replaced by the next one at the same offset (Kafka).
    assert cache.assign(6, 25)
    assert cache.entries == [(1, 5), (3, 10), (6, 25)]
    # The epoch a record was written in (ListOffsets answers it with offsets).
    assert [cache.epoch_for(o) for o in (4, 5, 9, 10, 24, 25, 99)] == [-1, 1, 1, 3, 3, 6, 6]

    reopened = LeaderEpochCache(str(tmp_path))
    assert reopened.load() and reopened.entries == cache.entries
    assert reopened.latest_epoch == 6


def test_epoch_cache_truncation(tmp_path: Any) -> None:
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, start in [(0, 0), (2, 10), (5, 20), (7, 30)]:
        cache.assign(epoch, start)
    cache.truncate_from_end(31)
    assert cache.entries == [(0, 0), (2, 10), (5, 20), (7, 30)]
    cache.truncate_from_end(30)
    assert cache.entries == [(0, 0), (2, 10), (5, 20)] and cache.latest_epoch == 5
    cache.truncate_from_start(10)
    assert cache.entries == [(2, 10), (5, 20)]
    cache.truncate_from_start(15)
    assert cache.entries == [(2, 15), (5, 20)]
    cache.truncate_from_start(25)
    assert cache.entries == [(5, 25)]
    assert cache.end_offset_for(2, 40) == (2, 25)
    cache.truncate_from_end(0)
    assert cache.entries == [] and cache.latest_epoch == -1
    reopened = LeaderEpochCache(str(tmp_path))
    assert reopened.load() and reopened.entries == []
    # A torn or foreign checkpoint reads as missing.
    with open(os.path.join(tmp_path, CHECKPOINT_NAME), "wb") as f:
        f.write(b"0\n3\n1 0\n")
    assert not reopened.load() and reopened.entries == []


# -- follower append ---------------------------------------------------------------------------


@pytest.mark.parametrize("fetch_bytes", [1, 1000, 1 << 20])
def test_replicated_log_is_byte_identical(tmp_path: Any, fetch_bytes: int) -> None:
    epochs = [0, 0, 0, 1, 1, 3, 3, 3, 3, 4, 4, 4, 4, 4]
    leader, expected = _build(str(tmp_path / "leader"), epochs)
    follower = PartitionLog(str(tmp_path / "follower"), CFG)
    _replicate(leader, follower, fetch_bytes)

    assert follower.log_end_offset == leader.log_end_offset == 2 * len(epochs)
    assert _values(follower) == expected
    assert _epoch_of_batches(follower) == [(2 * i, e) for i, e in enumerate(epochs)]
    logs_l, logs_f = _files(leader, (".log",)), _files(follower, (".log",))
    assert b"".join(logs_f.values()) == b"".join(logs_l.values())
    if fetch_bytes == 1:  # one batch per append: the same rolls, hence the same files
        assert logs_f == logs_l
    assert follower.epochs.entries == leader.epochs.entries == [(0, 0), (1, 6), (3, 10), (4, 18)]
    assert _is_duplicate(follower, len(epochs) - 1)
    for e in (0, 1, 2, 3, 4):
        assert follower.end_offset_for(e) == leader.end_offset_for(e)

    # Reads through the follower's indexes land on the right batches.
    for offset in range(0, follower.log_end_offset, 3):
        raw = follower.read_bytes(offset, 1, follower.log_end_offset)
        base = int.from_bytes(raw[:8], "big")
        assert base <= offset < base + 2

    leader.close()
    follower.close()
    if fetch_bytes == 1:
        idx = (".index", ".timeindex", ".log")
        assert _files(follower, idx) == _files(leader, idx)
    follower = PartitionLog(str(tmp_path / "follower"), CFG)
    assert _values(follower) == expected
    assert follower.epochs.entries == [(0, 0), (1, 6), (3, 10), (4, 18)]
    assert _is_duplicate(follower, len(epochs) - 1)
    follower.close()


def test_replicated_append_checks_offsets(tmp_path: Any) -> None:
    leader, _ = _build(str(tmp_path / "leader"), [0, 0, 1, 1])
    follower = PartitionLog(str(tmp_path / "follower"), CFG)
    # Batches that go back are refused before anything is written (a gap is fine: a
    # compacted leader's log has them).
    back = memoryview(leader.read_bytes(2, 1, 4) + leader.read_bytes(0, 1, 2))
    with pytest.raises(InvalidRecords, match="overlaps"):
        replicated_batches(back)
    # A flipped bit is caught by the CRC check.
    raw = bytearray(leader.read_bytes(0, 1, leader.log_end_offset))
    raw[-1] ^= 1
    with pytest.raises(InvalidRecords):
        replicated_batches(memoryview(raw))
    assert follower.log_end_offset == 0 and os.path.getsize(follower.segments[0].path(".log")) == 0
    follower.append_replicated(memoryview(b""), [])
    _replicate(leader, follower, 1 << 20)
    assert follower.log_end_offset == 8
    # A batch below the log end: the follower must truncate first.
    again = memoryview(leader.read_bytes(2, 1, leader.log_end_offset))
    with pytest.raises(UnexpectedAppendOffset) as e:
        follower.append_replicated(again, replicated_batches(again))
    assert (e.value.expected, e.value.first_offset, e.value.last_offset) == (8, 2, 3)
    assert follower.log_end_offset == 8


# -- truncation ----------------------------------------------------------------------------------

EPOCHS = [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3]  # 14 batches of 2 records: offsets 0..27


@pytest.mark.parametrize(
    ("offset", "end"),
    [
        (26, 26),  # one batch, in the active segment
        (24, 24),  # the epoch 3 boundary
        (18, 18),  # a segment boundary
        (14, 14),  # across segments, at the epoch 2 boundary
        (11, 10),  # inside a batch: cut before it
        (2, 2),  # nearly everything
        (0, 0),  # everything
    ],
)
def test_truncate_to(tmp_path: Any, offset: int, end: int) -> None:
    path = str(tmp_path / "p")
    plog, expected = _build(path, EPOCHS)
    assert plog.bases == [0, 6, 12, 18, 24]
    plog.write_producer_snapshot()  # a snapshot above the cut must not come back
    assert plog.truncate_to(offset) == end
    full_epochs = [(0, 0), (1, 6), (2, 14), (3, 24)]
    want_epochs = [(e, s) for e, s in full_epochs if s < end]
    kept = end // 2  # batches left

    def check(plog: PartitionLog) -> None:
        assert plog.log_end_offset == end
        assert _values(plog) == expected[:end]
        assert plog.epochs.entries == want_epochs
        for s in plog._snapshots():
            assert s <= end
        if kept:
            assert _is_duplicate(plog, kept - 1), "a surviving batch is still a duplicate"
        assert not _is_duplicate(plog, kept), "a truncated batch is new again"

    check(plog)
    # The log takes appends at once: the next batch gets the truncated offsets again.
    assert _append(plog, [b"new-a", b"new-b"], 5, seq=2 * kept) == end
    expected = [*expected[:end], (end, b"new-a"), (end + 1, b"new-b")]
    want_epochs = [*want_epochs, (5, end)]
    end += 2
    kept += 1
    check(plog)

    _crash(plog)  # no close: indexes and producer state come from the files alone
    plog = PartitionLog(path, CFG)
    check(plog)
    for o in range(0, end, 3):
        raw = plog.read_bytes(o, 1, end)
        assert int.from_bytes(raw[:8], "big") <= o
    assert plog.end_offset_for(5) == (5, end)
    plog.close()
    plog = PartitionLog(path, CFG)
    check(plog)
    plog.close()


def test_truncate_limits(tmp_path: Any) -> None:
    plog, _ = _build(str(tmp_path / "p"), EPOCHS)
    assert plog.truncate_to(100) == 28, "beyond the end: nothing to cut"
    # A leader that assigned its epoch but never appended: truncation drops that entry.
    plog.epochs.assign(9, plog.log_end_offset)
    assert plog.truncate_to(28) == 28
    assert plog.epochs.latest_epoch == 3
    plog.drop_segments_before(12)
    assert plog.log_start_offset > 0
    with pytest.raises(OffsetOutOfRange):
        plog.truncate_to(plog.log_start_offset - 1)
    plog.close()


def test_follower_drops_an_epoch_it_never_wrote(tmp_path: Any) -> None:
    """Leader in epoch 5 without appending, then follower of a leader whose log goes on
    with epoch 4 batches it never saw: the empty epoch 5 must not hide them."""
    leader, _ = _build(str(tmp_path / "leader"), [0, 0, 4, 4, 4])
    follower = PartitionLog(str(tmp_path / "follower"), CFG)
    view = memoryview(leader.read_bytes(0, 1 << 20, 6))
    follower.append_replicated(view, replicated_batches(view))
    assert follower.epochs.entries == [(0, 0), (4, 4)]
    follower.epochs.assign(5, follower.log_end_offset)  # became leader, wrote nothing
    _replicate(leader, follower, 1 << 20)
    assert follower.epochs.entries == [(0, 0), (4, 4)]
    assert follower.end_offset_for(0) == (0, 4)
    assert follower.end_offset_for(4) == (4, 10)
    leader.close()
    follower.close()


def _crash(plog: PartitionLog) -> None:
    """Let go of the files as a killed process does: pending index entries are lost."""
    plog.handles.close_all()


def test_checkpoint_and_log_agree_after_reopen(tmp_path: Any) -> None:
    path = str(tmp_path / "p")
    plog, expected = _build(path, EPOCHS)
    checkpoint = os.path.join(path, CHECKPOINT_NAME)
    with open(checkpoint, "rb") as f:
        ahead = f.read()
    plog.truncate_to(12)
    _crash(plog)
    # A crash between cutting the log and rewriting the checkpoint: it is ahead.
    with open(checkpoint, "wb") as f:
        f.write(ahead)
    plog = PartitionLog(path, CFG)
    assert plog.log_end_offset == 12
    assert plog.epochs.entries == [(0, 0), (1, 6)]
    _crash(plog)

    # Missing (a log from before the cache existed): rebuilt from the batch headers.
    plog = PartitionLog(str(tmp_path / "q"), CFG)
    plog.close()
    full, _ = _build(str(tmp_path / "full"), EPOCHS)
    full.close()
    os.unlink(os.path.join(full.directory, CHECKPOINT_NAME))
    full = PartitionLog(full.directory, CFG)
    assert full.epochs.entries == [(0, 0), (1, 6), (2, 14), (3, 24)]
    assert os.path.exists(os.path.join(full.directory, CHECKPOINT_NAME))
    # Behind the log (a lost rename after a machine crash): rebuilt too.
    full.epochs.truncate_from_end(14)
    full.close()
    full = PartitionLog(full.directory, CFG)
    assert full.epochs.entries == [(0, 0), (1, 6), (2, 14), (3, 24)]
    assert _values(full) == expected
    full.close()


# -- log start moves and resets -----------------------------------------------------------------


def test_advance_start_and_retention_trim_epochs(tmp_path: Any) -> None:
    path = str(tmp_path / "p")
    plog, expected = _build(path, EPOCHS)
    assert plog.bases == [0, 6, 12, 18, 24]
    assert plog.advance_start(5) == 0, "no segment ends at or before it"
    assert plog.log_start_offset == 5, "the log start may sit inside a segment and a batch"
    assert plog.epochs.entries == [(0, 5), (1, 6), (2, 14), (3, 24)]
    assert plog.advance_start(3) == 0 and plog.log_start_offset == 5, "never backwards"
    assert plog.advance_start(13) == 2
    start = plog.log_start_offset
    assert start == 13 and plog.bases == [12, 18, 24]
    want = [(1, 13), (2, 14), (3, 24)]  # epoch 0 is gone, epoch 1 now starts at 13
    assert plog.epochs.entries == want
    assert plog.end_offset_for(0) == (0, 13)
    # Reads start at the batch holding the start (12-13), as Kafka's do; callers filter.
    assert _values(plog) == [(o, v) for o, v in expected if o >= 12]
    with pytest.raises(OffsetOutOfRange):
        plog.advance_start(plog.log_end_offset + 1)
    plog.close()
    plog = PartitionLog(path, CFG)
    assert plog.log_start_offset == start and plog.epochs.entries == want, "checkpointed"
    assert _is_duplicate(plog, len(EPOCHS) - 1)

    plog.config = LogConfig(segment_bytes=300, retention_bytes=1)
    assert plog.apply_retention() == 2
    assert plog.bases == [24] and plog.log_start_offset == 24
    assert plog.epochs.entries == [(3, 24)]
    plog.close()
    plog = PartitionLog(path, CFG)
    assert plog.epochs.entries == [(3, 24)] and plog.log_start_offset == 24
    plog.close()


def test_log_start_inside_a_segment(tmp_path: Any) -> None:
    """DeleteRecords' log start: timestamps, retention, truncation and a reset respect it."""
    path = str(tmp_path / "p")
    plog, expected = _build(path, EPOCHS)  # segments [0, 6, 12, 18, 24]
    assert plog.advance_start(19) == 3 and plog.bases == [18, 24]
    assert plog.offset_for_timestamp(0) == (19, TS), "the first record at or after the start"
    assert plog.max_timestamp_offset() == (19, TS, 2), "equal timestamps: the first one"
    # Retention with nothing to delete by time or size keeps the start where it is.
    assert plog.apply_retention() == 0 and plog.log_start_offset == 19
    # Retention deletes a segment wholly below the start; here the start is in the
    # first one, so nothing goes until the start passes its end.
    assert plog.advance_start(24) == 1 and plog.bases == [24]
    assert plog.advance_start(25) == 0
    plog.close()
    plog = PartitionLog(path, CFG)
    assert plog.log_start_offset == 25
    # A follower truncating into the batch holding its start: the start comes down to
    # the new end (what lay between is gone), and stays there after a reopen.
    assert plog.truncate_to(25) == 24
    assert (plog.log_start_offset, plog.log_end_offset) == (24, 24)
    plog.close()
    plog = PartitionLog(path, CFG)
    assert (plog.log_start_offset, plog.log_end_offset) == (24, 24)
    # reset_to drops the checkpoint with the segments: the new base is the start.
    plog.reset_to(30)
    plog.close()
    plog = PartitionLog(path, CFG)
    assert (plog.log_start_offset, plog.log_end_offset) == (30, 30)
    plog.close()
    assert expected[-1][0] == 27

    # A crash after the checkpoint was written but before the segments below it went:
    # they go when the log is opened.
    path = str(tmp_path / "crashed")
    plog, _ = _build(path, EPOCHS)
    plog.close()
    with open(os.path.join(path, LOG_START_CHECKPOINT), "w") as f:
        f.write("13\n")
    plog = PartitionLog(path, CFG)
    assert plog.log_start_offset == 13 and plog.bases == [12, 18, 24]
    assert plog.epochs.entries == [(1, 13), (2, 14), (3, 24)]
    plog.close()


def test_reset_to_starts_empty_at_the_leaders_log_start(tmp_path: Any) -> None:
    path = str(tmp_path / "p")
    plog, _ = _build(path, [0, 0, 1])
    plog.write_producer_snapshot()
    with open(os.path.join(path, ".topic-id"), "w") as f:
        f.write("t")
    # The leader's log after retention: it starts at 20, epochs 6 then 7.
    leader = PartitionLog(str(tmp_path / "leader"), CFG)
    leader.reset_to(20)
    for i, epoch in enumerate([6, 6, 7]):
        assert _append(leader, [f"l{i}".encode()], epoch, seq=i) == 20 + i

    plog.reset_to(leader.log_start_offset)
    assert (plog.log_start_offset, plog.log_end_offset) == (20, 20)
    assert plog.epochs.entries == [] and plog._snapshots() == []
    assert not _is_duplicate(plog, 0)
    assert sorted(os.listdir(path)) == [".topic-id", "00000000000000000020.log", CHECKPOINT_NAME]
    plog.close()
    plog = PartitionLog(path, CFG)
    assert (plog.log_start_offset, plog.log_end_offset) == (20, 20)
    _replicate(leader, plog, 1 << 20)
    assert _values(plog) == [(20, b"l0"), (21, b"l1"), (22, b"l2")]
    assert plog.epochs.entries == [(6, 20), (7, 22)]
    assert plog.end_offset_for(5) == (5, 20)
    plog.close()
    plog = PartitionLog(path, CFG)
    assert _values(plog) == [(20, b"l0"), (21, b"l1"), (22, b"l2")]
    assert plog.epochs.entries == [(6, 20), (7, 22)]
    plog.close()
    leader.close()


def test_max_timestamp_offset(tmp_path: Any) -> None:
    """ListOffsets -3: the record with the largest timestamp, wherever it is, its batch's
    epoch; the first one on a tie; nothing in an empty log."""
    plog = PartitionLog(str(tmp_path / "p"), CFG)
    assert plog.max_timestamp_offset() is None
    for i, (ts, epoch) in enumerate([(TS, 0), (TS + 50, 1), (TS + 10, 1), (TS + 50, 2)]):
        view = memoryview(record_batch([b"a%d" % i, b"b%d" % i], None, ts))
        plog.append(view, validate_batches(view, 1 << 20), epoch)
    assert len(plog.segments) > 1
    assert plog.max_timestamp_offset() == (2, TS + 50, 1)
    plog.close()


def test_empty_follower_starts_at_a_log_start_inside_a_batch(tmp_path: Any) -> None:
    """After DeleteRecords put the leader's log start inside a batch, a new (empty)
    follower reset to that start is sent the whole batch: it starts its log at the
    batch's base, keeps the log start, and the bytes match the leader's."""
    leader, expected = _build(str(tmp_path / "leader"), EPOCHS)
    leader.advance_start(15)  # inside the batch 14-15
    # A log with records still refuses a batch that starts below its end.
    other, _ = _build(str(tmp_path / "other"), EPOCHS[:7])
    _append(other, [b"x"], 2)
    assert other.log_end_offset == 15
    with pytest.raises(UnexpectedAppendOffset):
        _replicate(leader, other, 1 << 20)
    other.close()
    follower = PartitionLog(str(tmp_path / "f"), CFG)
    follower.reset_to(leader.log_start_offset)
    assert (follower.log_start_offset, follower.log_end_offset) == (15, 15)
    _replicate(leader, follower, 1 << 20)
    assert follower.log_start_offset == 15 and follower.bases[0] == 14
    assert _values(follower) == [(o, v) for o, v in expected if o >= 14]
    assert follower.epochs.entries == [(2, 14), (3, 24)]
    follower.close()
    follower = PartitionLog(str(tmp_path / "f"), CFG)
    assert (follower.log_start_offset, follower.log_end_offset) == (15, 28)
    follower.close()
    leader.close()
