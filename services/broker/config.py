"""Broker settings, with Kafka's names where Kafka has the same knob."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class BrokerConfig:
    node_id: int = 1
    data_dir: str = "./.strait-data"
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str = "127.0.0.1"
    advertised_port: int = 9092
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    rack: str | None = None
    auto_create_topics: bool = True
    num_partitions: int = 1
    default_replication_factor: int = 1
    message_max_bytes: int = 1048588
    socket_request_max_bytes: int = 104857600
    offsets_topic_partitions: int = 16
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    retention_check_interval_ms: int = 300_000
    fetch_max_wait_s: float = 30.0
    log_flush_interval_messages: int | None = None
    # Cluster membership. No controller voters = a combined single node.
    cluster_id: str | None = None
    controller_voters: str | None = None
    offsets_topic_replication_factor: int = 1
    heartbeat_interval_ms: int = 2000
    replica_lag_time_max_ms: int = 30_000
    controlled_shutdown_timeout_ms: int = 30_000
    # The combined node's own quorum and controller.
    election_timeout_ms: int = 1000
    fetch_timeout_ms: int = 2000
    session_timeout_ms: int = 9000
    leader_rebalance_interval_ms: int = 30_000
    # Metrics: OTLP/HTTP collector base URL (None: the OTEL_EXPORTER_OTLP_* variables).
    otlp_endpoint: str | None = None

    def describe(self) -> dict[str, str]:
        """Broker configs as DescribeConfigs shows them (Kafka names)."""
        return {
            "node.id": str(self.node_id),
            "log.dirs": self.data_dir,
            "auto.create.topics.enable": str(self.auto_create_topics).lower(),
            "num.partitions": str(self.num_partitions),
            "default.replication.factor": str(self.default_replication_factor),
            "message.max.bytes": str(self.message_max_bytes),
            "socket.request.max.bytes": str(self.socket_request_max_bytes),
            "offsets.topic.num.partitions": str(self.offsets_topic_partitions),
            "group.initial.rebalance.delay.ms": str(self.group_initial_rebalance_delay_ms),
            "group.min.session.timeout.ms": str(self.group_min_session_timeout_ms),
            "group.max.session.timeout.ms": str(self.group_max_session_timeout_ms),
            "log.retention.check.interval.ms": str(self.retention_check_interval_ms),
            "offsets.topic.replication.factor": str(self.offsets_topic_replication_factor),
            "broker.heartbeat.interval.ms": str(self.heartbeat_interval_ms),
            "replica.lag.time.max.ms": str(self.replica_lag_time_max_ms),
            "controller.quorum.voters": self.controller_voters or "",
        }

    def as_dict(self) -> dict:
        return asdict(self)
