"""The broker's view of the cluster metadata and its calls to the active controller.

The image is the one the quorum shell applies (replaced whole when a snapshot loads, so
it is read through this object, never kept). `control` asks the active controller for a
change and returns once this broker's image shows it, so the caller's next read sees it.
"""

from __future__ import annotations

from typing import Protocol

from straitmq.controller.quorum import Quorum
from straitmq.metadata.image import MetadataImage

from .partitions import PartitionManager

METADATA_WAIT_S = 10.0  # how long a caller waits for a committed change to reach us


class ControllerCalls(Protocol):
    """The active controller as a broker calls it: over HTTP (ControllerClient) or, on
    a combined node, the in-process controller when it is the active one."""

    async def call(self, op: str, body: dict, within_s: float = 15.0) -> dict: ...


class MetadataView:
    def __init__(
        self, quorum: Quorum, controller: ControllerCalls, partitions: PartitionManager
    ) -> None:
        self._quorum = quorum
        self.controller = controller
        self._partitions = partitions

    @property
    def image(self) -> MetadataImage:
        return self._quorum.image

    def current(self) -> MetadataImage:
        """The image now: handed as a callable to what must not keep a stale one."""
        return self._quorum.image

    async def wait_applied(self, offset: int, within_s: float) -> None:
        """Return once the image has applied `offset` (ControllerError
        REQUEST_TIMED_OUT if it has not within `within_s`)."""
        await self._quorum.wait_applied(offset, within_s)

    async def control(self, op: str, body: dict, within_s: float = 15.0) -> dict:
        """Call the active controller, then wait until our image shows the change, so
        the caller's next read sees it (REQUEST_TIMED_OUT if it does not in time)."""
        reply = await self.controller.call(op, body, within_s)
        await self._quorum.wait_applied(reply.get("offset", -1), METADATA_WAIT_S)
        created = not body.get("validate_only") and not reply.get("error_code")
        if op in ("create_topic", "create_partitions") and created:
            await self._partitions.created(body["name"], METADATA_WAIT_S)
        return reply

    async def catch_up(self) -> None:
        """A read barrier: wait until our image has everything the active controller
        has committed (for decisions that must not act on a stale view)."""
        await self.control("describe", {})
