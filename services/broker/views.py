"""Narrow views of the broker's state that the composition root (broker.py) hands to
request handlers and writers instead of the Broker itself.

The metadata image is replaced by every applied record, so a holder keeps a view that
reads the current one, never an image.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol

from kio.schema.errors import ErrorCode

if TYPE_CHECKING:
    from straitmq.metadata.image import MetadataImage

    from .metadata_view import MetadataView
    from .partitions import Partition, PartitionManager


class Control(Protocol):
    """Call the active controller and wait until this broker's image shows the change
    (MetadataView.control)."""

    def __call__(self, op: str, body: dict, within_s: float = ...) -> Awaitable[dict]: ...


class ControllerCall(Protocol):
    """Call the active controller and return its reply, without waiting for the
    change to reach this broker's image (ControllerClient.call)."""

    def __call__(self, op: str, body: dict, within_s: float = ...) -> Awaitable[dict]: ...


class LeaderLookup(Protocol):
    """What deciding "does this broker lead that partition?" reads: whether the
    metadata knows the partition, and the replica this broker holds of it."""

    @property
    def image(self) -> MetadataImage: ...

    @property
    def partitions(self) -> PartitionManager: ...


class LocalReplicas:
    """The replicas this broker holds, with the metadata that says which partitions
    exist (a LeaderLookup for the handlers that must reach a partition's leader)."""

    __slots__ = ("metadata", "partitions")

    def __init__(self, metadata: MetadataView, partitions: PartitionManager) -> None:
        self.metadata = metadata
        self.partitions = partitions

    @property
    def image(self) -> MetadataImage:
        return self.metadata.image

    def leader(
        self, topic: str, index: int, current_leader_epoch: int = -1
    ) -> tuple[Partition | None, int]:
        """This broker's replica of the partition and 0 if it leads it (in the epoch the
        client names, if it names one); else the error to answer."""
        partition = self.partitions.get(topic, index)
        return partition, leader_error(self, topic, index, partition, current_leader_epoch)


def leader_error(
    leaders: LeaderLookup,
    topic: str,
    index: int,
    partition: Partition | None,
    current_leader_epoch: int,
) -> int:
    """The error for a request that must reach the partition's leader, or 0."""
    if partition is None or not partition.is_leader:
        if leaders.image.partition(topic, index) is None:
            return ErrorCode.unknown_topic_or_partition
        if partition is None and leaders.partitions.storage_error(topic, index):
            return ErrorCode.kafka_storage_error
        return ErrorCode.not_leader_or_follower
    if current_leader_epoch >= 0 and current_leader_epoch != partition.leader_epoch:
        if current_leader_epoch < partition.leader_epoch:
            return ErrorCode.fenced_leader_epoch
        return ErrorCode.unknown_leader_epoch
    return 0
