"""Groups of the three kinds (classic, KIP-848 consumer, KIP-932 share): list, describe
(epochs, members and their assignments, committed offsets and lag, or a share group's
start offsets) and delete."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from kio.schema.errors import ErrorCode

from straitmq.admin_client import AdminClient, AdminError
from straitmq.security.acls import DESCRIBE, GROUP, TOPIC

from ..groups.consumer_protocol import (
    MalformedProtocol,
    decode_assignment,
    decode_subscription,
)
from ..groups.coordinator import GroupCoordinator
from ..groups.offsets import OFFSETS_TOPIC, OffsetStore
from ..metadata_view import MetadataView
from ..partitions import PartitionManager
from ..share.coordinator import ShareCoordinator, is_state_group
from .common import PEERS, Peers, Permitted, _error, _json


@dataclass(frozen=True, slots=True)
class GroupsDeps:
    metadata: MetadataView
    partitions: PartitionManager
    groups: GroupCoordinator
    share: ShareCoordinator
    offsets: OffsetStore
    peers: Peers
    permitted: Permitted


async def _end_offsets(
    deps: GroupsDeps, peers: AdminClient, wanted: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """The high watermark of each partition: ours where we lead it, else asked of its
    leader, one request per (leader, topic) however many partitions; -1 if unknown."""
    out: dict[tuple[str, int], int] = {}
    remote: dict[tuple[int, str], list[int]] = {}
    for topic, index in wanted:
        p = deps.partitions.leader_of(topic, index)
        meta = deps.metadata.image.partition(topic, index)
        out[(topic, index)] = p.high_watermark if p is not None else -1
        if p is None and meta is not None:
            remote.setdefault((meta.leader, topic), []).append(index)

    async def ask(leader: int, topic: str, indexes: list[int]) -> None:
        b = deps.metadata.image.brokers.get(leader)
        if b is None:
            return
        try:
            body = await peers.get(deps.peers.url(leader, f"/api/v1/topics/{topic}"))
            parts = body["partitions"]
            for i in indexes:
                out[(topic, i)] = int(parts[i]["high_watermark"])
        except (AdminError, KeyError, IndexError, TypeError, ValueError):
            pass

    await asyncio.gather(*(ask(leader, t, ix) for (leader, t), ix in remote.items()))
    return out


def _decode_consumer_assignment(data: bytes) -> dict[str, list[int]] | None:
    """A classic "consumer" member's assignment as {topic: partitions}; None if it does
    not parse (or is empty: not settled yet)."""
    try:
        decoded = decode_assignment(data) if data else None
    except MalformedProtocol:
        return None
    return {t: sorted(ps) for t, ps in decoded.items()} if decoded is not None else None


def _decode_consumer_subscription(data: bytes) -> list[str] | None:
    """A classic "consumer" member's subscribed topics; None if it does not parse."""
    try:
        return sorted(decode_subscription(data).topics)
    except MalformedProtocol:
        return None


def _by_name(deps: GroupsDeps, by_topic: dict) -> dict[str, list[int]]:
    """{topic id: partitions} as {topic name: sorted partitions}."""
    out: dict[str, list[int]] = {}
    for tid, parts in by_topic.items():
        name = deps.metadata.image.topic_name(tid) or str(tid)
        out[name] = sorted(parts)
    return dict(sorted(out.items()))


def _pending(assigned: dict[str, list[int]], target: dict[str, list[int]]) -> dict:
    """What the target gives a member that it does not own yet, by topic."""
    out = {}
    for t, parts in target.items():
        if missing := sorted(set(parts) - set(assigned.get(t, ()))):
            out[t] = missing
    return out


def _group_kind(deps: GroupsDeps, gid: str) -> str | None:
    if deps.share.is_share_group(gid):
        return "share"
    return deps.groups.group_type(gid)


def _classic(deps: GroupsDeps, gid: str) -> dict[str, Any] | None:
    d = deps.groups.describe(gid)
    if d["group_state"] == "Dead":
        return None
    g = deps.groups.groups.get(gid)
    generation = g.generation if g is not None else None  # None: only commits are left
    consumer = d["protocol_type"] == "consumer"
    members = []
    for m in d["members"]:
        assigned = _decode_consumer_assignment(m["member_assignment"]) if consumer else None
        subscribed = _decode_consumer_subscription(m["member_metadata"]) if consumer else None
        members.append(
            {
                "member_id": m["member_id"],
                "instance_id": m["group_instance_id"],
                "client_id": m["client_id"],
                "host": m["client_host"],
                # A classic group's members all share its generation once it is Stable.
                "member_epoch": generation if d["group_state"] == "Stable" else None,
                "subscribed_topics": subscribed or [],
                "subscribed_topic_regex": None,
                "assignment": assigned or {},
            }
        )
    return {
        "type": "classic",
        "state": d["group_state"],
        "protocol_type": d["protocol_type"],
        "protocol": d["protocol_data"],
        "assignor": d["protocol_data"] or None,
        "group_epoch": generation,
        "assignment_epoch": None,
        "members": members,
    }


def _consumer(deps: GroupsDeps, gid: str) -> dict[str, Any] | None:
    code, _, g = deps.groups.consumer_describe(gid)
    if code or g is None:
        return None
    members = []
    for m in g["members"]:
        assigned = _by_name(deps, m["assignment"])
        target = _by_name(deps, m["target_assignment"])
        members.append(
            {
                "member_id": m["member_id"],
                "instance_id": m["instance_id"],
                "client_id": m["client_id"],
                "host": m["client_host"],
                "member_epoch": m["member_epoch"],
                "subscribed_topics": list(m["subscribed_topic_names"]),
                "subscribed_topic_regex": m["subscribed_topic_regex"],
                "assignment": assigned,
                "target_assignment": target,
                "pending": _pending(assigned, target),
            }
        )
    return {
        "type": "consumer",
        "state": g["group_state"],
        "protocol_type": "consumer",
        "protocol": g["assignor_name"],
        "assignor": g["assignor_name"],
        "group_epoch": g["group_epoch"],
        "assignment_epoch": g["assignment_epoch"],
        "members": members,
    }


def _share(deps: GroupsDeps, gid: str) -> dict[str, Any] | None:
    share = deps.share
    share.groups.expire(int(asyncio.get_running_loop().time() * 1000))
    share.members_gone()
    g = share.groups.describe(gid)
    if g is None:
        return None
    members = [
        {
            "member_id": m.member_id,
            "instance_id": None,  # share groups have no static members
            "client_id": m.client_id,
            "host": m.client_host,
            "member_epoch": m.epoch,
            "subscribed_topics": sorted(m.subscribed),
            "subscribed_topic_regex": None,
            "assignment": _by_name(deps, m.assignment),
        }
        for m in g.members.values()
    ]
    return {
        "type": "share",
        "state": g.state,
        "protocol_type": "share",
        "protocol": "simple",
        "assignor": "simple",  # as ShareGroupDescribe names it
        "group_epoch": g.epoch,
        "assignment_epoch": g.assignment_epoch,
        "members": members,
    }


def _not_coordinator(deps: GroupsDeps, request: web.Request, gid: str) -> web.Response | None:
    """None if this broker coordinates the group; else a 404 or a redirect to the one
    that does."""
    if deps.offsets.owns(gid):
        return None
    meta = deps.metadata.image.partition(OFFSETS_TOPIC, deps.offsets.partition_for(gid))
    if meta is None:
        return _error(404, f"group '{gid}' does not exist")
    return deps.peers.elsewhere(request, meta.leader)


def _local_groups(deps: GroupsDeps) -> list[dict]:
    """The groups this broker coordinates, all three kinds (as its ListGroups)."""
    out = []
    for g, pt, st in [*deps.groups.list_groups(), *deps.share.group_rows()]:
        if is_state_group(g):
            continue
        kind = "share" if pt == "share" else deps.groups.group_type(g) or "classic"
        out.append({"group_id": g, "type": kind, "protocol_type": pt, "state": st})
    return out


def add_routes(app: web.Application, deps: GroupsDeps) -> None:
    """/api/v1/groups[/{group}]"""
    routes = web.RouteTableDef()

    @routes.get("/api/v1/groups")
    async def list_groups(request: web.Request) -> web.Response:
        """Every group of the cluster, as `kafka-consumer-groups --list` (whose admin
        client asks each broker for the groups it coordinates): this broker's, and each
        other live broker's (`?scope=local`: only this one's). Those one may DESCRIBE."""
        may = deps.permitted
        groups = _local_groups(deps)
        out: dict = {}
        if request.query.get("scope") != "local":
            peers = request.app[PEERS]
            others = [
                b.id for b in deps.metadata.image.live_brokers() if b.id != deps.peers.node_id
            ]

            async def ask(node: int) -> list[dict] | None:
                try:
                    body = await peers.get(deps.peers.url(node, "/api/v1/groups?scope=local"))
                    return list(body["groups"])
                except (AdminError, KeyError, TypeError):
                    return None

            answers = await asyncio.gather(*(ask(b) for b in others))
            for rows in answers:
                groups.extend(rows or [])
            missing = [b for b, rows in zip(others, answers, strict=True) if rows is None]
            if missing:
                out["unreachable_brokers"] = sorted(missing)
        seen = {g["group_id"]: g for g in groups if may(request, DESCRIBE, GROUP, g["group_id"])}
        return _json({"groups": [seen[g] for g in sorted(seen)], **out})

    @routes.get("/api/v1/groups/{group}")
    async def describe_group(request: web.Request) -> web.Response:
        gid = request.match_info["group"]
        if (elsewhere := _not_coordinator(deps, request, gid)) is not None:
            return elsewhere
        kind = _group_kind(deps, gid)
        d = (
            _share(deps, gid)
            if kind == "share"
            else _consumer(deps, gid)
            if kind == "consumer"
            else _classic(deps, gid)
        )
        if d is None:
            return _error(404, f"group '{gid}' does not exist")
        may = deps.permitted
        offsets = []
        if kind == "share":
            # The share-partitions' start offsets as last saved (DescribeShareGroupOffsets).
            saved = await deps.share.checkpoints.saved(gid, None)
            if saved is None:
                d["offsets_note"] = "the share-partition start offsets could not be read"
            start = sorted((saved or {}).items())
        else:
            start = [(tp, c.offset) for tp, c in sorted(deps.offsets.fetch(gid).items())]
        ends = await _end_offsets(deps, request.app[PEERS], [tp for tp, _ in start])
        for (t, part), c in start:
            if not may(request, DESCRIBE, TOPIC, t):
                continue  # as OffsetFetch: topics one may not DESCRIBE are left out
            end = ends[(t, part)]
            row = {"topic": t, "partition": part}
            if kind == "share":
                row["start_offset"] = c
            else:
                row["committed"] = c
            lag = max(0, end - c) if end >= 0 and c >= 0 else None
            offsets.append({**row, "end": end, "lag": lag})
        return _json({"group_id": gid, **d, "offsets": offsets})

    @routes.delete("/api/v1/groups/{group}")
    async def delete_group(request: web.Request) -> web.Response:
        gid = request.match_info["group"]
        if (elsewhere := _not_coordinator(deps, request, gid)) is not None:
            return elsewhere
        code = deps.groups.delete(gid)
        if code == ErrorCode.group_id_not_found:
            return _error(404, f"group '{gid}' does not exist")
        if code == ErrorCode.non_empty_group:
            return _error(409, f"group '{gid}' still has members")
        return _json({"deleted": gid})

    app.add_routes(routes)
