"""Controller settings, each declared once: its default, its Kafka name and its
`strait-controller` flag, with Kafka's names (and defaults) where Kafka has the same knob.

The command line (`straitmq.controller.__main__`) is built from these declarations, and
the classes that use the values take their defaults from here: ControllerSettings
(active.py) and a combined node's BrokerConfig. The quorum's two timeouts are the other
way round: the Raft core (straitmq.raft, a floor below) keeps their values in RaftConfig
and they are declared here as settings with those defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from straitmq.raft import RaftConfig

from straitmq.settings import describe, setting

_RAFT = RaftConfig()  # the Raft core's own defaults of the quorum timeouts


@dataclass
class ControllerConfig:
    # The quorum (Kafka's controller.quorum.*).
    election_timeout_ms: int = setting(
        _RAFT.election_timeout_ms,
        "controller.quorum.election.timeout.ms",
        "--election-timeout-ms",
        "how long a voter waits for a leader before it campaigns (randomized in [T, 2T))",
    )
    fetch_timeout_ms: int = setting(
        _RAFT.fetch_timeout_ms,
        "controller.quorum.fetch.timeout.ms",
        "--fetch-timeout-ms",
        "a follower without a good fetch from the leader this long campaigns; the leader "
        "resigns when a majority has not fetched for 1.5 times as long",
    )
    # The active controller.
    broker_session_timeout_ms: int = setting(
        9000,
        "broker.session.timeout.ms",
        "--broker-session-timeout-ms",
        "a broker without a heartbeat this long is fenced",
    )
    leader_rebalance_interval_ms: int = setting(
        30_000,
        None,
        "--leader-rebalance-interval-ms",
        "how often leadership moves back to the preferred replicas",
    )
    auto_leader_rebalance: bool = setting(
        True,
        "auto.leader.rebalance.enable",
        "--no-auto-leader-rebalance",
        "never move leadership back to the preferred replicas",
    )
    default_partitions: int = setting(
        1,
        "num.partitions",
        "--default-partitions",
        "partitions of a topic created without a count",
    )
    default_replication_factor: int = setting(
        1,
        "default.replication.factor",
        "--default-replication-factor",
        "replicas of a topic created without a replication factor",
    )
    bootstrap_metadata_level: int = setting(
        3,
        None,
        "--bootstrap-metadata-level",
        "the straitmq.metadata.version a new cluster starts at: 3 finalizes every feature "
        "at this release's newest level (as Kafka's storage format does); 2, release "
        "0.2.0's levels (so 0.2.0 can still join); 1 writes no feature record, so release "
        "0.1.0 can still join and read the log (finalize later with `strait features "
        "upgrade`)",
    )
    quota_window_num: int = setting(
        11,
        "quota.window.num",
        "--quota-window-num",
        "the controller_mutation_rate allowance holds this many windows of the quota",
    )
    quota_window_size_seconds: int = setting(
        1,
        "quota.window.size.seconds",
        "--quota-window-size-seconds",
        "the length of one client quota window",
    )
    otlp_endpoint: str | None = setting(
        None,
        None,
        "--otlp-endpoint",
        "OTLP/HTTP collector base URL for metrics, e.g. http://otel-collector:4318 "
        "(default: the OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT variables; none: no export)",
    )

    def describe(self) -> dict[str, str]:
        """The settings by their Kafka names."""
        return describe(self)


# The declared values, for the classes that take them as their own defaults.
DEFAULTS = ControllerConfig()
