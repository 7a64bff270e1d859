"""Kafka's variable-length integers, for the few places that write them by hand."""

from __future__ import annotations

# One-byte varints, made once: nearly every compact length and count is one (a Produce
# answer per request at linger.ms=0 writes several).
_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))


def uvarint(n: int) -> bytes:
    """Unsigned varint (compact lengths and tagged-field counts in flexible versions)."""
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def varint(n: int) -> bytes:
    """Signed, zigzag-encoded varint (record fields inside a batch)."""
    return uvarint((n << 1) ^ (n >> 63))
