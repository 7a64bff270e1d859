"""Produce answers encoded straight from the handler's dict.

A producer with linger.ms=0 sends one Produce per record or few, so each answer's cost
counts: through `build` and kio's writers (an entity per partition and per topic, a
writer call per field, a buffer for the tagged fields) an answer of one partition took
about a fifth of the broker's CPU per request. This writes the same bytes with struct
for the versions the broker serves (3-12) and the fields Produce answers carry; an
answer with anything else (a log append time, KIP-951's current leader or node
endpoints) returns None and goes the generic way, as does every other version.
"""

from __future__ import annotations

import struct
from typing import Any

from .varint import uvarint

VERSIONS = range(3, 13)
FIRST_FLEXIBLE = 9
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION = struct.Struct(">ihqqq")  # index, error, base offset, append time, log start
_PARTITION_V3 = struct.Struct(">ihqq")  # no log start offset before v5
_TOP_KEYS = frozenset({"responses", "throttle_time"})
_PARTITION_KEYS = frozenset(
    {
        "index",
        "error_code",
        "base_offset",
        "log_append_time",
        "log_start_offset",
        "record_errors",
        "error_message",
    }
)


class _Unsupported(Exception):
    """Something this encoder does not write: the generic one does."""


def encode_produce_response(version: int, correlation_id: int, result: dict) -> bytes | None:
    """The whole size-prefixed answer frame, or None if this encoder does not take it."""
    if version not in VERSIONS or not _TOP_KEYS.issuperset(result):
        return None
    flexible = version >= FIRST_FLEXIBLE
    out = bytearray(b"\x00\x00\x00\x00")
    out += _I32.pack(correlation_id)
    if flexible:
        out += b"\x00"  # response header v1: no tagged fields
    try:
        topics = result["responses"]
        _array(out, len(topics), flexible)
        for topic in topics:
            if type(topic) is not dict:
                raise _Unsupported
            name = topic["name"].encode()
            if flexible:
                out += uvarint(len(name) + 1)
            else:
                out += _I16.pack(len(name))
            out += name
            parts = topic["partition_responses"]
            _array(out, len(parts), flexible)
            for p in parts:
                _partition(out, p, version, flexible)
            if flexible:
                out += b"\x00"
    except _Unsupported:
        return None
    out += _I32.pack(result.get("throttle_time") or 0)
    if flexible:
        out += b"\x00"  # no node endpoints (KIP-951): the tag is left out
    _I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _partition(out: bytearray, p: dict, version: int, flexible: bool) -> None:
    if (
        type(p) is not dict
        or p.get("log_append_time") is not None
        or not _PARTITION_KEYS.issuperset(p)
    ):
        raise _Unsupported
    code = p.get("error_code") or 0
    if version >= 5:
        out += _PARTITION.pack(
            p["index"], code, p["base_offset"], -1, p.get("log_start_offset", -1)
        )
    else:
        out += _PARTITION_V3.pack(p["index"], code, p["base_offset"], -1)
    if version < 8:
        return
    errors = p.get("record_errors") or ()
    _array(out, len(errors), flexible)
    for e in errors:
        if type(e) is not dict:
            raise _Unsupported
        out += _I32.pack(e["batch_index"])
        _nullable_string(out, e.get("batch_index_error_message"), flexible)
        if flexible:
            out += b"\x00"
    _nullable_string(out, p.get("error_message"), flexible)
    if flexible:
        out += b"\x00"  # the current leader (KIP-951) is not set: the tag is left out


def _array(out: bytearray, n: int, flexible: bool) -> None:
    if flexible:
        out += uvarint(n + 1)
    else:
        out += _I32.pack(n)


def _nullable_string(out: bytearray, value: Any, flexible: bool) -> None:
    if value is None:
        out += b"\x00" if flexible else b"\xff\xff"
        return
    data = value.encode()
    if flexible:
        out += uvarint(len(data) + 1)
    else:
        out += _I16.pack(len(data))
    out += data
