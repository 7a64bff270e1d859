"""Produce requests decoded without copying their record batches.

kio's reader copies every partition's `records` into a new bytes object: the one copy
of the whole payload between the socket and the log that was not needed (on TLS, up to
7% of the broker's produce CPU with librdkafka's 1 MB requests). This reader builds the
same kio entities with each `records` a read-only memoryview into the request frame. It
is Python, so slower per request than kio's native reader: codec.parse_request uses it
for large requests only (LARGE_PRODUCE_BYTES). It takes the versions the broker serves
(3-12); anything it does not understand, or malformed input, goes back to kio's reader,
which says what is wrong in the same words as before.
"""

from __future__ import annotations

import datetime
import struct
import sys
from functools import cache
from typing import Any

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
FIRST_FLEXIBLE = 9
VERSIONS = range(3, 13)


class NotDecoded(ValueError):
    """This reader does not take the frame; kio's does."""


class _Reader:
    __slots__ = ("frame", "pos")

    def __init__(self, frame: memoryview, pos: int) -> None:
        self.frame = frame
        self.pos = pos

    def i16(self) -> int:
        (v,) = _I16.unpack_from(self.frame, self.pos)
        self.pos += 2
        return int(v)

    def i32(self) -> int:
        (v,) = _I32.unpack_from(self.frame, self.pos)
        self.pos += 4
        return int(v)

    def uvarint(self) -> int:
        frame, pos = self.frame, self.pos
        shift = value = 0
        while True:
            if pos >= len(frame) or shift > 28:
                raise NotDecoded("bad varint")
            b = frame[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
        self.pos = pos
        return value

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.frame):
            raise NotDecoded("past the end")
        out = self.frame[self.pos : self.pos + n]
        self.pos += n
        return out

    def string(self, flexible: bool, nullable: bool) -> str | None:
        n = self.uvarint() - 1 if flexible else self.i16()
        if n < 0:
            if nullable and n == -1:
                return None
            raise NotDecoded("null string")
        return str(self.take(n), "utf-8")

    def array_length(self, flexible: bool) -> int:
        n = self.uvarint() - 1 if flexible else self.i32()
        if n < 0:
            raise NotDecoded("null array")
        return n

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())


@cache
def _classes(schema: type) -> tuple[Any, Any]:
    """The topic and partition entities of a ProduceRequest version (its kio module)."""
    module = sys.modules[schema.__module__]
    return module.TopicProduceData, module.PartitionProduceData


def parse_produce(frame: memoryview, version: int, schema: Any) -> tuple[int, str | None, Any]:
    """(correlation id, client id, ProduceRequest) of a Produce frame whose records are
    memoryviews into `frame`; `schema` is kio's ProduceRequest of that version.
    NotDecoded when kio's reader must decide."""
    if version not in VERSIONS:
        raise NotDecoded(f"version {version}")
    flexible = version >= FIRST_FLEXIBLE
    topic_cls, partition_cls = _classes(schema)
    r = _Reader(frame.toreadonly(), 4)  # past api key and version
    try:
        correlation_id = r.i32()
        client_id = r.string(False, True)  # not compact, even in header v2
        if flexible:
            r.skip_tagged_fields()
        transactional_id = r.string(flexible, True)
        acks = r.i16()
        timeout = datetime.timedelta(milliseconds=r.i32())
        topics = []
        for _ in range(r.array_length(flexible)):
            name = r.string(flexible, False)
            partitions = []
            for _ in range(r.array_length(flexible)):
                index = r.i32()
                n = r.uvarint() - 1 if flexible else r.i32()
                records = None if n == -1 else r.take(n)
                if flexible:
                    r.skip_tagged_fields()
                partitions.append(partition_cls(index=index, records=records))
            if flexible:
                r.skip_tagged_fields()
            topics.append(topic_cls(name=name, partition_data=tuple(partitions)))
        if flexible:
            r.skip_tagged_fields()
    except (struct.error, UnicodeDecodeError) as e:
        raise NotDecoded(str(e)) from None
    body = schema(
        transactional_id=transactional_id, acks=acks, timeout=timeout, topic_data=tuple(topics)
    )
    return correlation_id, client_id, body
