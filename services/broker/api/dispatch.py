"""The API table: which handler answers each API key, bound once to what it is given.

The composition root (broker.py) builds each family's collaborators (see deps.py) and
calls `kafka_api`; the listener looks requests up in the table it returns. Versions and
what ApiVersions advertises are in versions.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from . import (
    acls,
    admin,
    describe_topics,
    features,
    fetch,
    groups,
    metadata,
    partition_txns,
    produce,
    quorum,
    quotas,
    reassign,
    records,
    share,
    transactions,
)
from . import security as sec
from .context import RequestContext
from .versions import VERSIONS

if TYPE_CHECKING:
    from ..metadata_view import MetadataView
    from ..partition_write import PartitionWriter
    from ..share.coordinator import ShareCoordinator
    from ..transactions.verification import TxnVerifier
    from ..views import ControllerCall, LocalReplicas
    from .deps import AdminDeps, FetchDeps, GroupDeps, MetadataDeps, TxnDeps
    from .partition_txns import PartitionTxnDeps

Handler = Callable[[RequestContext, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ApiSpec:
    min_version: int
    max_version: int
    handler: Handler


def kafka_api(
    *,
    writer: PartitionWriter,
    verifier: TxnVerifier,
    fetch_deps: FetchDeps,
    replicas: LocalReplicas,
    metadata_deps: MetadataDeps,
    metadata_view: MetadataView,
    group_deps: GroupDeps,
    admin_deps: AdminDeps,
    txn_deps: TxnDeps,
    controller: ControllerCall,
    share_coordinator: ShareCoordinator,
    partition_txn_deps: PartitionTxnDeps,
) -> dict[int, ApiSpec]:
    """Every implemented API key -> its versions and its bound handler."""
    p = partial
    handlers: dict[int, Handler] = {
        0: p(produce.handle_produce, writer, verifier),
        1: p(fetch.handle_fetch, fetch_deps),
        2: p(fetch.handle_list_offsets, fetch_deps),
        3: p(metadata.handle_metadata, metadata_deps),
        8: p(groups.handle_offset_commit, group_deps),
        9: p(groups.handle_offset_fetch, group_deps),
        10: p(groups.handle_find_coordinator, group_deps),
        11: p(groups.handle_join_group, group_deps),
        12: p(groups.handle_heartbeat, group_deps),
        13: p(groups.handle_leave_group, group_deps),
        14: p(groups.handle_sync_group, group_deps),
        15: p(groups.handle_describe_groups, group_deps),
        16: p(groups.handle_list_groups, group_deps),
        17: sec.handle_sasl_handshake,
        18: p(features.handle_api_versions, metadata_view),
        57: p(features.handle_update_features, admin_deps),
        19: p(admin.handle_create_topics, admin_deps),
        20: p(admin.handle_delete_topics, admin_deps),
        21: p(records.handle_delete_records, replicas),
        22: p(
            transactions.handle_init_producer_id,
            txn_deps,
            p(admin.handle_init_producer_id, admin_deps),
        ),
        23: p(fetch.handle_offset_for_leader_epoch, fetch_deps),
        24: p(transactions.handle_add_partitions_to_txn, txn_deps),
        25: p(transactions.handle_add_offsets_to_txn, txn_deps),
        26: p(transactions.handle_end_txn, txn_deps),
        27: p(partition_txns.handle_write_txn_markers, partition_txn_deps),
        28: p(transactions.handle_txn_offset_commit, txn_deps),
        29: p(acls.handle_describe_acls, admin_deps),
        30: p(acls.handle_create_acls, admin_deps),
        31: p(acls.handle_delete_acls, admin_deps),
        32: p(admin.handle_describe_configs, admin_deps),
        74: p(admin.handle_list_config_resources, admin_deps),  # KIP-1142
        35: p(admin.handle_describe_log_dirs, admin_deps),
        36: sec.handle_sasl_authenticate,
        37: p(admin.handle_create_partitions, admin_deps),
        42: p(groups.handle_delete_groups, group_deps),
        43: p(reassign.handle_elect_leaders, admin_deps),
        44: p(admin.handle_incremental_alter_configs, admin_deps),
        45: p(reassign.handle_alter_partition_reassignments, admin_deps),
        46: p(reassign.handle_list_partition_reassignments, admin_deps),
        48: p(quotas.handle_describe_client_quotas, admin_deps),
        49: p(quotas.handle_alter_client_quotas, admin_deps),
        50: p(sec.handle_describe_user_scram_credentials, admin_deps),
        51: p(sec.handle_alter_user_scram_credentials, admin_deps),
        55: p(quorum.handle_describe_quorum, controller),
        60: p(metadata.handle_describe_cluster, metadata_deps),
        61: p(partition_txns.handle_describe_producers, partition_txn_deps),
        65: p(transactions.handle_describe_transactions, txn_deps),
        66: p(transactions.handle_list_transactions, txn_deps),
        68: p(groups.handle_consumer_group_heartbeat, group_deps),
        69: p(groups.handle_consumer_group_describe, group_deps),
        75: p(describe_topics.handle_describe_topic_partitions, metadata_view),
        76: p(share.handle_share_group_heartbeat, share_coordinator),  # KIP-932
        77: p(share.handle_share_group_describe, share_coordinator),
        78: p(share.handle_share_fetch, share_coordinator),
        79: p(share.handle_share_acknowledge, share_coordinator),
        80: p(quorum.handle_add_raft_voter, controller),  # KIP-853
        81: p(quorum.handle_remove_raft_voter, controller),
        82: p(quorum.handle_update_raft_voter, controller),
        90: p(share.handle_describe_share_group_offsets, share_coordinator),
    }
    if handlers.keys() != VERSIONS.keys():  # a key advertised without a handler, or not
        raise RuntimeError(f"API table mismatch: {sorted(handlers.keys() ^ VERSIONS.keys())}")
    return {
        key: ApiSpec(VERSIONS[key].min_version, VERSIONS[key].max_version, handler)
        for key, handler in handlers.items()
    }
