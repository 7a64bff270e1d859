"""DescribeQuorum (`kafka-metadata-quorum describe`): the metadata quorum as its leader
sees it, voters and observers with their directory ids. AddRaftVoter, RemoveRaftVoter and
UpdateRaftVoter (KIP-853: `kafka-metadata-quorum add-controller / remove-controller`)
change the voter set, one change at a time, answered once it is committed. Any broker
answers them, as in KRaft, by asking the active controller (the Raft leader of the
metadata log)."""

from __future__ import annotations

import base64
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kio.schema.errors import ErrorCode

from straitmq.errors import KafkaError
from straitmq.security.acls import ALTER, DESCRIBE

from .context import RequestContext

if TYPE_CHECKING:
    from ..views import ControllerCall

METADATA_TOPIC = "__cluster_metadata"


def _uuid(directory_id: str | None) -> uuid.UUID | None:
    """A Kafka directory id (URL-safe base64 of 16 bytes) as a UUID; None if it is not one."""
    if not directory_id:
        return None
    try:
        raw = base64.urlsafe_b64decode(directory_id + "=" * (-len(directory_id) % 4))
        return uuid.UUID(bytes=raw) if len(raw) == 16 else None
    except ValueError:
        return None


def _directory(u: uuid.UUID | None) -> str | None:
    if u is None or u.int == 0:  # Kafka's ZERO_UUID: no directory id
        return None
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


def _replica(r: dict) -> dict:
    return {
        "replica_id": r["node_id"],
        "replica_directory_id": _uuid(r.get("directory_id")),
        "log_end_offset": r["log_end_offset"],
        "last_fetch_timestamp": r["last_fetch_ms"],
        "last_caught_up_timestamp": r["last_caught_up_ms"],
    }


def _nodes(voter_urls: dict[str, str], voter_set: list[dict]) -> list[dict]:
    """The voters' endpoints: as the voter set has them, else the --voters flags'."""
    nodes = []
    for v in voter_set:
        node = v["id"]
        endpoint = (v.get("endpoints") or {}).get("CONTROLLER")
        if endpoint:
            host, _, port = endpoint.rpartition(":")
            listener = {"name": "CONTROLLER", "host": host, "port": int(port)}
        else:
            u = urlsplit(voter_urls.get(str(node), ""))
            listener = {"name": "CONTROLLER", "host": u.hostname or "", "port": u.port or 0}
        nodes.append({"node_id": node, "listeners": [listener]})
    return nodes


async def handle_describe_quorum(controller: ControllerCall, ctx: RequestContext, req: Any) -> dict:
    if not ctx.cluster_allowed(DESCRIBE):
        why = "DESCRIBE on the cluster is needed"
        return {
            "error_code": ErrorCode.cluster_authorization_failed,
            "error_message": why,
            "topics": [],
            "nodes": [],
        }
    try:
        st = await controller("describe_quorum", {}, within_s=10.0)
    except KafkaError as e:
        return {"error_code": e.code, "error_message": e.message, "topics": [], "nodes": []}
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            if t.topic_name == METADATA_TOPIC and p.partition_index == 0:
                parts.append(
                    {
                        "partition_index": 0,
                        "error_code": 0,
                        "error_message": None,
                        "leader_id": st["leader_id"],
                        "leader_epoch": st["epoch"],
                        "high_watermark": st["high_watermark"],
                        "current_voters": [_replica(r) for r in st["voters"]],
                        "observers": [_replica(r) for r in st["observers"]],
                    }
                )
            else:
                parts.append(
                    {
                        "partition_index": p.partition_index,
                        "error_code": ErrorCode.unknown_topic_or_partition,
                        "error_message": f"the metadata quorum is {METADATA_TOPIC}-0",
                        "leader_id": -1,
                        "leader_epoch": -1,
                        "high_watermark": -1,
                        "current_voters": [],
                        "observers": [],
                    }
                )
        topics.append({"topic_name": t.topic_name, "partitions": parts})
    return {
        "error_code": 0,
        "error_message": None,
        "topics": topics,
        "nodes": _nodes(st["voter_urls"], st.get("voter_set", [])),
    }


def _endpoint(listeners: Any) -> str | None:
    """The voter's endpoint for the controllers: the CONTROLLER listener, else the first."""
    chosen = None
    for listener in listeners or ():
        if chosen is None or listener.name == "CONTROLLER":
            chosen = listener
    return f"{chosen.host}:{chosen.port}" if chosen is not None else None


async def _change(controller: ControllerCall, ctx: RequestContext, op: str, body: dict) -> dict:
    if not ctx.cluster_allowed(ALTER):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "error_message": "ALTER on the cluster is needed to change the controller quorum",
        }
    try:
        await controller(op, body, within_s=float(body.get("timeout_s", 30.0)) + 5.0)
    except KafkaError as e:
        return {"throttle_time": 0, "error_code": e.code, "error_message": e.message}
    return {"throttle_time": 0, "error_code": 0, "error_message": None}


def _timeout_s(req: Any) -> float:
    t = getattr(req, "timeout", None)
    seconds = t.total_seconds() if t is not None else 30.0
    return min(max(seconds, 1.0), 120.0)


async def handle_add_raft_voter(controller: ControllerCall, ctx: RequestContext, req: Any) -> dict:
    body = {
        "node_id": int(req.voter_id),
        "directory_id": _directory(req.voter_directory_id),
        "endpoint": _endpoint(req.listeners),
        "timeout_s": _timeout_s(req),
    }
    return await _change(controller, ctx, "add_voter", body)


async def handle_remove_raft_voter(
    controller: ControllerCall, ctx: RequestContext, req: Any
) -> dict:
    body = {"node_id": int(req.voter_id), "directory_id": _directory(req.voter_directory_id)}
    return await _change(controller, ctx, "remove_voter", body)


async def handle_update_raft_voter(
    controller: ControllerCall, ctx: RequestContext, req: Any
) -> dict:
    body = {
        "node_id": int(req.voter_id),
        "directory_id": _directory(req.voter_directory_id),
        "endpoint": _endpoint(req.listeners),
    }
    out = await _change(controller, ctx, "update_voter", body)
    out.pop("error_message")  # UpdateRaftVoter's response has none...
    # ...but a current leader (a tagged field its schema requires): unknown here, the
    # broker forwarded the change to whichever controller leads.
    out["current_leader"] = {"leader_id": -1, "leader_epoch": -1, "host": "", "port": 0}
    return out
