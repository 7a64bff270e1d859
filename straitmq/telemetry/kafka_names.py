"""Bounded, readable attribute values for Kafka API keys and error codes."""

from __future__ import annotations

from functools import cache

from kio.schema.errors import ErrorCode

API_NAMES = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
    9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
    13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups", 16: "ListGroups",
    17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics", 20: "DeleteTopics",
    21: "DeleteRecords", 22: "InitProducerId", 23: "OffsetForLeaderEpoch",
    24: "AddPartitionsToTxn", 25: "AddOffsetsToTxn", 26: "EndTxn", 28: "TxnOffsetCommit",
    29: "DescribeAcls", 32: "DescribeConfigs", 33: "AlterConfigs", 35: "DescribeLogDirs",
    36: "SaslAuthenticate", 37: "CreatePartitions", 42: "DeleteGroups", 43: "ElectLeaders",
    44: "IncrementalAlterConfigs", 45: "AlterPartitionReassignments",
    46: "ListPartitionReassignments", 47: "OffsetDelete", 60: "DescribeCluster",
    61: "DescribeProducers", 68: "ConsumerGroupHeartbeat",
}  # fmt: skip
FETCH_FOLLOWER = "FetchFollower"  # Fetch from a replica (replica_id >= 0)


def api_name(api_key: int) -> str:
    """Known API keys by name; anything else (a client sending garbage) is 'unknown'."""
    return API_NAMES.get(api_key, "unknown")


@cache
def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return "UNKNOWN_SERVER_ERROR" if code == -1 else f"ERROR_{code}"
