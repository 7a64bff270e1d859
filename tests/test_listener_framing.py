"""A listener's framing (server.KafkaConnection): the event loop reads (the TLS layer
decrypts) into the buffers the connection hands out; whatever the read boundaries, the
frames come out whole and in order, a large frame is read into a buffer of its own size
(no copy), and a bad size closes the connection. And its raw answers (a Fetch's file
ranges): small ones copied and written at once, large ones by sendfile."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
from pathlib import Path

import pytest
from conftest import record_batch
from straitmq.broker import server
from straitmq.broker.api.context import RawResponse, RequestContext
from straitmq.broker.metrics import BrokerMetrics
from straitmq.broker.quotas import ClientQuotas
from straitmq.broker.records import validate_batches
from straitmq.broker.security.sasl import ConnectionSecurity
from straitmq.broker.server import SCRATCH_BYTES, KafkaConnection, ListenerDeps
from straitmq.broker.storage.log import LogConfig, PartitionLog
from straitmq.metadata.image import MetadataImage


def _no_context(*args: object) -> RequestContext:
    raise AssertionError("framing alone handles no request")


def connection(request_max_bytes: int = 1 << 20) -> KafkaConnection:
    deps = ListenerDeps(
        BrokerMetrics(),
        set(),
        request_max_bytes,
        MetadataImage,
        _no_context,
        {},
        ClientQuotas(MetadataImage),
    )
    conn = KafkaConnection(deps)
    conn.security = ConnectionSecurity(None, lambda user, mech: None)  # no SASL: named
    return conn


def feed(conn: KafkaConnection, stream: bytes, rng: random.Random) -> None:
    """Write `stream` into the connection's buffers in reads of random sizes, as the
    event loop does (it fills at most the buffer it is given)."""
    pos = 0
    while pos < len(stream) and not conn.closed:
        buf = conn.get_buffer(len(stream) - pos)
        assert len(buf) > 0
        n = min(len(buf), rng.randint(1, 40_000), len(stream) - pos)
        buf[:n] = stream[pos : pos + n]
        conn.buffer_updated(n)
        pos += n


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("prealloc", [server.PREALLOC_BYTES, 30_000])
def test_frames_come_out_whole_whatever_the_read_boundaries(
    seed: int, prealloc: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 30,000: the 70,000-byte frames grow as their bytes come instead."""
    monkeypatch.setattr(server, "PREALLOC_BYTES", prealloc)
    rng = random.Random(seed)
    bodies = [
        rng.randbytes(rng.choice([8, 20, 300, SCRATCH_BYTES - 4, SCRATCH_BYTES, 70_000]))
        for _ in range(40)
    ]
    conn = connection()
    feed(conn, b"".join(frame(b) for b in bodies), rng)
    got = list(conn.frames)
    assert [bytes(f) for f in got] == bodies
    for f, body in zip(got, bodies, strict=True):
        assert f.readonly
        if len(body) > SCRATCH_BYTES - 4:
            # Read straight into a buffer (pooled, so maybe larger): no copy after.
            assert isinstance(f.obj, bytearray) and len(f.obj) >= len(body)
    assert not conn.closed


def test_a_large_frames_buffer_is_reused_only_once_nothing_refers_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Large frames come from a pool (a fresh 1 MB bytearray is zeroed and faulted in
    each time): a buffer whose frame, or any view of it, is still alive is never
    written again; once released, the next frame gets it."""
    monkeypatch.setattr(server, "_FRAME_BUFFERS", [])  # not other tests' buffers
    rng = random.Random(5)
    conn = connection()
    first = [rng.randbytes(60_000) for _ in range(3)]
    feed(conn, b"".join(frame(b) for b in first), rng)
    held = [conn.frames.popleft() for _ in range(3)]
    kept = held[1][100:200]  # a view into the second frame, as a request's records are
    ids = {id(f.obj) for f in held}
    del held
    second = [rng.randbytes(50_000) for _ in range(3)]
    feed(conn, b"".join(frame(b) for b in second), rng)
    got = [conn.frames.popleft() for _ in range(3)]
    assert [bytes(f) for f in got] == second
    assert bytes(kept) == first[1][100:200]  # its buffer was not handed out again
    reused = {id(f.obj) for f in got} & ids
    assert len(reused) == 2 and id(kept.obj) not in reused
    assert not conn.closed


def test_the_same_path_serves_a_transport_that_calls_data_received() -> None:
    bodies = [b"x" * 9, b"y" * 50_000, b"z" * 12]
    conn = connection()
    conn.data_received(b"".join(frame(b) for b in bodies))
    assert [bytes(f) for f in conn.frames] == bodies


def test_a_claimed_size_is_not_allocated_before_its_bytes_come() -> None:
    """socket.request.max.bytes is 100 MB and a TLS client may be anonymous: a size
    prefix alone must not make the broker commit that much memory."""
    conn = connection(request_max_bytes=100 << 20)
    feed(conn, struct.pack(">i", 90 << 20) + b"x" * 1000, random.Random(2))
    assert not conn.closed and not conn.frames
    held = len(conn._grow or b"") + (len(conn._body) if conn._body is not None else 0)
    assert held <= 1000


@pytest.mark.parametrize("size", [-1, 3, (1 << 20) + 1])
def test_a_bad_frame_size_closes_the_connection(size: int) -> None:
    conn = connection()
    feed(conn, frame(b"a" * 10) + struct.pack(">i", size) + b"b" * 64, random.Random(1))
    assert conn.closed
    assert [bytes(f) for f in conn.frames] == [b"a" * 10]


def test_the_event_loops_take_it_for_a_buffered_protocol() -> None:
    """uvloop (and asyncio) read into get_buffer's buffer only for a protocol that has
    get_buffer and is not an asyncio.Protocol; otherwise they call data_received with a
    new bytes object per read, the copy this class exists to avoid."""
    conn = connection()
    assert isinstance(conn, asyncio.BufferedProtocol)
    assert not isinstance(conn, asyncio.Protocol)


def _answer_with_range(plog: PartitionLog, record_bytes: int) -> tuple[RawResponse, bytes]:
    """A RawResponse as a Fetch builds it (bytes, a file range, bytes) whose range holds
    one record of `record_bytes`, and the bytes it stands for."""
    data = memoryview(record_batch([b"r" * record_bytes]))
    plog.append(data, validate_batches(data, 1 << 30), 0)
    sl = plog.read(plog.log_end_offset - 1, 1 << 30, plog.log_end_offset)
    assert sl is not None
    head, tail = b"head" * 5, b"tail"
    out = RawResponse()
    out.add(head, len(head))
    out.add(sl, sl.size)
    out.add(tail, len(tail))
    return out, head + os.pread(sl.fd, sl.size, sl.position) + tail


@pytest.mark.parametrize("record_bytes", [100, server.SMALL_RAW_BYTES * 2])
def test_a_raw_answer_arrives_whole_copied_when_small_sent_from_the_file_when_large(
    tmp_path: Path, record_bytes: int
) -> None:
    """A small answer's file ranges are read and the whole answer written at once; a
    large one goes by sendfile. Either way the peer reads exactly the answer's bytes."""
    plog = PartitionLog(str(tmp_path / "p"), LogConfig())

    async def run() -> bytes:
        answer, expected = _answer_with_range(plog, record_bytes)
        assert (answer.size <= server.SMALL_RAW_BYTES) == (record_bytes < 1000)
        ours, theirs = socket.socketpair()
        conn = connection()
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(lambda: conn, ours)
        reader, writer = await asyncio.open_connection(sock=theirs)
        try:
            await conn.write_raw(answer)
            got = await reader.readexactly(len(expected))
            assert got == expected
            return got
        finally:
            conn.close()
            writer.close()

    assert asyncio.run(run())
    plog.close()


def test_a_small_answer_whose_file_shrank_is_a_connection_error(tmp_path: Path) -> None:
    """The range was cut (truncated) after the answer was built: as on the sendfile path
    the connection ends rather than send fewer bytes than the size prefix says."""
    plog = PartitionLog(str(tmp_path / "p"), LogConfig())
    answer, _ = _answer_with_range(plog, 100)
    plog.truncate_to(0)
    with pytest.raises(ConnectionError):
        server._small_raw(answer)
    plog.close()
