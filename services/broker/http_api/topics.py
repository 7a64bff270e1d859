"""Topic admin: list, create, describe, alter (partitions, configs) and delete."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from straitmq.metadata.topic_config import effective

from straitmq.errors import KafkaError
from straitmq.security.acls import DESCRIBE, TOPIC

from ..groups.offsets import OFFSETS_TOPIC
from ..log_cleaner import CleanerStats
from ..metadata_view import MetadataView
from ..partitions import PartitionManager
from .common import Permitted, _body, _controller_error, _error, _json, _topic_or_404


@dataclass(frozen=True, slots=True)
class TopicsDeps:
    metadata: MetadataView
    partitions: PartitionManager
    topic_defaults: dict[str, str]
    num_partitions: int  # a new topic's, unless the request says
    default_replication_factor: int
    permitted: Permitted
    cleaner: CleanerStats


def _topic_view(deps: TopicsDeps, name: str) -> dict:
    """The topic as the metadata says, plus what this broker's replicas hold."""
    t = deps.metadata.image.topics[name]
    parts = []
    for i, meta in enumerate(t.partitions):
        p = deps.partitions.get(name, i)
        parts.append(
            {
                "partition": i,
                "leader": meta.leader,
                "leader_epoch": meta.leader_epoch,
                "replicas": meta.replicas,
                "isr": meta.isr,
                "adding": meta.adding,
                "removing": meta.removing,
                "local": p.role if p else None,
                "log_start_offset": p.log.log_start_offset if p else -1,
                "log_end_offset": p.log.log_end_offset if p else -1,
                "high_watermark": p.high_watermark if p else -1,
                # Where read_committed consumers stop: the first open transaction's.
                "last_stable_offset": p.log.last_stable_offset(p.high_watermark) if p else -1,
                "size_bytes": p.log.size_bytes if p else 0,
                "segments": len(p.log.segments) if p else 0,
            }
        )
        cleaned = deps.cleaner.partitions.get((name, i))
        if p is not None and p.log.config.compact and cleaned is not None:
            parts[-1]["cleaner"] = {
                "dirty_ratio": round(cleaned.dirty_ratio, 4),
                "last_cleaned_ms": cleaned.last_clean_ms or None,
                "uncleanable": cleaned.uncleanable,
            }
    return {
        "name": name,
        "topic_id": str(t.topic_id),
        "internal": t.internal,
        "partitions": parts,
        "replication_factor": t.replication_factor,
        "configs": t.configs,
        "effective_configs": effective({**deps.topic_defaults, **t.configs}),
    }


def add_routes(app: web.Application, deps: TopicsDeps) -> None:
    """/api/v1/topics[/{name}]"""
    routes = web.RouteTableDef()

    @routes.get("/api/v1/topics")
    async def list_topics(request: web.Request) -> web.Response:
        internal = request.query.get("internal") == "true"
        may = deps.permitted  # as Metadata: only the topics one may DESCRIBE
        names = sorted(
            n
            for n, t in deps.metadata.image.topics.items()
            if (internal or not t.internal) and may(request, DESCRIBE, TOPIC, n)
        )
        return _json({"topics": [_topic_view(deps, n) for n in names]})

    @routes.post("/api/v1/topics")
    async def create_topic(request: web.Request) -> web.Response:
        body = await _body(request)
        name = body.get("name")
        if not isinstance(name, str):
            return _error(400, "'name' (string) is required")
        partitions = body.get("partitions", deps.num_partitions)
        rf = body.get("replication_factor", deps.default_replication_factor)
        configs = body.get("configs", {})
        if not isinstance(partitions, int) or not isinstance(rf, int):
            return _error(400, "'partitions' and 'replication_factor' must be integers")
        if not isinstance(configs, dict) or not all(
            isinstance(v, str | int) for v in configs.values()
        ):
            return _error(400, "'configs' must map config names to strings")
        try:
            await deps.metadata.control(
                "create_topic",
                {
                    "name": name,
                    "partitions": partitions,
                    "replication_factor": rf,
                    "configs": {k: str(v) for k, v in configs.items()},
                },
            )
        except KafkaError as e:
            return _controller_error(e)
        return _json(_topic_view(deps, name), 201)

    @routes.get("/api/v1/topics/{name}")
    async def describe_topic(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _topic_or_404(deps.metadata.image, name)
        return _json(_topic_view(deps, name))

    @routes.delete("/api/v1/topics/{name}")
    async def delete_topic(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == OFFSETS_TOPIC:
            return _error(400, "the internal offsets topic cannot be deleted")
        try:
            await deps.metadata.control("delete_topic", {"name": name})
        except KafkaError as e:
            return _controller_error(e)
        return _json({"deleted": name})

    @routes.patch("/api/v1/topics/{name}")
    async def alter_topic(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _topic_or_404(deps.metadata.image, name)
        body = await _body(request)
        try:
            if "partitions" in body:
                if not isinstance(body["partitions"], int):
                    return _error(400, "'partitions' must be an integer")
                if body["partitions"] != len(deps.metadata.image.topics[name].partitions):
                    await deps.metadata.control(
                        "create_partitions", {"name": name, "count": body["partitions"]}
                    )
            if "configs" in body:
                changes = body["configs"]
                if not isinstance(changes, dict):
                    return _error(400, "'configs' must be an object (null deletes a key)")
                await deps.metadata.control(
                    "alter_configs",
                    {
                        "name": name,
                        "changes": {k: None if v is None else str(v) for k, v in changes.items()},
                    },
                )
        except KafkaError as e:
            return _controller_error(e)
        return _json(_topic_view(deps, name))

    app.add_routes(routes)
