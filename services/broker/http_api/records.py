"""REST produce and consume, JSON in and out. A produce is the same partition write as
Kafka's Produce with acks=all (see partition_write).

Client quotas apply as on the Kafka listener, to the authenticated principal (User:
ANONYMOUS without authentication) and the client id of an `X-Client-Id` header: a
produce's body counts against producer_byte_rate, a consume's records against
consumer_byte_rate. Over quota the answer waits out the throttle (HTTP has no muted
connection) and says it in `X-Throttle-Time-Ms`; a consume over quota answers no records
(as Kafka's Fetch does), from the same offset next time."""

from __future__ import annotations

import asyncio
import base64
import time
import zlib
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from kio.schema.errors import ErrorCode

from straitmq.admin_client import AdminError
from straitmq.errors import error_name
from straitmq.security.http_security import PRINCIPAL
from straitmq.security.tls import ANONYMOUS

from ..groups.offsets import OFFSETS_TOPIC, OffsetStore
from ..metadata_view import MetadataView
from ..partition_write import PartitionWriter
from ..partitions import PartitionManager
from ..quotas import ClientQuotas, user_of
from ..record_codec import build_batch, decode_batch
from .common import (
    PEERS,
    Peers,
    _body,
    _error,
    _int_param,
    _json,
    _topic_or_404,
)


@dataclass(frozen=True, slots=True)
class RecordsDeps:
    metadata: MetadataView
    partitions: PartitionManager
    writer: PartitionWriter
    offsets: OffsetStore
    peers: Peers
    quotas: ClientQuotas


THROTTLE_HEADER = "X-Throttle-Time-Ms"


def _client(request: web.Request) -> tuple[str, str]:
    """(quota user, client id) of a REST call."""
    return user_of(request.get(PRINCIPAL) or ANONYMOUS), request.headers.get("X-Client-Id", "")


async def _throttled(response: web.Response, throttle_ms: int) -> web.Response:
    if throttle_ms:
        response.headers[THROTTLE_HEADER] = str(throttle_ms)
        await asyncio.sleep(throttle_ms / 1000.0)  # the quota's throttle, not a fixed pause
    return response


MAX_REST_RECORDS = 10_000
REST_WRITE_TIMEOUT_S = 30.0
# A refused REST write's status; any other refusal (not enough replicas, timed out, a
# storage error) is a 503: retry later.
_WRITE_STATUS: dict[int, int] = {
    ErrorCode.message_too_large: 413,
    ErrorCode.corrupt_message: 400,
    ErrorCode.invalid_record: 400,
    ErrorCode.unknown_topic_or_partition: 404,
}


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


class _RecordsRoutes:
    """/api/v1/topics/{name}/records and .../partitions/{p}/records"""

    def __init__(self, deps: RecordsDeps) -> None:
        self.deps = deps

    async def produce(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _topic_or_404(self.deps.metadata.image, name)
        body = await _body(request)
        records = body.get("records")
        if not isinstance(records, list) or not records:
            return _error(400, "'records' must be a non-empty list")
        if len(records) > MAX_REST_RECORDS:
            return _error(413, f"at most {MAX_REST_RECORDS} records per request")
        topic = self.deps.metadata.image.topics[name]
        by_partition: dict[int, list] = {}
        raw_by_partition: dict[int, list[dict]] = {}  # as sent, for forwarding
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
            raw_by_partition.setdefault(part, []).append({**r, "partition": part})
        # Partitions led elsewhere: one leader alone gets the whole request (307); with
        # several, this broker writes its own and forwards each leader its share.
        remote: dict[int, list[int]] = {}
        for part in by_partition:
            if self.deps.partitions.leader_of(name, part) is None:
                remote.setdefault(topic.partitions[part].leader, []).append(part)
        if len(remote) == 1 and sum(map(len, remote.values())) == len(by_partition):
            return self.deps.peers.elsewhere(request, next(iter(remote)))
        now = int(time.time() * 1000)
        local = {
            p: recs for p, recs in by_partition.items() if self.deps.partitions.leader_of(name, p)
        }

        async def write(part: int, recs: list) -> dict:
            # The same write as Kafka's Produce with acks=all: min ISR, storage errors,
            # the ISR's confirmation.
            w = self.deps.writer.begin(name, part, memoryview(build_batch(recs, now)), acks=-1)
            await w.replicated(REST_WRITE_TIMEOUT_S)
            if w.error_code:
                message = w.error_message or error_name(w.error_code)
                raise AdminError(
                    _WRITE_STATUS.get(w.error_code, 503),  # 503: retriable
                    f"partition {part}: {message}",
                    error_name(w.error_code),
                    w.error_code,
                )
            return {"partition": part, "base_offset": w.base_offset, "count": len(recs)}

        async def forward(leader: int, parts: list[int]) -> list[dict]:
            b = self.deps.metadata.image.brokers.get(leader)
            if b is None or b.fenced:
                raise AdminError(503, f"partitions {parts}: no live leader right now; retry")
            share = [rec for p in parts for rec in raw_by_partition[p]]
            url = self.deps.peers.url(leader, f"/api/v1/topics/{name}/records")
            answer = await request.app[PEERS].request(
                "POST", url, {"records": share}, timeout_s=REST_WRITE_TIMEOUT_S + 5
            )
            return answer["offsets"]

        outcomes = await asyncio.gather(
            *(write(p, recs) for p, recs in sorted(local.items())),
            *(forward(leader, parts) for leader, parts in remote.items()),
            return_exceptions=True,
        )
        results: list[dict] = []
        failure: AdminError | None = None
        for o in outcomes:
            if isinstance(o, AdminError):
                failure = failure or o
            elif isinstance(o, BaseException):
                raise o
            else:
                results += o if isinstance(o, list) else [o]
        results.sort(key=lambda r: r["partition"])
        if failure is not None:  # what was written is said too: a retry may duplicate it
            status = failure.status or 503
            body = {"error": failure.message, "offsets": results}
            if failure.error_code is not None:
                body.update(error_code=failure.error_code, error_name=failure.error_name)
            return _json(body, status)
        throttle = 0
        if self.deps.quotas.enabled:
            user, client = _client(request)
            size = request.content_length or 0
            throttle = self.deps.quotas.produce(user, client, size, time.perf_counter() * 1000.0)
        return await _throttled(_json({"offsets": results}), throttle)

    async def consume(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        _topic_or_404(self.deps.metadata.image, name)
        try:
            part_no = int(request.match_info["partition"])
        except ValueError:
            return _error(400, "partition must be an integer")
        meta = self.deps.metadata.image.partition(name, part_no)
        if meta is None:
            return _error(404, f"topic '{name}' has no partition {part_no}")
        p = self.deps.partitions.leader_of(name, part_no)
        group = request.query.get("group")
        if p is None or (group and not self.deps.offsets.owns(group)):
            if p is not None and group:
                return _error(400, "with 'group', ask the group's coordinator (see /api/v1/groups)")
            return self.deps.peers.elsewhere(request, meta.leader)
        default_offset = p.log.log_start_offset
        if group:
            c = self.deps.offsets.fetch(group).get((name, part_no))
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
        out: list[dict[str, Any]] = []
        pos = offset
        size = 0
        for raw in p.log.batches(offset, p.high_watermark, max_bytes):
            size += len(raw)
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
        if out and self.deps.quotas.enabled:
            user, client = _client(request)
            throttle = self.deps.quotas.fetch(user, client, size, time.perf_counter() * 1000.0)
            if throttle:
                answer = {"records": [], "next_offset": offset, "high_watermark": p.high_watermark}
                return await _throttled(_json(answer), throttle)
        if group and out:
            end = self.deps.offsets.commit(group, [(name, part_no, pos, p.leader_epoch, "rest")])
            part = self.deps.partitions.leader_of(
                OFFSETS_TOPIC, self.deps.offsets.partition_for(group)
            )
            if part is not None:
                await part.wait_for_hw(end, 5.0)
        return _json({"records": out, "next_offset": pos, "high_watermark": p.high_watermark})


def add_routes(app: web.Application, deps: RecordsDeps) -> None:
    """/api/v1/topics/{name}/records and .../partitions/{p}/records"""
    r = _RecordsRoutes(deps)
    table = [
        web.post("/api/v1/topics/{name}/records", r.produce),
        web.get("/api/v1/topics/{name}/partitions/{partition}/records", r.consume),
    ]
    app.add_routes(table)
