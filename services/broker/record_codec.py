"""Decode and build whole record batches, for the few places that need records.

Never used on the produce/fetch hot path: only by the REST API, the group coordinator's
offset store and ListOffsets-by-timestamp (which looks inside one batch).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from crc32c import crc32c
from kio.serial.readers import read_signed_varint, read_signed_varlong

from straitmq.protocol.varint import varint as _varint

from .records import ATTR_COMPRESSION_MASK, ATTR_TRANSACTIONAL, HEADER, HEADER_SIZE
from .storage.batch_filter import compress, decompress


@dataclass(slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    n, size = read_signed_varint(buf, pos)
    pos += size
    if n < 0:
        return None, pos
    return buf[pos : pos + n], pos + n


def decode_batch(batch: bytes | memoryview) -> list[Record]:
    """All records of one v2 batch (any codec)."""
    (base_offset, _len, _e, _m, _c, attrs, _lod, base_ts, _mts, _pid, _pe, _bs, count) = (
        HEADER.unpack_from(batch, 0)
    )
    body = decompress(attrs & ATTR_COMPRESSION_MASK, batch[HEADER_SIZE:])
    out: list[Record] = []
    pos = 0
    for _ in range(count):
        length, size = read_signed_varint(body, pos)
        pos += size
        end = pos + length
        pos += 1  # attributes
        ts_delta, size = read_signed_varlong(body, pos)
        pos += size
        off_delta, size = read_signed_varint(body, pos)
        pos += size
        key, pos = _read_bytes(body, pos)
        value, pos = _read_bytes(body, pos)
        n_headers, size = read_signed_varint(body, pos)
        pos += size
        headers = []
        for _h in range(n_headers):
            hk, pos = _read_bytes(body, pos)
            hv, pos = _read_bytes(body, pos)
            headers.append(((hk or b"").decode("utf-8", "replace"), hv))
        if pos != end:
            raise ValueError("record length does not match its content")
        out.append(Record(base_offset + off_delta, base_ts + ts_delta, key, value, headers))
    return out


def _bytes_field(b: bytes | None) -> bytes:
    return _varint(-1) if b is None else _varint(len(b)) + b


def build_batch(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    timestamp_ms: int,
    compression: int = 0,
    producer: tuple[int, int] | None = None,
) -> bytes:
    """A v2 batch (any codec) with base offset 0; no producer id, or `producer` (id,
    epoch) for a transactional batch without sequence numbers, as the group coordinator
    writes TxnOffsetCommit's offsets."""
    body = bytearray()
    for delta, (key, value, headers) in enumerate(records):
        rec = bytearray(b"\x00")
        rec += _varint(0) + _varint(delta) + _bytes_field(key) + _bytes_field(value)
        rec += _varint(len(headers))
        for hk, hv in headers:
            rec += _bytes_field(hk.encode()) + _bytes_field(hv)
        body += _varint(len(rec)) + rec
    payload = compress(compression, bytes(body))
    pid, epoch = producer if producer is not None else (-1, -1)
    tail = (
        struct.pack(
            ">hiqqqhii",
            compression | (ATTR_TRANSACTIONAL if producer is not None else 0),
            len(records) - 1,
            timestamp_ms,
            timestamp_ms,
            pid,
            epoch,
            -1,
            len(records),
        )
        + payload
    )
    length = 4 + 1 + 4 + len(tail)
    return struct.pack(">qiibI", 0, length, 0, 2, crc32c(tail)) + tail
