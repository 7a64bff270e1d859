"""Incremental fetch sessions on the leader (KIP-227).

A fetcher that opens a session names its partitions once; later fetches name only the
partitions whose fetch position changed, and the answer lists only partitions with
something new: records, a moved high watermark or log start, or an error. A follower
of 30,000 partitions then sends and receives a few partitions per fetch instead of all.

The leader does not re-read every partition of a session on each fetch, as Kafka does:
a partition that appends, moves its high watermark or log start, or changes role marks
itself dirty in the sessions that hold it (`changed`, called from `Partition._wake`),
so a fetch visits only the partitions it names plus the dirty ones. A follower's
unchanged partitions stay caught up through the session's last fetch time (see
`Partition.caught_up_at`), so the ISR rule does not need a visit per partition either.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .partitions import Partition

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
Key = tuple[str, int]


def next_epoch(epoch: int) -> int:
    """Epochs run 1, 2, ... and wrap to 1 after the largest int32, as Kafka's do."""
    return 1 if epoch >= 2**31 - 1 else epoch + 1


@dataclass(slots=True)
class SessionPartition:
    """What the fetcher asked for last, and what it was last told."""

    fetch_offset: int
    max_bytes: int
    leader_epoch: int
    fetcher_log_start: int  # the follower's own log start, as its last fetch said
    hw: int = -1  # -1: never answered, so the next answer includes it
    log_start: int = -1
    last_fetched_epoch: int = -1  # the epoch of the fetcher's last record (KIP-320)


class FetchSession:
    __slots__ = ("alive", "dirty", "epoch", "id", "last_fetch", "parts", "replica", "waiter")

    def __init__(self, session_id: int, replica: int) -> None:
        self.id = session_id
        self.replica = replica  # the follower's broker id, or -1 for a consumer
        self.epoch = 1  # the epoch the next incremental fetch must carry
        self.parts: dict[Key, SessionPartition] = {}
        self.dirty: set[Key] = set()
        self.waiter: asyncio.Future[None] | None = None
        self.last_fetch = time.monotonic()
        self.alive = True

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


class FetchSessions:
    """The leader's session cache: bounded in count, least recently used go first."""

    def __init__(self, max_slots: int = 1000, evict_after_s: float = 120.0) -> None:
        self.max_slots = max_slots  # Kafka's max.incremental.fetch.session.cache.slots
        self.evict_after_s = evict_after_s  # min.incremental.fetch.session.eviction.ms
        self.sessions: dict[int, FetchSession] = {}  # insertion order = least recently used
        self.watch: dict[Key, set[FetchSession]] = {}
        self.by_replica: dict[int, int] = {}  # follower broker id -> its session id
        self.evictions = 0

    # -- partitions report changes --------------------------------------------------------

    def changed(self, part: Partition) -> None:
        key = (part.topic, part.index)
        sessions = self.watch.get(key)
        if sessions:
            for s in sessions:
                s.dirty.add(key)
                s.wake()

    # -- lifetime -------------------------------------------------------------------------

    def open(self, replica: int) -> FetchSession | None:
        """A new session, or None when the cache is full of sessions still in use (the
        fetcher then goes on with full fetches, as with Kafka). A follower has one
        fetcher per leader, so its new session replaces any older one (a restarted
        follower's old session would otherwise linger until evicted)."""
        if replica >= 0 and (old := self.by_replica.get(replica)) is not None:
            self.close(old)
        if len(self.sessions) >= self.max_slots and not self._evict_one(replica):
            return None
        while True:
            sid = random.randint(1, 2**31 - 1)
            if sid not in self.sessions:
                break
        s = FetchSession(sid, replica)
        self.sessions[sid] = s
        if replica >= 0:
            self.by_replica[replica] = sid
        return s

    def _evict_one(self, replica: int) -> bool:
        """Evict the least recently used session if it has been idle long enough, or,
        for a follower's new session, the least recently used consumer session:
        replication must not lose its session to consumers (Kafka privileges it too)."""
        now = time.monotonic()
        oldest = next(iter(self.sessions.values()), None)
        victim: FetchSession | None = None
        if oldest is not None and now - oldest.last_fetch >= self.evict_after_s:
            victim = oldest
        elif replica >= 0:
            victim = next((s for s in self.sessions.values() if s.replica < 0), None)
        if victim is None:
            return False
        self.close(victim.id)
        self.evictions += 1
        return True

    def get(self, session_id: int) -> FetchSession | None:
        s = self.sessions.get(session_id)
        if s is not None:
            # Most recently used last: move to the end of the dict.
            del self.sessions[session_id]
            self.sessions[session_id] = s
            s.last_fetch = time.monotonic()
        return s

    def close(self, session_id: int) -> None:
        s = self.sessions.pop(session_id, None)
        if s is None:
            return
        s.alive = False
        if self.by_replica.get(s.replica) == session_id:
            del self.by_replica[s.replica]
        for key in s.parts:
            self._unwatch(s, key)
        s.parts.clear()
        s.dirty.clear()
        s.wake()

    def close_all(self) -> None:
        for sid in list(self.sessions):
            self.close(sid)

    # -- partitions of a session ----------------------------------------------------------

    def put(self, s: FetchSession, topic: str, wanted: tuple[int, int, int, int, int, int]) -> None:
        """Add or update a partition: (index, fetch offset, max bytes, leader epoch,
        the fetcher's log start, the epoch of its last record)."""
        index, fetch_offset, max_bytes, epoch, log_start, last_epoch = wanted
        key = (topic, index)
        sp = s.parts.get(key)
        if sp is None:
            s.parts[key] = SessionPartition(
                fetch_offset, max_bytes, epoch, log_start, last_fetched_epoch=last_epoch
            )
            self.watch.setdefault(key, set()).add(s)
        else:
            sp.fetch_offset = fetch_offset
            sp.max_bytes = max_bytes
            sp.leader_epoch = epoch
            sp.fetcher_log_start = log_start
            sp.last_fetched_epoch = last_epoch

    def forget(self, s: FetchSession, key: Key) -> None:
        if s.parts.pop(key, None) is not None:
            self._unwatch(s, key)
        s.dirty.discard(key)

    def _unwatch(self, s: FetchSession, key: Key) -> None:
        sessions = self.watch.get(key)
        if sessions is not None:
            sessions.discard(s)
            if not sessions:
                del self.watch[key]

    def stats(self, count_partitions: bool) -> dict[str, int]:
        """Sessions (or their partitions) by fetcher: follower replicas and consumers."""
        out = {"follower": 0, "consumer": 0}
        for s in self.sessions.values():
            out["follower" if s.replica >= 0 else "consumer"] += (
                len(s.parts) if count_partitions else 1
            )
        return out
