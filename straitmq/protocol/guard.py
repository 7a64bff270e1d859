"""Refuse requests whose array counts overrun the frame, before kio decodes them.

kio's native reader reserves memory for an array from the count on the wire before it
reads any element: one frame claiming ~2**32 elements made the process abort ("memory
allocation of 34359738352 bytes failed"), taking every connection down. Strings and
bytes are bounds-checked by kio; arrays are not. So before kio sees a body, a walk over
the schema (compiled once per schema into straight-line Python) checks that no array
claims more elements than there are bytes left (every element takes at least 1 byte),
and that arrays the schema does not allow to be null are not (kio gives None, which the
handlers would then iterate).
"""

from __future__ import annotations

import dataclasses
import re
import struct
import types
import typing
from collections.abc import Callable
from typing import Any

from kio.serial.errors import DecodeError
from kio.serial.readers import read_unsigned_varint

from .codec import ProtocolError, request_schema

_ADD = re.compile(r"^(\s*)pos \+= (\d+)$")
_FIXED = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}


def _uv(buf: Any, pos: int) -> tuple[int, int]:
    """Unsigned varint at pos: (value, next position), with kio's native reader."""
    value, size = read_unsigned_varint(buf, pos)
    return value, pos + size


def _uv_lines(var: str, ind: str) -> list[str]:
    """`var, pos = UV(buf, pos)` with a one-byte varint (nearly every count and length
    in a request) read inline, not through a call."""
    return [
        f"{ind}{var} = buf[pos]",
        f"{ind}if {var} < 0x80: pos += 1",
        f"{ind}else: {var}, pos = UV(buf, pos)",
    ]


def _too_many(n: int, left: int) -> ProtocolError:
    return ProtocolError(f"array of {n} elements in {left} bytes")


def _skip_tags(buf: Any, pos: int, end: int, count: int, tags: dict) -> int:
    for _ in range(count):
        tag, pos = _uv(buf, pos)
        size, pos = _uv(buf, pos)
        walk = tags.get(tag)
        if walk is not None:
            walk(buf, pos, pos + size)
        pos += size
    return pos


class _Gen:
    """Generates one walker function per kio entity class."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {
            "UV": _uv,
            "I16": struct.Struct(">h").unpack_from,
            "I32": struct.Struct(">i").unpack_from,
            "TOO_MANY": _too_many,
            "TAGS": _skip_tags,
            "ProtocolError": ProtocolError,
        }
        self.names: dict[Any, str] = {}
        self._pending: list[tuple[str, dict[int, str]]] = []

    def entity(self, schema: type) -> str:
        if schema in self.names:
            return self.names[schema]
        name = f"w{len(self.names)}"
        self.names[schema] = name
        hints = typing.get_type_hints(schema)
        flexible = schema.__flexible__  # type: ignore[attr-defined]  # every kio entity has it
        lines: list[str] = []
        tags: dict[int, str] = {}
        for f in dataclasses.fields(schema):
            kafka_type = f.metadata.get("kafka_type", "")
            if "tag" in f.metadata:
                fname = f"{name}_t{f.metadata['tag']}"
                body = self.field(hints[f.name], kafka_type, flexible, "  ")
                self._define(fname, body)
                tags[f.metadata["tag"]] = fname
            else:
                lines += self.field(hints[f.name], kafka_type, flexible, "  ")
        if flexible:
            tagmap = f"{name}_tags"
            self.ns[tagmap] = {}
            lines += [*_uv_lines("t", "  "), f"  if t: pos = TAGS(buf, pos, end, t, {tagmap})"]
            self._pending.append((tagmap, tags))
        self._define(name, lines)
        return name

    def _define(self, name: str, lines: list[str]) -> None:
        merged: list[str] = []  # runs of fixed-size fields become one addition
        for line in lines:
            m = _ADD.match(line)
            prev = _ADD.match(merged[-1]) if merged else None
            if m and prev and m.group(1) == prev.group(1):
                merged[-1] = f"{m.group(1)}pos += {int(prev.group(2)) + int(m.group(2))}"
            else:
                merged.append(line)
        lines = merged
        src = f"def {name}(buf, pos, end):\n" + "\n".join(lines or ["  pass"]) + "\n  return pos\n"
        exec(src, self.ns)  # generated from kio's schema classes only

    def field(
        self, tp: Any, kafka_type: str, flexible: bool, ind: str, nullable: bool = False
    ) -> list[str]:
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            inner = next(a for a in typing.get_args(tp) if a is not type(None))
            # A nullable struct: an int8 presence marker, then the struct.
            if isinstance(inner, type) and dataclasses.is_dataclass(inner):
                sub = self.entity(inner)
                return [
                    f"{ind}if buf[pos] == 0xFF: pos += 1",
                    f"{ind}else: pos = {sub}(buf, pos + 1, end)",
                ]
            return self.field(inner, kafka_type, flexible, ind, nullable=True)
        if origin is tuple:
            element = typing.get_args(tp)[0]
            head = (
                [*_uv_lines("n", ind), f"{ind}n -= 1"]
                if flexible
                else [f"{ind}n = I32(buf, pos)[0]", f"{ind}pos += 4"]
            )
            head.append(f"{ind}if n > end - pos: raise TOO_MANY(n, end - pos)")
            if not nullable:  # kio reads -1 as None even where the schema has no null
                head.append(f"{ind}if n < 0: raise ProtocolError('null array')")
            if not dataclasses.is_dataclass(element) and kafka_type in _FIXED:
                return [*head, f"{ind}if n > 0: pos += n * {_FIXED[kafka_type]}"]
            body = self.field(element, kafka_type, flexible, ind + "  ")
            return [*head, f"{ind}for _ in range(n):", *body]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return [f"{ind}pos = {self.entity(tp)}(buf, pos, end)"]
        if kafka_type in _FIXED:
            return [f"{ind}pos += {_FIXED[kafka_type]}"]
        if kafka_type in ("string", "bytes", "records"):
            if flexible:
                return [*_uv_lines("n", ind), f"{ind}if n > 1: pos += n - 1"]
            if kafka_type == "string":
                return [f"{ind}n = I16(buf, pos)[0]", f"{ind}pos += 2 + (n if n > 0 else 0)"]
            return [f"{ind}n = I32(buf, pos)[0]", f"{ind}pos += 4 + (n if n > 0 else 0)"]
        raise TypeError(f"no length check for kafka type {kafka_type!r}")

    def compile(self, schema: type) -> Callable[[Any, int, int], int]:
        self._pending = []
        name = self.entity(schema)
        for tagmap, tags in self._pending:
            self.ns[tagmap].update({t: self.ns[f] for t, f in tags.items()})
        return self.ns[name]


_GEN = _Gen()


_I16_AT = struct.Struct(">h").unpack_from
# (api key, version) -> its body's walker and whether its header has tagged fields.
_PLANS: dict[tuple[int, int], tuple[Callable[[Any, int, int], int], bool]] = {}


def _plan(api_key: int, version: int) -> tuple[Callable[[Any, int, int], int], bool]:
    plan = _PLANS.get((api_key, version))
    if plan is None:
        schema = request_schema(api_key, version)
        plan = _PLANS[(api_key, version)] = (
            _GEN.compile(schema),
            schema.__header_schema__.__flexible__,
        )
    return plan


def check_array_lengths(frame: memoryview, api_key: int, version: int) -> None:
    """Raise ProtocolError if an array count in the request overruns the frame."""
    walk, flexible_header = _plan(api_key, version)
    try:
        # Header: api key, version, correlation id, client id (always a classic
        # string), then tagged fields in header v2 (only flexible request versions).
        (n,) = _I16_AT(frame, 8)
        pos = 10 + (n if n > 0 else 0)
        if flexible_header:
            if frame[pos] == 0:  # no tagged fields: nearly always
                pos += 1
            else:
                count, pos = _uv(frame, pos)
                pos = _skip_tags(frame, pos, len(frame), count, {})
        walk(frame, pos, len(frame))
    except (IndexError, struct.error, DecodeError, ValueError) as exc:
        raise ProtocolError(f"request overruns its frame: {exc}") from None
