"""Exhausted resources become clear errors: a broker keeps at most a bounded number of
segment files open (so thousands of partitions run under a small `ulimit -n`), and when
no descriptor or no disk is left a request gets KAFKA_STORAGE_ERROR while the broker
goes on serving what it can and recovers when the resource returns."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import BrokerProcess, record_batch
from straitmq.broker.records import validate_batches
from straitmq.broker.storage import flusher
from straitmq.broker.storage.handles import FileHandles
from straitmq.broker.storage.log import LogConfig, PartitionLog
from waiting import wait_for

from straitmq.admin_client import request_sync

ROOT = Path(__file__).resolve().parent.parent


def _append(plog: PartitionLog, value: bytes) -> int:
    view = memoryview(record_batch([value]))
    return plog.append(view, validate_batches(view, 1 << 20), 0)


def _values(plog: PartitionLog) -> list[bytes]:
    from straitmq.broker.record_codec import decode_batch

    return [
        rec.value
        for raw in plog.batches(plog.log_start_offset, plog.log_end_offset)
        for rec in decode_batch(raw)
    ]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_many_logs_share_a_bounded_number_of_open_files(tmp_path: Path) -> None:
    """40 logs of several segments each through a cache of 5: never more than 5 segment
    files open, every append and read lands in the right file, and nothing else (index
    files) holds a descriptor."""
    handles = FileHandles(5)
    gc.collect()  # an earlier test's garbage closing its files here would skew the count
    before = _open_fds()
    cfg = LogConfig(segment_bytes=300, index_interval_bytes=64)
    logs = [PartitionLog(str(tmp_path / f"p{i}"), cfg, handles) for i in range(40)]
    for round_ in range(6):
        for i, plog in enumerate(logs):
            _append(plog, f"{i}:{round_}".encode() * 8)
            assert len(handles) <= 5
            # Besides the cache: a rolled segment's duplicate descriptor until the
            # flusher thread has fsynced it (storage/flusher.py, itself bounded).
            queued = flusher.pending()  # read first: it only shrinks meanwhile
            assert queued <= flusher.MAX_PENDING
            assert _open_fds() - before <= 5 + queued
    assert all(len(plog.segments) > 1 for plog in logs)
    assert handles.closed > 0  # the bound was really in force
    for i, plog in enumerate(logs):
        assert _values(plog) == [f"{i}:{r}".encode() * 8 for r in range(6)]
    for plog in logs:
        plog.close()
    reopened = [PartitionLog(str(tmp_path / f"p{i}"), cfg, handles) for i in range(40)]
    for i, plog in enumerate(reopened):
        assert _values(plog) == [f"{i}:{r}".encode() * 8 for r in range(6)]
        plog.close()
    assert flusher.drain(30)
    assert _open_fds() == before


def test_a_fetched_range_survives_its_file_being_closed_before_it_is_sent(
    tmp_path: Path,
) -> None:
    """A fetch answer holds a range of a segment, sent later: if the cache closes that
    file meanwhile (and the descriptor number goes to another file), the range still
    sends its own bytes; once the segment is deleted it fails instead of sending
    something else."""
    handles = FileHandles(1)
    a = PartitionLog(str(tmp_path / "a"), LogConfig(), handles)
    b = PartitionLog(str(tmp_path / "b"), LogConfig(), handles)
    _append(a, b"from-a" * 10)
    sl = a.read(0, 1 << 20, a.log_end_offset)
    assert sl is not None
    fd_before = sl.fd
    _append(b, b"from-b" * 10)  # evicts a's file; b's may get the same number
    assert a.segments[0]._fd == -1
    left, right = socket.socketpair()
    try:
        sent = os.sendfile(left.fileno(), sl.fd, sl.position, sl.size)
        assert sent == sl.size
        assert right.recv(1 << 16) == os.pread(sl.fd, sl.size, sl.position)
        assert b"from-a" in os.pread(sl.fd, sl.size, sl.position)
        assert fd_before >= 0
    finally:
        left.close()
        right.close()
    a.segments[0].delete()
    with pytest.raises(FileNotFoundError):
        _ = sl.fd
    b.close()


_EXHAUST = textwrap.dedent(
    """
    import errno, os, resource, sys
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from conftest import record_batch
    from straitmq.broker.records import validate_batches
    from straitmq.broker.storage.handles import FileHandles
    from straitmq.broker.storage.log import LogConfig, PartitionLog

    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    handles = FileHandles(1000)  # the bound is not what stops it here: the process limit is
    plog = PartitionLog({path!r}, LogConfig(), handles)
    view = memoryview(record_batch([b"first"]))
    plog.append(view, validate_batches(view, 1 << 20), 0)
    handles.close_all()
    fillers = []
    while True:  # everything else takes every descriptor (connections would)
        try:
            fillers.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            break
    try:
        plog.append(view, validate_batches(view, 1 << 20), 0)
        print("UNEXPECTED: appended with no descriptor left")
    except OSError as e:
        print("REFUSED", e.errno == errno.EMFILE, str(e))
    for fd in fillers[:8]:
        os.close(fd)
    plog.append(view, validate_batches(view, 1 << 20), 0)
    print("RECOVERED", plog.log_end_offset)
    """
)


def test_no_descriptor_left_is_a_clear_error_and_passes(tmp_path: Path) -> None:
    """A real process limit (64) filled up by other files: the append is refused with
    an error that names both limits, nothing is half written, and once descriptors
    return the next append works."""
    script = _EXHAUST.format(root=str(ROOT), tests=str(ROOT / "tests"), path=str(tmp_path / "p"))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    refused = next(line for line in lines if line.startswith(("REFUSED", "UNEXPECTED")))
    assert refused.startswith("REFUSED True"), out.stdout
    assert "out of file descriptors" in refused and "RLIMIT_NOFILE 64" in refused, refused
    assert "--max-open-files 1000" in refused, refused
    assert "RECOVERED 2" in lines, out.stdout


def _broker_fds(b: BrokerProcess) -> int:
    assert b.proc is not None
    return len(os.listdir(f"/proc/{b.proc.pid}/fd"))


def test_thousands_of_partitions_under_a_256_descriptor_limit(tmp_path: Path) -> None:
    """`ulimit -n 256` and 3,000 partitions (a descriptor each would need 3,000): topics
    are created, a sample of partitions takes idempotent acks=all writes, the broker is
    killed -9 and recovers every log, and a consumer group reads everything back; the
    process stays under its limit throughout."""
    b = BrokerProcess(tmp_path / "data", fd_limit=256).start()
    try:
        for i in range(30):
            request_sync(b.http, "POST", "/api/v1/topics", {"name": f"t{i}", "partitions": 100})
        assert _broker_fds(b) < 256
        p = Producer(
            {
                "bootstrap.servers": b.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )
        sent: set[bytes] = set()
        errors: list[object] = []

        def delivered(err: object, msg: object) -> None:
            if err is not None:
                errors.append(err)

        for i in range(30):
            for part in range(i % 7, 100, 7):
                value = f"t{i}-{part}".encode()
                p.produce(f"t{i}", value=value, partition=part, on_delivery=delivered)
                sent.add(value)
        assert p.flush(60) == 0 and not errors, errors
        assert _broker_fds(b) < 256
        b.kill9()
        b.start(120)
        c = Consumer(
            {
                "bootstrap.servers": b.bootstrap,
                "group.id": "all",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        c.subscribe([f"t{i}" for i in range(30)])
        got: set[bytes] = set()
        deadline = time.monotonic() + 120
        while got != sent and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                got.add(m.value())
        c.close()
        assert got == sent, f"{len(sent - got)} acknowledged records missing"
        assert _broker_fds(b) < 256
    finally:
        b.stop()


def test_connections_taking_every_descriptor_do_not_break_the_broker(tmp_path: Path) -> None:
    """A flood of connections beyond the process limit: the broker neither dies nor
    stops accepting for good; once the flood goes, a new client works at once."""
    b = BrokerProcess(tmp_path / "data", fd_limit=128).start()
    flood: list[socket.socket] = []
    try:
        request_sync(b.http, "POST", "/api/v1/topics", {"name": "t", "partitions": 4})
        for _ in range(300):
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(("127.0.0.1", b.port))
            except OSError:
                s.close()
                continue
            flood.append(s)
        assert b.proc is not None and b.proc.poll() is None
    finally:
        for s in flood:
            s.close()
    try:
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
        for i in range(4):
            p.produce("t", value=b"after the flood", partition=i)
        assert p.flush(60) == 0
        assert b.proc.poll() is None
    finally:
        b.stop()


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.fail("this test mounts a small tmpfs (a full disk) and needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


def test_full_disk_is_a_storage_error_and_the_broker_recovers(tmp_path: Path) -> None:
    """The partition logs on a 24 MiB filesystem: produce until it is full. Writes are
    refused with KAFKA_STORAGE_ERROR (never a crash or a hang), metadata still answers,
    every acknowledged record reads back, and once space returns (a topic deleted)
    writes succeed again."""
    data = tmp_path / "data"
    logs = data / "logs"
    _mount_tmpfs(logs, "24m")
    b = BrokerProcess(data)

    def one_write(topic: str, value: bytes = b"one") -> int | None:
        """The error code of one acks=all write without retries, None when written."""
        q = Producer(
            {"bootstrap.servers": b.bootstrap, "acks": "all", "message.send.max.retries": 0}
        )
        errs: list[KafkaError | None] = []
        q.produce(topic, value=value, on_delivery=lambda err, msg: errs.append(err))
        assert q.flush(30) == 0
        return None if errs[0] is None else errs[0].code()

    try:
        b.start()
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for f in admin.create_topics([NewTopic("fill", 1, 1), NewTopic("spare", 1, 1)]).values():
            f.result(30)
        p = Producer(
            {
                "bootstrap.servers": b.bootstrap,
                "acks": "all",
                "message.send.max.retries": 0,
                "linger.ms": 20,
                "batch.size": 1 << 20,
            }
        )
        acked: list[int] = []
        refused: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: object) -> None:
            if err is None:
                acked.append(msg.offset())  # type: ignore[attr-defined]
            else:
                refused.append(err)

        chunk = os.urandom(100_000)
        for _ in range(400):  # 40 MB into 24 MiB
            p.produce("fill", value=chunk, on_delivery=delivered)
            p.poll(0)
            if refused:
                break
        p.flush(60)
        assert refused, "the disk never filled up"
        assert refused[0].code() == KafkaError.KAFKA_STORAGE_ERROR, refused[0]
        assert b.proc is not None and b.proc.poll() is None
        assert "fill" in admin.list_topics(timeout=10).topics
        # The refused batch was cut off again: take the last free bytes too, as another
        # writer on the same disk would.
        fd = os.open(logs / "ballast", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while os.write(fd, b"\0" * 4096) > 0:
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        assert one_write("fill", chunk) == KafkaError.KAFKA_STORAGE_ERROR
        # A topic created now has no room for its log: the controller creates it, this
        # broker cannot open it and says so for each write.
        for f in admin.create_topics([NewTopic("late", 1, 1)]).values():
            f.result(30)
        assert one_write("late") == KafkaError.KAFKA_STORAGE_ERROR
        c = Consumer(
            {
                "bootstrap.servers": b.bootstrap,
                "group.id": str(uuid.uuid4()),
                "auto.offset.reset": "earliest",
            }
        )
        c.assign([TopicPartition("fill", 0, 0)])
        seen = 0
        deadline = time.monotonic() + 60
        while seen < len(acked) and time.monotonic() < deadline:
            for m in c.consume(100, 1.0):
                assert m.error() is None and m.value() == chunk
                seen += 1
        c.close()
        assert seen == len(acked) > 0
        for f in admin.delete_topics(["fill"]).values():
            f.result(30)
        wait_for(lambda: one_write("spare") is None, 30, "a write once space returned", 0.5)
        wait_for(lambda: one_write("late") is None, 30, "the late topic's log opened", 0.5)
    finally:
        b.stop()
        subprocess.run(["umount", "-l", str(logs)], check=False)
