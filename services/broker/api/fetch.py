"""Fetch (long polling, zero-copy) and ListOffsets.

The Fetch response is written by hand (v4-v12) so each partition's records go from the
segment file to the socket with sendfile instead of through Python memory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from bisect import bisect_right
from time import perf_counter
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from straitmq.protocol.codec import response_header_bytes
from straitmq.protocol.varint import uvarint as _uvarint
from straitmq.security.acls import CLUSTER_ACTION, DESCRIBE, READ, TOPIC
from straitmq.tasks import settle

from ..fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    FetchSession,
    FetchSessions,
    next_epoch,
)
from ..loop_slice import LoopSlice
from ..quotas import Sensor
from ..replication.core import UNDEFINED, diverging_epoch
from ..replication.follower_id import fetcher_incarnation
from ..storage.log import ReadSlice
from ..storage.txn_index import AbortedTxn
from .context import RawResponse, RequestContext

if TYPE_CHECKING:
    from ..views import LocalReplicas
    from .deps import FetchDeps

log = logging.getLogger("straitmq.broker")

LATEST = -1
EARLIEST = -2
# A fetch naming thousands of partitions yields to the event loop after this much work
# (checked every COLLECT_CHECK partitions).
COLLECT_SLICE_S = 0.02
COLLECT_CHECK = 200

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PART_V4 = struct.Struct(">ihqq")  # partition, error, high watermark, last stable offset
_I64 = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")  # producer id, first offset
_DIVERGING = struct.Struct(">iq")  # epoch, end offset


# topic -> [(partition, fetch offset, partition max bytes, current leader epoch,
#            the fetching follower's log start, the epoch of its last record)]
WantedPartition = tuple[int, int, int, int, int, int]
Wanted = list[tuple[str, list[WantedPartition]]]
# A partition's answer: (partition, error, high watermark, log start, records, fetch
# offset, last stable offset, aborted transactions (None: read_uncommitted or an error),
# the diverging epoch and its end offset (None: the fetcher's log does not part, KIP-320)).
PartAnswer = tuple[
    int, int, int, int, ReadSlice | None, int, int, list[AbortedTxn] | None, tuple[int, int] | None
]


def _wanted(p: Any) -> WantedPartition:
    return (
        p.partition,
        p.fetch_offset,
        p.partition_max_bytes,
        getattr(p, "current_leader_epoch", -1),
        getattr(p, "log_start_offset", -1),
        getattr(p, "last_fetched_epoch", -1),  # v12+
    )


class _FetchPlan:
    """The partitions of one Fetch request, or of its session, and what each would
    return right now."""

    def __init__(
        self,
        deps: FetchDeps,
        ctx: RequestContext,
        req: Any,
        named: Wanted,
        session: FetchSession | None = None,
        incremental: bool = False,
    ) -> None:
        self.deps = deps
        self.ctx = ctx
        self.req = req
        # A follower's fetch (replica_id >= 0) reads up to the log end and reports its
        # position; a consumer's reads up to the high watermark.
        self.replica = getattr(req, "replica_id", -1)
        # The follower's process (KIP-903): the one its fetcher names, else the one the
        # metadata names now. A fetch of one that restarted since counts only for it.
        self.incarnation = (
            fetcher_incarnation(ctx.client_id, self.replica) or deps.incarnation(self.replica)
            if self.replica >= 0
            else None
        )
        self.session = session
        self.incremental = incremental
        # The partitions whose follower position this fetch has reported: each once, at
        # its first look (a session partition may first show up dirty mid-wait). Not one
        # whose leader did not know the follower yet: a reassignment's new replica may
        # fetch before the leader applies it, and the leader, once it does, marks the
        # partition dirty so that a look later in this very fetch records the position
        # (the follower names an unchanged partition never again).
        self.reported: set[tuple[str, int]] = set()
        self.named = named
        # The session's change marks this fetch answers, taken out of the session when it
        # looks: marks made while it collects (it yields on large fetches) or waits stay
        # in the session for the next look or the next fetch.
        self.taken: set[tuple[str, int]] = set()
        # A follower needs CLUSTER_ACTION on the cluster (Kafka), asked once per request;
        # a consumer READ on each topic (a cached decision per topic per pass).
        self.follower_ok = self.replica < 0 or ctx.cluster_allowed(CLUSTER_ACTION)
        # isolation_level=1 (READ_COMMITTED): a consumer reads up to the last stable
        # offset and is told the aborted transactions in what it reads.
        self.read_committed = self.replica < 0 and getattr(req, "isolation_level", 0) == 1

    def may_read(self, topic: str) -> bool:
        if self.replica >= 0:
            return self.follower_ok
        return self.ctx.allowed(READ, TOPIC, topic)

    def wanted(self) -> Wanted:
        """Everything the request names; in an incremental session fetch, the session's
        partitions the request names or that changed since they were last answered."""
        session = self.session
        if session is None:
            return self.named
        if session.dirty:
            self.taken |= session.dirty
            session.dirty = set()
        if not self.incremental:
            return self.named
        keys = {(t, p[0]) for t, ps in self.named for p in ps}
        keys |= self.taken
        by_topic: dict[str, list[WantedPartition]] = {}
        for key in keys:
            sp = session.parts.get(key)
            if sp is not None:
                by_topic.setdefault(key[0], []).append(
                    (
                        key[1],
                        sp.fetch_offset,
                        sp.max_bytes,
                        sp.leader_epoch,
                        sp.fetcher_log_start,
                        sp.last_fetched_epoch,
                    )
                )
        return list(by_topic.items())

    async def collect(self, wanted: Wanted) -> tuple[list, int, set]:
        """The answer for `wanted` now, its record bytes, and the partitions that have
        records to send but got none (the response's byte budget ran out). A fetch of
        thousands of partitions (a restarted follower's first) yields to the event loop
        every COLLECT_SLICE_S of work."""
        replicas = self.deps.replicas
        throttle = self.deps.throttle
        pacer = LoopSlice(COLLECT_SLICE_S, COLLECT_CHECK)
        budget = self.req.max_bytes if self.ctx.version >= 3 else 2**31 - 1
        topics = []
        total = 0
        unsent: set[tuple[str, int]] = set()
        replica = self.replica
        session = self.session
        for topic, wants in wanted:
            parts: list[PartAnswer] = []
            error: int
            denied = not self.may_read(topic)
            for index, fetch_offset, max_bytes, leader_epoch, follower_start, last_epoch in wants:
                if pacer.due():
                    await pacer.pause()
                if denied:
                    error = ErrorCode.topic_authorization_failed
                    parts.append((index, error, -1, -1, None, fetch_offset, -1, None, None))
                    continue
                partition, error = replicas.leader(topic, index, leader_epoch)
                if error:
                    hw = partition.high_watermark if partition is not None else -1
                    parts.append((index, error, hw, -1, None, fetch_offset, -1, None, None))
                    continue
                assert partition is not None
                plog = partition.log
                hw = partition.high_watermark
                if replica >= 0 and last_epoch >= 0:
                    # KIP-320, before the fetch counts: a follower whose log parted from
                    # this one is told where, and is not caught up (Kafka records its
                    # fetch only without a divergence). Followers only: consumers keep
                    # validating positions by OffsetForLeaderEpoch, as before.
                    leo = plog.log_end_offset
                    parted = diverging_epoch(plog.epochs, leo, fetch_offset, last_epoch)
                    if parted is not None:
                        start = plog.log_start_offset
                        if parted[0] == UNDEFINED:  # as Kafka: the fetcher asks by epoch
                            error = ErrorCode.offset_out_of_range
                            parts.append(
                                (index, error, hw, start, None, fetch_offset, -1, None, None)
                            )
                        else:
                            parts.append(
                                (index, 0, hw, start, None, fetch_offset, -1, None, parted)
                            )
                        continue
                if replica >= 0 and (topic, index) not in self.reported:
                    if partition.on_follower_fetch(
                        replica, fetch_offset, session, follower_start, self.incarnation
                    ):
                        self.reported.add((topic, index))
                if fetch_offset < plog.log_start_offset or fetch_offset > plog.log_end_offset:
                    error = ErrorCode.offset_out_of_range
                    start = plog.log_start_offset
                    parts.append((index, error, hw, start, None, fetch_offset, -1, None, None))
                    continue
                lso = plog.last_stable_offset(hw)
                limit = min(max_bytes, budget) if total else max_bytes
                upper = lso if self.read_committed else hw
                if replica >= 0:
                    upper = plog.log_end_offset
                    limit = throttle.allowance(topic, index, replica, limit)
                try:
                    sl = plog.read(fetch_offset, max(limit, 1), upper) if limit > 0 else None
                except OSError as e:  # out of descriptors, or the file went away
                    log.warning(
                        "fetch read failed",
                        extra={"topic": topic, "partition": index, "error": str(e)},
                    )
                    error = ErrorCode.kafka_storage_error
                    parts.append((index, error, hw, -1, None, fetch_offset, -1, None, None))
                    continue
                aborted = None
                if self.read_committed:
                    # From the indexes only (Kafka's collectAbortedTxns): no record is read.
                    aborted = (
                        plog.aborted_transactions(fetch_offset, plog.upper_bound_of(sl))
                        if sl is not None
                        else []
                    )
                if sl is not None:
                    total += sl.size
                    budget -= sl.size
                    if replica >= 0:
                        throttle.spent(topic, index, replica, sl.size)
                elif fetch_offset < upper:
                    unsent.add((topic, index))
                start = plog.log_start_offset
                parts.append((index, 0, hw, start, sl, fetch_offset, lso, aborted, None))
            topics.append((topic, parts))
        return topics, total, unsent

    def changed_only(self, topics: list) -> list:
        """An incremental answer lists only partitions with records, an error, or a high
        watermark or log start the fetcher has not been told yet."""
        assert self.session is not None
        parts_of = self.session.parts
        out = []
        for name, parts in topics:
            keep = []
            for part in parts:
                sp = parts_of.get((name, part[0]))
                if (
                    sp is None
                    or part[1]
                    or part[4] is not None
                    or part[8] is not None
                    or part[2] != sp.hw
                    or part[3] != sp.log_start
                ):
                    keep.append(part)
            if keep:
                out.append((name, keep))
        return out

    def answered(self, topics: list, unsent: set) -> None:
        """Remember what the session's fetcher now knows; what could not be sent stays
        dirty for the next fetch."""
        session = self.session
        assert session is not None
        for name, parts in topics:
            for part in parts:
                sp = session.parts.get((name, part[0]))
                if sp is not None:
                    sp.hw = part[2]
                    sp.log_start = part[3]
        session.dirty.update(k for k in unsent if k in session.parts)
        self.taken = set()

    def partitions(self) -> list:
        held = self.deps.replicas.partitions
        return [
            part
            for t in self.req.topics
            for p in t.partitions
            if (part := held.get(t.topic, p.partition)) is not None
        ]


def _encode(ctx: RequestContext, topics: list, error: int = 0, session_id: int = 0) -> RawResponse:
    v = ctx.version
    flexible = v >= 12
    out = RawResponse()
    head = bytearray(_I32.pack(0))  # throttle (the listener sets it)
    if v >= 7:
        head += _I16.pack(error) + _I32.pack(session_id)
    head += _uvarint(len(topics) + 1) if flexible else _I32.pack(len(topics))
    chunks: list[Any] = []
    for name, parts in topics:
        raw = name.encode()
        head += (_uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw
        head += _uvarint(len(parts) + 1) if flexible else _I32.pack(len(parts))
        for index, p_error, hw, log_start, sl, _, lso, aborted, parted in parts:
            head += _PART_V4.pack(index, p_error, hw, lso)
            if v >= 5:
                head += _I64.pack(log_start)
            if aborted is None:  # read_uncommitted (and errors): null, as Kafka answers
                head += _uvarint(0) if flexible else _I32.pack(-1)
            else:
                head += _uvarint(len(aborted) + 1) if flexible else _I32.pack(len(aborted))
                for txn in aborted:
                    head += _ABORTED.pack(txn.producer_id, txn.first_offset)
                    if flexible:
                        head += b"\x00"
            if v >= 11:
                head += _I32.pack(-1)  # preferred read replica
            size = sl.size if sl else 0
            head += _uvarint(size + 1) if flexible else _I32.pack(size)
            if sl:
                chunks.append(bytes(head))
                chunks.append(sl)
                head = bytearray()
            if flexible:
                if parted is None:
                    head += b"\x00"  # no tagged fields
                else:  # one: DivergingEpoch (tag 0: epoch, end offset, no tags of its own)
                    head += b"\x01\x00\x0d" + _DIVERGING.pack(*parted) + b"\x00"
        if flexible:
            head += b"\x00"
    if flexible:
        head += b"\x00"
    chunks.append(bytes(head))
    header = response_header_bytes(1, v, ctx.correlation_id)
    body_size = len(header) + sum(c.size if isinstance(c, ReadSlice) else len(c) for c in chunks)
    out.add(_I32.pack(body_size) + header, 4 + len(header))
    for c in chunks:
        out.add(c, c.size if isinstance(c, ReadSlice) else len(c))
    return out


def _session_for(
    sessions: FetchSessions, ctx: RequestContext, req: Any, replica: int, named: Wanted
) -> tuple[FetchSession | None, bool, int]:
    """KIP-227: (the session, whether this fetch is incremental, a top-level error).
    Epoch -1 fetches without a session (closing the named one), epoch 0 opens a new
    session (closing the named one), any other epoch continues a session."""
    if ctx.version < 7:
        return None, False, 0
    sid, epoch = req.session_id, req.session_epoch
    if epoch in (FINAL_EPOCH, INITIAL_EPOCH):
        if sid != INVALID_SESSION_ID:
            sessions.close(sid)
        if epoch == FINAL_EPOCH:
            return None, False, 0
        session = sessions.open(replica)
        if session is not None:
            for topic, wants in named:
                for want in wants:
                    sessions.put(session, topic, want)
        return session, False, 0
    session = sessions.get(sid)
    if session is None or session.replica != replica:
        return None, False, ErrorCode.fetch_session_id_not_found
    if session.epoch != epoch:
        return None, False, ErrorCode.invalid_fetch_session_epoch
    session.epoch = next_epoch(epoch)
    for t in req.forgotten_topics_data:
        for index in t.partitions:
            sessions.forget(session, (t.topic, index))
    for topic, wants in named:
        for want in wants:
            sessions.put(session, topic, want)
    return session, True, 0


async def handle_fetch(deps: FetchDeps, ctx: RequestContext, req: Any) -> RawResponse:
    replica = getattr(req, "replica_id", -1)
    named: Wanted = [(t.topic, [_wanted(p) for p in t.partitions]) for t in req.topics]
    session, incremental, error = _session_for(deps.sessions, ctx, req, replica, named)
    if error:
        deps.metrics.request_errors[(1, error)] += 1
        return _encode(ctx, [], error)
    plan = _FetchPlan(deps, ctx, req, named, session, incremental)
    loop = asyncio.get_running_loop()
    max_wait = req.max_wait.total_seconds()
    deadline = loop.time() + min(max_wait, deps.max_wait_s)
    try:
        while True:
            topics, total, unsent = await plan.collect(plan.wanted())
            if incremental:
                topics = plan.changed_only(topics)
            remaining = deadline - loop.time()
            if total >= max(req.min_bytes, 1) or remaining <= 0 or deps.stopping():
                break
            if session is not None and not session.alive:
                break
            if session is not None and session.dirty:
                # Marked while collecting (new records, or the high watermark this very
                # fetch moved), so no wake-up will come for it. A full fetch answers now
                # (its marks go to the incremental fetch that follows; a second pass
                # would visit every partition again); an incremental one looks again.
                if not incremental:
                    break
                continue
            await _wait_for_change(plan, session, remaining)
    except BaseException:
        if session is not None:  # not answered: its marks stay for the next fetch
            session.dirty |= plan.taken
        raise
    if replica < 0 and ctx.quotas is not None and ctx.quotas[1] is not None:
        throttled = _over_quota(deps, ctx.quotas[1], topics)
        if throttled:
            # Kafka's answer to a consumer over its consumer_byte_rate: nothing (the
            # bytes are not counted), the throttle time, and the session as it was.
            if session is not None:
                session.dirty |= plan.taken
                if not incremental:
                    deps.sessions.close(session.id)
                    session = None
            out = _encode(ctx, [], 0, session.id if session is not None else INVALID_SESSION_ID)
            out.throttle_ms = throttled
            return out
    if session is not None:
        plan.answered(topics, unsent)
    _count(deps, topics, plan.replica >= 0)
    return _encode(ctx, topics, 0, session.id if session is not None else INVALID_SESSION_ID)


def _over_quota(deps: FetchDeps, allowance: Sensor, topics: list) -> int:
    """The throttle (ms) of a consumer whose answer would take it over its quota; the
    bytes stay counted only when it is within quota."""
    size = sum(p[4].size for _, parts in topics for p in parts if p[4] is not None)
    return deps.quotas.charge_fetch(allowance, size, perf_counter() * 1000.0)


async def _wait_for_change(plan: _FetchPlan, session: FetchSession | None, within: float) -> None:
    """Until a partition of the fetch changes, or `within` seconds."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    if session is not None:
        # The session's partitions mark themselves dirty and wake it: no waiter on each
        # of tens of thousands of partitions.
        session.waiter = fut
        parts = []
    else:
        # A partition with MAX_PARKED_FETCHES parked already does not take this one: its
        # records are seen when another partition wakes the fetch, or at the timer.
        named = plan.partitions()
        parts = [part for part in named if part.park(fut)]
        if len(parts) < len(named):
            plan.deps.metrics.limit_refusals["fetch.parked.per.partition"] += 1
    # A timer, not asyncio.wait_for (a second future and a callback per wait: a
    # follower's fetch waits once per leader append).
    timer = loop.call_later(within, settle, fut)
    try:
        await fut
    finally:
        timer.cancel()
        if session is not None and session.waiter is fut:
            session.waiter = None
        for part in parts:
            part.waiters.discard(fut)


def _count(deps: FetchDeps, topics: list, follower: bool) -> None:
    """Metrics of one answered fetch: errors, bytes and records out per topic.

    Records are counted as the offsets the slice covers past the fetch offset: the
    first offset after the slice is the base offset of the batch that follows it on
    disk (an 8-byte read), or the next segment's base or the high watermark."""
    metrics = deps.metrics
    for name, parts in topics:
        for p in parts:
            sl = p[4]
            fetch_offset = p[5]
            if p[1]:
                metrics.request_errors[(1, p[1])] += 1
            elif sl is not None:
                if follower:
                    metrics.replication_bytes_out += sl.size
                    continue
                metrics.bytes_out[name] += sl.size
                try:
                    head = os.pread(sl.fd, 8, sl.position + sl.size)
                except OSError:
                    head = b""  # counted from the segment bases below
                if len(head) == 8:
                    end = min(_I64.unpack(head)[0], p[2])
                else:
                    part = deps.replicas.partitions.get(name, p[0])
                    end = p[2]
                    if part is not None:
                        bases = part.log.bases
                        i = bisect_right(bases, fetch_offset)
                        if i < len(bases):
                            end = min(end, bases[i])
                metrics.messages_out[name] += max(0, end - fetch_offset)


MAX_TIMESTAMP = -3  # KIP-734: the record with the largest timestamp
EARLIEST_LOCAL = -4  # KIP-405: the local log start; without tiered storage, the log start
LATEST_TIERED = -5  # KIP-1005: the last tiered offset; none without tiered storage
# The first ListOffsets version that may ask for each special timestamp (Kafka's
# timestampMinSupportedVersion); older requests get UNSUPPORTED_VERSION for it.
_SPECIAL_MIN_VERSION = {
    EARLIEST: 1,
    LATEST: 1,
    MAX_TIMESTAMP: 7,
    EARLIEST_LOCAL: 8,
    LATEST_TIERED: 9,
}


def _list_offset(partition: Any, timestamp: int, isolation: int = 0) -> tuple[int, int, int]:
    """(offset, timestamp, leader epoch) a leader answers for one ListOffsets timestamp.
    Kafka's last fetchable offset bounds the answer: the high watermark, or with
    isolation_level=1 (READ_COMMITTED) the last stable offset."""
    plog = partition.log
    fetchable = partition.high_watermark
    if isolation == 1:
        fetchable = plog.last_stable_offset(fetchable)
    if timestamp == LATEST:
        return fetchable, -1, partition.leader_epoch
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        # The epoch the first record was written in, as Kafka answers: consumers check
        # their position against it (KIP-320).
        return plog.log_start_offset, -1, plog.epochs.epoch_for(plog.log_start_offset)
    if timestamp == LATEST_TIERED:
        return -1, -1, -1  # as Kafka answers for a topic without remote storage
    if timestamp == MAX_TIMESTAMP:
        found = plog.max_timestamp_offset()
        if found is None:
            return -1, -1, -1
        offset, ts, epoch = found
    else:
        by_time = plog.offset_for_timestamp(timestamp)
        if by_time is None:
            return -1, -1, -1
        (offset, ts), epoch = by_time, plog.epochs.epoch_for(by_time[0])
    # Only committed records are found (Kafka: nothing at or above the last fetchable
    # offset, the high watermark for a consumer).
    if offset >= fetchable:
        return -1, -1, -1
    return offset, ts, epoch


async def handle_list_offsets(deps: FetchDeps, ctx: RequestContext, req: Any) -> dict:
    replicas = deps.replicas
    version = ctx.version
    # A partition named twice gets INVALID_REQUEST, answered once (Kafka's rule).
    seen: set[tuple[str, int]] = set()
    duplicates = set()
    for t in req.topics:
        for p in t.partitions:
            key = (t.name, p.partition_index)
            if key in seen:
                duplicates.add(key)
            seen.add(key)
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            key = (t.name, p.partition_index)
            if key in duplicates:
                if key not in seen:
                    continue  # answered already
                seen.discard(key)
            out = {
                "partition_index": p.partition_index,
                "error_code": 0,
                "timestamp": -1,
                "offset": -1,
                "leader_epoch": -1,
                "old_style_offsets": [],
            }
            parts.append(out)
            if key in duplicates:
                out["error_code"] = ErrorCode.invalid_request
                continue
            if not ctx.allowed(DESCRIBE, TOPIC, t.name):
                out["error_code"] = ErrorCode.topic_authorization_failed
                continue
            if p.timestamp < 0:
                least = _SPECIAL_MIN_VERSION.get(p.timestamp)
                if least is None:
                    out["error_code"] = ErrorCode.invalid_request  # no such special timestamp
                    continue
                if version < least:
                    out["error_code"] = ErrorCode.unsupported_version
                    continue
            partition, error = replicas.leader(
                t.name, p.partition_index, getattr(p, "current_leader_epoch", -1)
            )
            if error:
                out["error_code"] = error
                continue
            out["offset"], out["timestamp"], out["leader_epoch"] = _list_offset(
                partition, p.timestamp, getattr(req, "isolation_level", 0)
            )
        if parts:
            topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}


async def handle_offset_for_leader_epoch(deps: FetchDeps, ctx: RequestContext, req: Any) -> dict:
    """Where does leader epoch E end in this leader's log (KIP-279)? Followers truncate
    to it after a leader change; consumers use it to detect truncation."""
    replicas: LocalReplicas = deps.replicas
    topics = []
    # Kafka: a follower (replica_id >= 0) needs CLUSTER_ACTION, a client DESCRIBE.
    follower = getattr(req, "replica_id", -1) >= 0
    cluster_ok = not follower or ctx.cluster_allowed(CLUSTER_ACTION)
    for t in req.topics:
        parts = []
        ok = cluster_ok if follower else ctx.allowed(DESCRIBE, TOPIC, t.topic)
        for p in t.partitions:
            partition, error = replicas.leader(
                t.topic, p.partition, getattr(p, "current_leader_epoch", -1)
            )
            if not ok:
                error = ErrorCode.topic_authorization_failed
            epoch, end = -1, -1
            if not error:
                assert partition is not None
                epoch, end = partition.log.epochs.end_offset_for(
                    p.leader_epoch, partition.log.log_end_offset
                )
            parts.append(
                {
                    "error_code": error,
                    "partition": p.partition,
                    "leader_epoch": epoch,
                    "end_offset": end,
                }
            )
        topics.append({"topic": t.topic, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
