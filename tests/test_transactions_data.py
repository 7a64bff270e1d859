"""The partition side of transactions (KIP-98): transactional batches, markers, the last
stable offset, the aborted-transaction index (`.txnindex`), producer state on followers
and after a restart, read_committed Fetch, ListOffsets by isolation level,
WriteTxnMarkers and DescribeProducers over the wire, and the log cleaner's rules for
aborted data and markers."""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
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
from test_acls import secured
from test_errors import MS, Raw, code, fetch, kio_module, list_offsets, make, new_topic, raw
from test_errors import produce as produce_req

__all__ = ["raw", "secured"]  # the fixtures, imported for the tests below

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
    for batch in plog.batches(start, end):
        if batch[22] & 0x20:
            continue
        out += [(r.offset, r.value) for r in decode_batch(batch) if start <= r.offset < end]
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


# -- over the wire: Produce, WriteTxnMarkers, Fetch, ListOffsets, DescribeProducers ------------

INVALID_PRODUCER_EPOCH = 47
INVALID_RECORD = 87
UNKNOWN_TOPIC_OR_PARTITION = 3


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from conftest import BrokerProcess

    # This module plays the coordinator itself (its own markers), so the partition
    # leader's verification with a coordinator (KIP-890) is off, as the flag allows.
    b = BrokerProcess(
        tmp_path_factory.mktemp("txn") / "data",
        extra_args=["--no-transaction-partition-verification"],
    ).start()
    yield b
    b.stop()


def write_markers(
    version: int, pid: int, epoch: int, commit: bool, topic: str, parts: tuple[int, ...] = (0,)
) -> Any:
    """v2 markers say transactions v2 (the coordinator bumped the epoch)."""
    m = kio_module("write_txn_markers", version)
    return m.WriteTxnMarkersRequest(
        markers=(
            make(
                m.WritableTxnMarker,
                producer_id=pid,
                producer_epoch=epoch,
                transaction_result=commit,
                topics=(m.WritableTxnMarkerTopic(name=topic, partition_indexes=parts),),
                coordinator_epoch=0,
                transaction_version=2 if version >= 2 else 0,
            ),
        )
    )


def marker_errors(resp: Any) -> list[int]:
    return [code(p) for m in resp.markers for t in m.topics for p in t.partitions]


def fetch_isolated(version: int, topic: str, offset: int, isolation: int, **kw: Any) -> Any:
    req = fetch(version, topic, offset)
    return dataclass_replace(req, isolation_level=isolation, **kw)


def dataclass_replace(obj: Any, **kw: Any) -> Any:
    return dataclasses.replace(obj, **kw)


def part_of(resp: Any) -> Any:
    (t,) = resp.responses
    (p,) = t.partitions
    return p


def data_offsets(records: bytes | None) -> list[int]:
    """Offsets of the data records (control batches skipped), as a client sees them before
    it filters aborted transactions."""
    out = []
    data = records or b""
    pos = 0
    while pos + 12 <= len(data):
        size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        if not data[pos + 22] & 0x20:
            out += [r.offset for r in decode_batch(data[pos : pos + size])]
        pos += size
    return out


def latest(r: Raw, topic: str, isolation: int) -> int:
    req = dataclass_replace(list_offsets(5, topic, -1), isolation_level=isolation)
    (t,) = r.call(req).topics
    (p,) = t.partitions
    assert code(p) == 0
    return p.offset


@pytest.mark.parametrize("version", [4, 12])
def test_read_committed_over_the_wire(txn_broker: Any, raw: Any, version: int) -> None:
    r: Raw = raw(txn_broker)
    topic = f"txn-wire-{version}"
    new_topic(r, topic)
    p1, p2 = 1000 + version, 2000 + version
    for data in (txn_batch(p1, 0, 0, [b"a0", b"a1"]), txn_batch(p2, 0, 0, [b"b0"])):
        resp = r.call(dataclass_replace(produce_req(7, topic, data), transactional_id="tx"))
        assert code(resp.responses[0].partition_responses[0]) == 0
    # Nothing is stable yet: read_committed sees nothing, read_uncommitted everything.
    rc = part_of(r.call(fetch_isolated(version, topic, 0, 1)))
    assert code(rc) == 0 and rc.high_watermark == 3 and rc.last_stable_offset == 0
    assert data_offsets(rc.records) == [] and rc.aborted_transactions == ()
    ru = part_of(r.call(fetch_isolated(version, topic, 0, 0)))
    assert data_offsets(ru.records) == [0, 1, 2]
    assert ru.last_stable_offset == 0 and ru.aborted_transactions is None
    assert latest(r, topic, 1) == 0 and latest(r, topic, 0) == 3
    # The coordinator's markers: p1 commits, p2 aborts.
    assert marker_errors(r.call(write_markers(1, p1, 0, True, topic))) == [0]
    assert latest(r, topic, 1) == 2  # p2's transaction at 2 is still open
    assert marker_errors(r.call(write_markers(1, p2, 0, False, topic))) == [0]
    rc = part_of(r.call(fetch_isolated(version, topic, 0, 1)))
    assert rc.high_watermark == 5 and rc.last_stable_offset == 5
    assert data_offsets(rc.records) == [0, 1, 2]
    assert [(a.producer_id, a.first_offset) for a in rc.aborted_transactions] == [(p2, 2)]
    # From its marker on it is still listed (Kafka's overlap rule), not from past it.
    rc = part_of(r.call(fetch_isolated(version, topic, 4, 1)))
    assert [a.producer_id for a in rc.aborted_transactions] == [p2]
    rc = part_of(r.call(fetch_isolated(version, topic, 5, 1)))
    assert rc.aborted_transactions == () and data_offsets(rc.records) == []
    assert latest(r, topic, 1) == 5


def test_fencing_and_bad_input_over_the_wire(txn_broker: Any, raw: Any) -> None:
    r: Raw = raw(txn_broker)
    topic = "txn-fence"
    new_topic(r, topic)

    def send(data: bytes) -> int:
        resp = r.call(dataclass_replace(produce_req(7, topic, data), transactional_id="tx"))
        return code(resp.responses[0].partition_responses[0])

    assert send(txn_batch(77, 3, 0, [b"x"])) == 0
    assert send(txn_batch(77, 2, 0, [b"zombie"])) == INVALID_PRODUCER_EPOCH
    assert send(end_txn_marker(77, 3, True, 0, TS)) == INVALID_RECORD  # a client's marker
    # Transactional records in a request without a transactional id (Kafka's rule).
    resp = r.call(produce_req(7, topic, txn_batch(78, 0, 0, [b"x"])))
    assert code(resp.responses[0].partition_responses[0]) == 53
    assert marker_errors(r.call(write_markers(1, 77, 2, True, topic))) == [INVALID_PRODUCER_EPOCH]
    # Transactions v2: the marker must carry a bumped epoch.
    v2 = write_markers(2, 77, 3, True, topic)
    assert marker_errors(r.call(v2)) == [INVALID_PRODUCER_EPOCH]
    assert marker_errors(r.call(write_markers(2, 77, 4, True, topic))) == [0]
    assert marker_errors(r.call(write_markers(1, 77, 4, True, "no-such-topic"))) == [
        UNKNOWN_TOPIC_OR_PARTITION
    ]
    assert marker_errors(r.call(write_markers(1, 77, 4, True, topic, (5,)))) == [
        UNKNOWN_TOPIC_OR_PARTITION
    ]
    # DescribeProducers shows the producer with its bumped epoch and no open transaction.
    m = kio_module("describe_producers", 0)
    resp = r.call(
        m.DescribeProducersRequest(topics=(m.TopicRequest(name=topic, partition_indexes=(0,)),))
    )
    (t,) = resp.topics
    (p,) = t.partitions
    assert code(p) == 0
    (state,) = p.active_producers
    assert (state.producer_id, state.producer_epoch, state.current_txn_start_offset) == (77, 4, -1)
    assert state.coordinator_epoch == 0
    assert send(txn_batch(77, 4, 0, [b"again"])) == 0
    (p,) = (
        r.call(
            m.DescribeProducersRequest(topics=(m.TopicRequest(name=topic, partition_indexes=(0,)),))
        )
        .topics[0]
        .partitions
    )
    assert p.active_producers[0].current_txn_start_offset == 2
    assert p.active_producers[0].last_sequence == 0


def test_read_committed_long_poll_wakes_on_the_marker(txn_broker: Any, raw: Any) -> None:
    r: Raw = raw(txn_broker)
    topic = "txn-poll"
    new_topic(r, topic)
    resp = r.call(
        dataclass_replace(produce_req(7, topic, txn_batch(5, 0, 0, [b"v"])), transactional_id="t")
    )
    assert code(resp.responses[0].partition_responses[0]) == 0
    got: list[Any] = []
    poller = raw(txn_broker)
    req = fetch_isolated(12, topic, 0, 1, min_bytes=1, max_wait=20_000 * MS)
    th = threading.Thread(target=lambda: got.append(poller.call(req)))
    started = time.monotonic()
    th.start()
    # The open transaction's record is past the LSO: the fetch waits, then the commit
    # marker makes it visible.
    th.join(0.5)
    assert th.is_alive(), "a read_committed fetch must not count records past the LSO"
    assert marker_errors(r.call(write_markers(1, 5, 0, True, topic))) == [0]
    th.join(15)
    assert not th.is_alive() and time.monotonic() - started < 15
    p = part_of(got[0])
    assert data_offsets(p.records) == [0] and p.last_stable_offset == 2


# -- the log cleaner and transactions -----------------------------------------------------------

DAY = 24 * 3600 * 1000


class CleanerSettings:
    threads = 1
    io_max_bytes_per_second = 0.0
    dedupe_buffer_size = 1 << 27
    backoff_ms = 50
    enable = True


def _batches(plog: PartitionLog) -> list[tuple[int, int, int, int]]:
    """(base offset, attributes, producer id, record count) of every batch."""
    out = []
    for b in plog.batches(plog.log_start_offset, plog.log_end_offset):
        out.append(
            (
                int.from_bytes(b[0:8], "big"),
                int.from_bytes(b[21:23], "big"),
                int.from_bytes(b[43:51], "big", signed=True),
                int.from_bytes(b[57:61], "big"),
            )
        )
    return out


def test_cleaner_removes_aborted_data_then_markers(tmp_path) -> None:
    from straitmq.broker.log_cleaner import clean_in_place

    path = str(tmp_path / "p")
    cfg = LogConfig(segment_bytes=300, compact=True, delete=False, index_interval_bytes=100)
    plog = PartitionLog(path, cfg)
    produce(plog, txn_batch(1, 0, 0, [b"a"]))  # 0: committed, key ka
    produce(plog, txn_batch(2, 0, 0, [b"a", b"b"]))  # 1-2: aborted, keys ka kb
    marker(plog, 2, 0, False)  # 3
    marker(plog, 1, 0, True)  # 4
    # 5: producer 2 writes on (else its last batch stays, emptied, and keeps its marker)
    produce(plog, txn_batch(2, 0, 2, [b"d"], transactional=False))
    produce(plog, txn_batch(3, 0, 0, [b"c"]))  # 6: still open at the end
    plog.roll()
    end = plog.log_end_offset
    assert plog.last_stable_offset(end) == 6
    t0 = TS
    r = clean_in_place(plog, end, CleanerSettings(), t0)
    assert r is not None and r.records_removed == 2
    batches = _batches(plog)
    # The aborted batch is gone and did not shadow key "ka": the committed record stays.
    assert [b[0] for b in batches if not b[1] & 0x20] == [0, 5, 6]
    assert values_between(plog, 0, end) == [(0, b"a"), (5, b"d"), (6, b"c")]
    # Nothing at or past the LSO (6) was cleaned: the open transaction is whole.
    assert plog.producers.ongoing == {3: 6}
    # The abort marker had data in this cleaning: kept as is. The commit marker's
    # transaction still has its record: kept too.
    assert [(b[0], b[3]) for b in batches if b[1] & 0x20] == [(3, 1), (4, 1)]
    # The aborted transaction stays listed in the cleaned segment's index.
    assert plog.aborted_transactions(0, end) == [AbortedTxn(2, 1, 3, 0)]
    # The next cleaning (new dirty data) finds nothing left of the aborted transaction:
    # its marker is stamped with a delete horizon.
    marker(plog, 3, 0, True)  # 7
    produce(plog, txn_batch(4, 0, 0, [b"e"], transactional=False))  # 8
    plog.roll()
    end = plog.log_end_offset
    assert clean_in_place(plog, end, CleanerSettings(), t0 + 1000) is not None
    markers = [b for b in _batches(plog) if b[1] & 0x20]
    assert [(b[0], bool(b[1] & 0x40)) for b in markers] == [(3, True), (4, False), (7, False)]
    # Before the horizon the marker stays, after it it goes.
    clean_in_place(plog, end, CleanerSettings(), t0 + 1000 + DAY - 1)
    assert 3 in [b[0] for b in _batches(plog) if b[1] & 0x20]
    clean_in_place(plog, end, CleanerSettings(), t0 + 1000 + DAY + 1)
    assert [b[0] for b in _batches(plog) if b[1] & 0x20] == [4, 7]
    assert plog.aborted_transactions(0, end) == []  # its entry went with it
    # A restart rebuilds the same state from the cleaned log.
    plog.handles.close_all()
    for n in os.listdir(path):
        if n.endswith(".snapshot"):
            os.unlink(os.path.join(path, n))
    again = PartitionLog(path, cfg)
    assert again.producers.ongoing == {}
    assert again.last_stable_offset(end) == end
    assert values_between(again, 0, end) == [(0, b"a"), (5, b"d"), (6, b"c"), (8, b"e")]
    again.close()


def test_markers_need_cluster_action_and_describe_producers_read(secured: Any) -> None:
    """WriteTxnMarkers is an inter-broker API (CLUSTER_ACTION on the cluster), refused
    partition by partition; DescribeProducers needs READ on the topic (Kafka's checks)."""
    t = secured.topic("txn-acl")
    m = kio_module("describe_producers", 0)
    describe = m.DescribeProducersRequest(topics=(m.TopicRequest(name=t, partition_indexes=(0,)),))
    hank = secured.raw_as("hank")
    try:
        assert marker_errors(hank.call(write_markers(1, 9, 0, True, t, (0, 1)))) == [31, 31]
        assert [code(p) for p in hank.call(describe).topics[0].partitions] == [29]
    finally:
        hank.close()
    admin = secured.raw_as("admin")
    try:
        assert marker_errors(admin.call(write_markers(1, 9, 0, True, t, (0, 1)))) == [
            0,
            UNKNOWN_TOPIC_OR_PARTITION,
        ]
        (p,) = admin.call(describe).topics[0].partitions
        assert code(p) == 0 and [s.producer_id for s in p.active_producers] == [9]
    finally:
        admin.close()


def test_cleaner_keeps_a_later_transaction_of_a_producer_whose_abort_marker_went(
    tmp_path,
) -> None:
    """The `.txnindex` keeps an aborted transaction after its data and marker are cleaned
    away; a later, committed transaction of the same producer is not taken for it."""
    from straitmq.broker.log_cleaner import clean_in_place

    cfg = LogConfig(segment_bytes=1 << 20, compact=True, delete=False)
    plog = PartitionLog(str(tmp_path / "p"), cfg)
    produce(plog, txn_batch(2, 0, 0, [b"x"]))  # 0: aborted
    marker(plog, 2, 0, False)  # 1
    produce(plog, txn_batch(2, 0, 1, [b"y"]))  # 2: committed
    marker(plog, 2, 0, True)  # 3
    t = TS
    for step, value in enumerate((b"f1", b"f2", b"f3", b"f4")):
        # New dirty data each round (and the horizon passed for the last two).
        produce(plog, txn_batch(4, 0, step, [value], transactional=False))
        plog.roll()
        t += DAY + 1 if step >= 2 else 1000
        clean_in_place(plog, plog.log_end_offset, CleanerSettings(), t)
    left = [b[0] for b in _batches(plog) if b[1] & 0x20]
    assert 1 not in left, "the abort marker went after its horizon"
    assert values_between(plog, 0, plog.log_end_offset)[0] == (2, b"y")
    # Its index entry went with the marker: a read_committed client would otherwise
    # drop the producer's later transaction too.
    assert plog.aborted_transactions(0, plog.log_end_offset) == []


def _read_committed(plog: PartitionLog, lso: int) -> list[bytes]:
    """What a read_committed client delivers from offset 0, fetch by fetch, filtering as
    Kafka's consumer does (CompletedFetch): the response's aborted transactions mark
    their producer from their first offset until its ABORT marker; control batches are
    never delivered."""
    out: list[bytes] = []
    offset = 0
    while offset < lso:
        sl = plog.read(offset, 300, lso)
        if sl is None:  # cleaned away up to the LSO: nothing more to read yet
            break
        data = os.pread(sl.fd, sl.size, sl.position)
        pending = sorted(
            plog.aborted_transactions(offset, plog.upper_bound_of(sl)), key=lambda a: a[1]
        )
        aborted: set[int] = set()
        pos = 0
        while pos < len(data):
            size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
            batch = data[pos : pos + size]
            pos += size
            (info,) = replicated_batches(memoryview(batch))
            last = info.base_offset + info.last_offset_delta
            while pending and pending[0].first_offset <= last:
                aborted.add(pending.pop(0).producer_id)
            offset = last + 1
            if info.attributes & 0x20:
                if parse_marker(batch) == (False, 0):
                    aborted.discard(info.producer_id)
                continue
            if info.attributes & 0x10 and info.producer_id in aborted:
                continue
            out += [r.value for r in decode_batch(batch) if r.value is not None]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_property_read_committed_sees_exactly_the_committed(tmp_path, seed: int) -> None:
    """Random interleavings of transactions (committed, aborted, open) from several
    producers, plain records, rolls: the LSO, the aborted list and what a read_committed
    client keeps match a model, on the leader, after a crash and restart, on a follower
    copied from the leader's bytes, and after the cleaner removed aborted data and then
    (past delete.retention.ms) markers."""
    import random

    from straitmq.broker.log_cleaner import clean_in_place, cleanable

    rng = random.Random(seed)
    path = str(tmp_path / "p")
    cfg = LogConfig(segment_bytes=rng.choice([300, 600, 1 << 20]), compact=True, delete=False)
    plog = PartitionLog(path, cfg)
    open_first: dict[int, int] = {}  # producer -> first offset of its open transaction
    pending_values: dict[int, list[tuple[int, bytes]]] = {}
    seqs: dict[int, int] = {}
    committed: list[tuple[int, bytes]] = []  # (offset, value) of what a reader must see
    n = 0
    for _ in range(120):
        pid = rng.randint(1, 4)
        if pid in open_first and rng.random() < 0.3:
            commit = rng.random() < 0.5
            marker(plog, pid, 0, commit)
            values = pending_values.pop(pid)
            if commit:
                committed += values
            del open_first[pid]
        elif rng.random() < 0.15:
            value = b"plain-%d" % n
            n += 1
            seq = seqs.get(99, 0)
            base = produce(plog, txn_batch(99, 0, seq, [value], transactional=False))
            seqs[99] = seq + 1
            committed.append((base, value))
        else:
            count = rng.randint(1, 3)
            values = [b"v-%d" % (n + i) for i in range(count)]
            n += count
            seq = seqs.get(pid, 0)
            base = produce(plog, txn_batch(pid, 0, seq, values))
            seqs[pid] = seq + count
            open_first.setdefault(pid, base)
            pending_values.setdefault(pid, []).extend((base + i, v) for i, v in enumerate(values))
        if rng.random() < 0.05:
            plog.roll()
    end = plog.log_end_offset
    lso = min(open_first.values(), default=end)
    expected = [v for o, v in sorted(committed) if o < lso]

    def check(log: PartitionLog) -> None:
        assert log.last_stable_offset(end) == lso
        assert _read_committed(log, lso) == expected

    check(plog)
    aborted = plog.aborted_transactions(0, end)
    follower = PartitionLog(str(tmp_path / "f"), cfg)
    while follower.log_end_offset < end:
        view = memoryview(plog.read_bytes(follower.log_end_offset, 1 << 20, end))
        follower.append_replicated(view, replicated_batches(view))
    check(follower)
    assert follower.aborted_transactions(0, end) == aborted
    follower.close()
    plog.handles.close_all()  # a crash: no final snapshot
    again = PartitionLog(path, cfg)
    check(again)
    assert again.aborted_transactions(0, end) == aborted
    # Every key is unique: the cleaner removes only aborted data, then markers; a reader
    # sees the same before, between and after.
    again.roll()
    for now in (TS, TS + 1000, TS + 2000 + DAY):
        again.write_cleaner_checkpoint(0)  # clean it all again each round
        clean_in_place(again, end, CleanerSettings(), now)
        check(again)
    # Below what may be cleaned (segments wholly under the LSO) the aborted data is gone
    # from the log itself, and so are the ABORT markers with their index entries.
    bound = cleanable(again, end, TS).clean_end
    kept = [v for o, v in sorted(committed) if o < bound]
    assert [v for _, v in values_between(again, 0, bound)] == kept
    assert all(a.last_offset >= bound for a in again.aborted_transactions(0, end))
    again.close()
