"""kill -9 in the middle of a produce stream, then restart: nothing acknowledged is lost.

The broker relies on the page cache by default (an acknowledged write has reached the
kernel), so a SIGKILL of the process must never lose an acknowledged message; with
`--flush-messages 1` every append is also fsynced. After each restart the log must
recover on its own (torn tails cut), every acknowledged message must be readable at the
offset it was acknowledged with, no offset may hold two different messages, and each
partition keeps the order in which the producer sent.

The storage-level tests tear the tail of the active segment by hand and reopen the
PartitionLog directly.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

import pytest
from conftest import record_batch
from straitmq.broker.record_codec import decode_batch
from straitmq.broker.records import validate_batches
from straitmq.broker.storage.log import LogConfig, PartitionLog

from straitmq.admin_client import request_sync

PARTITIONS = 3


def _read_all(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """Every (offset, value) of every partition, from the log start to the high watermark."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "crash-check",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        ends = {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + 60
        while any((out[p][-1][0] + 1 if out[p] else 0) < ends[p] for p in out):
            assert time.monotonic() < deadline, "could not read back to the high watermark"
            msg = c.poll(0.5)
            if msg is None:
                continue
            assert not msg.error(), msg.error()
            out[msg.partition()].append((msg.offset(), msg.value()))
        return out
    finally:
        c.close()


class Stream:
    """A producer sending `p:seq` values round-robin over partitions, recording acks."""

    def __init__(self, bootstrap: str, topic: str, conf: dict) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "message.timeout.ms": 60000,
                "retry.backoff.ms": 100,
                "reconnect.backoff.max.ms": 500,
                **conf,
            }
        )
        self.seq = [0] * PARTITIONS
        self.sent = 0
        self.acked: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> value
        self.acked_values: dict[bytes, tuple[int, int]] = {}
        self.conflicts: list[str] = []
        self.failed: list[str] = []

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))
            return
        where = (msg.partition(), msg.offset())
        prev = self.acked.get(where)
        if prev is not None and prev != msg.value():
            self.conflicts.append(f"{where} acked for {prev!r} and {msg.value()!r}")
        self.acked[where] = msg.value()
        self.acked_values[msg.value()] = where

    def produce(self, n: int, pace_s: float = 0.0) -> None:
        for _ in range(n):
            p = self.sent % PARTITIONS
            value = f"{p}:{self.seq[p]:07d}".encode()
            self.seq[p] += 1
            self.sent += 1
            while True:
                try:
                    self.producer.produce(
                        self.topic, value=value, partition=p, on_delivery=self._on_delivery
                    )
                    break
                except BufferError:
                    self.producer.poll(0.05)
            self.producer.poll(0)
            if pace_s:
                time.sleep(pace_s)

    def produce_until_acked(self, target: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < target:
            assert time.monotonic() < deadline, f"only {len(self.acked)} of {target} acked"
            self.produce(20)
            while len(self.producer) > 200 and time.monotonic() < deadline:
                self.producer.poll(0.005)  # keep a steady stream, not one huge batch


def _check_log(
    stream: Stream, log: dict[int, list[tuple[int, bytes]]], allow_duplicates: bool
) -> None:
    assert not stream.conflicts, stream.conflicts[:5]
    # Every acknowledged message is readable at the offset it was acknowledged with.
    by_offset = {(p, off): v for p, recs in log.items() for off, v in recs}
    missing = [(where, v) for where, v in stream.acked.items() if by_offset.get(where) != v]
    assert not missing, (
        f"{len(missing)} of {len(stream.acked)} acked messages lost or changed, e.g. "
        f"{[(w, v, by_offset.get(w)) for w, v in missing[:5]]}"
    )
    for p, recs in log.items():
        offsets = [off for off, _v in recs]
        # Offsets are unique and increase (the read found each offset once).
        assert offsets == sorted(set(offsets)), f"partition {p}: offsets repeat or go back"
        values = [v for _off, v in recs]
        assert all(v.startswith(f"{p}:".encode()) for v in values), f"partition {p}: strays"
        if not allow_duplicates:
            assert len(values) == len(set(values)), (
                f"partition {p}: {len(values) - len(set(values))} duplicates after recovery"
            )
        # Order per partition: first occurrences follow the send order (a retried batch
        # whose ack was lost in the crash may appear twice without idempotence).
        seen: set[bytes] = set()
        firsts = []
        for v in values:
            if v not in seen:
                seen.add(v)
                firsts.append(int(v.split(b":")[1]))
        assert firsts == sorted(firsts), f"partition {p}: order broken"
        # Acked messages are in send order too.
        acked = sorted(
            (int(v.split(b":")[1]), off) for (pp, off), v in stream.acked.items() if pp == p
        )
        acked_offsets = [off for _s, off in acked]
        assert acked_offsets == sorted(acked_offsets), f"partition {p}: acked order broken"


CASES = {
    # acks=all with idempotence: the broker must also rebuild producer state from the log
    # so the producer's retries after the restart are not written twice.
    "acks-all-idempotent": ((), {"acks": "all", "enable.idempotence": True}, False),
    # acks=1, fsync per message. Without idempotence a batch written just before the kill
    # whose ack was lost is legitimately retried into a duplicate.
    "acks-1-flush-every-message": (
        ("--flush-messages", "1"),
        {"acks": "1", "enable.idempotence": False, "max.in.flight.requests.per.connection": 1},
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_mid_stream_loses_no_acked_message(broker_factory: Any, case: str) -> None:
    broker_args, producer_conf, allow_duplicates = CASES[case]
    b = broker_factory(*broker_args)
    topic = "crash"
    b.create_topic(topic, PARTITIONS)
    stream = Stream(b.bootstrap, topic, producer_conf)
    kills = 2
    for round_no in range(kills):
        stream.produce_until_acked(600 * (round_no + 1))
        # Keep sending while the process dies: some requests are mid-flight, some get
        # written without their ack going out, some are refused.
        stream.produce(200)
        b.kill9()
        stream.produce(300)  # queued by the client while the broker is down
        stream.producer.poll(0.2)
        b.start()
        assert b.proc.poll() is None
    stream.produce(500)
    remaining = stream.producer.flush(60)
    assert remaining == 0, f"{remaining} messages never delivered"
    assert not stream.failed, stream.failed[:5]
    assert len(stream.acked) == stream.sent, "every message was eventually acknowledged"
    log = _read_all(b.bootstrap, topic, PARTITIONS)
    _check_log(stream, log, allow_duplicates)
    # Recovery needed no manual step and the broker keeps appending after it.
    b.restart()
    log2 = _read_all(b.bootstrap, topic, PARTITIONS)
    assert log2 == log, "a clean restart changed the log"


def test_sigkill_with_many_small_segments_recovers(broker_factory: Any) -> None:
    """Tiny segments: the kill lands among many rolled segments and producer snapshots."""
    b = broker_factory()
    request_sync(
        b.http,
        "POST",
        "/api/v1/topics",
        {"name": "rolls", "partitions": 1, "configs": {"segment.bytes": "1024"}},
    )
    stream = Stream(
        b.bootstrap,
        "rolls",
        {"acks": "all", "enable.idempotence": True, "linger.ms": 0, "batch.num.messages": 10},
    )
    global PARTITIONS
    saved, PARTITIONS = PARTITIONS, 1
    try:
        stream.produce_until_acked(400)
        stream.produce(100)
        b.kill9()
        b.start()
        stream.produce(100)
        assert stream.producer.flush(60) == 0
        assert not stream.failed, stream.failed[:5]
        log = _read_all(b.bootstrap, "rolls", 1)
        _check_log(stream, log, allow_duplicates=False)
        topic = request_sync(b.http, "GET", "/api/v1/topics/rolls")
        assert topic["partitions"][0]["segments"] > 5
    finally:
        PARTITIONS = saved


# -- storage level -------------------------------------------------------------------------


def _append(plog: PartitionLog, raw: bytes) -> int:
    view = memoryview(raw)
    batches = validate_batches(view, plog.config.max_message_bytes)
    plog.producers.check(batches)
    return plog.append(view, batches, 0)


def _values(plog: PartitionLog) -> list[tuple[int, bytes]]:
    out = []
    for raw in plog.batches(plog.log_start_offset, plog.log_end_offset):
        out += [(rec.offset, rec.value) for rec in decode_batch(raw)]
    reached = out[-1][0] + 1 if out else plog.log_start_offset
    assert reached == plog.log_end_offset, (
        f"no data at {reached} below the end {plog.log_end_offset}"
    )
    return out


def _crash(plog: PartitionLog) -> None:
    """Drop the log like a killed process would: no close(), no snapshot, no index flush."""
    plog.handles.close_all()


def _active_path(plog: PartitionLog) -> str:
    return plog.segments[-1].path(".log")


TAILS = {
    "garbage": lambda good: os.urandom(97),
    "half-batch": lambda good: good[: len(good) // 2],
    "header-only": lambda good: good[:61],
    "few-bytes": lambda good: good[:5],
    "bad-crc": lambda good: good[:-1] + bytes([good[-1] ^ 0xFF]),
    "zeros": lambda good: b"\x00" * 4096,  # a preallocated/zero-filled tail
    "length-too-big": lambda good: good[:8] + struct.pack(">i", 2**31 - 1) + good[12:],
}


@pytest.mark.parametrize("tail", list(TAILS))
@pytest.mark.parametrize("segment_bytes", [1 << 30, 600])
def test_torn_tail_is_truncated_on_reopen(tmp_path: Any, tail: str, segment_bytes: int) -> None:
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=128)
    plog = PartitionLog(str(tmp_path / "p-0"), config)
    expected = []
    for i in range(20):
        values = [f"m{i}-{j}".encode() for j in range(i % 3 + 1)]
        base = _append(plog, record_batch(values))
        expected += [(base + j, v) for j, v in enumerate(values)]
    end = plog.log_end_offset
    assert end == len(expected)
    path = _active_path(plog)
    good_size = os.path.getsize(path)
    # The next batch as the log would have written it (offsets assigned), then torn.
    nxt = bytearray(record_batch([b"torn-1", b"torn-2"]))
    struct.pack_into(">q", nxt, 0, end)
    _crash(plog)
    with open(path, "ab") as f:
        f.write(TAILS[tail](bytes(nxt)))

    plog = PartitionLog(str(tmp_path / "p-0"), config)
    try:
        assert os.path.getsize(path) == good_size, "torn tail not truncated"
        assert plog.log_end_offset == end
        assert _values(plog) == expected
        # Appends continue at the right offset, and the result survives another reopen.
        base = _append(plog, record_batch([b"after-1", b"after-2"]))
        assert base == end
        expected += [(end, b"after-1"), (end + 1, b"after-2")]
        assert _values(plog) == expected
        assert plog.read_bytes(end, 1 << 20, plog.log_end_offset)[:8] == struct.pack(">q", end)
    finally:
        plog.close()
    plog = PartitionLog(str(tmp_path / "p-0"), config)
    try:
        assert _values(plog) == expected
        assert plog.log_end_offset == end + 2
    finally:
        plog.close()


def test_torn_tail_keeps_idempotent_producer_state(tmp_path: Any) -> None:
    """After recovery the producer state comes from the surviving batches only: a retry
    of the last surviving batch is a duplicate, the torn one must be accepted again."""
    from straitmq.broker.producer_state import DuplicateBatch

    config = LogConfig()
    plog = PartitionLog(str(tmp_path / "p-0"), config)
    pid, epoch = 7000, 0
    seq = 0
    for i in range(6):
        _append(plog, record_batch([f"v{i}a".encode(), f"v{i}b".encode()], (pid, epoch, seq)))
        seq += 2
    end = plog.log_end_offset
    path = _active_path(plog)
    torn = bytearray(record_batch([b"torn"], (pid, epoch, seq)))
    struct.pack_into(">q", torn, 0, end)
    _crash(plog)
    with open(path, "ab") as f:
        f.write(bytes(torn[:40]))
    plog = PartitionLog(str(tmp_path / "p-0"), config)
    try:
        assert plog.log_end_offset == end
        # Retry of the last surviving batch (sequence 10..11) is recognised.
        with pytest.raises(DuplicateBatch) as dup:
            _append(plog, record_batch([b"v5a", b"v5b"], (pid, epoch, 10)))
        assert dup.value.cached.base_offset == end - 2
        # The torn batch was never stored: its sequence is the next expected one.
        assert _append(plog, record_batch([b"torn"], (pid, epoch, seq))) == end
    finally:
        plog.close()
