"""Consumer groups: list, describe (members, committed offsets and lag) and delete."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web
from kio.schema.errors import ErrorCode

from straitmq.admin_client import AdminClient, AdminError

from ..groups.offsets import OFFSETS_TOPIC
from ..security.acls import DESCRIBE, GROUP, TOPIC
from .common import PEERS, _elsewhere, _error, _json, peer_url

if TYPE_CHECKING:
    from ..broker import Broker


async def _end_offsets(
    broker: Broker, peers: AdminClient, wanted: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """The high watermark of each partition: ours where we lead it, else asked of its
    leader, one request per (leader, topic) however many partitions; -1 if unknown."""
    out: dict[tuple[str, int], int] = {}
    remote: dict[tuple[int, str], list[int]] = {}
    for topic, index in wanted:
        p = broker.partitions.leader_of(topic, index)
        meta = broker.image.partition(topic, index)
        out[(topic, index)] = p.high_watermark if p is not None else -1
        if p is None and meta is not None:
            remote.setdefault((meta.leader, topic), []).append(index)

    async def ask(leader: int, topic: str, indexes: list[int]) -> None:
        b = broker.image.brokers.get(leader)
        if b is None:
            return
        try:
            body = await peers.get(peer_url(broker, leader, f"/api/v1/topics/{topic}"))
            parts = body["partitions"]
            for i in indexes:
                out[(topic, i)] = int(parts[i]["high_watermark"])
        except (AdminError, KeyError, IndexError, TypeError, ValueError):
            pass

    await asyncio.gather(*(ask(leader, t, ix) for (leader, t), ix in remote.items()))
    return out


def _not_coordinator(broker: Broker, request: web.Request, gid: str) -> web.Response | None:
    """None if this broker coordinates the group; else a 404 or a redirect to the one
    that does."""
    if broker.offsets.owns(gid):
        return None
    meta = broker.image.partition(OFFSETS_TOPIC, broker.offsets.partition_for(gid))
    if meta is None:
        return _error(404, f"group '{gid}' does not exist")
    return _elsewhere(broker, request, meta.leader)


def add_routes(app: web.Application, broker: Broker) -> None:
    """/api/v1/groups[/{group}]"""
    routes = web.RouteTableDef()

    @routes.get("/api/v1/groups")
    async def list_groups(request: web.Request) -> web.Response:
        may = broker.http_security.permitted  # as ListGroups: those one may DESCRIBE
        return _json(
            {
                "groups": [
                    {"group_id": g, "protocol_type": pt, "state": st}
                    for g, pt, st in broker.groups.list_groups()
                    if may(request, DESCRIBE, GROUP, g)
                ]
            }
        )

    @routes.get("/api/v1/groups/{group}")
    async def describe_group(request: web.Request) -> web.Response:
        gid = request.match_info["group"]
        if (elsewhere := _not_coordinator(broker, request, gid)) is not None:
            return elsewhere
        d = broker.groups.describe(gid)
        if d["group_state"] == "Dead":
            return _error(404, f"group '{gid}' does not exist")
        offsets = []
        committed = sorted(broker.offsets.fetch(gid).items())
        ends = await _end_offsets(broker, request.app[PEERS], [tp for tp, _ in committed])
        for (t, part), c in committed:
            if not broker.http_security.permitted(request, DESCRIBE, TOPIC, t):
                continue  # as OffsetFetch: topics one may not DESCRIBE are left out
            end = ends[(t, part)]
            offsets.append(
                {
                    "topic": t,
                    "partition": part,
                    "committed": c.offset,
                    "end": end,
                    "lag": max(0, end - c.offset) if end >= 0 else None,
                }
            )
        return _json(
            {
                "group_id": gid,
                "state": d["group_state"],
                "protocol": d["protocol_data"],
                "members": [
                    {
                        "member_id": m["member_id"],
                        "client_id": m["client_id"],
                        "host": m["client_host"],
                        "instance_id": m["group_instance_id"],
                    }
                    for m in d["members"]
                ],
                "offsets": offsets,
            }
        )

    @routes.delete("/api/v1/groups/{group}")
    async def delete_group(request: web.Request) -> web.Response:
        gid = request.match_info["group"]
        if (elsewhere := _not_coordinator(broker, request, gid)) is not None:
            return elsewhere
        code = broker.groups.delete(gid)
        if code == ErrorCode.group_id_not_found:
            return _error(404, f"group '{gid}' does not exist")
        if code == ErrorCode.non_empty_group:
            return _error(409, f"group '{gid}' still has members")
        return _json({"deleted": gid})

    app.add_routes(routes)
