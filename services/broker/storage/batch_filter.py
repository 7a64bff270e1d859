"""SCRATCH stand-in for helper A's module (not committed)."""

from __future__ import annotations
import struct
from dataclasses import dataclass
from collections.abc import Sequence
from crc32c import crc32c
from kio.serial.readers import read_signed_varint, read_signed_varlong
from straitmq.protocol.varint import varint as _uvarint
from ..record_codec import _decompress
from ..records import HEADER, HEADER_SIZE
import gzip, cramjam

ATTR_DELETE_HORIZON = 0x40


def _zz(n: int) -> bytes:
    return _uvarint(n)


@dataclass(slots=True)
class RawRecord:
    offset: int
    timestamp: int
    key: bytes | None
    tombstone: bool
    start: int
    end: int


@dataclass(slots=True)
class ParsedBatch:
    base_offset: int
    last_offset_delta: int
    partition_leader_epoch: int
    attributes: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    body: bytes
    records: list

    @property
    def codec(self) -> int:
        return self.attributes & 7

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.attributes & 0x40 else None


def parse_batch(batch) -> ParsedBatch:
    try:
        (bo, _l, ple, _m, _c, attrs, lod, bts, mts, pid, pe, bs, count) = HEADER.unpack_from(
            batch, 0
        )
        if crc32c(bytes(batch[21:])) != _c:
            raise ValueError("CRC mismatch")
        body = _decompress(attrs & 7, bytes(batch[HEADER_SIZE:]))
        recs = []
        pos = 0
        for _ in range(count):
            start = pos
            length, n = read_signed_varint(body, pos)
            pos += n
            end = pos + length
            pos += 1
            tsd, n = read_signed_varlong(body, pos)
            pos += n
            od, n = read_signed_varint(body, pos)
            pos += n
            kl, n = read_signed_varint(body, pos)
            pos += n
            key = None
            if kl >= 0:
                key = body[pos : pos + kl]
                pos += kl
            vl, n = read_signed_varint(body, pos)
            pos += n
            recs.append(RawRecord(bo + od, bts + tsd, key, vl < 0, start, end))
            pos = end
        if pos != len(body):
            raise ValueError("length")
    except (struct.error, IndexError) as e:
        raise ValueError(str(e)) from e
    return ParsedBatch(bo, lod, ple, attrs, bts, mts, pid, pe, bs, body, recs)


def rebuild_batch(
    p: ParsedBatch, kept: Sequence[int], *, delete_horizon_ms: int | None = None
) -> bytes:
    attrs = p.attributes
    base_ts = p.base_timestamp
    parts = []
    if delete_horizon_ms is not None:
        attrs |= 0x40
        base_ts = delete_horizon_ms
        for i in kept:
            r = p.records[i]
            rec = p.body[r.start : r.end]
            length, n = read_signed_varint(rec, 0)
            pos = n + 1
            tsd, m = read_signed_varlong(rec, pos)
            inner = rec[n : n + 1] + _zz(r.timestamp - base_ts) + rec[pos + m :]
            parts.append(_zz(len(inner)) + inner)
    else:
        parts = [p.body[p.records[i].start : p.records[i].end] for i in kept]
    body = b"".join(parts)
    codec = attrs & 7
    if not kept:
        codec = 0
        attrs &= ~7
        body = b""
    elif codec == 1:
        body = gzip.compress(body)
    elif codec == 4:
        body = bytes(cramjam.zstd.compress(body))
    elif codec != 0:
        raise ValueError("scratch")
    mts = max((p.records[i].timestamp for i in kept), default=p.max_timestamp)
    tail = (
        struct.pack(
            ">hiqqqhii",
            attrs,
            p.last_offset_delta,
            base_ts,
            mts,
            p.producer_id,
            p.producer_epoch,
            p.base_sequence,
            len(kept),
        )
        + body
    )
    return (
        struct.pack(
            ">qiibI", p.base_offset, 9 + len(tail), p.partition_leader_epoch, 2, crc32c(tail)
        )
        + tail
    )


def first_keyless(batch) -> int | None:
    for i, r in enumerate(parse_batch(batch).records):
        if r.key is None:
            return i
    return None
