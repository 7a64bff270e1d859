"""Group coordination APIs: FindCoordinator, Join/Sync/Heartbeat/Leave, offsets, admin."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from straitmq.errors import KafkaError
from straitmq.security.acls import DELETE, DESCRIBE, GROUP, READ, TOPIC, TRANSACTIONAL_ID

from ..groups.coordinator import JoinError
from ..groups.messages import ConsumerHeartbeatRequest
from ..groups.offsets import OFFSETS_TOPIC
from ..security.listeners import endpoint_for
from ..share.coordinator import is_state_group
from .context import RequestContext

if TYPE_CHECKING:
    from ..groups.offsets import OffsetStore
    from .deps import GroupDeps

MAX_METADATA = 4096
_GROUP_DENIED = ErrorCode.group_authorization_failed


def _no_read(ctx: RequestContext, group_id: str) -> int:
    """GROUP_AUTHORIZATION_FAILED unless the principal may READ the group (Kafka's
    check for joining, syncing, heartbeats, leaving and offsets)."""
    return 0 if ctx.allowed(READ, GROUP, group_id) else _GROUP_DENIED


def _coordinator(deps: GroupDeps, ctx: RequestContext, group_id: str) -> dict:
    """The leader of the group's offsets partition, or COORDINATOR_NOT_AVAILABLE."""
    p = deps.metadata.image.partition(OFFSETS_TOPIC, deps.offsets.partition_for(group_id))
    return _endpoint_of(deps, ctx, p.leader if p is not None else None, "group")


def _endpoint_of(deps: GroupDeps, ctx: RequestContext, leader: int | None, kind: str) -> dict:
    """A coordinator's node and its endpoint on the client's listener, or
    COORDINATOR_NOT_AVAILABLE while it has none."""
    b = deps.metadata.image.brokers.get(leader) if leader is not None else None
    ep = endpoint_for(b, ctx.listener) if b is not None else None  # the client's listener
    if b is None or not b.alive or ep is None:
        return {
            "node_id": -1,
            "host": "",
            "port": -1,
            "error_code": ErrorCode.coordinator_not_available,
            "error_message": f"the {kind} coordinator is not available yet; retry",
        }
    return {"node_id": b.id, "host": ep[0], "port": ep[1], "error_code": 0, "error_message": None}


async def _txn_coordinator(deps: GroupDeps, ctx: RequestContext, tid: str) -> dict:
    """The leader of the id's `__transaction_state` partition (the topic made on first
    use, as Kafka does), or COORDINATOR_NOT_AVAILABLE while there is none."""
    none = {"node_id": -1, "host": "", "port": -1}
    if not ctx.allowed(DESCRIBE, TRANSACTIONAL_ID, tid):
        code = ErrorCode.transactional_id_authorization_failed
        return {**none, "error_code": code, "error_message": None}
    txn = deps.transactions
    try:
        await txn.ensure_topic()
    except KafkaError as e:
        return {
            **none,
            "error_code": ErrorCode.coordinator_not_available,
            "error_message": e.message,
        }
    return _endpoint_of(deps, ctx, txn.coordinator_of(tid), "transaction")


class OffsetsHolder(Protocol):
    @property
    def offsets(self) -> OffsetStore: ...


def not_coordinator(holder: OffsetsHolder, group_id: str) -> int:
    """NOT_COORDINATOR unless this broker leads the group's offsets partition."""
    return 0 if holder.offsets.owns(group_id) else ErrorCode.not_coordinator


async def handle_find_coordinator(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    await deps.ensure_offsets_topic()
    if ctx.version >= 4:
        keys = list(req.coordinator_keys)
    else:
        keys = [req.key]
    coordinators = []
    key_type = getattr(req, "key_type", 0)
    for key in keys:
        if key_type == 1:  # a transactional id
            coordinators.append({"key": key, **await _txn_coordinator(deps, ctx, key)})
        elif key_type != 0:  # 2: share-group state coordinators, Kafka's internal use
            coordinators.append(
                {
                    "key": key,
                    "node_id": -1,
                    "host": "",
                    "port": -1,
                    "error_code": ErrorCode.invalid_request,
                    "error_message": f"coordinator key type {key_type} is not supported",
                }
            )
        elif not ctx.allowed(DESCRIBE, GROUP, key):
            denied = {"node_id": -1, "host": "", "port": -1, "error_code": _GROUP_DENIED}
            coordinators.append({"key": key, **denied, "error_message": None})
        else:
            coordinators.append({"key": key, **_coordinator(deps, ctx, key)})
    if ctx.version >= 4:
        return {"throttle_time": 0, "coordinators": coordinators}
    first = coordinators[0]
    return {
        "throttle_time": 0,
        "error_code": first["error_code"],
        "error_message": first["error_message"],
        "node_id": first["node_id"],
        "host": first["host"],
        "port": first["port"],
    }


async def handle_join_group(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    session_ms = int(req.session_timeout.total_seconds() * 1000)
    rebalance = getattr(req, "rebalance_timeout", None)
    rebalance_ms = int(rebalance.total_seconds() * 1000) if rebalance is not None else session_ms
    try:
        if code := _no_read(ctx, req.group_id) or not_coordinator(deps, req.group_id):
            raise JoinError(code, req.member_id)
        if _is_share_group(deps, req.group_id):  # KIP-932: not a classic group
            raise JoinError(ErrorCode.inconsistent_group_protocol, req.member_id)
        result = await deps.groups.join(
            req.group_id,
            req.member_id,
            getattr(req, "group_instance_id", None),
            ctx.client_id or "",
            ctx.client_host,
            session_ms,
            rebalance_ms,
            req.protocol_type,
            [(p.name, p.metadata) for p in req.protocols],
            require_known_member_id=ctx.version >= 4,
            supports_skip_assignment=ctx.version >= 9,
            topics=_ImageTopics(deps.metadata.image),
        )
    except JoinError as e:
        return {
            "throttle_time": 0,
            "error_code": e.code,
            "generation_id": -1,
            "protocol_type": None,
            "protocol_name": "" if ctx.version < 7 else None,
            "leader": "",
            "member_id": e.member_id,
            "members": [],
        }
    if ctx.version < 7 and result["protocol_name"] is None:
        result["protocol_name"] = ""
    return {"throttle_time": 0, **result}


async def handle_sync_group(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    try:
        if code := _no_read(ctx, req.group_id) or not_coordinator(deps, req.group_id):
            raise JoinError(code)
        result = await deps.groups.sync(
            req.group_id,
            req.member_id,
            getattr(req, "group_instance_id", None),
            req.generation_id,
            {a.member_id: a.assignment for a in req.assignments},
            # v5+ says which protocol it synced for; a mismatch is refused.
            protocol_type=getattr(req, "protocol_type", None),
            protocol_name=getattr(req, "protocol_name", None),
        )
    except JoinError as e:
        return {
            "throttle_time": 0,
            "error_code": e.code,
            "protocol_type": None,
            "protocol_name": None,
            "assignment": b"",
        }
    return {"throttle_time": 0, "error_code": 0, **result}


async def handle_heartbeat(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    if code := _no_read(ctx, req.group_id) or not_coordinator(deps, req.group_id):
        return {"throttle_time": 0, "error_code": code}
    code = deps.groups.heartbeat(
        req.group_id, req.member_id, getattr(req, "group_instance_id", None), req.generation_id
    )
    return {"throttle_time": 0, "error_code": code}


async def handle_leave_group(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    if ctx.version >= 3:
        members = [(m.member_id, m.group_instance_id) for m in req.members]
    else:
        members = [(req.member_id, None)]
    if code := _no_read(ctx, req.group_id) or not_coordinator(deps, req.group_id):
        top, results = code, [(m, i, code) for m, i in members]
    else:
        top, results = deps.groups.leave(req.group_id, members)
    return {
        "throttle_time": 0,
        "error_code": top if ctx.version < 3 else 0,
        "members": [
            {"member_id": mid, "group_instance_id": iid, "error_code": code}
            for mid, iid, code in results
        ],
    }


async def handle_offset_commit(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    generation: int | None = getattr(req, "generation_id_or_member_epoch", None)
    if generation is None:
        generation = int(getattr(req, "generation_id", -1))
    code = deps.groups.commit_check(
        req.group_id,
        req.member_id,
        getattr(req, "group_instance_id", None),
        generation,
        ctx.version,  # v9+: a member epoch for a KIP-848 member
    )
    if not req.group_id:
        code = ErrorCode.invalid_group_id
    code = code or _no_read(ctx, req.group_id) or not_coordinator(deps, req.group_id)
    topics = []
    entries = []
    image_topics = deps.metadata.image.topics
    for t in req.topics:
        parts = []
        known = image_topics.get(t.name)
        # The partition must exist, not be held here: the coordinator commits offsets of
        # partitions on any broker (Kafka checks its metadata cache the same way).
        count = len(known.partitions) if known is not None else 0
        topic_ok = code != 0 or ctx.allowed(READ, TOPIC, t.name)
        for p in t.partitions:
            pcode = code if topic_ok else ErrorCode.topic_authorization_failed
            if pcode == 0:
                if not 0 <= p.partition_index < count:
                    pcode = ErrorCode.unknown_topic_or_partition
                elif p.committed_metadata and len(p.committed_metadata) > MAX_METADATA:
                    pcode = ErrorCode.offset_metadata_too_large
                else:
                    entries.append(
                        (
                            t.name,
                            p.partition_index,
                            p.committed_offset,
                            getattr(p, "committed_leader_epoch", -1),
                            p.committed_metadata,
                        )
                    )
            parts.append({"partition_index": p.partition_index, "error_code": pcode})
        topics.append({"name": t.name, "partitions": parts})
    if entries:
        # Like Kafka (offsets.commit.required.acks=-1): answer once the ISR has it.
        try:
            end = deps.offsets.commit(req.group_id, entries)
        except KafkaError as e:  # not written (not the leader, a full disk)
            end, failed = -1, e.code
        else:
            failed = ErrorCode.none
        part = deps.partitions.leader_of(OFFSETS_TOPIC, deps.offsets.partition_for(req.group_id))
        if failed:
            for t in topics:
                for p in t["partitions"]:
                    if p["error_code"] == 0:
                        p["error_code"] = failed
        elif part is None or not await part.wait_for_hw(end, 5.0):
            for t in topics:
                for p in t["partitions"]:
                    if p["error_code"] == 0:
                        p["error_code"] = (
                            ErrorCode.request_timed_out if part else ErrorCode.not_coordinator
                        )
    return {"throttle_time": 0, "topics": topics}


async def handle_offset_fetch(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    stable = bool(getattr(req, "require_stable", False))  # v7+
    if ctx.version < 8:
        answer = _offset_fetch_group(deps, ctx, req.group_id, req.topics, require_stable=stable)
        return {"throttle_time": 0, **answer}
    # v8+: several groups in one request; v9+ with the member's id and epoch (KIP-848).
    groups = []
    for g in req.groups:
        answer = _offset_fetch_group(
            deps,
            ctx,
            g.group_id,
            g.topics,
            getattr(g, "member_id", None),
            getattr(g, "member_epoch", -1),
            stable,
        )
        groups.append({"group_id": g.group_id, **answer})
    return {"throttle_time": 0, "groups": groups}


def _offset_fetch_group(
    deps: GroupDeps,
    ctx: RequestContext,
    group_id: str,
    wanted_topics: Any,
    member_id: str | None = None,
    member_epoch: int = -1,
    require_stable: bool = False,
) -> dict:
    code = _no_read(ctx, group_id) or not_coordinator(deps, group_id)
    code = code or deps.groups.fetch_check(group_id, member_id, member_epoch)
    if code:
        return {"topics": [], "error_code": code}
    committed = deps.offsets.fetch(group_id)
    req = wanted_topics
    if req is None:
        wanted: dict[str, list[int]] = {}
        for t, p in sorted(committed):
            wanted.setdefault(t, []).append(p)
    else:
        wanted = {t.name: list(t.partition_indexes) for t in req}
    topics = []
    for name, parts in wanted.items():
        # Kafka: topics the principal may not DESCRIBE are left out of an all-topics
        # fetch and answered TOPIC_AUTHORIZATION_FAILED when named.
        if not ctx.allowed(DESCRIBE, TOPIC, name):
            if req is not None:
                topics.append(
                    {
                        "name": name,
                        "partitions": [
                            {
                                "partition_index": p,
                                "committed_offset": -1,
                                "committed_leader_epoch": -1,
                                "metadata": "",
                                "error_code": ErrorCode.topic_authorization_failed,
                            }
                            for p in parts
                        ],
                    }
                )
            continue
        out = []
        for p in parts:
            c = committed.get((name, p))
            # KIP-447: an offset an open transaction will change is not stable yet; the
            # client (Streams' exactly-once) retries until the transaction is decided.
            unstable = require_stable and deps.offsets.has_pending(group_id, name, p)
            out.append(
                {
                    "partition_index": p,
                    "committed_offset": -1 if unstable or not c else c.offset,
                    "committed_leader_epoch": -1 if unstable or not c else c.leader_epoch,
                    "metadata": c.metadata if c and not unstable else "",
                    "error_code": ErrorCode.unstable_offset_commit if unstable else 0,
                }
            )
        topics.append({"name": name, "partitions": out})
    return {"topics": topics, "error_code": 0}


async def handle_describe_groups(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    groups = []
    for gid in req.groups:
        desc = deps.groups.describe(gid)
        if desc.get("protocol_type") == "consumer" and deps.groups.group_type(gid) == "consumer":
            # Kafka 4.1 (DescribeGroups v0-5): a KIP-848 group is not a classic group, so it
            # is answered as Dead; clients describe it with ConsumerGroupDescribe.
            desc = {
                **desc,
                "group_state": "Dead",
                "protocol_type": "",
                "protocol_data": "",
                "members": [],
            }
        code = not_coordinator(deps, gid) if gid else ErrorCode.invalid_group_id
        if gid and not ctx.allowed(DESCRIBE, GROUP, gid):
            code = _GROUP_DENIED
            desc = {
                **desc,
                "group_state": "",
                "protocol_type": "",
                "protocol_data": "",
                "members": [],
            }
        if not code and getattr(req, "include_authorized_operations", False):  # v3+
            desc = {**desc, "authorized_operations": ctx.authorized_operations(GROUP, gid)}
        groups.append({"error_code": code, **desc})
    return {"throttle_time": 0, "groups": groups}


async def handle_list_groups(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    # Kafka compares both filters case-insensitively ("stable", "Consumer").
    states = {s.lower() for s in getattr(req, "states_filter", ()) or ()}
    types = {t.lower() for t in getattr(req, "types_filter", ()) or ()}
    # Kafka: DESCRIBE on the cluster lists every group, else those the principal may
    # DESCRIBE.
    everything = ctx.cluster_allowed(DESCRIBE)
    coordinator = deps.groups
    groups = []
    # Share groups (KIP-932), but not the internal groups holding their saved SPSOs.
    rows = deps.share.group_rows()
    for gid, pt, st in [*coordinator.list_groups(), *rows]:
        if is_state_group(gid):
            continue
        kind = "share" if pt == "share" else coordinator.group_type(gid) or "classic"
        if (states and st.lower() not in states) or (types and kind not in types):
            continue
        if everything or ctx.allowed(DESCRIBE, GROUP, gid):
            groups.append(
                {"group_id": gid, "protocol_type": pt, "group_state": st, "group_type": kind}
            )
    return {"throttle_time": 0, "error_code": 0, "groups": groups}


async def handle_delete_groups(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    results = [
        {
            "group_id": gid,
            "error_code": (
                _GROUP_DENIED
                if not ctx.allowed(DELETE, GROUP, gid)
                else not_coordinator(deps, gid) or _delete_group(deps, gid)
            ),
        }
        for gid in req.groups_names
    ]
    return {"throttle_time": 0, "results": results}


def _is_share_group(deps: GroupDeps, group_id: str) -> bool:
    return deps.share.is_share_group(group_id)


def _delete_group(deps: GroupDeps, group_id: str) -> int:
    """DeleteGroups of one group: a share group (NON_EMPTY_GROUP while it has members)
    or a classic / KIP-848 one."""
    share = deps.share
    if share.is_share_group(group_id):
        return share.delete_group(group_id)
    return deps.groups.delete(group_id)


class _ImageTopics:
    """The metadata image as the consumer group assignors read it."""

    # The topic names at the last metadata offset asked: regular expressions are matched
    # against them at every heartbeat of a member that has one (the image is updated in
    # place, so its offset tells whether they may have changed).
    _names: tuple[Any, int, frozenset[str]] | None = None

    def __init__(self, image: Any) -> None:
        self._image = image
        self._topics = image.topics

    def topic(self, name: str) -> tuple[Any, int] | None:
        t = self._topics.get(name)
        return (t.topic_id, len(t.partitions)) if t is not None else None

    def names(self) -> frozenset[str]:
        cached = _ImageTopics._names
        offset = getattr(self._image, "offset", None)
        if cached is None or cached[0] is not self._image or offset is None or cached[1] != offset:
            cached = _ImageTopics._names = (self._image, offset or 0, frozenset(self._topics))
        return cached[2]


async def handle_consumer_group_describe(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    """ConsumerGroupDescribe v0-1 (KIP-848): the group's epochs, each member's
    subscription, current and target assignment (topic ids with their names)."""
    image = deps.metadata.image

    def assignment(by_topic: dict) -> dict:
        return {
            "topic_partitions": [
                {"topic_id": tid, "topic_name": image.topic_name(tid) or "", "partitions": parts}
                for tid, parts in by_topic.items()
            ]
        }

    groups = []
    code: int
    for gid in req.group_ids:
        if not ctx.allowed(DESCRIBE, GROUP, gid):
            code, message, group = _GROUP_DENIED, None, None
        elif code := not_coordinator(deps, gid):
            message, group = None, None
        else:
            code, message, group = deps.groups.consumer_describe(gid)
        if group is None:
            group = {
                "group_id": gid,
                "group_state": "",
                "group_epoch": -1,
                "assignment_epoch": -1,
                "assignor_name": "",
                "members": [],
            }
        else:
            group["members"] = [
                {
                    **m,
                    "assignment": assignment(m["assignment"]),
                    "target_assignment": assignment(m["target_assignment"]),
                }
                for m in group["members"]
            ]
        if code == 0 and req.include_authorized_operations:
            group["authorized_operations"] = ctx.authorized_operations(GROUP, gid)
        groups.append({"error_code": code, "error_message": message, **group})
    return {"throttle_time": 0, "groups": groups}


async def handle_consumer_group_heartbeat(deps: GroupDeps, ctx: RequestContext, req: Any) -> dict:
    """ConsumerGroupHeartbeat v0-1 (KIP-848), with OffsetCommit/OffsetFetch v9 for the
    member epochs and ConsumerGroupDescribe."""
    answer: dict[str, Any] = {
        "throttle_time": 0,
        "error_message": None,
        "member_id": None,
        "member_epoch": -1,
        "heartbeat_interval": 0,
        "assignment": None,
    }
    if code := _no_read(ctx, req.group_id) or not_coordinator(deps, req.group_id):
        return {**answer, "error_code": code}
    if _is_share_group(deps, req.group_id):
        return {
            **answer,
            "error_code": ErrorCode.group_id_not_found,
            "error_message": f"Group {req.group_id} is not a consumer group.",
        }
    names = req.subscribed_topic_names
    owned = req.topic_partitions
    r = await deps.groups.consumer_heartbeat(
        ConsumerHeartbeatRequest(
            req.group_id,
            req.member_id,
            req.member_epoch,
            req.instance_id,
            req.rack_id,
            int(req.rebalance_timeout.total_seconds() * 1000),
            tuple(names) if names is not None else None,
            req.server_assignor,
            tuple((tp.topic_id, tuple(tp.partitions)) for tp in owned)
            if owned is not None
            else None,
            ctx.client_id or "",
            ctx.client_host,
            getattr(req, "subscribed_topic_regex", None),  # v1+
        ),
        _ImageTopics(deps.metadata.image),
    )
    assignment = None
    if r.assignment is not None:
        assignment = {
            "topic_partitions": [
                {"topic_id": t, "partitions": ps} for t, ps in r.assignment.items()
            ]
        }
    return {
        **answer,
        "error_code": r.error,
        "error_message": r.message,
        "member_id": r.member_id,
        "member_epoch": r.member_epoch,
        "heartbeat_interval": r.heartbeat_interval_ms,
        "assignment": assignment,
    }
