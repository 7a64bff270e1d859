"""One broker's share groups (KIP-932): the membership of the share groups it
coordinates and the share-partitions it leads, with the task that saves their state.

Built by the Broker with the rest of its subsystems, started and stopped as the group
coordinator is. The wire handlers (`api/share.py`) and the HTTP API read it; nothing
creates it on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import Callable

from straitmq.metadata.image import MetadataImage

from straitmq.errors import KafkaError

from ..config import BrokerConfig
from ..groups.offsets import OFFSETS_TOPIC, OffsetStore
from ..groups.share_group import ShareGroupStateMachine, ShareSettings
from ..metadata_view import MetadataView
from ..partitions import LEADER, Partition, PartitionManager
from ..security.listeners import Listener
from .checkpoints import STATE_GROUP_PREFIX, ShareCheckpoints
from .sessions import ShareState

# ShareFetches parked on this broker at once (each is one member's request in flight;
# a wake-up walks them all, and each woken one counts those ahead of it). Past it a
# ShareFetch is not parked: it waits out its max wait on a timer and answers with what
# it can acquire then (an empty answer, at once, would have the member fetch again at
# once). 2000: the members of the share groups led here that wait at the same moment.
MAX_PARKED_SHARE_FETCHES = 2000


class ShareCoordinator:
    def __init__(
        self,
        config: BrokerConfig,
        metadata: MetadataView,
        partitions: PartitionManager,
        offsets: OffsetStore,
        listener: Listener,
        stopping: Callable[[], bool],
        other_group_type: Callable[[str], str | None],
    ) -> None:
        self.metadata = metadata
        self.partitions = partitions
        self.offsets = offsets
        self.fetch_max_wait_s = config.fetch_max_wait_s
        self.stopping = stopping  # the broker is leaving: parked fetches answer at once
        # The kind of a classic or consumer group with that id, if there is one (group
        # ids are one space: such an id cannot be a share group's).
        self.other_group_type = other_group_type
        self.groups = ShareGroupStateMachine(
            ShareSettings(
                session_timeout_ms=config.group_share_session_timeout_ms,
                heartbeat_interval_ms=config.group_share_heartbeat_interval_ms,
            )
        )
        self.state = ShareState(
            lock_duration_ms=config.group_share_record_lock_duration_ms,
            delivery_limit=config.group_share_delivery_count_limit,
            max_record_locks=config.group_share_partition_max_record_locks,
            auto_offset_reset=config.share_auto_offset_reset,
            session_idle_ms=config.group_share_session_timeout_ms,
        )
        self.checkpoints = ShareCheckpoints(
            config.node_id, self.state, metadata.current, offsets.partition_for, listener
        )
        # Fetches parked until records are released or acknowledged (acquirable again).
        self.waiters: set[asyncio.Future[None]] = set()
        # Parked ShareFetches in arrival order (first come, first served on wake-up); at
        # most MAX_PARKED_SHARE_FETCHES (api/share.py: past it a fetch is not parked).
        self.parked: dict[object, int] = {}
        # Requests refused at a bound: the bound's name -> how many (metrics).
        self.refusals: Counter[str] = Counter()
        self.park_order = itertools.count()
        partitions.role_listeners.append(self._on_role)

    @property
    def image(self) -> MetadataImage:
        return self.metadata.image

    def start(self) -> None:
        self.checkpoints.start()

    async def stop(self) -> None:
        self.wake()  # parked fetches answer now (the broker is stopping)
        await self.checkpoints.close()

    def _on_role(self, part: Partition, role: str) -> None:
        if role == LEADER:
            return
        self.state.drop_partition(part.topic, part.index)
        if part.topic == OFFSETS_TOPIC:  # no longer the coordinator of these groups
            offsets = self.offsets
            for gid in [g for g in self.groups.groups if offsets.partition_for(g) == part.index]:
                del self.groups.groups[gid]

    def members_gone(self) -> None:
        """Members that left or were expired by this coordinator: what they hold on
        this broker goes back at once (other leaders wait for the locks to expire)."""
        released = False
        for group_id, member_id in self.groups.take_removed():
            released |= self.state.drop_member(group_id, member_id)
        if released:
            self.wake()

    def wake(self) -> None:
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(None)
        self.waiters.clear()

    async def save(self, within_s: float) -> bool:
        """Write every changed share-partition's state; True once all of it is saved,
        False if it could not be within `within_s`. A write fails when the group's
        coordinator moves or is fenced, which the metadata shows: try again when it
        changes, or a checkpoint interval later (a new coordinator still loading its
        partition says so without any metadata change)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while True:
            seen = self.metadata.image.offset
            if await self.checkpoints.flush():
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(KafkaError):  # timed out: try again
                await self.metadata.wait_applied(
                    seen + 1, min(remaining, self.checkpoints.interval_s)
                )

    # -- what the group APIs and the HTTP API ask --------------------------------------

    def is_share_group(self, group_id: str) -> bool:
        return group_id in self.groups.groups

    def delete_group(self, group_id: str) -> int:
        """DeleteGroups of a share group: NON_EMPTY_GROUP while it has members."""
        return self.groups.delete(group_id)

    def group_rows(self) -> list[tuple[str, str, str]]:
        """ListGroups: (group id, "share", state) of the share groups coordinated here."""
        return [(gid, "share", g.state) for gid, g in sorted(self.groups.groups.items())]


def is_state_group(group_id: str) -> bool:
    """An internal group holding a share group's saved start offsets (never listed)."""
    return group_id.startswith(STATE_GROUP_PREFIX)
