"""HTTP side of a broker: health, readiness, admin API and a small REST produce/consume API.

JSON in and out (orjson). Every error is a 4xx/5xx with {"error": "..."} that says what
to fix; nothing here can take the broker down.
"""

from __future__ import annotations

import asyncio
import base64
import time
import zlib
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import web
from kio.schema.errors import ErrorCode
from straitmq.controller.errors import ControllerError, error_name
from straitmq.controller.http_api import add_routes as add_controller_routes
from straitmq.metadata.topic_config import effective

from .groups.offsets import OFFSETS_TOPIC
from .partition_write import begin_write
from .record_codec import build_batch, decode_batch

if TYPE_CHECKING:
    from .broker import Broker

MAX_REST_RECORDS = 10_000
REST_WRITE_TIMEOUT_S = 30.0
# A refused REST write's status; any other refusal (not enough replicas, timed out, a
# storage error) is a 503: retry later.
_WRITE_STATUS = {
    ErrorCode.message_too_large: 413,
    ErrorCode.corrupt_message: 400,
    ErrorCode.invalid_record: 400,
    ErrorCode.unknown_topic_or_partition: 404,
}
_ERROR_STATUS = {3: 404, 36: 409, 17: 400, 37: 400, 38: 400, 39: 400, 40: 400, 42: 400, 10: 413}


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(status: int, message: str, code: int | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if code is not None:  # the Kafka error, for clients (the operator) that branch on it
        body["error_code"] = code
        body["error_name"] = error_name(code)
    return _json(body, status)


async def _body(request: web.Request) -> dict:
    try:
        data = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise web.HTTPBadRequest(
            body=orjson.dumps({"error": f"request body is not valid JSON: {e}"}),
            content_type="application/json",
        ) from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(
            body=orjson.dumps({"error": "request body must be a JSON object"}),
            content_type="application/json",
        )
    return data


def _controller_error(e: ControllerError) -> web.Response:
    return _error(_ERROR_STATUS.get(e.code, 400), e.message, e.code)


def _int_param(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise web.HTTPBadRequest(
            body=orjson.dumps({"error": f"query parameter '{name}' must be an integer"}),
            content_type="application/json",
        ) from None


def _topic_view(broker: Broker, name: str) -> dict:
    """The topic as the metadata says, plus what this broker's replicas hold."""
    t = broker.image.topics[name]
    parts = []
    for i, meta in enumerate(t.partitions):
        p = broker.partitions.get(name, i)
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
                "size_bytes": p.log.size_bytes if p else 0,
                "segments": len(p.log.segments) if p else 0,
            }
        )
    return {
        "name": name,
        "topic_id": str(t.topic_id),
        "internal": t.internal,
        "partitions": parts,
        "replication_factor": t.replication_factor,
        "configs": t.configs,
        "effective_configs": effective({**broker.topic_defaults, **t.configs}),
    }


def _elsewhere(broker: Broker, request: web.Request, node: int) -> web.Response:
    """Another broker leads this partition or coordinates this group: redirect there
    (307 keeps the method and body)."""
    b = broker.image.brokers.get(node)
    if b is None or b.fenced:
        return _error(503, "no live leader for this partition right now; retry")
    host = b.host
    url = f"http://{host}:{b.http_port}{request.rel_url}"
    raise web.HTTPTemporaryRedirect(url)


async def _end_offset(broker: Broker, topic: str, index: int) -> int:
    p = broker.partitions.leader_of(topic, index)
    if p is not None:
        return p.high_watermark
    meta = broker.image.partition(topic, index)
    b = broker.image.brokers.get(meta.leader) if meta is not None else None
    if b is None:
        return -1
    try:
        _, body = await _get_json(f"http://{b.host}:{b.http_port}/api/v1/topics/{topic}")
        return int(body["partitions"][index]["high_watermark"])
    except (aiohttp.ClientError, TimeoutError, OSError, KeyError, IndexError, ValueError):
        return -1


def _encode_value(v: Any) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    return orjson.dumps(v)


def _decode_bytes(b: bytes | None) -> dict:
    if b is None:
        return {"text": None}
    try:
        return {"text": b.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(b).decode()}


# Answered in every phase: liveness, readiness (with its reason) and metrics.
ALWAYS_OPEN = frozenset({"/healthz", "/readyz", "/metrics"})
# The controller quorum's own endpoints: they answer from the quorum, not from this
# broker's view, once the quorum shell exists (a combined node votes through them).
QUORUM_PATHS = ("/raft", "/controller/", "/api/v1/quorum")


def _gate(broker: Broker) -> Any:
    """Until the broker serves (and once it is leaving), admin and REST calls get a 503
    with the reason instead of an answer from a view the broker does not have yet."""

    @web.middleware
    async def gate(request: web.Request, handler: Any) -> web.StreamResponse:
        path = request.path
        if broker.serving or path in ALWAYS_OPEN:
            return await handler(request)
        if path.startswith(QUORUM_PATHS) and hasattr(broker, "quorum"):
            return await handler(request)
        resp = _error(503, f"{broker.not_ready_reason()}; retry shortly")
        resp.headers["Retry-After"] = "1"
        return resp

    return gate


def build_app(broker: Broker) -> web.Application:
    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(_: web.Request) -> web.Response:
        return _json({"status": "ok"})

    @routes.get("/readyz")
    async def readyz(_: web.Request) -> web.Response:
        reason = broker.not_ready_reason()
        if reason is None:
            return _json({"status": "ready"})
        return _json({"status": "not ready", "reason": reason}, 503)

    @routes.get("/api/v1/cluster")
    async def cluster(_: web.Request) -> web.Response:
        image = broker.image
        offline, under = image.partition_health()
        return _json(
            {
                "cluster_id": image.cluster_id,
                "node_id": broker.node_id,
                "controller": broker.quorum.leader_id,
                "brokers": image.describe_brokers(),
                "offline_partitions": offline,
                "under_replicated_partitions": under,
                "quorum": broker.quorum.status(),
                "metrics": broker.metrics.snapshot(),
            }
        )

    @routes.get("/api/v1/topics")
    async def list_topics(request: web.Request) -> web.Response:
        internal = request.query.get("internal") == "true"
        names = sorted(n for n, t in broker.image.topics.items() if internal or not t.internal)
        return _json({"topics": [_topic_view(broker, n) for n in names]})

    @routes.post("/api/v1/topics")
    async def create_topic(request: web.Request) -> web.Response:
        body = await _body(request)
        name = body.get("name")
        if not isinstance(name, str):
            return _error(400, "'name' (string) is required")
        partitions = body.get("partitions", broker.config.num_partitions)
        rf = body.get("replication_factor", broker.config.default_replication_factor)
        configs = body.get("configs", {})
        if not isinstance(partitions, int) or not isinstance(rf, int):
            return _error(400, "'partitions' and 'replication_factor' must be integers")
        if not isinstance(configs, dict) or not all(
            isinstance(v, str | int) for v in configs.values()
        ):
            return _error(400, "'configs' must map config names to strings")
        try:
            await broker.control(
                "create_topic",
                {
                    "name": name,
                    "partitions": partitions,
                    "replication_factor": rf,
                    "configs": {k: str(v) for k, v in configs.items()},
                },
            )
        except ControllerError as e:
            return _controller_error(e)
        return _json(_topic_view(broker, name), 201)

    def _topic_or_404(name: str) -> None:
        if name not in broker.image.topics:
            raise web.HTTPNotFound(
                body=orjson.dumps({"error": f"topic '{name}' does not exist"}),
                content_type="application/json",
            )

    @routes.get("/api/v1/topics/{name}")
    async def describe_topic(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _topic_or_404(name)
        return _json(_topic_view(broker, name))

    @routes.delete("/api/v1/topics/{name}")
    async def delete_topic(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == OFFSETS_TOPIC:
            return _error(400, "the internal offsets topic cannot be deleted")
        try:
            await broker.control("delete_topic", {"name": name})
        except ControllerError as e:
            return _controller_error(e)
        return _json({"deleted": name})

    @routes.patch("/api/v1/topics/{name}")
    async def alter_topic(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _topic_or_404(name)
        body = await _body(request)
        try:
            if "partitions" in body:
                if not isinstance(body["partitions"], int):
                    return _error(400, "'partitions' must be an integer")
                if body["partitions"] != len(broker.image.topics[name].partitions):
                    await broker.control(
                        "create_partitions", {"name": name, "count": body["partitions"]}
                    )
            if "configs" in body:
                changes = body["configs"]
                if not isinstance(changes, dict):
                    return _error(400, "'configs' must be an object (null deletes a key)")
                await broker.control(
                    "alter_configs",
                    {
                        "name": name,
                        "changes": {k: None if v is None else str(v) for k, v in changes.items()},
                    },
                )
        except ControllerError as e:
            return _controller_error(e)
        return _json(_topic_view(broker, name))

    @routes.post("/api/v1/topics/{name}/records")
    async def produce(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _topic_or_404(name)
        body = await _body(request)
        records = body.get("records")
        if not isinstance(records, list) or not records:
            return _error(400, "'records' must be a non-empty list")
        if len(records) > MAX_REST_RECORDS:
            return _error(413, f"at most {MAX_REST_RECORDS} records per request")
        topic = broker.image.topics[name]
        by_partition: dict[int, list] = {}
        for i, r in enumerate(records):
            if not isinstance(r, dict):
                return _error(400, f"records[{i}] must be an object")
            part = r.get("partition")
            key = _encode_value(r.get("key"))
            if part is None:
                part = (zlib.crc32(key) if key is not None else i) % len(topic.partitions)
            if not isinstance(part, int) or not 0 <= part < len(topic.partitions):
                return _error(
                    400, f"records[{i}].partition must be in [0, {len(topic.partitions)})"
                )
            headers = r.get("headers") or {}
            if not isinstance(headers, dict):
                return _error(400, f"records[{i}].headers must be an object")
            by_partition.setdefault(part, []).append(
                (
                    key,
                    _encode_value(r.get("value")),
                    [(str(k), _encode_value(v)) for k, v in headers.items()],
                )
            )
        for part in by_partition:
            if broker.partitions.leader_of(name, part) is None:
                return _elsewhere(broker, request, topic.partitions[part].leader)
        results = []
        now = int(time.time() * 1000)
        for part, recs in sorted(by_partition.items()):
            # The same write as Kafka's Produce with acks=all: min ISR, storage errors,
            # the ISR's confirmation.
            w = begin_write(broker, name, part, memoryview(build_batch(recs, now)), acks=-1)
            await w.replicated(REST_WRITE_TIMEOUT_S)
            if w.error_code == ErrorCode.not_leader_or_follower:
                now_topic = broker.image.topics.get(name)
                leader = now_topic.partitions[part].leader if now_topic else -1
                return _elsewhere(broker, request, leader)
            if w.error_code:
                message = w.error_message or error_name(w.error_code)
                status = _WRITE_STATUS.get(w.error_code, 503)  # 503: retriable
                return _error(status, f"partition {part}: {message}", w.error_code)
            results.append({"partition": part, "base_offset": w.base_offset, "count": len(recs)})
        return _json({"offsets": results})

    @routes.get("/api/v1/topics/{name}/partitions/{partition}/records")
    async def consume(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _topic_or_404(name)
        try:
            part_no = int(request.match_info["partition"])
        except ValueError:
            return _error(400, "partition must be an integer")
        meta = broker.image.partition(name, part_no)
        if meta is None:
            return _error(404, f"topic '{name}' has no partition {part_no}")
        p = broker.partitions.leader_of(name, part_no)
        group = request.query.get("group")
        if p is None or (group and not broker.offsets.owns(group)):
            if p is not None and group:
                return _error(400, "with 'group', ask the group's coordinator (see /api/v1/groups)")
            return _elsewhere(broker, request, meta.leader)
        default_offset = p.log.log_start_offset
        if group:
            c = broker.offsets.fetch(group).get((name, part_no))
            if c is not None:
                default_offset = c.offset
        offset = _int_param(request, "offset", default_offset)
        limit = max(1, min(_int_param(request, "limit", 100), MAX_REST_RECORDS))
        max_bytes = max(1, min(_int_param(request, "max_bytes", 1 << 20), 64 << 20))
        if offset < p.log.log_start_offset or offset > p.log.log_end_offset:
            return _error(
                416,
                f"offset {offset} is outside [{p.log.log_start_offset}, {p.log.log_end_offset}]",
            )
        out = []
        pos = offset
        for raw in p.log.batches(offset, p.high_watermark, max_bytes):
            for rec in decode_batch(raw):
                if rec.offset >= offset and len(out) < limit:
                    out.append(
                        {
                            "offset": rec.offset,
                            "timestamp": rec.timestamp,
                            "key": _decode_bytes(rec.key),
                            "value": _decode_bytes(rec.value),
                            "headers": {k: _decode_bytes(v) for k, v in rec.headers},
                        }
                    )
                    pos = rec.offset + 1
            if len(out) >= limit:
                break
        if group and out:
            end = broker.offsets.commit(group, [(name, part_no, pos, p.leader_epoch, "rest")])
            part = broker.partitions.leader_of(
                OFFSETS_TOPIC, broker.offsets.partition_for(group)
            )
            if part is not None:
                await part.wait_for_hw(end, 5.0)
        return _json({"records": out, "next_offset": pos, "high_watermark": p.high_watermark})

    @routes.get("/api/v1/groups")
    async def list_groups(_: web.Request) -> web.Response:
        return _json(
            {
                "groups": [
                    {"group_id": g, "protocol_type": pt, "state": st}
                    for g, pt, st in broker.groups.list_groups()
                ]
            }
        )

    @routes.get("/api/v1/groups/{group}")
    async def describe_group(request: web.Request) -> web.Response:
        gid = request.match_info["group"]
        if not broker.offsets.owns(gid):
            meta = broker.image.partition(OFFSETS_TOPIC, broker.offsets.partition_for(gid))
            if meta is None:
                return _error(404, f"group '{gid}' does not exist")
            return _elsewhere(broker, request, meta.leader)
        d = broker.groups.describe(gid)
        if d["group_state"] == "Dead":
            return _error(404, f"group '{gid}' does not exist")
        offsets = []
        for (t, part), c in sorted(broker.offsets.fetch(gid).items()):
            end = await _end_offset(broker, t, part)
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
        if not broker.offsets.owns(gid):
            meta = broker.image.partition(OFFSETS_TOPIC, broker.offsets.partition_for(gid))
            if meta is None:
                return _error(404, f"group '{gid}' does not exist")
            return _elsewhere(broker, request, meta.leader)
        code = broker.groups.delete(gid)
        if code == 69:
            return _error(404, f"group '{gid}' does not exist")
        if code == 68:
            return _error(409, f"group '{gid}' still has members")
        return _json({"deleted": gid})

    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_gate(broker)])
    app.add_routes(routes)
    add_cluster_routes(app, broker)
    broker.telemetry.add_routes(app)  # GET /metrics
    if broker.combined:
        add_controller_routes(app, broker)
    return app


async def start_http(broker: Broker, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(build_app(broker), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
    actual = sockets[0].getsockname()[1] if sockets else port
    return runner, actual


# -- cluster operations: reassignment, throttle, quorum, preferred leaders --------------

_OPS_STATUS = {**_ERROR_STATUS, 85: 409, 7: 503, 41: 503}


def _ops_error(e: ControllerError) -> web.Response:
    return _error(_OPS_STATUS.get(e.code, 400), e.message, e.code)


def _local_progress(broker: Broker) -> list[dict]:
    """Replica log ends of the moving partitions this broker leads."""
    out = []
    for t in broker.image.topics.values():
        for i, meta in enumerate(t.partitions):
            if not (meta.adding or meta.removing):
                continue
            p = broker.partitions.leader_of(t.name, i)
            if p is None:
                continue
            ends = {str(r): f.log_end_offset for r, f in p.followers.items()}
            ends[str(broker.node_id)] = p.log.log_end_offset
            out.append(
                {
                    "topic": t.name,
                    "partition": i,
                    "leader_log_end_offset": p.log.log_end_offset,
                    "replica_log_end_offsets": ends,
                }
            )
    return out


async def _get_json(url: str, timeout_s: float = 2.0) -> Any:
    async with (
        aiohttp.ClientSession() as s,
        s.get(url, timeout=aiohttp.ClientTimeout(timeout_s)) as r,
    ):
        return r.status, orjson.loads(await r.read())


def _throttle(broker: Broker) -> int:
    return int(broker.image.cluster_configs.get("replication.throttled.rate", "-1"))


def add_cluster_routes(app: web.Application, broker: Broker) -> None:
    from straitmq.controller.operations import CLUSTER_CONFIGS

    routes = web.RouteTableDef()

    @routes.get("/api/v1/reassignments")
    async def list_reassignments(request: web.Request) -> web.Response:
        if request.query.get("local") == "true":
            return _json({"progress": _local_progress(broker)})
        try:
            reply = await broker.control("list_reassignments", {})
        except ControllerError as e:
            return _ops_error(e)
        progress = {(p["topic"], p["partition"]): p for p in _local_progress(broker)}
        leaders = set()
        for r in reply["reassignments"]:
            meta = broker.image.partition(r["topic"], r["index"])
            if meta is not None and (r["topic"], r["index"]) not in progress:
                leaders.add(meta.leader)

        async def ask(node: int) -> list[dict]:
            b = broker.image.brokers.get(node)
            if b is None or node == broker.node_id:
                return []
            try:
                _, body = await _get_json(
                    f"http://{b.host}:{b.http_port}/api/v1/reassignments?local=true"
                )
                return body.get("progress", [])
            except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError):
                return []

        for found in await asyncio.gather(*(ask(n) for n in leaders)):
            progress.update({(p["topic"], p["partition"]): p for p in found})
        out = []
        for r in reply["reassignments"]:
            meta = broker.image.partition(r["topic"], r["index"])
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
        return _json({"reassignments": out, "throttle_bytes_per_sec": _throttle(broker)})

    @routes.post("/api/v1/reassignments")
    async def reassign(request: web.Request) -> web.Response:
        body = await _body(request)
        parts = body.get("partitions")
        if not isinstance(parts, list) or not parts:
            return _error(
                400,
                "'partitions' must be a non-empty list of "
                '{"topic", "partition", "replicas": [broker ids] | null}',
            )
        items = []
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
        throttle_set = "throttle_bytes_per_sec" in body
        throttle = body.get("throttle_bytes_per_sec")
        is_int = isinstance(throttle, int) and not isinstance(throttle, bool)
        if throttle is not None and not (is_int and (throttle > 0 or throttle == -1)):
            return _error(
                400, "'throttle_bytes_per_sec' must be a positive integer, or -1/null for none"
            )
        before = broker.image.cluster_configs.get("replication.throttled.rate")
        try:
            if throttle_set:  # first, so the copying starts throttled
                value = None if throttle in (None, -1) else str(throttle)
                await broker.control(
                    "alter_cluster_configs", {"changes": {"replication.throttled.rate": value}}
                )
            try:
                await broker.control("reassign", {"partitions": items})
            except ControllerError:
                if throttle_set and before != value:
                    await broker.control(
                        "alter_cluster_configs",
                        {"changes": {"replication.throttled.rate": before}},
                    )
                raise
        except ControllerError as e:
            return _ops_error(e)
        state = []
        for it in items:
            meta = broker.image.partition(it["topic"], it["index"])
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
        return _json({"partitions": state, "throttle_bytes_per_sec": _throttle(broker)}, 202)

    @routes.get("/api/v1/cluster/configs")
    async def get_cluster_configs(_: web.Request) -> web.Response:
        configs = {k: str(v) for k, v in CLUSTER_CONFIGS.items()}
        configs.update(broker.image.cluster_configs)
        return _json({"configs": configs})

    @routes.put("/api/v1/cluster/configs")
    async def put_cluster_configs(request: web.Request) -> web.Response:
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
            await broker.control(
                "alter_cluster_configs",
                {"changes": {k: None if v is None else str(v) for k, v in changes.items()}},
            )
        except ControllerError as e:
            return _ops_error(e)
        return await get_cluster_configs(request)

    @routes.post("/api/v1/elect-preferred")
    async def elect_preferred(_: web.Request) -> web.Response:
        def leaders() -> dict[tuple[str, int], int]:
            return {
                (t.name, i): p.leader
                for t in broker.image.topics.values()
                for i, p in enumerate(t.partitions)
            }

        before = leaders()
        try:
            await broker.control("elect_preferred", {})
        except ControllerError as e:
            return _ops_error(e)
        moved = [
            {"topic": t, "partition": i, "from": before[(t, i)], "to": leader}
            for (t, i), leader in sorted(leaders().items())
            if (t, i) in before and before[(t, i)] != leader
        ]
        return _json({"elected": moved})

    async def quorum(_: web.Request) -> web.Response:
        """Each voter's own status plus the leader's view of their lag."""
        voters = broker.quorum.voters

        async def ask(url: str) -> dict | None:
            try:
                status, body = await _get_json(f"{url}/api/v1/quorum")
                return body if status == 200 and isinstance(body, dict) else None
            except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError):
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
        for node, url in sorted(voters.items()):
            s = answers[node]
            view = lag.get(node, {})
            out.append(
                {
                    "node_id": node,
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
            }
        )

    if not broker.combined:  # a combined node serves its own quorum's status already
        routes.get("/api/v1/quorum")(quorum)
    app.add_routes(routes)
