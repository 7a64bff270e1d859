"""A full disk (ENOSPC) on the broker's write paths, injected in process: a produce
whose write fails is answered KAFKA_STORAGE_ERROR and never acknowledged, the log keeps
exactly what was acknowledged (no torn batch, no doubled index entries), and writes go on
once space is back. The fault runs (bench/fault_runs.py, kind diskfull) do the same with
a real full filesystem under a cluster."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from conftest import record_batch
from kio.schema.errors import ErrorCode
from straitmq.broker.metrics import BrokerMetrics
from straitmq.broker.partition_write import PartitionWriter
from straitmq.broker.partitions import LEADER, Partition, PartitionManager
from straitmq.broker.record_codec import decode_batch
from straitmq.broker.records import replicated_batches, validate_batches
from straitmq.broker.storage import segment as segment_module
from straitmq.broker.storage.log import LogConfig, PartitionLog
from straitmq.broker.transactions.coordinator import (
    TXN_TOPIC,
    TransactionCoordinator,
    TxnSettings,
)
from straitmq.metadata.image import MetadataImage

STORAGE_ERROR = 56  # KAFKA_STORAGE_ERROR on the wire


def _writer(
    tmp_path: Path, configs: dict[str, str] | None = None, topic: str = "t"
) -> tuple[PartitionWriter, Partition]:
    """Broker 1 leading `topic`-0 alone."""
    image = MetadataImage()
    image.apply(
        {"type": "topic", "name": topic, "topic_id": str(uuid.uuid4()), "configs": configs or {}}
    )
    image.apply(
        {"type": "partition", "topic": topic, "index": 0, "replicas": [1], "isr": [1]}
        | {"leader": 1}
    )
    parts = PartitionManager(str(tmp_path / "data"), {}, 1)
    parts.sync(image)
    part = parts.get(topic, 0)
    assert part is not None and part.is_leader
    return PartitionWriter(BrokerMetrics(), parts, lambda: image, lambda: True), part


def _produce(writer: PartitionWriter, value: bytes, acks: int = -1) -> Any:
    return writer.begin("t", 0, memoryview(record_batch([value])), acks)


def _values(plog: PartitionLog) -> list[bytes | None]:
    return [
        rec.value
        for raw in plog.batches(plog.log_start_offset, plog.log_end_offset)
        for rec in decode_batch(raw)
    ]


def _reopened(plog: PartitionLog) -> PartitionLog:
    """The same directory loaded again, as after a restart."""
    return PartitionLog(plog.directory, plog.config)


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _no_space(*_: Any) -> int:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _half_write(real: Callable[..., int]) -> Callable[..., int]:
    """A pwritev that writes half of its bytes and returns that count, as Linux does when
    the disk fills in the middle of a write."""

    def write(fd: int, pieces: list, offset: int) -> int:
        data = b"".join(bytes(p) for p in pieces)
        return real(fd, [data[: len(data) // 2]], offset)

    return write


@pytest.mark.parametrize("acks", [1, -1])
@pytest.mark.parametrize("how", ["enospc", "short"])
def test_a_failed_append_is_a_storage_error_and_never_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, acks: int, how: str
) -> None:
    writer, part = _writer(tmp_path)
    ok = _produce(writer, b"before", acks)
    assert (ok.error_code, ok.base_offset) == (0, 0)
    size = os.path.getsize(part.log.segments[-1].path(".log"))

    fake = _no_space if how == "enospc" else _half_write(os.pwritev)
    monkeypatch.setattr(segment_module.os, "pwritev", fake)
    w = _produce(writer, b"lost", acks)
    monkeypatch.undo()

    assert w.error_code == ErrorCode.kafka_storage_error == STORAGE_ERROR
    assert w.base_offset == -1 and not w.pending  # nothing to wait for: never acked
    assert writer.metrics.request_errors[(0, STORAGE_ERROR)] == 1
    assert part.log.log_end_offset == 1
    # A torn batch is cut off again: the next write lands right after the last good one.
    assert os.path.getsize(part.log.segments[-1].path(".log")) == size
    again = _produce(writer, b"after", acks)
    assert (again.error_code, again.base_offset) == (0, 1)
    assert _values(part.log) == [b"before", b"after"]
    assert _values(_reopened(part.log)) == [b"before", b"after"]


def test_a_full_disk_at_a_roll_keeps_the_index_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The roll writes the old segment's index entries: a short write there used to
    leave a part of them on disk, and the retry at the next roll appended them all again
    (an index whose offsets go back)."""
    writer, part = _writer(tmp_path, {"segment.bytes": "1000", "index.interval.bytes": "1"})
    for i in range(3):  # several index entries waiting for the roll
        assert _produce(writer, b"v%d" % i).error_code == 0
    assert len(part.log.segments) == 1
    first = part.log.segments[0]
    real_write = os.write

    def short_index_write(fd: int, data: bytes) -> int:
        if _fd_path(fd).endswith(".index"):
            return real_write(fd, bytes(data)[:5])  # not even a whole entry
        return real_write(fd, data)

    monkeypatch.setattr(segment_module.os, "write", short_index_write)
    w = _produce(writer, b"x" * 1000)  # does not fit: the segment rolls first
    monkeypatch.undo()
    assert w.error_code == STORAGE_ERROR and w.base_offset == -1
    end = part.log.log_end_offset
    index = first.path(".index")
    assert not os.path.exists(index) or os.path.getsize(index) == 0

    ok = _produce(writer, b"y" * 1000)  # space again: the roll goes through
    assert ok.error_code == 0 and ok.base_offset == end
    assert len(part.log.segments) == 2
    entries = len(first.index_offsets)
    assert os.path.getsize(index) == 8 * entries  # each entry once
    reopened = _reopened(part.log)
    assert reopened.segments[0].index_offsets == first.index_offsets
    assert _values(reopened)[-1] == b"y" * 1000
    assert len(_values(reopened)) == end + 1


def test_a_failed_follower_append_leaves_the_log_where_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower whose disk is full keeps its log end (the fetcher retries the same
    offset), so the leader never counts it as having data it did not write."""
    plog = PartitionLog(str(tmp_path / "f"), LogConfig())
    leader = PartitionLog(str(tmp_path / "l"), LogConfig())
    for v in (b"a", b"b"):
        view = memoryview(record_batch([v]))
        leader.append(view, validate_batches(view, 1 << 20), 3)
    data = memoryview(leader.read_bytes(0, 1 << 20, leader.log_end_offset))
    monkeypatch.setattr(segment_module.os, "pwritev", _no_space)
    with pytest.raises(OSError):
        plog.append_replicated(data, replicated_batches(data))
    monkeypatch.undo()
    assert plog.log_end_offset == 0
    plog.append_replicated(data, replicated_batches(data))
    assert _values(plog) == [b"a", b"b"]


def test_failing_appends_are_said_once_and_their_end_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk fails every produce to the partition: one error line when it starts
    (Kafka logs the failed log directory), one when appends work again."""
    writer, part = _writer(tmp_path)
    monkeypatch.setattr(segment_module.os, "pwritev", _no_space)
    with caplog.at_level(logging.WARNING, logger="straitmq.broker"):
        codes = [_produce(writer, b"v%d" % i).error_code for i in range(5)]
        monkeypatch.undo()
        assert _produce(writer, b"ok").error_code == 0
        assert _produce(writer, b"ok again").error_code == 0
    assert codes == [STORAGE_ERROR] * 5
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        (
            "ERROR",
            "cannot append to the log: writes to this partition get KAFKA_STORAGE_ERROR "
            "(reported to the controller, which moves its leadership to an in-sync replica)",
        ),
        ("WARNING", "appends to the log work again"),
    ]
    assert part.write_error is None and _values(part.log) == [b"ok", b"ok again"]


def test_a_leader_whose_appends_fail_reports_the_partition_until_it_leads_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka takes a failed log directory offline and its leaderships move; here the
    partitions whose appends fail go into the heartbeat's offline report (the controller
    then leads them from another in-sync replica: election.on_replicas_offline), and
    leave it once an append works again or the broker no longer leads them."""
    writer, part = _writer(tmp_path)
    parts = writer.partitions
    assert list(parts.offline()) == []
    monkeypatch.setattr(segment_module.os, "pwritev", _no_space)
    assert _produce(writer, b"lost").error_code == STORAGE_ERROR
    assert list(parts.offline()) == [("t", 0)]
    monkeypatch.undo()
    assert _produce(writer, b"ok").error_code == 0
    assert list(parts.offline()) == []

    monkeypatch.setattr(segment_module.os, "pwritev", _no_space)
    assert _produce(writer, b"lost again").error_code == STORAGE_ERROR
    assert list(parts.offline()) == [("t", 0)]
    image = writer._image()
    image.apply(
        {"type": "partition_change", "topic": "t", "index": 0, "replicas": [1, 2], "isr": [2]}
        | {"leader": 2}
    )
    parts.sync(image)  # the controller moved it: this broker follows now
    assert not part.is_leader and part.write_error is None
    assert list(parts.offline()) == []


def test_a_log_start_that_cannot_be_checkpointed_does_not_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteRecords (or a follower taking its leader's log start) on a full disk: the
    start stays where its checkpoint says, so an error answered now is not undone by a
    restart that brings the records back after a success was seen."""
    plog = PartitionLog(str(tmp_path / "l"), LogConfig())
    for v in (b"a", b"b", b"c"):
        view = memoryview(record_batch([v]))
        plog.append(view, validate_batches(view, 1 << 20), 0)
    real_open = os.open

    def full_open(path: str, flags: int, mode: int = 0o777) -> int:
        if str(path).endswith(".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", full_open)
    with pytest.raises(OSError):
        plog.advance_start(2)
    monkeypatch.undo()
    assert plog.log_start_offset == 0
    assert plog.advance_start(2) == 0 and plog.log_start_offset == 2  # space again: it moves
    assert PartitionLog(plog.directory, plog.config).log_start_offset == 2


def test_the_transaction_coordinator_on_a_full_disk_answers_not_coordinator_and_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `__transaction_state` write that fails on a full disk (fault run disk full #30):
    the client is told NOT_COORDINATOR (retriable: it finds the coordinator again), the
    transition is dropped (a retry is not CONCURRENT_TRANSACTIONS for ever), and the
    partition is reported offline like a produce's, so its leadership moves to a replica
    with a disk. Once space is back the same request succeeds."""
    writer, part = _writer(tmp_path, topic=TXN_TOPIC)
    parts, image = writer.partitions, writer._image()

    async def no_topic(_: dict) -> None:
        raise AssertionError("the topic exists")

    async def no_pid() -> int:
        raise AssertionError("the test allocates producer ids")

    coord = TransactionCoordinator(
        1,
        TxnSettings(1, 1, 1 << 20, 60_000, 3_600_000, 10_000),
        parts,
        cast(Any, SimpleNamespace(image=image)),
        cast(Any, None),  # markers go nowhere here: no transaction completes
        no_pid,
        no_topic,
    )
    coord.on_role(part, LEADER)

    async def init() -> Any:
        return await coord.run(coord.core.init_producer_id("tid", 60_000, 0, 7))

    monkeypatch.setattr(segment_module.os, "pwritev", _no_space)
    refused = asyncio.run(init())
    assert refused.error == ErrorCode.not_coordinator
    assert "tid" not in coord.core.pending and "tid" not in coord.core.txns
    assert list(parts.offline()) == [(TXN_TOPIC, 0)]
    assert part.write_error is not None and "No space" in part.write_error

    monkeypatch.undo()
    granted = asyncio.run(init())
    assert (granted.error, granted.producer_id, granted.producer_epoch) == (0, 7, 0)
    assert list(parts.offline()) == []
