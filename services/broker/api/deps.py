"""What each family of Kafka handlers is given: built once by the composition root
(broker.py), bound to the handlers in dispatch.py. A handler sees only these, never the
Broker.

| family | handlers | given |
|---|---|---|
| produce | Produce | PartitionWriter |
| fetch | Fetch, ListOffsets, OffsetForLeaderEpoch | FetchDeps |
| records | DeleteRecords | LocalReplicas |
| metadata | Metadata, DescribeCluster | MetadataDeps |
| topics | DescribeTopicPartitions, ApiVersions | MetadataView |
| groups | FindCoordinator ... ConsumerGroupDescribe | GroupDeps |
| share | ShareGroupHeartbeat ... DescribeShareGroupOffsets | ShareCoordinator |
| admin | topics, configs, producer ids, log dirs, ACLs, reassignment, SCRAM | AdminDeps |
| transactions | InitProducerId (transactional), AddPartitionsToTxn ... ListTransactions | TxnDeps |
| quorum | DescribeQuorum, AddRaftVoter, RemoveRaftVoter, UpdateRaftVoter | ControllerCall |
| sasl | SaslHandshake, SaslAuthenticate | (the connection's security only) |
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import BrokerConfig
    from ..fetch_sessions import FetchSessions
    from ..groups.coordinator import GroupCoordinator
    from ..groups.offsets import OffsetStore
    from ..metadata_view import MetadataView
    from ..metrics import BrokerMetrics
    from ..partitions import PartitionManager
    from ..quotas import ClientQuotas
    from ..replication.throttle import ReplicationThrottle
    from ..security.listeners import Listener
    from ..share.coordinator import ShareCoordinator
    from ..transactions.coordinator import TransactionCoordinator
    from ..transactions.verification import TxnVerifier
    from ..views import Control, LocalReplicas
    from .metadata import TopicAnswers


@dataclass(frozen=True, slots=True)
class FetchDeps:
    """Fetch's route: the session cache, the partition's leader replica (and whether
    the metadata knows it), the follower throttle, then the counters."""

    replicas: LocalReplicas
    sessions: FetchSessions
    throttle: ReplicationThrottle
    metrics: BrokerMetrics
    max_wait_s: float  # fetch.max.wait.ms: the longest a fetch is held
    stopping: Callable[[], bool]  # a leaving broker answers parked fetches at once
    quotas: ClientQuotas  # consumer_byte_rate (the client's allowance is on the context)
    # A broker's registration (incarnation) in this broker's metadata, None if unknown:
    # a follower's fetch counts for the process that registered last (KIP-903).
    incarnation: Callable[[int], str | None]


@dataclass(frozen=True, slots=True)
class MetadataDeps:
    metadata: MetadataView
    answers: TopicAnswers  # each topic's encoded answer, cached per version
    control: Control  # auto-created topics
    # This broker's own endpoint, the answer's last resort when the image shows every
    # broker fenced (read per request: a port 0 listener learns its port when bound).
    config: BrokerConfig
    listeners: list[Listener]


@dataclass(frozen=True, slots=True)
class GroupDeps:
    groups: GroupCoordinator
    offsets: OffsetStore
    metadata: MetadataView
    partitions: PartitionManager  # the offsets partition a commit waits on
    ensure_offsets_topic: Callable[[], Awaitable[bool]]
    # KIP-932 share groups share the group id space (ListGroups, DeleteGroups).
    share: ShareCoordinator
    transactions: TransactionCoordinator  # FindCoordinator for transactional ids


@dataclass(frozen=True, slots=True)
class AdminDeps:
    metadata: MetadataView
    control: Control
    config: BrokerConfig  # topic defaults, DescribeConfigs of this broker
    topic_defaults: dict[str, str]
    partitions: PartitionManager  # DescribeLogDirs
    next_producer_id: Callable[[], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class TxnDeps:
    coordinator: TransactionCoordinator
    metadata: MetadataView
    next_producer_id: Callable[[], Awaitable[int]]
    # TxnOffsetCommit is the group coordinator's: it writes into the offsets partition.
    groups: GroupCoordinator
    offsets: OffsetStore
    ensure_offsets_topic: Callable[[], Awaitable[bool]]
    offsets_durable: Callable[[str, int], Awaitable[bool]]
    verifier: TxnVerifier  # the offsets partition in the transaction (KIP-890)
