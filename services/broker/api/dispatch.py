"""The API table: what this broker implements, in which versions, and by which handler.

Only implemented APIs are advertised (clients call whatever ApiVersions lists).
Produce is advertised from v0 because older librdkafka turns compression off when it
is not; versions below 3 (message sets v0/v1) are refused by closing the connection.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from . import (
    acls,
    admin,
    describe_topics,
    features,
    fetch,
    groups,
    metadata,
    produce,
    quorum,
    reassign,
    records,
    share,
)
from . import security as sec
from .context import RequestContext

Handler = Callable[[RequestContext, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ApiSpec:
    min_version: int
    max_version: int
    handler: Handler
    advertised_min: int | None = None


def advertised() -> list[dict]:
    return [
        {
            "api_key": key,
            "min_version": spec.advertised_min
            if spec.advertised_min is not None
            else spec.min_version,
            "max_version": spec.max_version,
        }
        for key, spec in sorted(HANDLERS.items())
    ]


def api_versions_fallback(correlation_id: int) -> bytes:
    """ApiVersions v0 response with UNSUPPORTED_VERSION, for a version we do not know."""
    keys = advertised()
    body = struct.pack(">ihi", correlation_id, ErrorCode.unsupported_version, len(keys)) + b"".join(
        struct.pack(">hhh", k["api_key"], k["min_version"], k["max_version"]) for k in keys
    )
    return struct.pack(">i", len(body)) + body


HANDLERS: dict[int, ApiSpec] = {
    0: ApiSpec(3, 9, produce.handle_produce, advertised_min=0),
    1: ApiSpec(4, 12, fetch.handle_fetch),
    2: ApiSpec(1, 10, fetch.handle_list_offsets),
    3: ApiSpec(0, 12, metadata.handle_metadata),
    8: ApiSpec(2, 9, groups.handle_offset_commit),  # v9: KIP-848 member epochs
    9: ApiSpec(1, 9, groups.handle_offset_fetch),  # v8: many groups, v9: member epochs
    10: ApiSpec(0, 4, groups.handle_find_coordinator),
    11: ApiSpec(0, 9, groups.handle_join_group),
    12: ApiSpec(0, 4, groups.handle_heartbeat),
    13: ApiSpec(0, 5, groups.handle_leave_group),
    14: ApiSpec(0, 5, groups.handle_sync_group),
    15: ApiSpec(0, 5, groups.handle_describe_groups),
    16: ApiSpec(0, 5, groups.handle_list_groups),  # v5: group types
    17: ApiSpec(0, 1, sec.handle_sasl_handshake),
    18: ApiSpec(0, 4, features.handle_api_versions),  # with feature flags (v3+)
    19: ApiSpec(2, 7, admin.handle_create_topics),
    20: ApiSpec(1, 5, admin.handle_delete_topics),
    21: ApiSpec(0, 2, records.handle_delete_records),
    22: ApiSpec(0, 4, admin.handle_init_producer_id),
    23: ApiSpec(2, 4, fetch.handle_offset_for_leader_epoch),
    29: ApiSpec(2, 3, acls.handle_describe_acls),
    30: ApiSpec(2, 3, acls.handle_create_acls),
    31: ApiSpec(2, 3, acls.handle_delete_acls),
    32: ApiSpec(1, 4, admin.handle_describe_configs),
    35: ApiSpec(1, 4, admin.handle_describe_log_dirs),
    36: ApiSpec(0, 2, sec.handle_sasl_authenticate),
    37: ApiSpec(0, 3, admin.handle_create_partitions),
    42: ApiSpec(0, 2, groups.handle_delete_groups),
    43: ApiSpec(0, 2, reassign.handle_elect_leaders),
    44: ApiSpec(0, 1, admin.handle_incremental_alter_configs),
    45: ApiSpec(0, 0, reassign.handle_alter_partition_reassignments),
    46: ApiSpec(0, 0, reassign.handle_list_partition_reassignments),
    48: ApiSpec(0, 1, sec.handle_describe_client_quotas),
    50: ApiSpec(0, 0, sec.handle_describe_user_scram_credentials),
    51: ApiSpec(0, 0, sec.handle_alter_user_scram_credentials),
    55: ApiSpec(0, 2, quorum.handle_describe_quorum),
    60: ApiSpec(0, 1, metadata.handle_describe_cluster),
    68: ApiSpec(0, 1, groups.handle_consumer_group_heartbeat),  # KIP-848
    69: ApiSpec(0, 1, groups.handle_consumer_group_describe),
    75: ApiSpec(0, 0, describe_topics.handle_describe_topic_partitions),
    76: ApiSpec(1, 1, share.handle_share_group_heartbeat),  # KIP-932 share groups
    77: ApiSpec(1, 1, share.handle_share_group_describe),
    78: ApiSpec(1, 1, share.handle_share_fetch),
    79: ApiSpec(1, 1, share.handle_share_acknowledge),
    90: ApiSpec(0, 0, share.handle_describe_share_group_offsets),  # kafka-share-groups
}
