"""Topic-level configs: Kafka's names, defaults and validation rules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: str  # "long" | "int" | "string" | "boolean"
    default: str
    check: Callable[[str], str | None]  # returns an error message or None
    doc: str


def _long(low: int, high: int = LONG_MAX) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        try:
            n = int(value)
        except ValueError:
            return f"'{value}' is not an integer"
        if not low <= n <= high:
            return f"{n} is outside [{low}, {high}]"
        return None

    return check


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if value not in allowed:
            return f"'{value}' is not one of {', '.join(allowed)}"
        return None

    return check


TOPIC_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef(
            "cleanup.policy",
            "list",
            "delete",
            _one_of("delete"),
            "only 'delete' is supported (no compaction yet)",
        ),
        ConfigDef(
            "retention.ms",
            "long",
            str(7 * 24 * 3600 * 1000),
            _long(-1),
            "delete segments older than this; -1 keeps forever",
        ),
        ConfigDef(
            "retention.bytes",
            "long",
            "-1",
            _long(-1),
            "delete oldest segments while the partition is larger; -1 no limit",
        ),
        ConfigDef(
            "segment.bytes",
            "int",
            str(1 << 30),
            _long(14, INT_MAX),
            "roll to a new segment at this size",
        ),
        ConfigDef(
            "segment.ms",
            "long",
            str(7 * 24 * 3600 * 1000),
            _long(1),
            "roll to a new segment after this time",
        ),
        ConfigDef(
            "max.message.bytes",
            "int",
            "1048588",
            _long(0, INT_MAX),
            "largest record batch accepted",
        ),
        ConfigDef(
            "min.insync.replicas",
            "int",
            "1",
            _long(1, INT_MAX),
            "replicas that must acknowledge an acks=all write",
        ),
        ConfigDef(
            "flush.messages", "long", str(LONG_MAX), _long(1), "fsync after this many messages"
        ),
        ConfigDef("flush.ms", "long", str(LONG_MAX), _long(0), "fsync after this long"),
        ConfigDef(
            "index.interval.bytes",
            "int",
            "4096",
            _long(0, INT_MAX),
            "bytes between offset index entries",
        ),
        ConfigDef(
            "message.timestamp.type",
            "string",
            "CreateTime",
            _one_of("CreateTime"),
            "only CreateTime: batches are stored as the producer sent them",
        ),
        ConfigDef(
            "compression.type",
            "string",
            "producer",
            _one_of("producer"),
            "batches keep the producer's compression; the broker never recompresses",
        ),
        ConfigDef(
            "unclean.leader.election.enable",
            "boolean",
            "false",
            _one_of("true", "false"),
            "allow an out-of-sync replica to lead",
        ),
    )
}


def validate_topic_configs(configs: dict[str, str | None]) -> str | None:
    """An error message for the first invalid entry, or None."""
    for key, value in configs.items():
        d = TOPIC_CONFIGS.get(key)
        if d is None:
            return f"unknown topic config '{key}'"
        if value is None:
            continue
        problem = d.check(value)
        if problem:
            return f"invalid value for {key}: {problem}"
    return None


def effective(configs: dict[str, str]) -> dict[str, str]:
    out = {k: d.default for k, d in TOPIC_CONFIGS.items()}
    out.update(configs)
    return out
