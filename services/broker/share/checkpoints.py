"""Durable share-partition start offsets: the SPSO of every share-partition this broker
leads is written, within `interval_s` of each change, as a committed offset of an
internal group (`__share_group_state.<group>`) in `__consumer_offsets`, replicated like
any commit; a broker that becomes a partition's leader reads it back before serving
that share-partition, so after a failover the group goes on from the last saved SPSO
instead of share.auto.offset.reset.

This is what StraitMQ keeps of Kafka's `__share_group_state` (which the share
coordinator writes: the SPSO plus every in-flight range with its state and delivery
count). Only the SPSO is kept, so at-least-once holds across a failover: records
acknowledged after the last save, or after the SPSO (acknowledged out of order or
archived), are delivered again, with delivery counts starting over.

The writes and reads go through the Kafka protocol (OffsetCommit v8 / OffsetFetch v8) to
the group's coordinator, on the inter-broker listener, whichever broker that is (this
one included), so the coordinator's own checks and replication apply unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kio.schema.offset_commit.v8 import request as oc
from kio.schema.offset_fetch.v8 import request as of

from straitmq.protocol.client import ConnectionClosed, KafkaConnection

from ..groups.offsets import OFFSETS_TOPIC
from ..security.listeners import endpoint_for
from .sessions import ShareState

log = logging.getLogger("straitmq.share")

STATE_GROUP_PREFIX = "__share_group_state."


def state_group(group_id: str) -> str:
    """The internal group whose committed offsets hold `group_id`'s SPSOs."""
    return STATE_GROUP_PREFIX + group_id


class ShareCheckpoints:
    def __init__(self, broker: Any, state: ShareState, interval_s: float = 0.5) -> None:
        self.broker = broker
        self.state = state
        self.interval_s = interval_s
        self._conns: dict[tuple[str, int], KafkaConnection] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}  # one request in flight each
        self._task: asyncio.Task[None] | None = None
        self.writes = 0  # checkpoints written (tests, metrics)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self.broker.stopping:
            await asyncio.sleep(self.interval_s)
            try:
                await self.flush()
            except Exception:  # a failed round is retried at the next
                log.warning("share checkpoint round failed", exc_info=True)

    # -- writing ---------------------------------------------------------------------------

    async def flush(self) -> None:
        by_group: dict[str, list[tuple[str, int, int, Any]]] = {}
        for (group, topic, index), sp in list(self.state.partitions.items()):
            if sp.saved_spso != sp.spso:
                by_group.setdefault(group, []).append((topic, index, sp.spso, sp))
        for group, entries in by_group.items():
            topics: dict[str, list[oc.OffsetCommitRequestPartition]] = {}
            for topic, index, spso, _ in entries:
                topics.setdefault(topic, []).append(
                    oc.OffsetCommitRequestPartition(
                        partition_index=index,
                        committed_offset=spso,
                        committed_leader_epoch=-1,
                        committed_metadata=None,
                    )
                )
            req = oc.OffsetCommitRequest(
                group_id=state_group(group),
                generation_id_or_member_epoch=-1,
                member_id="",
                group_instance_id=None,
                topics=tuple(
                    oc.OffsetCommitRequestTopic(name=t, partitions=tuple(ps))
                    for t, ps in topics.items()
                ),
            )
            resp = await self._call(state_group(group), 8, 8, req)
            if resp is None:
                continue
            ok = {
                (t.name, p.partition_index)
                for t in resp.topics
                for p in t.partitions
                if p.error_code == 0
            }
            for topic, index, spso, sp in entries:
                if (topic, index) in ok:
                    sp.saved_spso = spso
                    self.writes += 1

    # -- reading ---------------------------------------------------------------------------

    async def load(self, group: str, topic: str, index: int) -> tuple[bool, int | None]:
        """(answered, the saved SPSO or None if there is none). Not answered: the
        coordinator could not be asked; the caller should not start the share-partition
        from share.auto.offset.reset yet."""
        req = of.OffsetFetchRequest(
            groups=(
                of.OffsetFetchRequestGroup(
                    group_id=state_group(group),
                    topics=(of.OffsetFetchRequestTopics(name=topic, partition_indexes=(index,)),),
                ),
            ),
            require_stable=False,
        )
        resp = await self._call(state_group(group), 9, 8, req)
        if resp is None or not resp.groups or resp.groups[0].error_code:
            return False, None
        for t in resp.groups[0].topics:
            for p in t.partitions:
                if p.partition_index == index and p.error_code == 0:
                    return True, (p.committed_offset if p.committed_offset >= 0 else None)
        return True, None

    async def saved(
        self, group: str, topics: list[tuple[str, list[int]]] | None
    ) -> dict[tuple[str, int], int] | None:
        """The saved SPSOs of `group` ((topic, partition) -> offset), of the named
        partitions or of all of them; None if the coordinator could not be asked."""
        req = of.OffsetFetchRequest(
            groups=(
                of.OffsetFetchRequestGroup(
                    group_id=state_group(group),
                    topics=tuple(
                        of.OffsetFetchRequestTopics(name=t, partition_indexes=tuple(ps))
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
        broker = self.broker
        p = broker.image.partition(OFFSETS_TOPIC, broker.offsets.partition_for(group_id))
        b = broker.image.brokers.get(p.leader) if p is not None else None
        if b is None or not b.alive:
            return None
        return endpoint_for(b, broker.listeners[0].name) or (b.host, b.port)

    async def _call(self, group_id: str, api_key: int, version: int, req: Any) -> Any:
        addr = self._coordinator(group_id)
        if addr is None:
            return None
        conn = self._conns.get(addr)
        if conn is None:
            conn = self._conns[addr] = KafkaConnection(
                addr[0],
                addr[1],
                f"share-state-{self.broker.config.node_id}",
                self.broker.listeners[0].client,
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

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
