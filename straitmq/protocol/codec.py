"""Kafka request/response framing glue around kio's generated schemas.

Request bodies are decoded with kio's native readers; responses are encoded with
kio's writers. The Fetch response is the exception: the broker writes it by hand so
record data can go out with sendfile (see straitmq.broker.api.fetch).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from .produce_request import NotDecoded, parse_produce

_HEADER_PREFIX = struct.Struct(">hhi")
# From this size on a Produce is decoded by produce_request.py: the copy of its batches
# that it saves costs more than its Python decoding (~25 us more per request than kio's
# native reader, which a small request from a linger.ms=0 producer would pay for nothing).
LARGE_PRODUCE_BYTES = 128 * 1024
_INT32 = struct.Struct(">i")


class ProtocolError(Exception):
    """The bytes on the wire do not form a request we can parse; the connection closes."""


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@cache
def request_schema(api_key: int, version: int) -> Any:
    return load_request_schema(api_key, version)


@cache
def response_schema(api_key: int, version: int) -> Any:
    return load_response_schema(api_key, version)


@cache
def _reader(schema: type) -> Any:
    return entity_reader(schema)


@cache
def _writer(schema: type) -> Any:
    return entity_writer(schema)


# (api_key, version) pairs whose schemas, reader and writer are built (load below).
LOADED: set[tuple[int, int]] = set()


def load(api_key: int, version: int) -> None:
    """Load an (API, version)'s request and response schema and build their reader and
    writer. kio imports a schema's modules on first use, which held the event loop for
    up to 150 ms: the broker calls this in a thread for the first request of each
    version (a broker serves ~220 pairs and a client uses a handful: loading them all at
    every start cost ~0.8 s of CPU)."""
    schema = request_schema(api_key, version)
    _reader(schema.__header_schema__)
    _reader(schema)
    _writer(response_schema(api_key, version))
    LOADED.add((api_key, version))


def parse_header_prefix(frame: memoryview) -> tuple[int, int, int]:
    """api_key, api_version, correlation_id: readable even for APIs we do not know."""
    if len(frame) < 8:
        raise ProtocolError("request shorter than its header")
    return _HEADER_PREFIX.unpack_from(frame, 0)


def parse_request(frame: memoryview, api_key: int, version: int) -> tuple[RequestHeader, Any]:
    """Decode header and body. Trailing bytes after the body are tolerated (librdkafka).
    A large Produce's record batches stay memoryviews into `frame` (produce_request.py)."""
    if api_key == 0 and len(frame) >= LARGE_PRODUCE_BYTES:
        try:
            correlation_id, client_id, body = parse_produce(
                frame, version, request_schema(0, version)
            )
            return RequestHeader(api_key, version, correlation_id, client_id), body
        except NotDecoded:
            pass  # kio's reader decides, and says what is wrong
    schema = request_schema(api_key, version)
    header_schema = schema.__header_schema__
    try:
        header, offset = _reader(header_schema)(frame, 0)
        body, _size = _reader(schema)(frame, offset)
    except Exception as exc:  # kio raises several types on malformed input
        raise ProtocolError(f"malformed {schema.__name__}: {exc}") from None
    return (
        RequestHeader(api_key, version, header.correlation_id, header.client_id),
        body,
    )


def response_header_bytes(api_key: int, version: int, correlation_id: int) -> bytes:
    schema = response_schema(api_key, version)
    if schema.__header_schema__.__flexible__:
        return _INT32.pack(correlation_id) + b"\x00"
    return _INT32.pack(correlation_id)


def encode_entity(entity: Any) -> bytes:
    """One entity's bytes, as they appear inside a response (e.g. a Metadata topic)."""
    buf = io.BytesIO()
    schema: type = type(entity)  # mypy: type[Any] would not count as hashable for the cache
    _writer(schema)(buf, entity)
    return buf.getvalue()


def encode_response(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """Return a complete size-prefixed response frame."""
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    buf.write(response_header_bytes(api_key, version, correlation_id))
    schema: type = type(body)  # as in encode_entity
    _writer(schema)(buf, body)
    data = buf.getbuffer()
    _INT32.pack_into(data, 0, len(data) - 4)
    out = bytes(data)
    del data
    return out
