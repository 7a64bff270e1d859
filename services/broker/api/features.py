"""ApiVersions with feature flags (KIP-584): what `kafka-features.sh describe` shows.

Kafka's Admin.describeFeatures asks a broker's ApiVersions (v3+) and prints, for every
supported feature, its supported range and finalized level. The levels below are what
StraitMQ really implements, named as Kafka 4.1 names them:

- metadata.version: 3.3-IV3 (7) to 4.1-IV1 (27), finalized at 4.1-IV1, as a new Kafka
  4.1 cluster reports. StraitMQ's metadata log has its own records, so the level only
  tells tools which Kafka APIs and versions to expect (those of 4.1).
- transaction.version 2, finalized: KIP-890's transactions v2, which Java 4.x producers
  use when it is finalized (EndTxn v5, Produce v12, TxnOffsetCommit v5); older clients
  and librdkafka keep v1 on the same brokers.
- kraft.version 0 (static voters: no AddRaftVoter/RemoveRaftVoter), group.version 0 (the
  classic group protocol only, no KIP-848 ConsumerGroupHeartbeat),
  eligible.leader.replicas.version 0 (no ELR), streams.version 0.
- share.version 1, finalized: KIP-932 share groups (ShareGroupHeartbeat, ShareGroupDescribe,
  ShareFetch, ShareAcknowledge v1), as a Kafka 4.1 cluster with share groups enabled.

As in Kafka, a finalized level 0 is not listed (the tool prints 0 for it), and before
v4 features whose supported minimum is 0 are left out (KAFKA-17492: older clients fail
to read them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .context import RequestContext
from .versions import advertised

if TYPE_CHECKING:
    from ..metadata_view import MetadataView

METADATA_VERSION_MIN = 7  # 3.3-IV3, the oldest metadata.version Kafka 4.x knows
METADATA_VERSION = 27  # 4.1-IV1, Kafka 4.1's latest production level

# name -> (supported min, supported max, finalized level)
FEATURES: dict[str, tuple[int, int, int]] = {
    "metadata.version": (METADATA_VERSION_MIN, METADATA_VERSION, METADATA_VERSION),
    "kraft.version": (0, 0, 0),
    "group.version": (0, 0, 0),
    "transaction.version": (0, 2, 2),
    "eligible.leader.replicas.version": (0, 0, 0),
    "share.version": (0, 1, 1),
    "streams.version": (0, 0, 0),
}


def feature_fields(version: int, epoch: int) -> dict:
    """The ApiVersions fields for features, for response `version` (none before v3)."""
    if version < 3:
        return {}
    return {
        "supported_features": [
            {"name": name, "min_version": lo, "max_version": hi}
            for name, (lo, hi, _) in FEATURES.items()
            if version >= 4 or lo > 0
        ],
        "finalized_features_epoch": epoch,
        "finalized_features": [
            {"name": name, "min_version_level": level, "max_version_level": level}
            for name, (_, _, level) in FEATURES.items()
            if level > 0
        ],
    }


async def handle_api_versions(metadata: MetadataView, ctx: RequestContext, req: Any) -> dict:
    # Kafka's finalized-features epoch is the metadata offset the levels were read at.
    epoch = max(metadata.image.offset, 0)
    return {
        "error_code": 0,
        "api_keys": advertised(),
        "throttle_time": 0,
        **feature_fields(ctx.version, epoch),
    }
