"""The API versions this broker implements, and what ApiVersions advertises.

Only implemented APIs are advertised (clients call whatever ApiVersions lists).
Produce is advertised from v0 because older librdkafka turns compression off when it
is not; versions below 3 (message sets v0/v1) are refused by closing the connection.
The handlers for them are bound in dispatch.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kio.schema.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class Versions:
    min_version: int
    max_version: int
    advertised_min: int | None = None


VERSIONS: dict[int, Versions] = {
    0: Versions(3, 12, advertised_min=0),  # Produce; v12: transactions v2 (KIP-890)
    1: Versions(4, 12),  # Fetch
    2: Versions(1, 10),  # ListOffsets
    3: Versions(0, 12),  # Metadata
    8: Versions(2, 9),  # OffsetCommit; v9: KIP-848 member epochs
    9: Versions(1, 9),  # OffsetFetch; v8: many groups, v9: member epochs
    10: Versions(0, 4),  # FindCoordinator
    11: Versions(0, 9),  # JoinGroup
    12: Versions(0, 4),  # Heartbeat
    13: Versions(0, 5),  # LeaveGroup
    14: Versions(0, 5),  # SyncGroup
    15: Versions(0, 5),  # DescribeGroups
    16: Versions(0, 5),  # ListGroups; v5: group types
    17: Versions(0, 1),  # SaslHandshake
    18: Versions(0, 4),  # ApiVersions, with feature flags (v3+)
    19: Versions(2, 7),  # CreateTopics
    20: Versions(1, 5),  # DeleteTopics
    21: Versions(0, 2),  # DeleteRecords
    22: Versions(0, 5),  # InitProducerId
    23: Versions(2, 4),  # OffsetForLeaderEpoch
    # Transactions v1 (KIP-98/447) and v2 (KIP-890, the transaction.version feature)
    24: Versions(0, 5),  # AddPartitionsToTxn; v4: batched, from brokers; v5: v2 adds
    25: Versions(0, 4),  # AddOffsetsToTxn
    26: Versions(0, 5),  # EndTxn; v5: the epoch bumps, the answer carries the next one
    27: Versions(1, 2),  # WriteTxnMarkers (v0 went in Kafka 4.0; v2: transaction version)
    28: Versions(0, 5),  # TxnOffsetCommit; v3: KIP-447 member and generation; v5: v2
    29: Versions(2, 3),  # DescribeAcls
    30: Versions(2, 3),  # CreateAcls
    31: Versions(2, 3),  # DeleteAcls
    32: Versions(1, 4),  # DescribeConfigs
    35: Versions(1, 4),  # DescribeLogDirs
    36: Versions(0, 2),  # SaslAuthenticate
    37: Versions(0, 3),  # CreatePartitions
    42: Versions(0, 2),  # DeleteGroups
    43: Versions(0, 2),  # ElectLeaders
    44: Versions(0, 1),  # IncrementalAlterConfigs
    45: Versions(0, 0),  # AlterPartitionReassignments
    46: Versions(0, 0),  # ListPartitionReassignments
    48: Versions(0, 1),  # DescribeClientQuotas
    49: Versions(0, 1),  # AlterClientQuotas
    50: Versions(0, 0),  # DescribeUserScramCredentials
    51: Versions(0, 0),  # AlterUserScramCredentials
    55: Versions(0, 2),  # DescribeQuorum
    57: Versions(0, 2),  # UpdateFeatures (kafka-features upgrade|downgrade)
    60: Versions(0, 1),  # DescribeCluster
    61: Versions(0, 0),  # DescribeProducers
    65: Versions(0, 0),  # DescribeTransactions
    66: Versions(0, 1),  # ListTransactions
    68: Versions(0, 1),  # ConsumerGroupHeartbeat (KIP-848)
    69: Versions(0, 1),  # ConsumerGroupDescribe
    74: Versions(0, 1),  # ListConfigResources (v0: ListClientMetricsResources), KIP-1142
    75: Versions(0, 0),  # DescribeTopicPartitions
    76: Versions(1, 1),  # ShareGroupHeartbeat (KIP-932 share groups)
    77: Versions(1, 1),  # ShareGroupDescribe
    78: Versions(1, 1),  # ShareFetch
    79: Versions(1, 1),  # ShareAcknowledge
    80: Versions(0, 1),  # AddRaftVoter (KIP-853)
    81: Versions(0, 0),  # RemoveRaftVoter
    82: Versions(0, 0),  # UpdateRaftVoter
    90: Versions(0, 0),  # DescribeShareGroupOffsets (kafka-share-groups)
}


def advertised() -> list[dict]:
    return [
        {
            "api_key": key,
            "min_version": v.advertised_min if v.advertised_min is not None else v.min_version,
            "max_version": v.max_version,
        }
        for key, v in sorted(VERSIONS.items())
    ]


def api_versions_fallback(correlation_id: int) -> bytes:
    """ApiVersions v0 response with UNSUPPORTED_VERSION, for a version we do not know."""
    keys = advertised()
    body = struct.pack(">ihi", correlation_id, ErrorCode.unsupported_version, len(keys)) + b"".join(
        struct.pack(">hhh", k["api_key"], k["min_version"], k["max_version"]) for k in keys
    )
    return struct.pack(">i", len(body)) + body
