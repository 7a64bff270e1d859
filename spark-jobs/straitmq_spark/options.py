"""Options of the `straitmq` data source and the offset arithmetic behind them (no I/O).

Offsets are JSON-able dicts shaped like Spark's Kafka source:
``{"orders": {"0": 23, "1": 42}}`` (topic -> partition as a string -> next offset to read).
In `startingOffsets` / `endingOffsets`, -2 means earliest and -1 latest, as in Spark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from straitmq.client_security import ClientSecurityError, librdkafka_config

from .errors import StraitMQSparkError

EARLIEST = -2
LATEST = -1

# Options read by the data source itself; every other `kafka.<name>` option is handed to the
# client (librdkafka) as `<name>`, like Spark's Kafka source does for the Java client.
_BOOTSTRAP_KEYS = ("kafka.bootstrap.servers", "bootstrap.servers", "bootstrap")
_TOPIC_KEYS = ("subscribe", "topics", "topic")
# Java-client options with no librdkafka equivalent; passing them on would be refused.
_JAVA_ONLY = {
    "key.deserializer",
    "value.deserializer",
    "auto.offset.reset",
    "enable.auto.commit",
    "group.id",
    "interceptor.classes",
}

Offsets = dict[str, dict[str, int]]
TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    topics: tuple[str, ...]
    starting: str | Offsets
    ending: str | Offsets
    max_records_per_trigger: int | None
    include_headers: bool
    fail_on_data_loss: bool
    poll_timeout_ms: int
    metadata_timeout_ms: int
    client_config: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        bootstrap = _first(opts, _BOOTSTRAP_KEYS)
        if not bootstrap:
            raise StraitMQSparkError(
                "StraitMQ bootstrap servers not set: add "
                '.option("kafka.bootstrap.servers", "host:9092")'
            )
        topics_text = _first(opts, _TOPIC_KEYS)
        if not topics_text:
            raise StraitMQSparkError(
                f"no StraitMQ topic to read at bootstrap {bootstrap}: add "
                '.option("subscribe", "topic1,topic2")'
            )
        topics = tuple(t.strip() for t in topics_text.split(",") if t.strip())
        if not topics:
            raise StraitMQSparkError(f"option 'subscribe' lists no topic: {topics_text!r}")
        starting = _parse_offsets_option(
            "startingOffsets", opts.get("startingoffsets", "latest" if streaming else "earliest")
        )
        ending = _parse_offsets_option("endingOffsets", opts.get("endingoffsets", "latest"))
        if streaming and "endingoffsets" in opts:
            raise StraitMQSparkError(
                "option 'endingOffsets' is for batch reads (spark.read); a streaming query "
                "reads until stopped"
            )
        if ending == "earliest" or (isinstance(ending, dict) and _has(ending, EARLIEST)):
            raise StraitMQSparkError(
                "endingOffsets cannot be 'earliest' (-2): use 'latest' or explicit offsets"
            )
        if isinstance(starting, dict) and _has(starting, LATEST) and not streaming:
            raise StraitMQSparkError(
                "startingOffsets cannot use -1 (latest) in a batch read: it would read nothing"
            )
        max_records = _first(opts, ("maxrecordspertrigger", "maxoffsetspertrigger"))
        client_config = _client_config(opts)
        for key in client_config:
            if key in _JAVA_ONLY:
                raise StraitMQSparkError(
                    f"option 'kafka.{key}' is not supported: the data source manages it "
                    "(offsets live in Spark's checkpoint, records are read as binary)"
                )
        return cls(
            bootstrap=bootstrap,
            topics=topics,
            starting=starting,
            ending=ending,
            max_records_per_trigger=_positive_int("maxRecordsPerTrigger", max_records),
            include_headers=_bool("includeHeaders", opts.get("includeheaders", "false")),
            fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
            poll_timeout_ms=_positive_int(
                "kafkaConsumer.pollTimeoutMs", opts.get("kafkaconsumer.polltimeoutms", "120000")
            )
            or 120000,
            metadata_timeout_ms=_positive_int(
                "metadataTimeoutMs", opts.get("metadatatimeoutms", "15000")
            )
            or 15000,
            client_config=client_config,
        )


def _client_config(opts: Mapping[str, str]) -> dict[str, str]:
    """The `kafka.*` options for the client, with Java's security options (the ones a
    user of Spark's Kafka source already has) in librdkafka's names."""
    options = {
        k[len("kafka.") :]: v
        for k, v in opts.items()
        if k.startswith("kafka.") and k not in _BOOTSTRAP_KEYS
    }
    try:
        return librdkafka_config(options, prefix="kafka.")
    except ClientSecurityError as e:
        raise StraitMQSparkError(str(e)) from None


def _first(opts: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    for k in keys:
        if opts.get(k):
            return opts[k]
    return None


def _has(offsets: Offsets, value: int) -> bool:
    return any(v == value for parts in offsets.values() for v in parts.values())


def _bool(name: str, text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise StraitMQSparkError(f"option '{name}' must be true or false, not {text!r}")


def _positive_int(name: str, text: str | None) -> int | None:
    if text is None or str(text).strip() == "":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise StraitMQSparkError(f"option '{name}' must be a positive integer, not {text!r}")
    return n


def _parse_offsets_option(name: str, text: str) -> str | Offsets:
    low = text.strip().lower()
    if low in ("earliest", "latest"):
        return low
    try:
        raw = json.loads(text)
    except ValueError:
        raw = None
    ok = isinstance(raw, dict) and all(
        isinstance(parts, dict)
        and all(str(p).isdigit() and isinstance(o, int) and o >= -2 for p, o in parts.items())
        for parts in raw.values()
    )
    if not ok:
        raise StraitMQSparkError(
            f"option '{name}' must be 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}} (-2 = earliest, -1 = latest), not {text!r}'
        )
    return {t: {str(int(p)): o for p, o in parts.items()} for t, parts in raw.items()}


def sorted_offsets(offsets: Mapping[TopicPartition, int]) -> Offsets:
    """{(topic, partition): offset} as the JSON dict form, in a stable order."""
    out: Offsets = {}
    for (topic, part), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(part)] = int(off)
    return out


def flatten(offsets: Mapping[str, Mapping[str, Any]]) -> dict[TopicPartition, int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_records: int
) -> dict[TopicPartition, int]:
    """End offsets that take at most `max_records` records in total, shared among partitions
    in proportion to what each has waiting (like Spark's Kafka source), and never fewer than
    one record per trigger while anything is waiting (so a query always makes progress).
    `start` must hold every partition of `latest`."""
    waiting = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(waiting.values())
    if total <= max_records:
        return dict(latest)
    share = {tp: (n * max_records) // total for tp, n in waiting.items()}
    left = max_records - sum(share.values())
    # Hand out what rounding left, largest remainder first, ties by partition order.
    order = sorted(waiting, key=lambda tp: (-((waiting[tp] * max_records) % total), tp))
    for tp in order:
        if left == 0:
            break
        if share[tp] < waiting[tp]:
            share[tp] += 1
            left -= 1
    return {tp: start[tp] + share[tp] for tp in latest}


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    metadata_timeout_ms: int
    client_config: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = {k.lower(): v for k, v in options.items()}
        bootstrap = _first(opts, _BOOTSTRAP_KEYS)
        if not bootstrap:
            raise StraitMQSparkError(
                "StraitMQ bootstrap servers not set: add "
                '.option("kafka.bootstrap.servers", "host:9092")'
            )
        return cls(
            bootstrap=bootstrap,
            topic=opts.get("topic") or None,
            metadata_timeout_ms=_positive_int(
                "metadataTimeoutMs", opts.get("metadatatimeoutms", "15000")
            )
            or 15000,
            client_config=_client_config(opts),
        )
