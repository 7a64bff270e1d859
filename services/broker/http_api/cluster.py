"""Cluster operations: reassignment with its throttle, cluster configs, preferred-leader
election and the controller quorum's status."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from kio.schema.errors import ErrorCode
from straitmq.controller.operations import CLUSTER_CONFIGS
from straitmq.metadata import features

from straitmq.admin_client import AdminError
from straitmq.errors import KafkaError

from ..metadata_view import MetadataView
from ..partitions import PartitionManager
from .common import _ERROR_STATUS, PEERS, Peers, _body, _error, _json


@dataclass(frozen=True, slots=True)
class ClusterDeps:
    metadata: MetadataView
    partitions: PartitionManager
    peers: Peers
    voters: dict[int, str]  # the controller quorum's, id -> URL
    combined: bool  # this process runs the controller too (it serves its quorum's status)


_OPS_STATUS: dict[int, int] = {
    **_ERROR_STATUS,
    ErrorCode.no_reassignment_in_progress: 409,
    ErrorCode.request_timed_out: 503,
    ErrorCode.not_controller: 503,
    ErrorCode.duplicate_voter: 409,
    ErrorCode.voter_not_found: 404,
    ErrorCode.not_leader_or_follower: 503,
}


def _ops_error(e: KafkaError) -> web.Response:
    return _error(_OPS_STATUS.get(e.code, 400), e.message, e.code)


def _local_progress(deps: ClusterDeps) -> list[dict]:
    """Replica log ends of the moving partitions this broker leads."""
    out = []
    for t in deps.metadata.image.topics.values():
        for i, meta in enumerate(t.partitions):
            if not (meta.adding or meta.removing):
                continue
            p = deps.partitions.leader_of(t.name, i)
            if p is None:
                continue
            ends = {str(r): f.log_end_offset for r, f in p.followers.items()}
            ends[str(deps.peers.node_id)] = p.log.log_end_offset
            out.append(
                {
                    "topic": t.name,
                    "partition": i,
                    "leader_log_end_offset": p.log.log_end_offset,
                    "replica_log_end_offsets": ends,
                }
            )
    return out


def _throttle(deps: ClusterDeps) -> int:
    return int(deps.metadata.image.cluster_configs.get("replication.throttled.rate", "-1"))


class _ClusterRoutes:
    def __init__(self, deps: ClusterDeps) -> None:
        self.deps = deps

    async def list_reassignments(self, request: web.Request) -> web.Response:
        if request.query.get("local") == "true":
            return _json({"progress": _local_progress(self.deps)})
        try:
            reply = await self.deps.metadata.control("list_reassignments", {})
        except KafkaError as e:
            return _ops_error(e)
        progress = {(p["topic"], p["partition"]): p for p in _local_progress(self.deps)}
        leaders = set()
        for r in reply["reassignments"]:
            meta = self.deps.metadata.image.partition(r["topic"], r["index"])
            if meta is not None and (r["topic"], r["index"]) not in progress:
                leaders.add(meta.leader)

        async def ask(node: int) -> list[dict]:
            b = self.deps.metadata.image.brokers.get(node)
            if b is None or node == self.deps.peers.node_id:
                return []
            try:
                body = await request.app[PEERS].get(
                    self.deps.peers.url(node, "/api/v1/reassignments?local=true")
                )
                return body.get("progress", []) if isinstance(body, dict) else []
            except AdminError:
                return []

        for found in await asyncio.gather(*(ask(n) for n in leaders)):
            progress.update({(p["topic"], p["partition"]): p for p in found})
        out = []
        for r in reply["reassignments"]:
            meta = self.deps.metadata.image.partition(r["topic"], r["index"])
            prog = progress.get((r["topic"], r["index"]), {})
            out.append(
                {
                    "topic": r["topic"],
                    "partition": r["index"],
                    "replicas": r["replicas"],
                    "target": [x for x in r["replicas"] if x not in r["removing"]],
                    "adding": r["adding"],
                    "removing": r["removing"],
                    "isr": r["isr"],
                    "leader": meta.leader if meta is not None else -1,
                    "leader_log_end_offset": prog.get("leader_log_end_offset"),
                    "replica_log_end_offsets": prog.get("replica_log_end_offsets", {}),
                }
            )
        return _json({"reassignments": out, "throttle_bytes_per_sec": _throttle(self.deps)})

    async def reassign(self, request: web.Request) -> web.Response:
        body = await _body(request)
        parts = body.get("partitions")
        if not isinstance(parts, list) or not parts:
            return _error(
                400,
                "'partitions' must be a non-empty list of "
                '{"topic", "partition", "replicas": [broker ids] | null}',
            )
        items: list[dict[str, Any]] = []
        for i, p in enumerate(parts):
            if not isinstance(p, dict):
                return _error(400, f"partitions[{i}] must be an object")
            topic, index = p.get("topic"), p.get("partition")
            if not isinstance(topic, str) or not isinstance(index, int):
                return _error(
                    400, f"partitions[{i}] needs 'topic' (string) and 'partition' (integer)"
                )
            if "replicas" not in p:
                return _error(
                    400,
                    f"partitions[{i}] needs 'replicas': a list of broker ids, "
                    "or null to cancel the partition's reassignment",
                )
            replicas = p["replicas"]
            if replicas is not None and (
                not isinstance(replicas, list)
                or not replicas
                or not all(isinstance(r, int) and not isinstance(r, bool) for r in replicas)
            ):
                return _error(
                    400, f"partitions[{i}].replicas must be a non-empty list of broker ids or null"
                )
            items.append({"topic": topic, "index": index, "replicas": replicas})
        throttle = body.get("throttle_bytes_per_sec")
        is_int = isinstance(throttle, int) and not isinstance(throttle, bool)
        if throttle is not None and not (is_int and (throttle > 0 or throttle == -1)):
            return _error(
                400, "'throttle_bytes_per_sec' must be a positive integer, or -1/null for none"
            )
        request_body: dict = {"partitions": items}
        if "throttle_bytes_per_sec" in body:
            request_body["throttle"] = None if throttle in (None, -1) else throttle
        try:
            await self.deps.metadata.control("reassign", request_body)
        except KafkaError as e:
            return _ops_error(e)
        state = []
        for it in items:
            meta = self.deps.metadata.image.partition(it["topic"], it["index"])
            if meta is None:
                continue
            state.append(
                {
                    "topic": it["topic"],
                    "partition": it["index"],
                    "replicas": meta.replicas,
                    "adding": meta.adding,
                    "removing": meta.removing,
                    "isr": meta.isr,
                    "leader": meta.leader,
                    "done": not meta.adding and not meta.removing,
                }
            )
        return _json({"partitions": state, "throttle_bytes_per_sec": _throttle(self.deps)}, 202)

    async def get_cluster_configs(self, _: web.Request) -> web.Response:
        configs = {k: str(v) for k, v in CLUSTER_CONFIGS.items()}
        configs.update(self.deps.metadata.image.cluster_configs)
        return _json({"configs": configs})

    async def put_cluster_configs(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        changes = body.get("configs")
        if not isinstance(changes, dict) or not changes:
            return _error(
                400,
                'body must be {"configs": {"replication.throttled.rate": "<bytes/s>" | null}}',
            )
        if not all(v is None or isinstance(v, str | int) for v in changes.values()):
            return _error(400, "config values must be strings or integers (null resets)")
        try:
            await self.deps.metadata.control(
                "alter_cluster_configs",
                {"changes": {k: None if v is None else str(v) for k, v in changes.items()}},
            )
        except KafkaError as e:
            return _ops_error(e)
        return await self.get_cluster_configs(request)

    async def elect_preferred(self, _: web.Request) -> web.Response:
        def leaders() -> dict[tuple[str, int], int]:
            return {
                (t.name, i): p.leader
                for t in self.deps.metadata.image.topics.values()
                for i, p in enumerate(t.partitions)
            }

        before = leaders()
        try:
            await self.deps.metadata.control("elect_preferred", {})
        except KafkaError as e:
            return _ops_error(e)
        moved = [
            {"topic": t, "partition": i, "from": before[(t, i)], "to": leader}
            for (t, i), leader in sorted(leaders().items())
            if (t, i) in before and before[(t, i)] != leader
        ]
        return _json({"elected": moved})

    async def quorum(self, request: web.Request) -> web.Response:
        """Each voter's own status plus the leader's view of their lag."""
        voters = self.deps.voters

        async def ask(url: str) -> dict | None:
            try:
                body = await request.app[PEERS].get(f"{url}/api/v1/quorum")
                return body if isinstance(body, dict) else None
            except AdminError:
                return None

        answers = dict(zip(voters, await asyncio.gather(*map(ask, voters.values())), strict=True))
        leader = next(
            (s for s in answers.values() if s is not None and s.get("role") == "leader"), None
        )
        if leader is None:
            reachable = [n for n, s in answers.items() if s is not None]
            return _error(
                503,
                f"no controller quorum leader right now (voters {sorted(voters)}, reachable "
                f"{reachable}); check the controller processes and their logs",
            )
        lag = {v["node_id"]: v for v in leader.get("voters", [])}
        out = []
        # The voter set in force, as the leader has it (the flags name the first one).
        voter_set = leader.get("voter_set") or [{"id": n} for n in sorted(voters)]
        for v in voter_set:
            node = v["id"]
            url = voters.get(node)
            s = answers.get(node)
            view = lag.get(node, {})
            out.append(
                {
                    "node_id": node,
                    "directory_id": v.get("directory_id"),
                    "url": url,
                    "reachable": s is not None,
                    "role": s.get("role") if s else None,
                    "epoch": s.get("epoch") if s else None,
                    "log_end_offset": view.get("log_end_offset"),
                    "lag": view.get("lag"),
                    "last_fetch_ms": view.get("last_fetch_ms"),
                    "last_caught_up_ms": view.get("last_caught_up_ms"),
                }
            )
        return _json(
            {
                "cluster_id": leader.get("cluster_id"),
                "leader_id": leader["node_id"],
                "epoch": leader["epoch"],
                "high_watermark": leader["high_watermark"],
                "log_end_offset": leader["log_end_offset"],
                "active_controller": leader.get("active_controller"),
                "voters": out,
                "observers": leader.get("observers", []),
                "voter_change_pending": leader.get("voter_change_pending", False),
            }
        )

    async def add_voter(self, request: web.Request) -> web.Response:
        """Make a controller a voter: {"controller_url": "http://host:port"} (its id and
        directory id are asked from it), or {"node_id", "directory_id", "endpoint"}.
        Answered once the new voter set is committed."""
        body = await _body(request)
        node_id, directory_id = body.get("node_id"), body.get("directory_id")
        endpoint = body.get("endpoint")
        url = body.get("controller_url")
        if url is not None:
            if not isinstance(url, str) or not urlsplit(url).port:
                return _error(400, "controller_url must look like http://host:port")
            try:
                st = await request.app[PEERS].get(f"{url.rstrip('/')}/api/v1/quorum")
            except AdminError as e:
                return _error(
                    400,
                    f"the controller at {url} is unreachable ({e.message}): start it first "
                    "(strait-controller with --voters naming the quorum and its own --listen)",
                    ErrorCode.invalid_request,
                )
            if not isinstance(st, dict) or "node_id" not in st:
                return _error(400, f"{url} did not answer as a controller")
            node_id = st["node_id"] if node_id is None else node_id
            directory_id = directory_id or st.get("directory_id")
            endpoint = endpoint or urlsplit(url).netloc
        if not isinstance(node_id, int) or isinstance(node_id, bool):
            return _error(400, "give controller_url, or node_id (a number) with directory_id")
        req = {"node_id": node_id, "directory_id": directory_id, "endpoint": endpoint}
        return await self._change(req, "add_voter", body)

    async def remove_voter(self, request: web.Request) -> web.Response:
        """Remove a voter (?directory_id= to name which storage of that id); answered
        once committed. The active controller removing itself hands over afterwards."""
        try:
            node_id = int(request.match_info["node_id"])
        except ValueError:
            return _error(400, "the voter id must be a number")
        req = {"node_id": node_id, "directory_id": request.query.get("directory_id")}
        return await self._change(req, "remove_voter", dict(request.query))

    async def _change(self, req: dict, op: str, options: dict) -> web.Response:
        try:
            timeout_s = float(options.get("timeout_s", 30.0))
        except (TypeError, ValueError):
            return _error(400, "timeout_s must be a number")
        req["timeout_s"] = timeout_s
        try:
            reply = await self.deps.metadata.control(op, req, within_s=timeout_s + 5.0)
        except KafkaError as e:
            return _ops_error(e)
        return _json(reply)

    async def get_features(self, _: web.Request) -> web.Response:
        """Each feature's finalized level and what this broker supports, and each
        registered broker's supported ranges (release 0.1.0's for one that sent none)."""
        image = self.deps.metadata.image
        levels = image.finalized_features()
        return _json(
            {
                "epoch": max(image.offset, 0),
                "features": [
                    {
                        "name": name,
                        "supported_min": f.min_level,
                        "supported_max": f.max_level,
                        "finalized": levels.get(name, 0),
                        "explicit": name in image.features,
                    }
                    for name, f in features.SUPPORTED.items()
                ],
                "brokers": {
                    str(b): image.broker_features.get(b, features.RELEASE_0_1_0)
                    for b in sorted(image.brokers)
                },
            }
        )

    async def update_features(self, request: web.Request) -> web.StreamResponse:
        """{"updates": {feature: level}, "downgrade": false, "unsafe": false,
        "validate_only": false}: finalize levels (all or nothing), as UpdateFeatures."""
        body = await _body(request)
        updates = body.get("updates")
        if (
            not isinstance(updates, dict)
            or not updates
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in updates.values())
        ):
            return _error(400, 'body must be {"updates": {"<feature>": <level>, ...}}')
        kind = (
            (features.UNSAFE_DOWNGRADE if body.get("unsafe") else features.SAFE_DOWNGRADE)
            if body.get("downgrade")
            else features.UPGRADE
        )
        try:
            reply = await self.deps.metadata.control(
                "update_features",
                {
                    "updates": {n: [lvl, kind] for n, lvl in updates.items()},
                    "validate_only": bool(body.get("validate_only")),
                },
            )
        except KafkaError as e:
            return _ops_error(e)
        errors = reply.get("errors") or {}
        if errors:
            return _json(
                {
                    "error": "; ".join(msg for _, msg in errors.values()),
                    "errors": {n: {"error_code": c, "message": m} for n, (c, m) in errors.items()},
                },
                400,
            )
        return await self.get_features(request)


def add_routes(app: web.Application, deps: ClusterDeps) -> None:
    r = _ClusterRoutes(deps)
    table = [
        web.get("/api/v1/reassignments", r.list_reassignments),
        web.post("/api/v1/reassignments", r.reassign),
        web.get("/api/v1/cluster/configs", r.get_cluster_configs),
        web.put("/api/v1/cluster/configs", r.put_cluster_configs),
        web.post("/api/v1/elect-preferred", r.elect_preferred),
        web.post("/api/v1/quorum/voters", r.add_voter),
        web.delete("/api/v1/quorum/voters/{node_id}", r.remove_voter),
        web.get("/api/v1/features", r.get_features),
        web.post("/api/v1/features", r.update_features),
    ]
    if not deps.combined:  # a combined node serves its own quorum's status already
        table.append(web.get("/api/v1/quorum", r.quorum))
    app.add_routes(table)
