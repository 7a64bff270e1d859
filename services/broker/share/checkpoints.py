"""Durable share-partition state: the SPSO of every share-partition this broker leads
and its in-flight ranges (`SharePartition.snapshot()`: first offset, length, state and
delivery count of each, acquired ones saved as available) are written as a committed
offset (the SPSO) with its metadata (the ranges) of an internal group
(`__share_group_state.<group>`) in `__consumer_offsets`, replicated like any commit.
Acknowledgements are answered once their state is written (`flush()`); other changes
(acquisitions, expired locks) within `interval_s`. A broker that becomes a partition's
leader reads it back before serving that share-partition, so after a failover the group
goes on where it was: acknowledged and archived records stay done, the records that were
acquired are delivered again with their delivery counts.

This stands for Kafka's `__share_group_state`, which its share coordinator writes. The
difference: the ranges must fit in the commit's metadata (4,000 characters, a few
hundred ranges); what is cut off is fetched again as new records after a failover
(at-least-once still holds).

The writes and reads go through the Kafka protocol (OffsetCommit v8 / OffsetFetch v8) to
the group's coordinator, on the inter-broker listener, whichever broker that is (this
one included), so the coordinator's own checks and replication apply unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kio.schema.offset_commit.v8 import request as oc
from kio.schema.offset_fetch.v8 import request as of
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i64
from straitmq.metadata.image import MetadataImage

from straitmq.invariants import broken
from straitmq.protocol.client import ConnectionClosed, KafkaConnection

from ..groups.offsets import OFFSETS_TOPIC
from ..security.listeners import Listener, endpoint_for
from .sessions import ShareState

log = logging.getLogger("straitmq.share")

STATE_GROUP_PREFIX = "__share_group_state."


def state_group(group_id: str) -> str:
    """The internal group whose committed offsets hold `group_id`'s SPSOs."""
    return STATE_GROUP_PREFIX + group_id


class ShareCheckpoints:
    def __init__(
        self,
        node_id: int,
        state: ShareState,
        image: Callable[[], MetadataImage],
        partition_for: Callable[[str], int],
        listener: Listener,
        interval_s: float = 0.5,
    ) -> None:
        self.node_id = node_id
        self.state = state
        self._image = image
        self._partition_for = partition_for  # group id -> its __consumer_offsets partition
        self._listener = listener  # the inter-broker listener the coordinator is asked on
        self.interval_s = interval_s
        self._conns: dict[tuple[str, int], KafkaConnection] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}  # one request in flight each
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()
        self.writes = 0  # checkpoints written (tests, metrics)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.flush()
            except Exception as e:  # unreachable coordinators are handled in _call
                broken(
                    "a share checkpoint round fails only on I/O",
                    error=f"{type(e).__name__}: {e}",
                )

    # -- writing ---------------------------------------------------------------------------

    async def flush(self) -> bool:
        """Write every share-partition whose state changed since it was last written;
        True if all of them were. One flush at a time (the background round and the
        acknowledgements waiting for theirs share the lock)."""
        async with self._flushing:
            return await self._flush()

    async def _flush(self) -> bool:
        by_group: dict[str, list[tuple[str, int, tuple[int, str], Any]]] = {}
        for (group, topic, index), sp in list(self.state.partitions.items()):
            current = (sp.spso, sp.snapshot())
            if sp.saved != current:
                by_group.setdefault(group, []).append((topic, index, current, sp))
        all_saved = True
        for group, entries in by_group.items():
            topics: dict[str, list[oc.OffsetCommitRequestPartition]] = {}
            for topic, index, (spso, snap), _ in entries:
                topics.setdefault(topic, []).append(
                    oc.OffsetCommitRequestPartition(
                        partition_index=i32(index),
                        committed_offset=i64(spso),
                        committed_leader_epoch=i32(-1),
                        committed_metadata=snap,
                    )
                )
            req = oc.OffsetCommitRequest(
                group_id=GroupId(state_group(group)),
                generation_id_or_member_epoch=i32(-1),
                member_id="",
                group_instance_id=None,
                topics=tuple(
                    oc.OffsetCommitRequestTopic(name=TopicName(t), partitions=tuple(ps))
                    for t, ps in topics.items()
                ),
            )
            resp = await self._call(state_group(group), 8, 8, req)
            if resp is None:
                all_saved = False
                continue
            ok = {
                (t.name, p.partition_index)
                for t in resp.topics
                for p in t.partitions
                if p.error_code == 0
            }
            for topic, index, current, sp in entries:
                if (topic, index) in ok:
                    sp.saved = current
                    self.writes += 1
                else:
                    all_saved = False
        return all_saved

    # -- reading ---------------------------------------------------------------------------

    async def load(self, group: str, topic: str, index: int) -> tuple[bool, int | None, str | None]:
        """(answered, the saved SPSO or None if there is none, the saved in-flight
        ranges). Not answered: the coordinator could not be asked; the caller should not
        start the share-partition from share.auto.offset.reset yet."""
        req = of.OffsetFetchRequest(
            groups=(
                of.OffsetFetchRequestGroup(
                    group_id=GroupId(state_group(group)),
                    topics=(
                        of.OffsetFetchRequestTopics(
                            name=TopicName(topic), partition_indexes=(i32(index),)
                        ),
                    ),
                ),
            ),
            require_stable=False,
        )
        resp = await self._call(state_group(group), 9, 8, req)
        if resp is None or not resp.groups or resp.groups[0].error_code:
            return False, None, None
        for t in resp.groups[0].topics:
            for p in t.partitions:
                if p.partition_index == index and p.error_code == 0:
                    if p.committed_offset < 0:
                        return True, None, None
                    return True, p.committed_offset, p.metadata
        return True, None, None

    async def saved(
        self, group: str, topics: list[tuple[str, list[int]]] | None
    ) -> dict[tuple[str, int], int] | None:
        """The saved SPSOs of `group` ((topic, partition) -> offset), of the named
        partitions or of all of them; None if the coordinator could not be asked."""
        req = of.OffsetFetchRequest(
            groups=(
                of.OffsetFetchRequestGroup(
                    group_id=GroupId(state_group(group)),
                    topics=tuple(
                        of.OffsetFetchRequestTopics(
                            name=TopicName(t), partition_indexes=tuple(i32(p) for p in ps)
                        )
                        for t, ps in topics
                    )
                    if topics is not None
                    else None,
                ),
            ),
            require_stable=False,
        )
        resp = await self._call(state_group(group), 9, 8, req)
        if resp is None or not resp.groups or resp.groups[0].error_code:
            return None
        return {
            (t.name, p.partition_index): p.committed_offset
            for t in resp.groups[0].topics
            for p in t.partitions
            if p.error_code == 0 and p.committed_offset >= 0
        }

    # -- the connection to the coordinator ---------------------------------------------------

    def _coordinator(self, group_id: str) -> tuple[str, int] | None:
        image = self._image()
        p = image.partition(OFFSETS_TOPIC, self._partition_for(group_id))
        b = image.brokers.get(p.leader) if p is not None else None
        if b is None or not b.alive:
            return None
        return endpoint_for(b, self._listener.name) or (b.host, b.port)

    async def _call(self, group_id: str, api_key: int, version: int, req: Any) -> Any:
        addr = self._coordinator(group_id)
        if addr is None:
            return None
        conn = self._conns.get(addr)
        if conn is None:
            conn = self._conns[addr] = KafkaConnection(
                addr[0],
                addr[1],
                f"share-state-{self.node_id}",
                self._listener.client,
            )
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            try:
                return await conn.request(api_key, version, req, 10.0)
            except (ConnectionClosed, OSError, TimeoutError) as e:
                log.info("share state: coordinator %s:%s unreachable: %s", addr[0], addr[1], e)
                conn.close()
                if self._conns.get(addr) is conn:
                    del self._conns[addr]
                return None

    async def close(self) -> None:
        """Stop the background round and close the connections to the coordinators."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
