"""A small asyncio Kafka client connection, for broker-to-broker calls (replica fetch,
OffsetForLeaderEpoch). Requests and responses go through kio's generated schemas.
One request in flight per connection, which is how a replica fetcher uses it.
"""

from __future__ import annotations

import asyncio
import io
import struct
from typing import Any

from kio.index import load_request_schema

from .codec import _reader, _writer, response_schema

_I32 = struct.Struct(">i")


class ConnectionClosed(Exception):
    pass


class _Frames(asyncio.BufferedProtocol):
    """Reads each response straight into a buffer of its own size: one copy from the
    socket, none after (a follower's fetch responses are the replicated data)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._size = bytearray(4)
        self._frame: bytearray | None = None  # None: reading the 4-byte size
        self._filled = 0
        self.frames: list[memoryview] = []
        self.waiter: asyncio.Future[None] | None = None
        self.closed: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        target = self._size if self._frame is None else self._frame
        return memoryview(target)[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._frame is None:
            if self._filled < 4:
                return
            (size,) = _I32.unpack(self._size)
            if size < 4:
                self._lost(f"bad frame size {size}")
                return
            self._frame, self._filled = bytearray(size), 0
            return
        if self._filled < len(self._frame):
            return
        self.frames.append(memoryview(self._frame).toreadonly())
        self._frame, self._filled = None, 0
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _lost(self, why: str) -> None:
        self.closed = why
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = "closed by the peer"
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = self.closed or (str(exc) if exc else "closed")
        self._wake()

    async def next_frame(self) -> memoryview:
        while not self.frames:
            if self.closed is not None:
                raise ConnectionClosed(self.closed)
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.frames.pop(0)


class KafkaConnection:
    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self._proto: _Frames | None = None
        self._correlation = 0

    async def connect(self, within_s: float = 3.0) -> None:
        _, self._proto = await asyncio.wait_for(
            asyncio.get_running_loop().create_connection(_Frames, self.host, self.port),
            within_s,
        )

    def close(self) -> None:
        if self._proto is not None:
            if self._proto.transport is not None:
                self._proto.transport.close()
            self._proto = None

    async def request(self, api_key: int, version: int, body: Any, within_s: float) -> Any:
        if self._proto is None:
            await self.connect()
        proto = self._proto
        assert proto is not None and proto.transport is not None
        self._correlation += 1
        schema = load_request_schema(api_key, version)
        header_schema = schema.__header_schema__
        buf = io.BytesIO()
        buf.write(b"\x00\x00\x00\x00")
        _writer(header_schema)(
            buf,
            header_schema(
                request_api_key=api_key,
                request_api_version=version,
                correlation_id=self._correlation,
                client_id=self.client_id,
            ),
        )
        _writer(schema)(buf, body)
        data = buf.getbuffer()
        _I32.pack_into(data, 0, len(data) - 4)
        try:
            if proto.closed is not None:
                raise ConnectionClosed(proto.closed)
            proto.transport.write(bytes(data))
            del data
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # (CPython gh-86296) and a stopping broker would wait on its fetcher forever.
            async with asyncio.timeout(within_s):
                frame = await proto.next_frame()
        except (OSError, ConnectionClosed, TimeoutError) as e:
            self.close()
            raise ConnectionClosed(f"{self.host}:{self.port}: {e or type(e).__name__}") from None
        rschema = response_schema(api_key, version)
        header, offset = _reader(rschema.__header_schema__)(frame, 0)
        if header.correlation_id != self._correlation:
            self.close()
            raise ConnectionClosed("correlation id mismatch")
        resp, _ = _reader(rschema)(frame, offset)
        return resp
