"""Topic-level configs: Kafka 4.4's names, types, defaults and validation rules.

Every topic config Kafka 4.4 knows is accepted with Kafka's type and range, so the tools
that copy or clear them wholesale (MirrorMaker 2 syncs every source topic config,
`kafka-reassign-partitions --verify` deletes the throttled-replica lists) work unchanged.
Where StraitMQ does not act on a config its documentation says so: "accepted; no effect
here: <why>". A value StraitMQ cannot honour (tiered storage, broker-side recompression,
LogAppendTime) is refused instead of silently ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
LONG_MAX = 2**63 - 1

Check = Callable[[str], str | None]  # an error message, or None when the value is valid


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: str  # Kafka's ConfigDef.Type, lower case: long, int, double, string, boolean, list
    default: str
    check: Check
    doc: str


_INTEGER = re.compile(r"\s*[+-]?\d+\s*")


def long_range(low: int, high: int = LONG_MAX) -> Check:
    def check(value: str) -> str | None:
        if not _INTEGER.fullmatch(value):
            return f"'{value}' is not an integer"
        n = int(value)
        if not low <= n <= high:
            return f"{n} is outside [{low}, {high}]"
        return None

    return check


def double_range(low: float, high: float) -> Check:
    def check(value: str) -> str | None:
        try:
            x = float(value)
        except ValueError:
            return f"'{value}' is not a number"
        if not math.isfinite(x) or not low <= x <= high:
            return f"{value.strip()} is outside [{low:g}, {high:g}]"
        return None

    return check


def boolean(value: str) -> str | None:
    # Kafka's ConfigDef: true/false in any case, surrounding spaces ignored.
    if value.strip().lower() not in ("true", "false"):
        return f"'{value}' is not true or false"
    return None


def _one_of(*allowed: str) -> Check:
    def check(value: str) -> str | None:
        if value not in allowed:
            return f"'{value}' is not one of {', '.join(allowed)}"
        return None

    return check


def list_items(value: str) -> list[str]:
    """A LIST config's entries as Kafka's ConfigDef parses them: comma-separated,
    spaces around each entry dropped; an empty (or blank) value is the empty list."""
    if not value.strip():
        return []
    return [item.strip() for item in value.split(",")]


POLICIES = ("compact", "delete")


def cleanup_policy(value: str) -> str | None:
    # Kafka 4.1: any mix of compact and delete, in any order, repeats allowed; the empty
    # list keeps everything (no deletion, no compaction). Case matters, as in Kafka.
    for item in list_items(value):
        if item not in POLICIES:
            return (
                f"'{item}' is not a cleanup policy: use delete, compact, both "
                "(compact,delete), or an empty list to keep everything"
            )
    return None


def _throttled_replicas(value: str) -> str | None:
    # Kafka's ThrottledReplicaListValidator: "*" or partition:broker pairs.
    items = list_items(value)
    if items == ["*"] or all(re.fullmatch(r"\d+:\d+", i) or not i for i in items):
        return None
    return f"'{value}' is not '*' or a list of partitionId:brokerId"


def _remote_storage(value: str) -> str | None:
    if problem := boolean(value):
        return problem
    if value.strip().lower() == "true":
        return (
            "tiered storage is not supported: StraitMQ keeps every segment on the "
            "broker's own disk (remote.storage.enable=false is accepted)"
        )
    return None


# Kafka 4.4's max.decompressed.message.bytes: its default (and ceiling) is no limit at all.
MAX_DECOMPRESSED_DEFAULT = INT_MAX - 8


def _max_decompressed(value: str) -> str | None:
    if problem := long_range(1, MAX_DECOMPRESSED_DEFAULT)(value):
        return problem
    if int(value) != MAX_DECOMPRESSED_DEFAULT:
        return (
            "a cap on a record's decompressed size is not supported: StraitMQ does not "
            f"decompress batches on produce (only {MAX_DECOMPRESSED_DEFAULT}, no cap, is accepted)"
        )
    return None


_NO_RECOMPRESSION = (
    "accepted; no effect here: the broker never recompresses (compression.type is always producer)"
)
_NO_TIERED = "accepted; no effect here: tiered storage is not supported"
_NO_THROTTLE_LIST = (
    "accepted; no effect here: StraitMQ throttles, cluster-wide, exactly the replicas a "
    "reassignment is adding (replication.throttled.rate), which is what "
    "kafka-reassign-partitions --throttle lists here"
)


def _defs() -> tuple[ConfigDef, ...]:
    day_ms, week_ms = 24 * 3600 * 1000, 7 * 24 * 3600 * 1000
    return (
        ConfigDef(
            "cleanup.policy",
            "list",
            "delete",
            cleanup_policy,
            "delete: drop old segments (retention.ms, retention.bytes); compact: keep the "
            "latest record per key; compact,delete: both; empty: keep everything",
        ),
        ConfigDef(
            "retention.ms",
            "long",
            str(week_ms),
            long_range(-1),
            "delete segments older than this; -1 keeps forever",
        ),
        ConfigDef(
            "retention.bytes",
            "long",
            "-1",
            long_range(-(2**63)),  # Kafka: any long; negative means no limit
            "delete oldest segments while the partition is larger; -1 no limit",
        ),
        ConfigDef(
            "segment.bytes",
            "int",
            str(1 << 30),
            # Kafka 4.1's floor is 1 MiB; StraitMQ keeps a lower one so tests can roll
            # small segments (Kafka tests use internal.segment.bytes for that).
            long_range(14, INT_MAX),
            "roll to a new segment at this size",
        ),
        ConfigDef(
            "segment.ms",
            "long",
            str(week_ms),
            long_range(1),
            "roll to a new segment after this time",
        ),
        ConfigDef(
            "segment.jitter.ms",
            "long",
            "0",
            long_range(0),
            "accepted; no effect here: segments roll at segment.ms without a random jitter",
        ),
        ConfigDef(
            "segment.index.bytes",
            "int",
            str(10 * 1024 * 1024),
            long_range(4, INT_MAX),
            "accepted; no effect here: the offset and time indexes grow with their segment "
            "instead of being preallocated at a fixed size",
        ),
        ConfigDef(
            "max.message.bytes",
            "int",
            "1048588",
            long_range(0, INT_MAX),
            "largest record batch accepted",
        ),
        ConfigDef(
            "min.insync.replicas",
            "int",
            "1",
            long_range(1, INT_MAX),
            "replicas that must acknowledge an acks=all write",
        ),
        ConfigDef(
            "flush.messages", "long", str(LONG_MAX), long_range(1), "fsync after this many messages"
        ),
        ConfigDef("flush.ms", "long", str(LONG_MAX), long_range(0), "fsync after this long"),
        ConfigDef(
            "index.interval.bytes",
            "int",
            "4096",
            long_range(0, INT_MAX),
            "bytes between offset index entries",
        ),
        ConfigDef(
            "file.delete.delay.ms",
            "long",
            "60000",
            long_range(0),
            "accepted; no effect here: a deleted segment's files are removed once no "
            "reader holds them, not after a fixed delay",
        ),
        ConfigDef(
            "preallocate",
            "boolean",
            "false",
            boolean,
            "accepted; no effect here: segment files grow as they are written",
        ),
        # Compaction (the log cleaner's inputs).
        ConfigDef(
            "min.cleanable.dirty.ratio",
            "double",
            "0.5",
            double_range(0, 1),
            "clean a compacted log when its uncleaned share of bytes reaches this ratio",
        ),
        ConfigDef(
            "min.compaction.lag.ms",
            "long",
            "0",
            long_range(0),
            "a record stays uncompacted for at least this long after it is written",
        ),
        ConfigDef(
            "max.compaction.lag.ms",
            "long",
            str(LONG_MAX),
            long_range(1),
            "a record is compacted at most this long after it is written, whatever the dirty ratio",
        ),
        ConfigDef(
            "delete.retention.ms",
            "long",
            str(day_ms),
            long_range(0),
            "how long a compacted topic keeps a tombstone (a record with a null value) "
            "after cleaning reaches it",
        ),
        ConfigDef(
            "message.timestamp.type",
            "string",
            "CreateTime",
            _one_of("CreateTime"),
            "only CreateTime: batches are stored as the producer sent them",
        ),
        ConfigDef(
            "message.timestamp.before.max.ms",
            "long",
            str(LONG_MAX),
            long_range(0),
            "accepted; no effect here: record timestamps are stored as the producer sent "
            "them, however far in the past",
        ),
        ConfigDef(
            "message.timestamp.after.max.ms",
            "long",
            "3600000",
            long_range(0),
            "accepted; no effect here: record timestamps are stored as the producer sent "
            "them, however far in the future",
        ),
        ConfigDef(
            "compression.type",
            "string",
            "producer",
            _one_of("producer"),
            "batches keep the producer's compression; the broker never recompresses",
        ),
        ConfigDef("compression.gzip.level", "int", "-1", _gzip_level, _NO_RECOMPRESSION),
        ConfigDef("compression.lz4.level", "int", "9", long_range(1, 17), _NO_RECOMPRESSION),
        ConfigDef("compression.zstd.level", "int", "3", long_range(-131072, 22), _NO_RECOMPRESSION),
        ConfigDef(
            "unclean.leader.election.enable",
            "boolean",
            "false",
            boolean,
            "allow an out-of-sync replica to lead",
        ),
        ConfigDef(
            "leader.replication.throttled.replicas",
            "list",
            "",
            _throttled_replicas,
            _NO_THROTTLE_LIST,
        ),
        ConfigDef(
            "follower.replication.throttled.replicas",
            "list",
            "",
            _throttled_replicas,
            _NO_THROTTLE_LIST,
        ),
        # Tiered storage (KIP-405): off, and only off.
        ConfigDef(
            "remote.storage.enable",
            "boolean",
            "false",
            _remote_storage,
            "tiered storage is not supported: only false is accepted",
        ),
        ConfigDef("local.retention.ms", "long", "-2", long_range(-2), _NO_TIERED),
        ConfigDef("local.retention.bytes", "long", "-2", long_range(-2), _NO_TIERED),
        ConfigDef("remote.log.copy.disable", "boolean", "false", boolean, _NO_TIERED),
        ConfigDef("remote.log.delete.on.disable", "boolean", "false", boolean, _NO_TIERED),
        # New in Kafka 4.4 (a Kafka 4.4 source's MirrorMaker 2 sync sends them).
        ConfigDef("remote.copy.lag.ms", "long", "0", long_range(-1), _NO_TIERED),
        ConfigDef("remote.copy.lag.bytes", "long", "-1", long_range(-1), _NO_TIERED),
        ConfigDef(
            "max.decompressed.message.bytes",
            "int",
            str(MAX_DECOMPRESSED_DEFAULT),
            _max_decompressed,
            "largest decompressed record accepted; only the default (no cap) here",
        ),
        ConfigDef(
            "errors.deadletterqueue.group.enable",
            "boolean",
            "false",
            boolean,
            "accepted; no effect here: share groups do not write undeliverable records to a "
            "dead-letter queue",
        ),
    )


def _gzip_level(value: str) -> str | None:
    if long_range(-1, 9)(value) or int(value) == 0:
        return f"'{value.strip()}' is not -1 (the codec's default) or a level 1..9"
    return None


TOPIC_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in _defs()}


def canonical(name: str, value: str) -> str:
    """A valid value as Kafka describes it: the parsed value written back (list entries
    joined by ',' without spaces, numbers without padding, booleans in lower case)."""
    d = TOPIC_CONFIGS.get(name)
    if d is None or d.check(value):
        return value
    if d.type == "list":
        return ",".join(list_items(value))
    if d.type in ("int", "long"):
        return str(int(value))
    if d.type == "double":
        return repr(float(value))
    if d.type == "boolean":
        return value.strip().lower()
    return value


_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


def topic_name_problem(name: str | None) -> str | None:
    """Why a topic name is illegal (Kafka's Topic.validate), or None when it is legal.
    The controller refuses such a topic (errors.check_topic_name), the broker answers
    INVALID_TOPIC_EXCEPTION for it."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be '{name}'"
    if len(name) > MAX_TOPIC_NAME:
        return f"topic name is longer than {MAX_TOPIC_NAME} characters"
    if not _LEGAL_NAME.match(name):
        return f"topic name '{name}' has characters other than ASCII letters, digits, '.', '_', '-'"
    return None


def validate_topic_configs(
    configs: dict[str, str | None], current: dict[str, str] | None = None
) -> str | None:
    """An error message for the first invalid entry, or None. `current`: the topic's
    explicit configs the change applies to (None for a new topic), for Kafka's rules
    across configs."""
    for key, value in configs.items():
        d = TOPIC_CONFIGS.get(key)
        if d is None:
            return f"unknown topic config '{key}'"
        if value is None:
            continue
        problem = d.check(value)
        if problem:
            return f"invalid value for {key}: {problem}"
    merged = dict(current or {})
    for key, value in configs.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    values = effective(merged)
    low, high = int(values["min.compaction.lag.ms"]), int(values["max.compaction.lag.ms"])
    if low > high:  # Kafka's LogConfig.validateValues, word for word
        return (
            f"conflict topic config setting min.compaction.lag.ms ({low}) > "
            f"max.compaction.lag.ms ({high})"
        )
    return None


def effective(configs: dict[str, str]) -> dict[str, str]:
    """Every topic config: the given ones (canonical) over Kafka's defaults."""
    out = {k: d.default for k, d in TOPIC_CONFIGS.items()}
    out.update({k: canonical(k, v) for k, v in configs.items()})
    return out
