"""Shared pieces of the broker's HTTP API: JSON bodies and errors, query parameters,
redirects to the broker that owns a partition or group, and the admin client this broker
asks its peers with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from kio.schema.errors import ErrorCode
from straitmq.metadata.image import MetadataImage

from straitmq.admin_client import AdminClient
from straitmq.errors import KafkaError, error_name

# May the request's principal do (operation, resource type, name)? (HttpSecurity.permitted)
Permitted = Callable[[web.Request, int, int, str], bool]

_ERROR_STATUS: dict[int, int] = {
    ErrorCode.unknown_topic_or_partition: 404,
    ErrorCode.topic_already_exists: 409,
    ErrorCode.invalid_topic_exception: 400,
    ErrorCode.invalid_partitions: 400,
    ErrorCode.invalid_replication_factor: 400,
    ErrorCode.invalid_replica_assignment: 400,
    ErrorCode.invalid_config: 400,
    ErrorCode.invalid_request: 400,
    ErrorCode.message_too_large: 413,
}


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


def _controller_error(e: KafkaError) -> web.Response:
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


@dataclass(frozen=True, slots=True)
class Peers:
    """This broker's peers as its HTTP API reaches them: redirects and calls."""

    node_id: int  # this broker's
    # https when this broker's port is: the brokers of a cluster share their HTTP settings.
    scheme: str
    image: Callable[[], MetadataImage]

    def url(self, node: int, path: str) -> str:
        """`path` on broker `node`'s HTTP API."""
        b = self.image().brokers[node]
        return f"{self.scheme}://{b.host}:{b.http_port}{path}"

    def elsewhere(self, request: web.Request, node: int) -> web.Response:
        """Another broker leads this partition or coordinates this group: redirect
        there (307 keeps the method and body)."""
        b = self.image().brokers.get(node)
        if b is None or b.fenced:
            return _error(503, "no live leader for this partition right now; retry")
        if node == self.node_id:  # ours by the metadata, its log not open yet: never loop
            return _error(503, "this broker is opening the partition's log; retry")
        raise web.HTTPTemporaryRedirect(self.url(node, str(request.rel_url)))


def _topic_or_404(image: MetadataImage, name: str) -> None:
    if name not in image.topics:
        raise web.HTTPNotFound(
            body=orjson.dumps({"error": f"topic '{name}' does not exist"}),
            content_type="application/json",
        )


# The one admin client this broker asks its peers (brokers, controllers) with.
PEERS = web.AppKey("peers", AdminClient)
