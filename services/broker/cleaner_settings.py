"""The log cleaner's settings as they are now: Kafka's `log.cleaner.*` broker configs,
the cluster's dynamic values (`kafka-configs --entity-type brokers --alter`) over this
broker's static ones. The cleaner builds a `CleanerSettings` each round, so a change
applies from its next round without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .config import BrokerConfig
from .dynamic_configs import effective_values


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    enabled: bool  # log.cleaner.enable (static, as in Kafka)
    threads: int  # log.cleaner.threads
    io_max_bytes_per_second: float  # log.cleaner.io.max.bytes.per.second, all workers
    dedupe_buffer_size: int  # log.cleaner.dedupe.buffer.size, all workers together
    io_buffer_size: int  # log.cleaner.io.buffer.size, all workers together
    io_buffer_load_factor: float  # log.cleaner.io.buffer.load.factor
    backoff_ms: int  # log.cleaner.backoff.ms: sleep when nothing needs cleaning

    @classmethod
    def of(cls, config: BrokerConfig, cluster_configs: Mapping[str, str]) -> CleanerSettings:
        """The settings now: `cluster_configs` is the metadata image's
        (`broker.image.cluster_configs`), read afresh by each caller."""
        v = effective_values(config, cluster_configs)
        return cls(
            enabled=config.log_cleaner_enable,
            threads=int(v["log.cleaner.threads"]),
            io_max_bytes_per_second=float(v["log.cleaner.io.max.bytes.per.second"]),
            dedupe_buffer_size=int(v["log.cleaner.dedupe.buffer.size"]),
            io_buffer_size=int(v["log.cleaner.io.buffer.size"]),
            io_buffer_load_factor=float(v["log.cleaner.io.buffer.load.factor"]),
            backoff_ms=int(v["log.cleaner.backoff.ms"]),
        )
