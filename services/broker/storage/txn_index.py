"""The aborted-transaction index of a segment (Kafka's TransactionIndex, `.txnindex`).

One 34-byte entry per aborted transaction whose ABORT marker landed in the segment:
version int16 (0), producer id int64, first offset int64, last offset int64 (the
marker's), last stable offset int64 (at the time of the marker). A read_committed Fetch
lists the aborted transactions overlapping what it returns from these entries alone:
the records themselves are never read. As in Kafka the file is created with its first
entry; no file means no aborted transaction.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterable
from typing import NamedTuple

TXN_INDEX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")  # 34 bytes
VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(ENTRY.pack(VERSION, *e) for e in entries)


def decode(data: bytes) -> list[AbortedTxn]:
    """Whole entries only: a torn last entry (a crash mid-write) is left out."""
    usable = len(data) - len(data) % ENTRY.size
    return [AbortedTxn(*e[1:]) for e in ENTRY.iter_unpack(data[:usable])]


def read(path: str) -> list[AbortedTxn] | None:
    """The file's entries, or None if there is no file."""
    try:
        with open(path, "rb") as f:
            return decode(f.read())
    except FileNotFoundError:
        return None


def append(path: str, entry: AbortedTxn) -> None:
    data = ENTRY.pack(VERSION, *entry)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, f"short write to {path}")
    finally:
        os.close(fd)


def rewrite(path: str, entries: list[AbortedTxn]) -> None:
    """Replace the file (tmp + rename); no entries: no file."""
    if not entries:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(encode(entries))
    os.replace(tmp, path)


def collect(
    entries: list[AbortedTxn], fetch_offset: int, upper: int, out: list[AbortedTxn]
) -> bool:
    """Add to `out` the entries overlapping [fetch_offset, upper) (Kafka's
    TransactionIndex.collectAbortedTxns); True once an entry shows that no later
    segment can hold one that overlaps (its LSO at or past `upper`)."""
    for e in entries:
        if e.last_offset >= fetch_offset and e.first_offset < upper:
            out.append(e)
        if e.last_stable_offset >= upper:
            return True
    return False
