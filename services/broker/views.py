"""Narrow views of the broker's state that the composition root (broker.py) hands to
request handlers and writers instead of the Broker itself.

The metadata image is replaced by every applied record, so a holder keeps a view that
reads the current one, never an image.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from straitmq.metadata.image import MetadataImage

    from .partitions import PartitionManager


class Control(Protocol):
    """Call the active controller and wait until this broker's image shows the change
    (Broker.control)."""

    def __call__(self, op: str, body: dict, within_s: float = ...) -> Awaitable[dict]: ...


class ControllerCall(Protocol):
    """Call the active controller and return its reply, without waiting for the
    change to reach this broker's image (ControllerClient.call)."""

    def __call__(self, op: str, body: dict, within_s: float = ...) -> Awaitable[dict]: ...


class MetadataView:
    """The metadata image this broker holds now, and a read barrier (wait until it has
    everything the active controller has committed)."""

    __slots__ = ("_catch_up", "_current")

    def __init__(
        self, current: Callable[[], MetadataImage], catch_up: Callable[[], Awaitable[None]]
    ) -> None:
        self._current = current
        self._catch_up = catch_up

    @property
    def image(self) -> MetadataImage:
        return self._current()

    async def catch_up(self) -> None:
        await self._catch_up()


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
