"""The partition side of transactions (KIP-98): transactional batches, markers, the last
stable offset, the aborted-transaction index (`.txnindex`), producer state on followers
and after a restart, read_committed Fetch, ListOffsets by isolation level,
WriteTxnMarkers and DescribeProducers over the wire, and the log cleaner's rules for
aborted data and markers."""

from __future__ import annotations

import os
import struct

from kafka.record.default_records import DefaultRecordBatchBuilder
from straitmq.broker.producer_state import SequenceError
from straitmq.broker.record_codec import decode_batch
from straitmq.broker.records import (
    InvalidRecords,
    end_txn_marker,
    parse_marker,
    replicated_batches,
    validate_batches,
)
from straitmq.broker.storage import txn_index
from straitmq.broker.storage.log import LogConfig, PartitionLog
from straitmq.broker.storage.txn_index import AbortedTxn

TS = 1_700_000_000_000


def txn_batch(
    pid: int, epoch: int, seq: int, values: list[bytes], transactional: bool = True
) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=transactional,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 20,
    )
    for i, v in enumerate(values):
        b.append(i, TS, b"k" + v, v, [])
    return bytes(b.build())


def produce(plog: PartitionLog, data: bytes) -> int:
    view = memoryview(data)
    batches = validate_batches(view, 1 << 20)
    plog.producers.check(batches)
    return plog.append(view, batches, leader_epoch=0)


def marker(plog: PartitionLog, pid: int, epoch: int, commit: bool, coord_epoch: int = 0) -> int:
    plog.producers.check_marker(pid, epoch, coord_epoch, 1)
    view = memoryview(end_txn_marker(pid, epoch, commit, coord_epoch, TS))
    return plog.append(view, replicated_batches(view), leader_epoch=0)


def values_between(plog: PartitionLog, start: int, end: int) -> list[tuple[int, bytes | None]]:
    out = []
    for raw in plog.batches(start, end):
        if raw[22] & 0x20:
            continue
        out += [(r.offset, r.value) for r in decode_batch(raw) if start <= r.offset < end]
    return out


# -- the wire format of markers ------------------------------------------------------------


def test_marker_batch_bytes_are_kafkas() -> None:
    raw = end_txn_marker(7, 3, True, 5, TS)
    (info,) = validate_batches_allowing_control(raw)
    assert info.attributes == 0x30 and info.producer_id == 7 and info.producer_epoch == 3
    assert info.base_sequence == -1 and info.record_count == 1
    (rec,) = decode_batch(raw)
    assert rec.key == struct.pack(">hh", 0, 1)  # ControlRecordType COMMIT, version 0
    assert rec.value == struct.pack(">hi", 0, 5)  # EndTransactionMarker, coordinator epoch
    assert parse_marker(raw) == (True, 5)
    assert parse_marker(end_txn_marker(7, 3, False, 9, TS)) == (False, 9)


def validate_batches_allowing_control(raw: bytes) -> list:
    return replicated_batches(memoryview(raw))


def test_produce_refuses_client_control_batches_and_txn_without_producer() -> None:
    try:
        validate_batches(memoryview(end_txn_marker(7, 0, True, 0, TS)), 1 << 20)
        raise AssertionError("a client's control batch must be refused")
    except InvalidRecords as e:
        assert e.code == 87
    try:
        validate_batches(memoryview(txn_batch(-1, -1, -1, [b"a"])), 1 << 20)
        raise AssertionError("a transactional batch without a producer id must be refused")
    except InvalidRecords as e:
        assert e.code == 87
    assert validate_batches(memoryview(txn_batch(5, 0, 0, [b"a"])), 1 << 20)[0].attributes == 0x10


# -- storage: LSO, .txnindex, reopen, followers, truncation -----------------------------------


def _scenario(plog: PartitionLog) -> None:
    """pid 1 commits [0,1], pid 2 aborts [2..4] around pid 1's second transaction, pid 3
    stays open."""
    produce(plog, txn_batch(1, 0, 0, [b"a0", b"a1"]))  # 0-1
    assert plog.last_stable_offset(plog.log_end_offset) == 0
    marker(plog, 1, 0, True)  # 2
    assert plog.last_stable_offset(plog.log_end_offset) == 3
    produce(plog, txn_batch(2, 0, 0, [b"b0"]))  # 3
    produce(plog, txn_batch(1, 0, 2, [b"a2"]))  # 4
    produce(plog, txn_batch(2, 0, 1, [b"b1", b"b2"]))  # 5-6
    assert plog.last_stable_offset(plog.log_end_offset) == 3
    marker(plog, 2, 0, False)  # 7: abort, LSO then = pid 1's open txn at 4
    assert plog.last_stable_offset(plog.log_end_offset) == 4
    marker(plog, 1, 0, True)  # 8
    assert plog.last_stable_offset(plog.log_end_offset) == 9
    produce(plog, txn_batch(3, 0, 0, [b"c0"]))  # 9 stays open
    produce(plog, txn_batch(4, 0, 0, [b"plain"], transactional=False))  # 10 idempotent


def test_lso_and_txn_index(tmp_path) -> None:
    path = str(tmp_path / "p")
    plog = PartitionLog(path, LogConfig(segment_bytes=400))
    _scenario(plog)
    assert plog.log_end_offset == 11
    assert plog.last_stable_offset(11) == 9
    expected = [AbortedTxn(2, 3, 7, 4)]
    assert [e for s in plog.segments for e in s.aborted] == expected
    files = [n for n in os.listdir(path) if n.endswith(".txnindex")]
    assert len(files) == 1
    assert txn_index.read(os.path.join(path, files[0])) == expected
    assert os.path.getsize(os.path.join(path, files[0])) == 34
    assert plog.aborted_transactions(0, 11) == expected
    assert plog.aborted_transactions(8, 11) == []
    assert plog.aborted_transactions(0, 3) == []
    # A marker whose high watermark is not passed keeps its transaction unstable.
    plog2 = PartitionLog(str(tmp_path / "q"), LogConfig())
    produce(plog2, txn_batch(1, 0, 0, [b"x"]))
    marker(plog2, 1, 0, True)
    assert plog2.last_stable_offset(1) == 0
    assert plog2.last_stable_offset(2) == 2
    plog.close()
    plog2.close()


def test_reopen_and_follower_agree(tmp_path) -> None:
    path = str(tmp_path / "p")
    plog = PartitionLog(path, LogConfig(segment_bytes=400))
    _scenario(plog)
    aborted = plog.aborted_transactions(0, 11)
    # A crash: no close, no final snapshot; the `.txnindex` is lost too.
    plog.handles.close_all()
    for n in os.listdir(path):
        if n.endswith(".txnindex"):
            os.unlink(os.path.join(path, n))
    for n in os.listdir(path):
        if n.endswith(".snapshot"):
            os.unlink(os.path.join(path, n))
    again = PartitionLog(path, LogConfig(segment_bytes=400))
    assert again.last_stable_offset(11) == 9
    assert again.aborted_transactions(0, 11) == aborted
    assert again.producers.ongoing == {3: 9}
    # A follower built from the leader's bytes.
    follower = PartitionLog(str(tmp_path / "f"), LogConfig(segment_bytes=400))
    data = again.read_bytes(0, 1 << 20, 11)
    while follower.log_end_offset < 11:
        data = again.read_bytes(follower.log_end_offset, 1 << 20, 11)
        view = memoryview(data)
        follower.append_replicated(view, replicated_batches(view))
    assert follower.last_stable_offset(11) == 9
    assert follower.aborted_transactions(0, 11) == aborted
    assert follower.producers.producers[2].coordinator_epoch == 0
    # Clean close and reopen: the snapshot carries the open transaction.
    again.close()
    third = PartitionLog(path, LogConfig(segment_bytes=400))
    assert third.last_stable_offset(11) == 9
    assert third.aborted_transactions(0, 11) == aborted
    third.close()
    follower.close()


def test_truncation_drops_entries_above_the_cut(tmp_path) -> None:
    path = str(tmp_path / "p")
    plog = PartitionLog(path, LogConfig())
    _scenario(plog)
    plog.truncate_to(7)  # the abort marker goes
    assert plog.aborted_transactions(0, 7) == []
    assert plog.last_stable_offset(7) == 3  # pid 2's transaction is open again
    assert not [n for n in os.listdir(path) if n.endswith(".txnindex")]
    marker(plog, 2, 0, False)
    assert plog.aborted_transactions(0, 8) == [AbortedTxn(2, 3, 7, 4)]
    plog.close()


def test_epochs_fence_batches_and_markers(tmp_path) -> None:
    plog = PartitionLog(str(tmp_path / "p"), LogConfig())
    produce(plog, txn_batch(1, 2, 0, [b"a"]))
    try:
        produce(plog, txn_batch(1, 1, 1, [b"zombie"]))
        raise AssertionError("an older epoch must be fenced")
    except SequenceError as e:
        assert e.code == 47  # INVALID_PRODUCER_EPOCH
    try:
        plog.producers.check_marker(1, 1, 0, 1)
        raise AssertionError("a marker with an older epoch must be refused")
    except SequenceError as e:
        assert e.code == 47
    try:  # transactions v2: the marker carries a bumped epoch
        plog.producers.check_marker(1, 2, 0, 2)
        raise AssertionError("a TV2 marker must bump the epoch")
    except SequenceError as e:
        assert e.code == 47
    try:
        produce(plog, txn_batch(1, 2, 1, [b"x"], transactional=False))
        raise AssertionError("a plain batch inside a transaction is INVALID_TXN_STATE")
    except SequenceError as e:
        assert e.code == 48
    marker(plog, 1, 3, False, coord_epoch=4)
    try:
        plog.producers.check_marker(1, 3, 2, 1)
        raise AssertionError("an older coordinator epoch is fenced")
    except SequenceError as e:
        assert e.code == 52  # TRANSACTION_COORDINATOR_FENCED
    # The bumped epoch starts its sequences at 0.
    produce(plog, txn_batch(1, 3, 0, [b"next"]))
    plog.close()
