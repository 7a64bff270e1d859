"""The broker configs that change at runtime, as this broker sees them: the cluster's
dynamic value (the metadata image's `cluster_configs`, set with `kafka-configs
--entity-type brokers`) over this broker's static setting (BrokerConfig), over Kafka's
default. Also the topic defaults those broker configs feed (Kafka's synonyms:
`log.cleanup.policy` is the default `cleanup.policy`, ...).
"""

from __future__ import annotations

from collections.abc import Mapping

from straitmq.metadata.broker_configs import (
    DYNAMIC_BROKER_CONFIGS,
    TOPIC_SYNONYMS,
    check_together,
    check_value,
)

from .config import BrokerConfig


def static_values(config: BrokerConfig) -> dict[str, str]:
    """Each dynamic broker config's value before any runtime change, by Kafka name."""
    declared = config.describe()
    return {name: declared.get(name, d.default) for name, d in DYNAMIC_BROKER_CONFIGS.items()}


def effective_values(config: BrokerConfig, cluster_configs: Mapping[str, str]) -> dict[str, str]:
    """Each dynamic broker config's value now, by Kafka name."""
    return {name: cluster_configs.get(name, value) for name, value in static_values(config).items()}


def check_static(config: BrokerConfig) -> str | None:
    """Why the static settings of the runtime-changeable configs are invalid, or None
    (the broker refuses to start on them, as Kafka does)."""
    values = static_values(config)
    for name, value in values.items():
        if problem := check_value(name, value):
            return problem
    return check_together(values, values)


def topic_defaults(config: BrokerConfig, cluster_configs: Mapping[str, str]) -> dict[str, str]:
    """The broker's defaults of topic configs: what a topic without its own value gets."""
    out = {"max.message.bytes": str(config.message_max_bytes)}
    if config.log_flush_interval_messages:
        out["flush.messages"] = str(config.log_flush_interval_messages)
    values = effective_values(config, cluster_configs)
    for broker_name, topic_name in TOPIC_SYNONYMS.items():
        out[topic_name] = values[broker_name]
    return out
