"""Broker configs that can change at runtime (Kafka's dynamic broker configs), as far as
they matter to StraitMQ: the log cleaner's settings (Kafka's
LogCleaner.ReconfigurableConfigs), the broker defaults of the compaction topic configs
(Kafka's DynamicLogConfig synonyms), and the reassignment quotas `kafka-reassign-partitions`
sets and clears (Kafka's DynamicConfig.Broker).

They are stored cluster-wide in the metadata log under their Kafka names (the image's
`cluster_configs`), like `replication.throttled.rate`: every broker reads the same value.
A broker's static setting (BrokerConfig) is the default under a dynamic value.
"""

from __future__ import annotations

from straitmq.metadata.topic_config import (
    ConfigDef,
    boolean,
    cleanup_policy,
    double_range,
    long_range,
)

INT_MAX = 2**31 - 1
DOUBLE_MAX = 1.7976931348623157e308
MB = 1024 * 1024


def _defs() -> tuple[ConfigDef, ...]:
    return (
        # The log cleaner, read by the cleaner each round (straitmq.broker.cleaner_settings).
        ConfigDef(
            "log.cleaner.threads",
            "int",
            "1",
            long_range(0, INT_MAX),
            "cleaner workers compacting logs at once",
        ),
        ConfigDef(
            "log.cleaner.io.max.bytes.per.second",
            "double",
            repr(DOUBLE_MAX),
            double_range(0, DOUBLE_MAX),
            "the cleaners' read and write I/O, in bytes per second, all workers together "
            "(0: no limit)",
        ),
        ConfigDef(
            "log.cleaner.dedupe.buffer.size",
            "long",
            str(128 * MB),
            long_range(0),
            "memory for the cleaners' key maps, all workers together",
        ),
        ConfigDef(
            "log.cleaner.io.buffer.size",
            "int",
            str(512 * 1024),
            long_range(0, INT_MAX),
            "the cleaners' read and write buffers, all workers together",
        ),
        ConfigDef(
            "log.cleaner.io.buffer.load.factor",
            "double",
            "0.9",
            double_range(0, 1),
            "how full a cleaner's key map may get before it stops adding keys and cleans",
        ),
        ConfigDef(
            "log.cleaner.backoff.ms",
            "long",
            "15000",
            long_range(0),
            "how long a cleaner sleeps when no log needs cleaning",
        ),
        # Broker defaults of topic configs (a topic's own value wins).
        ConfigDef(
            "log.cleanup.policy",
            "list",
            "delete",
            cleanup_policy,
            "default cleanup.policy of topics that do not set one",
        ),
        ConfigDef(
            "log.cleaner.min.cleanable.ratio",
            "double",
            "0.5",
            double_range(0, 1),
            "default min.cleanable.dirty.ratio of topics that do not set one",
        ),
        ConfigDef(
            "log.cleaner.min.compaction.lag.ms",
            "long",
            "0",
            long_range(0),
            "default min.compaction.lag.ms of topics that do not set one",
        ),
        ConfigDef(
            "log.cleaner.max.compaction.lag.ms",
            "long",
            str(2**63 - 1),
            long_range(1),
            "default max.compaction.lag.ms of topics that do not set one",
        ),
        ConfigDef(
            "log.cleaner.delete.retention.ms",
            "long",
            str(24 * 3600 * 1000),
            long_range(0),
            "default delete.retention.ms of topics that do not set one",
        ),
        # KIP-890: partition leaders verify a v1 transactional producer's first write
        # with its coordinator (v2 producers' partitions are added whatever this says).
        ConfigDef(
            "transaction.partition.verification.enable",
            "boolean",
            "true",
            boolean,
            "verify with the coordinator that a transactional write's partition is in "
            "its transaction, so no late write opens a transaction nothing closes",
        ),
        # Reassignment quotas. (leader/follower.replication.throttled.rate are the cluster's
        # one replication.throttled.rate: straitmq.broker.api.admin maps them.)
        ConfigDef(
            "replica.alter.log.dirs.io.max.bytes.per.second",
            "long",
            str(2**63 - 1),
            long_range(0),
            "accepted; no effect here: a broker has one log directory, so no replica "
            "moves between directories (kafka-reassign-partitions --verify clears it)",
        ),
    )


DYNAMIC_BROKER_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in _defs()}

# Broker config -> the topic config it is the default of (Kafka's ServerTopicConfigSynonyms).
TOPIC_SYNONYMS: dict[str, str] = {
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
}


def check_value(name: str, value: str) -> str | None:
    """Why a dynamic broker config's value is invalid, or None (type and range)."""
    d = DYNAMIC_BROKER_CONFIGS.get(name)
    if d is None:
        return f"{name} is not a dynamic broker config"
    problem = d.check(value)
    return f"invalid value for {name}: {problem}" if problem else None


def check_together(current: dict[str, str], values: dict[str, str]) -> str | None:
    """Kafka's rules across the cleaner settings, for `values` replacing `current` (the
    effective values, by Kafka name): the thread count moves within half to double of the
    running one (LogCleaner.validateReconfiguration), and every thread keeps at least
    1 MiB of dedupe buffer (KafkaConfig)."""
    threads = int(values["log.cleaner.threads"])
    running = int(current["log.cleaner.threads"])
    if threads != running:
        if threads < 1:
            return "Log cleaner threads should be at least 1"
        if threads < running // 2:
            return (
                "Log cleaner threads cannot be reduced to less than half the current "
                f"value {running}"
            )
        if threads > running * 2:
            return (
                "Log cleaner threads cannot be increased to more than double the current "
                f"value {running}"
            )
    if threads > 0 and int(values["log.cleaner.dedupe.buffer.size"]) // threads < MB:
        return "log.cleaner.dedupe.buffer.size must be at least 1MB per cleaner thread."
    return None
