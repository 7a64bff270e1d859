"""Replica fetchers: a follower copies its leaders' logs with the Kafka Fetch API.

One task per leader broker fetches every partition this broker follows from it, as
Kafka's ReplicaFetcherThread does, in an incremental fetch session (KIP-227): after the
first fetch, a request names only partitions whose position changed and the leader
answers only partitions with something new. After a leader change a partition first asks the
leader where their logs agree (OffsetForLeaderEpoch, KIP-279) and truncates there, then
fetches from its log end. Batches are appended exactly as the leader wrote them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from kio.schema.errors import ErrorCode
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i32
from straitmq.metadata.image import MetadataImage

from straitmq.invariants import broken
from straitmq.protocol.client import AuthenticationFailed, ConnectionClosed, KafkaConnection
from straitmq.protocol.fetch_request import VERSION as FETCH_VERSION
from straitmq.protocol.fetch_request import FetchWant, encode_fetch_v12

from ..fetch_sessions import next_epoch
from ..partitions import FOLLOWER, Partition
from ..records import InvalidRecords, replicated_batches
from ..security.listeners import Listener, endpoint_for
from ..storage.log import OffsetOutOfRange, UnexpectedAppendOffset
from .core import truncation_offset
from .follower_id import fetcher_client_id

log = logging.getLogger("straitmq.replication")

FETCH_MAX_WAIT_MS = 500
# After a refused TLS handshake or SASL login: wait this long, doubling up to the max (a
# wrong password is not fixed by hammering the leader with logins).
AUTH_BACKOFF_S = 0.5
AUTH_BACKOFF_MAX_S = 10.0
PARTITION_MAX_BYTES = 1 << 20
RESPONSE_MAX_BYTES = 16 << 20
# An incremental fetch looks only at the partitions this fetcher changed since the last
# one (appends, truncation, new or dropped follows); every this often it compares them
# all, so a position changed by any other path is still named within seconds.
FULL_SCAN_S = 5.0
YIELD_EVERY = 1000  # partitions handled between turns of the event loop
TRUNCATE_CHUNK = 2000  # follows per OffsetForLeaderEpoch request

# Per-partition answers that mean the leader's authorizer refused this broker.
REFUSED = {ErrorCode.topic_authorization_failed, ErrorCode.cluster_authorization_failed}
# What the leader's session holds for a partition: fetch offset, leader epoch, log start,
# last fetched epoch.
SessionState = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class FetcherSettings:
    """What every fetcher of this broker shares: who fetches, from which rack, over
    which listener (the inter-broker one, the first), and the metadata it reads."""

    node_id: int
    rack: str | None
    listener: Listener
    image: Callable[[], MetadataImage]
    incarnation: str = ""  # this process's broker registration


@dataclass(slots=True)
class Follow:
    part: Partition
    leader_epoch: int


class LeaderFetcher:
    def __init__(self, settings: FetcherSettings, leader: int) -> None:
        self.settings = settings
        self.leader = leader
        self.follows: dict[tuple[str, int], Follow] = {}
        self.conn: KafkaConnection | None = None
        self.task: asyncio.Task | None = None
        self._wakeup = asyncio.Event()
        self.session_id = 0
        self.session_epoch = 0  # 0: the next fetch opens a new session
        self.in_session: dict[tuple[str, int], SessionState] = {}
        # Follows whose position, epoch or membership changed since the last fetch, and
        # the ones waiting for OffsetForLeaderEpoch: no per-round pass over every follow.
        self.changed: set[tuple[str, int]] = set()
        self.to_truncate: set[tuple[str, int]] = set()
        self._next_scan = 0.0
        self.auth_error: str | None = None  # the last refused login, logged once
        self.refused_logged: set[int] = set()  # authorization errors already logged
        self._auth_backoff = AUTH_BACKOFF_S

    def reset_session(self) -> None:
        """Start over with a full fetch (the leader closes the old session)."""
        self.session_epoch = 0
        self.in_session = {}

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        if self.conn is not None:
            self.conn.close()

    def _address(self) -> tuple[str, int] | None:
        """The leader's endpoint on our inter-broker listener (its registered host/port
        when it has no named listeners, i.e. one PLAINTEXT listener)."""
        b = self.settings.image().brokers.get(self.leader)
        if b is None:
            return None
        return endpoint_for(b, self.settings.listener.name) or (b.host, b.port)

    async def _run(self) -> None:
        me = self.settings.node_id
        while True:
            if not self.follows:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            addr = self._address()
            if addr is None:
                await asyncio.sleep(0.2)
                continue
            if self.conn is None or (self.conn.host, self.conn.port) != addr:
                if self.conn is not None:
                    self.conn.close()
                self.conn = KafkaConnection(
                    addr[0],
                    addr[1],
                    fetcher_client_id(me, self.settings.incarnation),
                    self.settings.listener.client,
                )
                self.session_id = 0  # a session lives on one leader
                self.reset_session()
            try:
                settled = await self._truncate(me) if self.to_truncate else 0
                if len(self.follows) > len(self.to_truncate):
                    await self._fetch(me)
                elif not settled:
                    await asyncio.sleep(0.1)
                self._auth_ok()
            except AuthenticationFailed as e:
                self._auth_refused(str(e))
                self.reset_session()
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                await asyncio.sleep(self._auth_backoff)
                self._auth_backoff = min(self._auth_backoff * 2, AUTH_BACKOFF_MAX_S)
            except (ConnectionClosed, OSError, TimeoutError) as e:
                log.debug("replica fetch failed", extra={"leader": self.leader, "error": str(e)})
                self.reset_session()
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                await asyncio.sleep(0.25)
            except (UnexpectedAppendOffset, OffsetOutOfRange) as e:
                # The leader's answer does not fit our log (it moved under the answer):
                # a new session names every position again.
                log.warning(
                    "replica fetch answer did not fit the log; fetching anew",
                    extra={"leader": self.leader, "error": str(e)},
                )
                self.reset_session()
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                await asyncio.sleep(1.0)
            except Exception as e:  # a bug: nothing else is raised by the fetch or the log
                broken(
                    "a replica fetcher meets only I/O errors and the leader's answers",
                    leader=self.leader,
                    error=f"{type(e).__name__}: {e}",
                )

    def _auth_refused(self, why: str) -> None:
        # Once per distinct reason: a wrong password retried with backoff would
        # otherwise write a line every few seconds for as long as it stays wrong.
        if why != self.auth_error:
            log.error(
                "replica fetcher cannot log in to the leader; retrying with backoff",
                extra={"leader": self.leader, "error": why},
            )
        self.auth_error = why

    def _auth_ok(self) -> None:
        if self.auth_error is not None:
            log.info("replica fetcher logged in to the leader", extra={"leader": self.leader})
            self.auth_error = None
        self._auth_backoff = AUTH_BACKOFF_S

    def follow(self, key: tuple[str, int], f: Follow) -> None:
        self.follows[key] = f
        self.changed.add(key)
        self.to_truncate.add(key)  # a new follow first agrees with the leader on its log end

    def unfollow(self, key: tuple[str, int]) -> None:
        if self.follows.pop(key, None) is not None:
            self.changed.add(key)  # forgotten by the next incremental fetch
        self.to_truncate.discard(key)

    def _set_truncating(self, key: tuple[str, int], truncating: bool) -> None:
        self.changed.add(key)
        if truncating:
            self.to_truncate.add(key)
        else:
            self.to_truncate.discard(key)

    async def _truncate(self, me: int) -> int:
        """Find where our log and the leader's agree and cut ours there, for up to
        TRUNCATE_CHUNK follows (a takeover can make thousands truncate at once: one
        request each way for all of them stalled both brokers' loops); how many settled."""
        by_topic: dict[str, list[Follow]] = {}
        for key in itertools.islice(self.to_truncate, TRUNCATE_CHUNK):
            f = self.follows[key]
            by_topic.setdefault(f.part.topic, []).append(f)
        # The int fields are cast, not parsed: kio's phantom ints only name the wire
        # width, and a parse per field would cost more than building the entity.
        req = OffsetForLeaderEpochRequest(
            replica_id=BrokerId(me),
            topics=tuple(
                OffsetForLeaderTopic(
                    topic=TopicName(t),
                    partitions=tuple(
                        OffsetForLeaderPartition(
                            partition=cast(i32, f.part.index),
                            current_leader_epoch=cast(i32, f.leader_epoch),
                            leader_epoch=cast(i32, f.part.log.epochs.latest_epoch),
                        )
                        for f in fs
                    ),
                )
                for t, fs in by_topic.items()
            ),
        )
        assert self.conn is not None
        resp = await self.conn.request(23, 4, req, 10.0)
        backoff = False
        settled = 0
        for t in resp.topics:
            for r in t.partitions:
                answered = self.follows.get((t.topic, r.partition))
                if answered is None or (t.topic, r.partition) not in self.to_truncate:
                    continue
                if int(r.error_code) != ErrorCode.none:
                    backoff = True
                    continue
                self._truncate_one(answered, r.leader_epoch, r.end_offset)
                self._set_truncating((t.topic, r.partition), False)
                settled += 1
        if backoff:
            await asyncio.sleep(0.1)
        return settled

    @staticmethod
    def _truncate_one(f: Follow, leader_epoch: int, leader_end: int) -> None:
        plog = f.part.log
        leo = plog.log_end_offset
        target = truncation_offset(
            plog.epochs, leo, plog.log_start_offset, leader_epoch, leader_end
        )
        if target < leo:
            log.info(
                "truncating follower log",
                extra={"partition": f"{f.part.topic}-{f.part.index}", "from": leo, "to": target},
            )
            plog.truncate_to(target)
            f.part.set_follower_hw(f.part.high_watermark)

    async def _fetch(self, me: int) -> None:
        full = self.session_epoch == 0
        now = time.monotonic()
        every = full or now >= self._next_scan
        if every:
            self._next_scan = now + FULL_SCAN_S
            looked_at: Any = self.follows
        else:
            looked_at = self.changed
        self.changed = set()
        follows = self.follows
        states: dict[tuple[str, int], SessionState] = {}
        send: dict[str, list[FetchWant]] = {}
        for n, key in enumerate(list(looked_at), 1):
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a session's first fetch names every follow
            f = follows.get(key)
            if f is None or key in self.to_truncate:
                continue
            plog = f.part.log
            # The epoch of our last record too: a diverging-epoch answer changes only
            # that (an epoch that started at our log end is dropped), and the leader
            # must hear the new one, or it keeps answering (and not counting) the old.
            state = (
                plog.log_end_offset,
                f.leader_epoch,
                plog.log_start_offset,
                plog.epochs.latest_epoch,
            )
            states[key] = state
            if full or self.in_session.get(key) != state:
                # (partition, current leader epoch, fetch offset, last fetched epoch,
                # log start, partition max bytes)
                send.setdefault(key[0], []).append(
                    (key[1], f.leader_epoch, state[0], state[3], state[2], PARTITION_MAX_BYTES)
                )
        forgotten: dict[str, list[int]] = {}
        if not full:
            for key in self.in_session if every else looked_at:
                if key not in states and key in self.in_session:
                    forgotten.setdefault(key[0], []).append(key[1])
        # Encoded directly (protocol/fetch_request.py): kio's entities and writer cost
        # more than a fifth of a follower's CPU at one fetch per leader append.
        req = encode_fetch_v12(
            me,
            FETCH_MAX_WAIT_MS,
            1,
            RESPONSE_MAX_BYTES,
            0,
            self.session_id,
            self.session_epoch,
            list(send.items()),
            list(forgotten.items()),
            self.settings.rack or "",
        )
        assert self.conn is not None
        resp = await self.conn.request(1, FETCH_VERSION, req, FETCH_MAX_WAIT_MS / 1000 + 10.0)
        top = int(resp.error_code)
        if top != ErrorCode.none:
            # FETCH_SESSION_ID_NOT_FOUND (evicted, or the leader restarted) or
            # INVALID_FETCH_SESSION_EPOCH: open a new session with a full fetch.
            log.debug("fetch session reset", extra={"leader": self.leader, "error": top})
            if top == ErrorCode.fetch_session_id_not_found:
                self.session_id = 0
            self.reset_session()
            return
        # What the leader's session holds now; its answers are about these positions.
        if full:
            self.in_session = states
            self.session_id = resp.session_id
            self.session_epoch = 1 if resp.session_id else 0
        else:
            for t, ps in forgotten.items():
                for index in ps:
                    self.in_session.pop((t, index), None)
            for t, fps in send.items():
                for fp in fps:
                    key = (t, fp[0])
                    self.in_session[key] = states[key]
            self.session_epoch = next_epoch(self.session_epoch)
        backoff = False
        n = 0
        for t in resp.responses:
            for r in t.partitions:
                n += 1
                if n % YIELD_EVERY == 0:
                    # A full answer holds every follow: let the listener answer between
                    # pieces (each partition is checked again below, as it may change).
                    await asyncio.sleep(0)
                key = (t.topic, r.partition_index)
                f = self.follows.get(key)
                held = self.in_session.get(key)
                # Skip answers for a partition that changed role, epoch or position
                # meanwhile (its next request names it again).
                if (
                    f is None
                    or key in self.to_truncate
                    or held is None
                    or f.part.log.log_end_offset != held[0]
                    or f.leader_epoch != held[1]
                ):
                    self.changed.add(key)  # named again with what it holds now
                    continue
                err = int(r.error_code)
                parted = r.diverging_epoch
                if err == ErrorCode.none and parted is not None and parted.end_offset >= 0:
                    # KIP-320: the leader's log parts from ours; cut ours where it says.
                    self._truncate_one(f, int(parted.epoch), int(parted.end_offset))
                    # An epoch starting at our log end holds nothing (we took it as a
                    # leader and wrote nothing in it): named again, it would part again.
                    f.part.log.epochs.truncate_from_end(f.part.log.log_end_offset)
                    self.changed.add(key)
                elif err == ErrorCode.none:
                    self._apply(f, r)
                    self.changed.add(key)
                elif err == ErrorCode.offset_out_of_range:
                    plog = f.part.log
                    if 0 <= plog.log_end_offset < r.log_start_offset:
                        plog.reset_to(r.log_start_offset)
                        self.changed.add(key)
                    else:
                        self._set_truncating(key, True)
                else:
                    backoff = True
                    if err in REFUSED and err not in self.refused_logged:
                        # Retried with backoff, but said once: an ACL a super user
                        # must fix, not something that heals by itself.
                        self.refused_logged.add(err)
                        log.error(
                            "leader refuses this broker's replica fetches; it needs "
                            "CLUSTER_ACTION on the cluster (or to be a super user)",
                            extra={
                                "leader": self.leader,
                                "partition": f"{key[0]}-{key[1]}",
                                "error": ErrorCode(err).name,
                            },
                        )
        if backoff:
            await asyncio.sleep(0.1)

    @staticmethod
    def _apply(f: Follow, r: Any) -> None:
        part = f.part
        data = memoryview(r.records) if r.records else memoryview(b"")
        try:
            batches = replicated_batches(data) if len(data) else []
        except InvalidRecords as e:
            log.error(
                "leader sent bad batches",
                extra={"partition": f"{part.topic}-{part.index}", "error": str(e)},
            )
            return
        part.append_replicated(data, batches, r.high_watermark)
        if r.log_start_offset > part.log.log_start_offset:
            part.log.advance_start(r.log_start_offset)


class ReplicaFetchers:
    """Keeps one LeaderFetcher per leader, fed by partition role changes."""

    def __init__(self, settings: FetcherSettings) -> None:
        self.settings = settings
        self.fetchers: dict[int, LeaderFetcher] = {}

    def on_role(self, part: Partition, role: str) -> None:
        key = (part.topic, part.index)
        for other in self.fetchers.values():
            other.unfollow(key)
        if role != FOLLOWER or part.leader < 0:
            return
        fetcher = self.fetchers.get(part.leader)
        if fetcher is None:
            fetcher = self.fetchers[part.leader] = LeaderFetcher(self.settings, part.leader)
            fetcher.start()
        fetcher.follow(key, Follow(part, part.leader_epoch))
        fetcher._wakeup.set()

    async def stop(self) -> None:
        for f in self.fetchers.values():
            await f.stop()
        self.fetchers.clear()
