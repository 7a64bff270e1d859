"""Broker settings, each declared once: its default, its Kafka name (what DescribeConfigs
shows) and its `strait-broker` flag, with Kafka's names where Kafka has the same knob.

`setting(...)` (straitmq.settings, shared with ControllerConfig) puts the name and flag in
the dataclass field's metadata; `describe()` and the command line
(`straitmq.broker.__main__`) are both built from these declarations. A combined node's own
controller settings take their defaults from ControllerConfig; the group coordinators'
settings take theirs from `DEFAULTS` here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from straitmq.controller.config import DEFAULTS as CONTROLLER
from straitmq.metadata.broker_configs import DYNAMIC_BROKER_CONFIGS as _DYNAMIC

from straitmq.settings import describe, setting


@dataclass
class BrokerConfig:
    node_id: int = setting(1, "node.id")  # flag --node-id: a number or 'auto'
    data_dir: str = setting("./.strait-data", "log.dirs", "--data-dir")
    host: str = "127.0.0.1"  # host, port and the advertised pair come from --listen,
    port: int = 9092  # --advertise and --http (host:port each)
    advertised_host: str = "127.0.0.1"
    advertised_port: int = 9092
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    rack: str | None = None  # --rack or --rack-file
    auto_create_topics: bool = setting(True, "auto.create.topics.enable")  # --no-auto-create
    num_partitions: int = setting(1, "num.partitions", "--num-partitions")
    default_replication_factor: int = setting(
        1, "default.replication.factor", "--default-replication-factor"
    )
    message_max_bytes: int = setting(1048588, "message.max.bytes", "--message-max-bytes")
    socket_request_max_bytes: int = setting(104857600, "socket.request.max.bytes")
    # Connection caps at accept (Kafka's names and defaults: Int.MaxValue, no cap). Past
    # one, a new connection is closed at once and logged (server.ConnectionLimits).
    max_connections: int = setting(
        2**31 - 1, "max.connections", "--max-connections",
        "Kafka connections this broker keeps open at once, over its listeners (an "
        "inter-broker listener beside client listeners is not counted); a new one past it "
        "is closed at once",
        properties=True,
    )  # fmt: skip
    max_connections_per_ip: int = setting(
        2**31 - 1, "max.connections.per.ip", "--max-connections-per-ip",
        "Kafka connections one client address may keep open at once, on every listener; a "
        "new one past it is closed at once",
        properties=True,
    )  # fmt: skip
    offsets_topic_partitions: int = setting(16, "offsets.topic.num.partitions")
    group_initial_rebalance_delay_ms: int = setting(
        3000, "group.initial.rebalance.delay.ms", "--group-initial-rebalance-delay-ms"
    )
    group_min_session_timeout_ms: int = setting(6000, "group.min.session.timeout.ms")
    group_max_session_timeout_ms: int = setting(1_800_000, "group.max.session.timeout.ms")
    # KIP-848 consumer groups (Kafka's defaults).
    group_consumer_session_timeout_ms: int = setting(
        45_000, "group.consumer.session.timeout.ms", "--group-consumer-session-timeout-ms"
    )
    group_consumer_heartbeat_interval_ms: int = setting(
        5_000, "group.consumer.heartbeat.interval.ms", "--group-consumer-heartbeat-interval-ms"
    )
    retention_check_interval_ms: int = setting(
        300_000, "log.retention.check.interval.ms", "--retention-check-interval-ms"
    )
    # KIP-932 share groups (Kafka's defaults; group.share.partition.max.record.locks 2000).
    group_share_session_timeout_ms: int = setting(
        45_000, "group.share.session.timeout.ms", "--group-share-session-timeout-ms"
    )
    group_share_heartbeat_interval_ms: int = setting(
        5_000, "group.share.heartbeat.interval.ms", "--group-share-heartbeat-interval-ms"
    )
    group_share_record_lock_duration_ms: int = setting(
        30_000, "group.share.record.lock.duration.ms", "--group-share-record-lock-duration-ms"
    )
    group_share_delivery_count_limit: int = setting(
        5, "group.share.delivery.count.limit", "--group-share-delivery-count-limit"
    )
    group_share_partition_max_record_locks: int = setting(
        2000, "group.share.partition.max.record.locks"
    )
    share_auto_offset_reset: str = setting(
        "latest", None, "--share-auto-offset-reset",
        "where a share group starts reading a partition: latest (Kafka's default) or "
        "earliest (Kafka sets it per group: share.auto.offset.reset)",
    )  # fmt: skip
    # Offsets of a group without members expire this long after their commit (KIP-848
    # and simple groups) or after the group became empty (classic), as Kafka 4 counts; a
    # group left with neither is removed. Kafka's is whole minutes; a fraction is
    # accepted here (tests).
    offsets_retention_minutes: float = setting(
        10080, "offsets.retention.minutes", "--offsets-retention-minutes"
    )
    offsets_retention_check_interval_ms: int = setting(
        600_000, "offsets.retention.check.interval.ms", "--offsets-retention-check-interval-ms"
    )
    # The log cleaner (Kafka's names and defaults, from straitmq.metadata.broker_configs).
    # All but log.cleaner.enable can also be changed at runtime, cluster-wide, with
    # `kafka-configs --entity-type brokers`: straitmq.broker.cleaner_settings reads both.
    log_cleaner_enable: bool = setting(
        True, "log.cleaner.enable", "--no-log-cleaner", "do not compact topics"
    )
    log_cleaner_threads: int = setting(
        int(_DYNAMIC["log.cleaner.threads"].default),
        "log.cleaner.threads",
        "--log-cleaner-threads",
    )
    log_cleaner_io_max_bytes_per_second: float = setting(
        float(_DYNAMIC["log.cleaner.io.max.bytes.per.second"].default),
        "log.cleaner.io.max.bytes.per.second",
        "--log-cleaner-io-max-bytes-per-second",
    )
    log_cleaner_dedupe_buffer_size: int = setting(
        int(_DYNAMIC["log.cleaner.dedupe.buffer.size"].default),
        "log.cleaner.dedupe.buffer.size",
        "--log-cleaner-dedupe-buffer-size",
    )
    log_cleaner_io_buffer_size: int = setting(
        int(_DYNAMIC["log.cleaner.io.buffer.size"].default),
        "log.cleaner.io.buffer.size",
        "--log-cleaner-io-buffer-size",
    )
    log_cleaner_io_buffer_load_factor: float = setting(
        float(_DYNAMIC["log.cleaner.io.buffer.load.factor"].default),
        "log.cleaner.io.buffer.load.factor",
        "--log-cleaner-io-buffer-load-factor",
    )
    log_cleaner_backoff_ms: int = setting(
        int(_DYNAMIC["log.cleaner.backoff.ms"].default),
        "log.cleaner.backoff.ms",
        "--log-cleaner-backoff-ms",
    )
    # Broker defaults of the compaction topic configs (Kafka's synonyms).
    log_cleanup_policy: str = setting(
        _DYNAMIC["log.cleanup.policy"].default, "log.cleanup.policy", "--log-cleanup-policy"
    )
    log_cleaner_min_cleanable_ratio: float = setting(
        float(_DYNAMIC["log.cleaner.min.cleanable.ratio"].default),
        "log.cleaner.min.cleanable.ratio",
        "--log-cleaner-min-cleanable-ratio",
    )
    log_cleaner_min_compaction_lag_ms: int = setting(
        int(_DYNAMIC["log.cleaner.min.compaction.lag.ms"].default),
        "log.cleaner.min.compaction.lag.ms",
        "--log-cleaner-min-compaction-lag-ms",
    )
    log_cleaner_max_compaction_lag_ms: int = setting(
        int(_DYNAMIC["log.cleaner.max.compaction.lag.ms"].default),
        "log.cleaner.max.compaction.lag.ms",
        "--log-cleaner-max-compaction-lag-ms",
    )
    log_cleaner_delete_retention_ms: int = setting(
        int(_DYNAMIC["log.cleaner.delete.retention.ms"].default),
        "log.cleaner.delete.retention.ms",
        "--log-cleaner-delete-retention-ms",
    )
    fetch_max_wait_s: float = 30.0
    log_flush_interval_messages: int | None = setting(
        None, None, "--flush-messages",
        "fsync every N messages (default: rely on the OS, as Kafka does)",
    )  # fmt: skip
    # Cluster membership. No controller voters = a combined single node.
    cluster_id: str | None = setting(None, None, "--cluster-id", "required with --controllers")
    controller_voters: str | None = setting(
        None, "controller.quorum.voters", "--controllers",
        "controller voters 1001@host:port,...; without it this is a combined single node",
    )  # fmt: skip
    offsets_topic_replication_factor: int = setting(
        1, "offsets.topic.replication.factor", "--offsets-topic-replication-factor"
    )
    # The transaction coordinator (Kafka's names; Kafka's defaults but the replication
    # factor, which follows offsets.topic.replication.factor's local default of 1).
    transaction_state_log_replication_factor: int = setting(
        1,
        "transaction.state.log.replication.factor",
        "--transaction-state-log-replication-factor",
    )
    transaction_state_log_num_partitions: int = setting(50, "transaction.state.log.num.partitions")
    transaction_state_log_segment_bytes: int = setting(
        100 * 1024 * 1024, "transaction.state.log.segment.bytes"
    )
    transaction_max_timeout_ms: int = setting(
        900_000, "transaction.max.timeout.ms", "--transaction-max-timeout-ms"
    )
    transactional_id_expiration_ms: int = setting(
        7 * 24 * 3600 * 1000, "transactional.id.expiration.ms"
    )
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = setting(
        10_000,
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "--transaction-abort-check-interval-ms",
    )
    transaction_partition_verification_enable: bool = setting(
        True,
        "transaction.partition.verification.enable",
        "--no-transaction-partition-verification",
        "do not verify a v1 transactional write's partition with its coordinator "
        "(KIP-890); also a dynamic broker config",
    )
    heartbeat_interval_ms: int = setting(
        2000, "broker.heartbeat.interval.ms", "--heartbeat-interval-ms"
    )
    replica_lag_time_max_ms: int = setting(
        30_000, "replica.lag.time.max.ms", "--replica-lag-time-max-ms"
    )
    quota_window_num: int = setting(
        11,
        "quota.window.num",
        "--quota-window-num",
        "samples a client quota's rate is measured over",
    )
    quota_window_size_seconds: int = setting(
        1,
        "quota.window.size.seconds",
        "--quota-window-size-seconds",
        "the length of one client quota sample",
    )
    max_open_files: int | None = setting(
        None, None, "--max-open-files",
        "segment files kept open at once, least recently used closed first "
        "(default: half the process's open-file limit)",
    )  # fmt: skip
    controlled_shutdown_timeout_ms: int = setting(30_000, None, "--controlled-shutdown-timeout-ms")
    # The clients seen lately (GET /api/v1/clients, `strait clients`, `strait upgrade plan`;
    # straitmq.broker.client_registry).
    client_registry_expiry_ms: int = setting(
        900_000, None, "--client-registry-expiry-ms",
        "how long a client stays listed by GET /api/v1/clients after its last connection closed",
    )  # fmt: skip
    client_registry_max_entries: int = setting(
        1000, None, "--client-registry-max-entries",
        "clients kept for GET /api/v1/clients; beyond it the least recently seen is dropped",
    )  # fmt: skip
    # On Kubernetes a Service routes to a terminating pod until the kubelet has seen its
    # readiness probe fail; a connection sent there after the pod's address is gone hangs
    # until the client's connect timeout (30 s). So a leaving broker answers /readyz 503
    # from the moment it is asked to stop and, its Kafka listeners closed (refusing, not
    # hanging), exits only once /readyz has answered 503 this many times, or after
    # --shutdown-readiness-timeout-ms. 0: exit at once (no probes to wait for).
    shutdown_readiness_probes: int = setting(
        0,
        None,
        "--shutdown-readiness-probes",
        "on stop, exit after /readyz has answered 503 this many times (Kubernetes: the "
        "readiness probe's failureThreshold + 1)",
    )
    shutdown_readiness_timeout_ms: int = setting(
        10_000,
        None,
        "--shutdown-readiness-timeout-ms",
        "the longest --shutdown-readiness-probes waits",
    )
    # The combined node's own quorum and controller (ControllerConfig declares them).
    election_timeout_ms: int = CONTROLLER.election_timeout_ms
    fetch_timeout_ms: int = CONTROLLER.fetch_timeout_ms
    session_timeout_ms: int = setting(
        CONTROLLER.broker_session_timeout_ms, None, "--session-timeout-ms",
        "combined node: broker session timeout of its controller",
    )  # fmt: skip
    leader_rebalance_interval_ms: int = CONTROLLER.leader_rebalance_interval_ms
    # Named listeners, as Kafka names them (see straitmq.broker.security.listeners). Unset:
    # one PLAINTEXT listener on --listen / --advertise, exactly as before listeners existed.
    listeners: str | None = setting(
        None, "listeners", "--listeners",
        "named listeners NAME://host:port,... (e.g. CLIENT://:9092,REPLICATION://:9192); "
        "replaces --listen",
        properties=True,
    )  # fmt: skip
    advertised_listeners: str | None = setting(
        None, "advertised.listeners", "--advertised-listeners",
        "NAME://host:port,... clients are told to use (default: each listener's own)",
        properties=True,
    )  # fmt: skip
    listener_security_protocol_map: str | None = setting(
        None, "listener.security.protocol.map", "--listener-security-protocol-map",
        "NAME:PROTOCOL,... (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL); default: each "
        "protocol's own name",
        properties=True,
    )  # fmt: skip
    inter_broker_listener_name: str | None = setting(
        None, "inter.broker.listener.name", "--inter-broker-listener-name",
        "the listener replicas fetch from, of any security protocol (default: the first "
        "PLAINTEXT listener)",
        properties=True,
    )  # fmt: skip
    connections_max_reauth_ms: int = setting(
        0, "connections.max.reauth.ms", "--connections-max-reauth-ms",
        "SASL session lifetime (KIP-368); 0: sessions never expire",
        properties=True,
    )  # fmt: skip
    # ssl.*, sasl.* and listener.name.<name>.* settings (Kafka names) from --properties
    # and --override; never shown by DescribeConfigs (they hold passwords).
    security: dict[str, str] = field(default_factory=dict)
    otlp_endpoint: str | None = setting(
        None, None, "--otlp-endpoint",
        "OTLP/HTTP collector base URL for metrics, e.g. http://otel-collector:4318 "
        "(default: the OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT variables; none: no export)",
    )  # fmt: skip

    def describe(self) -> dict[str, str]:
        """Broker configs as DescribeConfigs shows them (Kafka names)."""
        return describe(self)

    def as_dict(self) -> dict:
        return asdict(self)


# The declared defaults: the subsystems' own settings (GroupSettings, ShareSettings) take
# theirs from here instead of repeating the numbers.
DEFAULTS = BrokerConfig()
