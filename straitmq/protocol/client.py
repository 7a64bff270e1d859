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


class KafkaConnection:
    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation = 0

    async def connect(self, within_s: float = 3.0) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), within_s
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def request(self, api_key: int, version: int, body: Any, within_s: float) -> Any:
        if self._writer is None or self._reader is None:
            await self.connect()
        assert self._writer is not None and self._reader is not None
        self._correlation += 1
        schema = load_request_schema(api_key, version)
        header_schema = schema.__header_schema__
        buf = io.BytesIO()
        buf.write(b"\x00\x00\x00\x00")
        _writer(header_schema)(
            buf, header_schema(
                request_api_key=api_key,
                request_api_version=version,
                correlation_id=self._correlation,
                client_id=self.client_id,
            )
        )
        _writer(schema)(buf, body)
        data = buf.getbuffer()
        _I32.pack_into(data, 0, len(data) - 4)
        try:
            self._writer.write(bytes(data))
            del data
            await self._writer.drain()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # (CPython gh-86296) and a stopping broker would wait on its fetcher forever.
            async with asyncio.timeout(within_s):
                size = _I32.unpack(await self._reader.readexactly(4))[0]
                frame = memoryview(await self._reader.readexactly(size))
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
            self.close()
            raise ConnectionClosed(f"{self.host}:{self.port}: {e or type(e).__name__}") from None
        rschema = response_schema(api_key, version)
        header, offset = _reader(rschema.__header_schema__)(frame, 0)
        if header.correlation_id != self._correlation:
            self.close()
            raise ConnectionClosed("correlation id mismatch")
        resp, _ = _reader(rschema)(frame, offset)
        return resp
