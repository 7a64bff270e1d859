"""Share groups (KIP-932) on the wire: ShareGroupHeartbeat, ShareGroupDescribe,
ShareFetch and ShareAcknowledge, v1 each (what Kafka 4.1 and its KafkaShareConsumer
speak).

Membership (`groups/share_group.py`) lives on the group's coordinator, the leader of its
`__consumer_offsets` partition, as for the other kinds of group. The share-partition
state (`share/partition.py`) and the share sessions (`share/sessions.py`) live on each
partition's leader. The record batches go out as stored: ShareFetch reads whole
batches from the log and lists the offset ranges it acquired for the member
(AcquiredRecords); the client hands out only those records and acknowledges them.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from straitmq.security.acls import DESCRIBE, GROUP, READ, TOPIC

from ..security.listeners import endpoint_for
from ..share.coordinator import MAX_PARKED_SHARE_FETCHES, ShareCoordinator
from ..share.group_configs import config_key
from ..share.partition import Acquired, InvalidRecordState
from ..share.sessions import FINAL_EPOCH, INITIAL_EPOCH, ShareSession
from ..views import leader_error
from .context import RequestContext

log = logging.getLogger("straitmq.share")

_BATCH_HEAD = struct.Struct(">qi")  # baseOffset, batchLength
_LAST_DELTA = struct.Struct(">i")  # lastOffsetDelta, at byte 23 of a batch
_READ_CHUNK = 1 << 20
_GROUP_DENIED = ErrorCode.group_authorization_failed
RESET = "share.auto.offset.reset"


def _not_coordinator(share: ShareCoordinator, group_id: str) -> int:
    """NOT_COORDINATOR unless this broker leads the group's offsets partition."""
    return 0 if share.offsets.owns(group_id) else ErrorCode.not_coordinator


def _now() -> int:
    return int(asyncio.get_running_loop().time() * 1000)


class _Topics:
    def __init__(self, image: Any) -> None:
        self._topics = image.topics

    def topic(self, name: str) -> tuple[uuid.UUID, int] | None:
        t = self._topics.get(name)
        return (t.topic_id, len(t.partitions)) if t is not None else None


def _assignment(by_topic: dict, image: Any, names: bool) -> dict:
    return {
        "topic_partitions": [
            {
                "topic_id": tid,
                "partitions": list(ps),
                **({"topic_name": image.topic_name(tid) or ""} if names else {}),
            }
            for tid, ps in by_topic.items()
        ]
    }


# -- membership, on the coordinator ---------------------------------------------------------


async def handle_share_group_heartbeat(
    share: ShareCoordinator, ctx: RequestContext, req: Any
) -> dict:
    answer: dict[str, Any] = {
        "throttle_time": 0,
        "error_message": None,
        "member_id": None,
        "member_epoch": -1,
        "heartbeat_interval": 0,
        "assignment": None,
    }
    gid = req.group_id
    if not ctx.allowed(READ, GROUP, gid):
        return {**answer, "error_code": _GROUP_DENIED}
    if code := _not_coordinator(share, gid):
        return {**answer, "error_code": code}
    if share.other_group_type(gid) is not None:
        return {
            **answer,
            "error_code": ErrorCode.group_id_not_found,
            "error_message": f"Group {gid} is not a share group.",
        }
    names = req.subscribed_topic_names
    for name in names or ():
        if not ctx.allowed(DESCRIBE, TOPIC, name):
            return {**answer, "error_code": ErrorCode.topic_authorization_failed}
    r = share.groups.heartbeat(
        gid,
        req.member_id,
        req.member_epoch,
        req.rack_id,
        tuple(names) if names is not None else None,
        ctx.client_id or "",
        ctx.client_host,
        _Topics(share.image),
        _now(),
    )
    share.members_gone()
    return {
        **answer,
        "error_code": r.error,
        "error_message": r.message,
        "member_id": r.member_id,
        "member_epoch": r.member_epoch,
        "heartbeat_interval": r.heartbeat_interval_ms,
        "assignment": _assignment(r.assignment, None, False) if r.assignment is not None else None,
    }


async def handle_share_group_describe(
    share: ShareCoordinator, ctx: RequestContext, req: Any
) -> dict:
    share.groups.expire(_now())
    share.members_gone()
    image = share.image
    groups = []
    for gid in req.group_ids:
        empty = {
            "group_id": gid,
            "group_state": "",
            "group_epoch": -1,
            "assignment_epoch": -1,
            "assignor_name": "",
            "members": [],
            "authorized_operations": -2147483648,
        }
        if not ctx.allowed(DESCRIBE, GROUP, gid):
            groups.append({**empty, "error_code": _GROUP_DENIED, "error_message": None})
            continue
        if code := _not_coordinator(share, gid):
            groups.append({**empty, "error_code": code, "error_message": None})
            continue
        g = share.groups.describe(gid)
        if g is None:
            groups.append(
                {
                    **empty,
                    "group_state": "Dead",
                    "error_code": ErrorCode.group_id_not_found,
                    "error_message": f"Group {gid} not found.",
                }
            )
            continue
        members = [
            {
                "member_id": m.member_id,
                "rack_id": m.rack_id,
                "member_epoch": m.epoch,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "subscribed_topic_names": list(m.subscribed),
                "assignment": _assignment(m.assignment, image, True),
            }
            for m in g.members.values()
        ]
        groups.append(
            {
                **empty,
                "error_code": 0,
                "error_message": None,
                "group_state": g.state,
                "group_epoch": g.epoch,
                "assignment_epoch": g.assignment_epoch,
                "assignor_name": "simple",
                "members": members,
            }
        )
    return {"throttle_time": 0, "groups": groups}


# -- records, on the partition leaders ------------------------------------------------------


def _leader(image: Any, topic: str | None, index: int) -> dict:
    p = image.partition(topic, index) if topic else None
    if p is None:
        return {"leader_id": -1, "leader_epoch": -1}
    return {"leader_id": p.leader, "leader_epoch": p.leader_epoch}


def _endpoints(ctx: RequestContext, image: Any, leaders: set[int]) -> list[dict]:
    out = []
    for node in sorted(leaders):
        b = image.brokers.get(node)
        if b is None:
            continue
        ep = endpoint_for(b, ctx.listener)
        if ep is not None:
            out.append({"node_id": node, "host": ep[0], "port": ep[1], "rack": b.rack})
    return out


def _batches(data: bytes | memoryview) -> list[tuple[int, int, int, int]]:
    """(base offset, last offset, start, end) of each whole batch in `data`."""
    out = []
    pos, n = 0, len(data)
    while pos + 27 <= n:
        base, length = _BATCH_HEAD.unpack_from(data, pos)
        end = pos + 12 + length
        if end > n:
            break
        out.append((base, base + _LAST_DELTA.unpack_from(data, pos + 23)[0], pos, end))
        pos = end
    return out


def _read_ranges(plog: Any, acquired: list[Acquired], upper: int) -> bytes:
    """The batches holding the acquired offsets, each batch once, in offset order."""
    out: list[bytes] = []
    sent_upto = -1  # every offset up to this one is in a batch already in `out`
    for a in sorted(acquired, key=lambda a: a.first):
        at = max(a.first, sent_upto + 1)
        while at <= a.last:
            data = plog.read_bytes(at, _READ_CHUNK, upper)
            batches = _batches(data)
            if not batches:
                break
            view = memoryview(data)
            for base, last, start, end in batches:
                if base > a.last:
                    break
                if last > sent_upto:
                    out.append(bytes(view[start:end]))
                    sent_upto = last
            at = max(at, sent_upto + 1)
            if batches[-1][0] > a.last:
                break
    return b"".join(out)


class _Acks:
    """The acknowledgements of one request, applied partition by partition."""

    def __init__(
        self, ctx: RequestContext, share: ShareCoordinator, group: str, member: str
    ) -> None:
        self.ctx, self.share, self.group, self.member = ctx, share, group, member
        self.results: dict[tuple[uuid.UUID, int], tuple[int, str | None]] = {}

    def apply(self, topic_id: uuid.UUID, index: int, batches: Any) -> None:
        if not batches:
            return
        ctx, share = self.ctx, self.share
        name = share.image.topic_name(topic_id)
        code, message = 0, None
        if name is None:
            code = ErrorCode.unknown_topic_id
        elif not ctx.allowed(READ, TOPIC, name):
            code = ErrorCode.topic_authorization_failed
        else:
            part = share.partitions.get(name, index)
            code = leader_error(share, name, index, part, -1)
        sp = self.share.state.existing(self.group, name, index) if not code and name else None
        if not code and sp is None:
            code, message = ErrorCode.invalid_record_state, "no records acquired here"
        if sp is not None:
            sp.expire(_now())
            for b in batches:
                try:
                    sp.acknowledge(
                        self.member, b.first_offset, b.last_offset, list(b.acknowledge_types)
                    )
                except InvalidRecordState as e:
                    code, message = ErrorCode.invalid_record_state, str(e)
                except ValueError as e:
                    code, message = ErrorCode.invalid_request, str(e)
            self.share.wake()
        self.results[(topic_id, index)] = (code, message)


async def _durable(share: ShareCoordinator, acks: _Acks, within_s: float = 5.0) -> None:
    """Acknowledgements are answered once the share-partitions' new state is saved, as
    Kafka answers once its share coordinator wrote it. If it cannot be saved within
    `within_s` (the group's coordinator is moving), the acknowledged partitions answer
    COORDINATOR_NOT_AVAILABLE: applied here, but a failover before the background round
    saves them may deliver those records again (the client is told, not misled)."""
    if await share.save(within_s):
        return
    log.info("share state not saved before answering acknowledgements")
    for key, (code, _) in list(acks.results.items()):
        if code == 0:
            acks.results[key] = (
                ErrorCode.coordinator_not_available,
                "acknowledged but not saved yet: may be delivered again after a failover",
            )


def _session_error(code: int, message: str | None, extra: dict) -> dict:
    return {
        "throttle_time": 0,
        "error_code": code,
        "error_message": message,
        "responses": [],
        "node_endpoints": [],
        **extra,
    }


async def handle_share_fetch(share: ShareCoordinator, ctx: RequestContext, req: Any) -> dict:
    extra = {"acquisition_lock_timeout": share.state.lock_duration_ms}
    group, member, epoch = req.group_id or "", req.member_id or "", req.share_session_epoch
    if not group or not member:
        return _session_error(ErrorCode.invalid_request, "GroupId and MemberId are required", extra)
    if not ctx.allowed(READ, GROUP, group):
        return _session_error(_GROUP_DENIED, None, extra)
    has_acks = any(p.acknowledgement_batches for t in req.topics for p in t.partitions)
    session, code, message = share.state.session_for(group, member, epoch, has_acks, _now())
    if code or session is None:
        return _session_error(code, message, extra)
    for t in req.forgotten_topics_data:
        for index in t.partitions:
            session.partitions.discard((t.topic_id, index))
    acks = _Acks(ctx, share, group, member)
    for t in req.topics:
        for p in t.partitions:
            if epoch != FINAL_EPOCH:
                session.partitions.add((t.topic_id, p.partition_index))
            acks.apply(t.topic_id, p.partition_index, p.acknowledgement_batches)
    if epoch == FINAL_EPOCH:
        share.state.close(session)
        share.wake()
    if acks.results:
        await _durable(share, acks)
    if epoch == FINAL_EPOCH:
        return _respond(ctx, share, {k: _only_ack(share, k, acks) for k in acks.results}, extra)
    await _init_partitions(share, session)
    parts = await _fetch(ctx, share, session, req)
    for key in acks.results:
        parts.setdefault(key, _only_ack(share, key, acks))
    for key, p in parts.items():
        code_msg = acks.results.get(key)
        if code_msg is not None:
            p["acknowledge_error_code"], p["acknowledge_error_message"] = code_msg
    if epoch != INITIAL_EPOCH:  # incremental: what has records, errors or ack results
        parts = {
            k: p
            for k, p in parts.items()
            if p["acquired_records"] or p["error_code"] or k in acks.results
        }
    return _respond(ctx, share, parts, extra)


def _only_ack(share: ShareCoordinator, key: tuple[uuid.UUID, int], acks: _Acks) -> dict:
    code, message = acks.results[key]
    return {
        "partition_index": key[1],
        "error_code": 0,
        "error_message": None,
        "acknowledge_error_code": code,
        "acknowledge_error_message": message,
        "current_leader": _leader(share.image, share.image.topic_name(key[0]), key[1]),
        "records": b"",
        "acquired_records": [],
    }


def _respond(ctx: RequestContext, share: ShareCoordinator, parts: dict, extra: dict) -> dict:
    by_topic: dict[uuid.UUID, list[dict]] = {}
    leaders: set[int] = set()
    for (tid, _), p in sorted(parts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        by_topic.setdefault(tid, []).append(p)
        if p["error_code"] == ErrorCode.not_leader_or_follower:
            leaders.add(p["current_leader"]["leader_id"])
    return {
        "throttle_time": 0,
        "error_code": 0,
        "error_message": None,
        **extra,
        "responses": [{"topic_id": tid, "partitions": ps} for tid, ps in by_topic.items()],
        "node_endpoints": _endpoints(ctx, share.image, leaders - {-1}),
    }


async def _init_partitions(share: ShareCoordinator, session: ShareSession) -> None:
    """Make the share-partitions this broker leads and has no state for yet, each from
    its saved SPSO (share/checkpoints.py) or, if none was ever saved, from
    share.auto.offset.reset. A partition whose saved SPSO cannot be read now is left
    for the next fetch (it answers no records meanwhile)."""
    for tid, index in list(session.partitions):
        name = share.image.topic_name(tid)
        if name is None or share.state.existing(session.group_id, name, index) is not None:
            continue
        part = share.partitions.get(name, index)
        if part is None or not part.is_leader:
            continue
        answered, saved, saved_state = await share.checkpoints.load(session.group_id, name, index)
        if not answered or not part.is_leader:
            continue
        # The group's share.auto.offset.reset (kafka-configs --entity-type groups), else
        # the broker's --share-auto-offset-reset.
        reset = share.image.cluster_configs.get(config_key(session.group_id, RESET))
        share.state.partition(
            session.group_id,
            name,
            index,
            part.log.log_start_offset,
            part.high_watermark,
            saved,
            reset,
            saved_state,
            part.log.log_end_offset,
        )


async def _fetch(
    ctx: RequestContext, share: ShareCoordinator, session: ShareSession, req: Any
) -> dict:
    """Acquire records of the session's partitions, waiting up to max_wait for some."""
    loop = asyncio.get_running_loop()
    wait_s = min(req.max_wait.total_seconds(), share.fetch_max_wait_s)
    deadline = loop.time() + max(wait_s, 0)
    token = object()
    try:
        while True:
            parts, got, watched = _collect(ctx, share, session, req)
            remaining = deadline - loop.time()
            if got or remaining <= 0 or share.stopping() or not session.partitions:
                return parts
            if token not in share.parked and len(share.parked) >= MAX_PARKED_SHARE_FETCHES:
                # Not parked: answered with what there is once its wait is over.
                share.refusals["share.fetch.parked"] += 1
                await asyncio.sleep(remaining)
                continue
            # Parked fetches are served first come, first served: the oldest one keeps its
            # place when it wakes up to nothing, so members sharing a partition take turns.
            share.parked.setdefault(token, next(share.park_order))
            await _wait(share, session, watched, loop, remaining)
            ahead = sum(1 for seq in share.parked.values() if seq < share.parked[token])
            for _ in range(min(ahead, 64)):
                await asyncio.sleep(0)  # let the older fetches woken with this one go first
    finally:
        share.parked.pop(token, None)


async def _wait(
    share: ShareCoordinator, session: ShareSession, watched: list, loop: Any, remaining: float
) -> None:
    """Until one of `watched` partitions gets records, records are released or
    acknowledged, or the next acquisition lock of these share-partitions expires."""
    lock_due = share.state.next_deadline([(session.group_id, t, i) for t, i, _ in watched])
    if lock_due is not None:
        remaining = min(remaining, max(lock_due - _now(), 1) / 1000)
    fut: asyncio.Future[None] = loop.create_future()
    share.waiters.add(fut)
    for _, _, part in watched:
        part.park(fut)  # a partition with MAX_PARKED_FETCHES: seen at the next wake-up
    try:
        await asyncio.wait_for(fut, remaining)
    except TimeoutError:
        pass
    finally:
        share.waiters.discard(fut)
        for _, _, part in watched:
            part.waiters.discard(fut)
        if not fut.done():
            fut.cancel()


def _collect(
    ctx: RequestContext, share: ShareCoordinator, session: ShareSession, req: Any
) -> tuple[dict, bool, list]:
    image = share.image
    now = _now()
    budget_records = max(req.max_records, 1) if req.max_records > 0 else 500
    budget_bytes = req.max_bytes if req.max_bytes > 0 else 2**31 - 1
    parts: dict[tuple[uuid.UUID, int], dict] = {}
    watched = []
    got = False
    for tid, index in sorted(session.partitions, key=lambda k: (str(k[0]), k[1])):
        name = image.topic_name(tid)
        out: dict[str, Any] = {
            "partition_index": index,
            "error_code": 0,
            "error_message": None,
            "acknowledge_error_code": 0,
            "acknowledge_error_message": None,
            "current_leader": _leader(image, name, index),
            "records": b"",
            "acquired_records": [],
        }
        parts[(tid, index)] = out
        if name is None:
            out["error_code"] = ErrorCode.unknown_topic_id
            continue
        if not ctx.allowed(READ, TOPIC, name):
            out["error_code"] = ErrorCode.topic_authorization_failed
            continue
        part = share.partitions.get(name, index)
        if code := leader_error(share, name, index, part, -1):
            out["error_code"] = code
            continue
        assert part is not None  # leader_error answers for a missing one
        watched.append((name, index, part))
        if budget_records <= 0 or budget_bytes <= 0:
            continue
        plog = part.log
        hw = part.high_watermark
        sp = share.state.existing(session.group_id, name, index)
        if sp is None:
            continue  # its saved SPSO could not be read yet (see _init_partitions)
        sp.skip_to(plog.log_start_offset)
        new: list[tuple[int, int]] = []
        if sp.next_offset < hw and sp.in_flight() < sp.max_in_flight:
            for base, last, _, _ in _batches(
                plog.read_bytes(sp.next_offset, min(_READ_CHUNK, budget_bytes), hw)
            ):
                new.append((base, min(last, hw - 1)))
        acquired = sp.acquire(session.member_id, now, budget_records, new)
        if not acquired:
            continue
        records = _read_ranges(plog, acquired, hw)
        got = True
        budget_records -= sum(a.last - a.first + 1 for a in acquired)
        budget_bytes -= len(records)
        out["records"] = records
        out["acquired_records"] = [
            {"first_offset": a.first, "last_offset": a.last, "delivery_count": a.delivery_count}
            for a in acquired
        ]
    return parts, got, watched


async def handle_share_acknowledge(share: ShareCoordinator, ctx: RequestContext, req: Any) -> dict:
    group, member, epoch = req.group_id or "", req.member_id or "", req.share_session_epoch
    if not group or not member:
        return _session_error(ErrorCode.invalid_request, "GroupId and MemberId are required", {})
    if not ctx.allowed(READ, GROUP, group):
        return _session_error(_GROUP_DENIED, None, {})
    if epoch == INITIAL_EPOCH:
        return _session_error(
            ErrorCode.invalid_share_session_epoch,
            "ShareAcknowledge cannot open a share session",
            {},
        )
    session, code, message = share.state.session_for(group, member, epoch, True, _now())
    if code or session is None:
        return _session_error(code, message, {})
    acks = _Acks(ctx, share, group, member)
    for t in req.topics:
        for p in t.partitions:
            acks.apply(t.topic_id, p.partition_index, p.acknowledgement_batches)
            acks.results.setdefault((t.topic_id, p.partition_index), (0, None))
    if epoch == FINAL_EPOCH:
        share.state.close(session)
        share.wake()
    await _durable(share, acks)
    by_topic: dict[uuid.UUID, list[dict]] = {}
    leaders: set[int] = set()
    for (tid, index), (code, message) in acks.results.items():
        leader = _leader(share.image, share.image.topic_name(tid), index)
        if code == ErrorCode.not_leader_or_follower:
            leaders.add(leader["leader_id"])
        by_topic.setdefault(tid, []).append(
            {
                "partition_index": index,
                "error_code": code,
                "error_message": message,
                "current_leader": leader,
            }
        )
    return {
        "throttle_time": 0,
        "error_code": 0,
        "error_message": None,
        "responses": [{"topic_id": tid, "partitions": ps} for tid, ps in by_topic.items()],
        "node_endpoints": _endpoints(ctx, share.image, leaders - {-1}),
    }


async def handle_describe_share_group_offsets(
    share: ShareCoordinator, ctx: RequestContext, req: Any
) -> dict:
    """DescribeShareGroupOffsets v0 (what `kafka-share-groups --describe` shows): each
    share-partition's start offset as last saved (share/checkpoints.py)."""
    image = share.image
    groups = []
    for g in req.groups:
        gid = g.group_id
        code = 0 if ctx.allowed(DESCRIBE, GROUP, gid) else _GROUP_DENIED
        code = code or _not_coordinator(share, gid)
        if code:
            groups.append(
                {"group_id": gid, "topics": [], "error_code": code, "error_message": None}
            )
            continue
        wanted = [(t.topic_name, list(t.partitions)) for t in g.topics] if g.topics else None
        saved = await share.checkpoints.saved(gid, wanted)
        if saved is None:
            groups.append(
                {
                    "group_id": gid,
                    "topics": [],
                    "error_message": None,
                    "error_code": ErrorCode.coordinator_not_available,
                }
            )
            continue
        if wanted is None:
            by_topic: dict[str, list[int]] = {}
            for t, p in sorted(saved):
                by_topic.setdefault(t, []).append(p)
            wanted = list(by_topic.items())
        topics = []
        for name, parts in wanted:
            if not ctx.allowed(DESCRIBE, TOPIC, name):
                continue
            topic_image = image.topics.get(name)
            topics.append(
                {
                    "topic_name": name,
                    "topic_id": topic_image.topic_id if topic_image is not None else None,
                    "partitions": [
                        {
                            "partition_index": p,
                            "start_offset": saved.get((name, p), -1),
                            "leader_epoch": -1,
                            "error_code": 0
                            if topic_image is not None and 0 <= p < len(topic_image.partitions)
                            else ErrorCode.unknown_topic_or_partition,
                            "error_message": None,
                        }
                        for p in parts
                    ],
                }
            )
        groups.append({"group_id": gid, "topics": topics, "error_code": 0, "error_message": None})
    return {"throttle_time": 0, "groups": groups}
