"""The consumer's embedded protocol (ConsumerProtocolSubscription / Assignment): what a
classic "consumer" member puts in JoinGroup metadata and SyncGroup assignments.

The coordinator reads it where Kafka's does: to turn a classic group into a KIP-848 group
(its members' subscriptions and assignments), to serve classic members inside a KIP-848
group (their assignment is computed here and sent back in SyncGroup), and to describe
groups. kio's schemas do the bytes; the version is the leading int16, and a version
newer than we know is read as the newest we know (later versions only append fields).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import cache
from importlib import import_module
from typing import Any

from kio.serial import entity_reader, entity_writer

HIGHEST_VERSION = 3
_VERSION = struct.Struct(">h")


class MalformedProtocol(ValueError):
    """The bytes are not a consumer protocol subscription or assignment."""


@dataclass(frozen=True, slots=True)
class Subscription:
    topics: frozenset[str]
    owned: dict[str, tuple[int, ...]]  # v1+: what the member still holds
    rack_id: str | None = None  # v3+


@cache
def _schema(kind: str, version: int) -> tuple[type, Any, Any]:
    module = import_module(f"kio.schema.consumer_protocol_{kind}.v{version}.data")
    cls = getattr(module, f"ConsumerProtocol{kind.capitalize()}")
    return cls, entity_reader(cls), entity_writer(cls)


def version_of(data: bytes) -> int:
    if len(data) < 2:
        raise MalformedProtocol("shorter than its version")
    (version,) = _VERSION.unpack_from(data, 0)
    if version < 0:
        raise MalformedProtocol(f"version {version}")
    return min(version, HIGHEST_VERSION)


def _read(kind: str, data: bytes) -> Any:
    _, reader, _ = _schema(kind, version_of(data))
    try:
        value, _ = reader(memoryview(data), 2)
    except Exception as e:  # kio raises several types on malformed input
        raise MalformedProtocol(f"malformed consumer protocol {kind}: {e}") from None
    return value


def decode_subscription(data: bytes) -> Subscription:
    s = _read("subscription", data)
    owned: dict[str, tuple[int, ...]] = {}
    for tp in getattr(s, "owned_partitions", ()):
        owned[tp.topic] = owned.get(tp.topic, ()) + tuple(tp.partitions)
    return Subscription(frozenset(s.topics), owned, getattr(s, "rack_id", None))


def decode_assignment(data: bytes) -> dict[str, tuple[int, ...]]:
    """{topic: partitions}; an empty assignment (a member left out) is {}."""
    if not data:
        return {}
    a = _read("assignment", data)
    out: dict[str, tuple[int, ...]] = {}
    for tp in a.assigned_partitions:
        out[tp.topic] = out.get(tp.topic, ()) + tuple(tp.partitions)
    return out


def encode_assignment(partitions: dict[str, list[int]], version: int) -> bytes:
    """An assignment in the version the member's subscription used (as Kafka answers)."""
    version = max(0, min(version, HIGHEST_VERSION))
    cls, _, writer = _schema("assignment", version)
    tp_cls = import_module(cls.__module__).TopicPartition
    value = cls(
        assigned_partitions=tuple(
            tp_cls(topic=t, partitions=tuple(sorted(ps))) for t, ps in sorted(partitions.items())
        ),
        user_data=None,
    )
    buf = io.BytesIO()
    buf.write(_VERSION.pack(version))
    writer(buf, value)
    return buf.getvalue()
