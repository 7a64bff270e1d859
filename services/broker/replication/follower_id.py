"""How a replica fetcher names its process to the leader.

Kafka's Fetch v15 carries the follower's broker epoch (KIP-903) so that a leader never
counts a fetch of a process that has since restarted, and perhaps lost records it had
not flushed, for the new one. Our fetcher speaks Fetch v12, so its client id carries
its broker registration (incarnation) instead.
"""

from __future__ import annotations

from straitmq.metadata.client_impact import REPLICA_FETCHER_PREFIX


def fetcher_client_id(node_id: int, incarnation: str) -> str:
    """The client id of this process's replica fetchers."""
    return (
        f"{REPLICA_FETCHER_PREFIX}{node_id}@{incarnation}"
        if incarnation
        else f"{REPLICA_FETCHER_PREFIX}{node_id}"
    )


def fetcher_incarnation(client_id: str | None, replica: int) -> str | None:
    """The incarnation a follower's fetch names in its client id, None if it names none."""
    if not client_id:
        return None
    prefix, at, incarnation = client_id.rpartition("@")
    return incarnation if at and prefix == f"{REPLICA_FETCHER_PREFIX}{replica}" else None
