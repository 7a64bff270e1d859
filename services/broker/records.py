"""RecordBatch v2 handling without decoding records on the hot path.

Batches stay opaque bytes end to end. The produce path reads only the 61-byte header
(`struct`), checks the CRC (which covers `attributes` onwards) and sets `baseOffset` and
`partitionLeaderEpoch`, which the CRC does not cover, as separate write pieces so the
client's bytes are never copied.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength
_LEN_AT_8 = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")

ATTR_COMPRESSION_MASK = 0x07
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
NO_PRODUCER_ID = -1


class InvalidRecords(Exception):
    """Raised with the Kafka error code the client should see, and for refusals of
    single records (Produce v8+ record_errors) each one's index in its batch and why."""

    def __init__(
        self, code: int, message: str, record_errors: list[tuple[int, str]] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.record_errors = record_errors or []


@dataclass(slots=True)
class BatchInfo:
    position: int  # where the batch starts within the buffer
    size: int  # total bytes including the 12-byte log overhead
    base_offset: int
    last_offset_delta: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    attributes: int

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) % 2**31


def parse_header(buf: memoryview | bytes, pos: int, size: int) -> BatchInfo:
    (
        base_offset,
        _length,
        _epoch,
        _magic,
        _crc,
        attributes,
        last_offset_delta,
        _base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) = HEADER.unpack_from(buf, pos)
    return BatchInfo(
        pos,
        size,
        base_offset,
        last_offset_delta,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
        attributes,
    )


def validate_batches(data: memoryview, max_batch_bytes: int) -> list[BatchInfo]:
    """Split produce data into batches, checking framing, magic and CRC of each.

    Error codes: CORRUPT_MESSAGE (2) for framing/CRC, MESSAGE_TOO_LARGE (10),
    UNSUPPORTED_FOR_MESSAGE_FORMAT (43) for magic < 2, INVALID_RECORD (87).
    """
    batches: list[BatchInfo] = []
    pos = 0
    end = len(data)
    if end == 0:
        raise InvalidRecords(87, "produce request carries no record batch")
    while pos < end:
        if end - pos < HEADER_SIZE:
            raise InvalidRecords(2, "record batch truncated")
        _base, length = _LEN_AT_8.unpack_from(data, pos)
        size = length + LOG_OVERHEAD
        magic = data[pos + 16]
        if magic != 2:
            raise InvalidRecords(43, f"record batch magic {magic} is not supported; use v2")
        if length < HEADER_SIZE - LOG_OVERHEAD or pos + size > end:
            raise InvalidRecords(2, "record batch length does not match the data")
        if size > max_batch_bytes:
            raise InvalidRecords(
                10, f"record batch of {size} bytes exceeds max.message.bytes {max_batch_bytes}"
            )
        info = parse_header(data, pos, size)
        if crc32c(data[pos + 21 : pos + size]) != struct.unpack_from(">I", data, pos + 17)[0]:
            raise InvalidRecords(2, "record batch CRC mismatch")
        if info.record_count <= 0 or info.last_offset_delta < 0:
            raise InvalidRecords(87, "record batch has no records")
        if info.attributes & ATTR_CONTROL:
            # Markers are the transaction coordinator's (WriteTxnMarkers), never a client's.
            raise InvalidRecords(87, "clients may not write control batches")
        if info.attributes & ATTR_TRANSACTIONAL and info.producer_id < 0:
            raise InvalidRecords(87, "a transactional batch needs a producer id")
        if info.attributes & ATTR_COMPRESSION_MASK > 4:
            raise InvalidRecords(2, "unknown compression codec")
        batches.append(info)
        pos += size
    return batches


# Kafka's ControlRecordType (the control record's key: int16 version 0, int16 type) and
# EndTransactionMarker (its value: int16 version 0, int32 coordinator epoch).
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")
_BATCH_PREFIX = struct.Struct(">qiibI")
_BATCH_TAIL = struct.Struct(">hiqqqhii")


def end_txn_marker(
    producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timestamp_ms: int
) -> bytes:
    """One control batch holding one COMMIT or ABORT marker, as Kafka's
    MemoryRecords.withEndTransactionMarker builds it: transactional and control bits, no
    sequence, uncompressed, base offset 0 (the append sets it)."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    # attributes 0, timestamp delta 0, offset delta 0, key, value, no headers (zigzag varints
    # of small lengths are one byte: 2 * n).
    rec = b"\x00\x00\x00" + bytes([2 * len(key)]) + key + bytes([2 * len(value)]) + value + b"\x00"
    body = bytes([2 * len(rec)]) + rec
    tail = (
        _BATCH_TAIL.pack(
            ATTR_TRANSACTIONAL | ATTR_CONTROL,
            0,
            timestamp_ms,
            timestamp_ms,
            producer_id,
            producer_epoch,
            -1,
            1,
        )
        + body
    )
    return _BATCH_PREFIX.pack(0, 4 + 1 + 4 + len(tail), -1, 2, crc32c(tail)) + tail


def parse_marker(batch: bytes | memoryview) -> tuple[bool, int] | None:
    """(commit, coordinator epoch) of a control batch holding a transaction marker; None
    for an empty one (the cleaner removed it), a compressed one (Kafka never writes
    those) or another control record type. The one record is read by hand: length,
    attributes, timestamp and offset deltas (varints, skipped), key, value."""
    if len(batch) <= HEADER_SIZE or HEADER.unpack_from(batch, 0)[12] < 1:
        return None
    if batch[22] & ATTR_COMPRESSION_MASK:
        return None
    body = bytes(batch[HEADER_SIZE:])
    pos = _skip_varint(body, 0)  # record length
    pos += 1  # attributes
    for _ in range(2):  # timestamp delta, offset delta
        pos = _skip_varint(body, pos)
    key_len, pos = _zigzag(body, pos)
    if key_len < 4 or pos + key_len > len(body):
        return None
    _version, kind = _CONTROL_KEY.unpack_from(body, pos)
    if kind not in (CONTROL_ABORT, CONTROL_COMMIT):
        return None
    pos += key_len
    value_len, pos = _zigzag(body, pos)
    epoch = -1
    if value_len >= 6 and pos + value_len <= len(body):
        epoch = _MARKER_VALUE.unpack_from(body, pos)[1]
    return kind == CONTROL_COMMIT, epoch


def _skip_varint(buf: bytes, pos: int) -> int:
    while buf[pos] & 0x80:
        pos += 1
    return pos + 1


def _zigzag(buf: bytes, pos: int) -> tuple[int, int]:
    """A signed (zigzag) varint at `pos`: (value, position after it)."""
    n = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7


def assign_offsets(
    data: memoryview, batches: list[BatchInfo], next_offset: int, leader_epoch: int
) -> list[bytes | memoryview]:
    """Write pieces (for os.writev) of the batches with offsets and epoch set."""
    epoch = _INT32.pack(leader_epoch)
    pieces: list[bytes | memoryview] = []
    for b in batches:
        b.base_offset = next_offset
        pieces.append(_INT64.pack(next_offset))
        pieces.append(data[b.position + 8 : b.position + 12])
        pieces.append(epoch)
        pieces.append(data[b.position + 16 : b.position + b.size])
        next_offset += b.last_offset_delta + 1
    return pieces


def check_crc(buf: memoryview | bytes, pos: int, size: int) -> bool:
    return crc32c(buf[pos + 21 : pos + size]) == struct.unpack_from(">I", buf, pos + 17)[0]


def batch_leader_epoch(buf: memoryview | bytes, pos: int) -> int:
    """partitionLeaderEpoch of the batch at `pos` (a header field, outside the CRC)."""
    return _INT32.unpack_from(buf, pos + 12)[0]


def replicated_batches(data: memoryview) -> list[BatchInfo]:
    """Split batches fetched from the leader: framing, magic and CRC as `validate_batches`
    checks them, but none of the produce-time rules (max.message.bytes, transactional
    batches): the leader applied those already, and a follower must copy what it has.
    Offsets must grow: a compacted leader's log has gaps between batches, never
    overlaps. Empty data gives an empty list."""
    batches: list[BatchInfo] = []
    pos = 0
    end = len(data)
    expected = -1
    while pos < end:
        if end - pos < HEADER_SIZE:
            raise InvalidRecords(2, "replicated record batch truncated")
        _base, length = _LEN_AT_8.unpack_from(data, pos)
        size = length + LOG_OVERHEAD
        if data[pos + 16] != 2:
            raise InvalidRecords(43, f"replicated record batch has magic {data[pos + 16]}")
        if length < HEADER_SIZE - LOG_OVERHEAD or pos + size > end:
            raise InvalidRecords(2, "replicated record batch length does not match the data")
        if not check_crc(data, pos, size):
            raise InvalidRecords(2, "replicated record batch CRC mismatch")
        info = parse_header(data, pos, size)
        if info.last_offset_delta < 0 or (expected >= 0 and info.base_offset < expected):
            raise InvalidRecords(
                2, f"replicated batch at offset {info.base_offset} overlaps the one before it"
            )
        expected = info.base_offset + info.last_offset_delta + 1
        batches.append(info)
        pos += size
    return batches
