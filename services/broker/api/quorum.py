"""DescribeQuorum (`kafka-metadata-quorum describe`): the metadata quorum as its leader
sees it. Any broker answers it, as in KRaft, by asking the active controller (the Raft
leader of the metadata log)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kio.schema.errors import ErrorCode
from straitmq.controller.errors import ControllerError

from straitmq.security.acls import DESCRIBE

from .context import RequestContext

if TYPE_CHECKING:
    from ..views import ControllerCall

METADATA_TOPIC = "__cluster_metadata"


def _replica(r: dict) -> dict:
    return {
        "replica_id": r["node_id"],
        "replica_directory_id": None,
        "log_end_offset": r["log_end_offset"],
        "last_fetch_timestamp": r["last_fetch_ms"],
        "last_caught_up_timestamp": r["last_caught_up_ms"],
    }


def _nodes(voter_urls: dict[str, str]) -> list[dict]:
    nodes = []
    for node, url in sorted(voter_urls.items(), key=lambda kv: int(kv[0])):
        u = urlsplit(url)
        listener = {"name": "CONTROLLER", "host": u.hostname or "", "port": u.port or 0}
        nodes.append({"node_id": int(node), "listeners": [listener]})
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
    except ControllerError as e:
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
        "nodes": _nodes(st["voter_urls"]),
    }
