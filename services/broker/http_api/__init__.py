"""HTTP side of a broker, by resource: health and readiness, topics, records (REST
produce/consume), groups, cluster operations, SCRAM users and ACLs, plus the controller's
endpoints on a combined node. JSON in and out (orjson); every error is a 4xx/5xx with
{"error": "..."} that says what to fix; nothing here can take the broker down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web
from straitmq.controller.http_api import add_routes as add_controller_routes

from straitmq.admin_client import AdminClient

from . import cluster, groups, health, records, topics, users
from .common import PEERS, _error

if TYPE_CHECKING:
    from ..broker import Broker

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
    security = broker.http_security
    # Who is calling and what the ACLs allow them, first (straitmq/security/http_security.py);
    # nothing is added while http.authentication is none.
    middlewares = [security.middleware()] if security.enabled else []
    app = web.Application(
        client_max_size=64 * 1024 * 1024, middlewares=[*middlewares, _gate(broker)]
    )
    # Peers are asked as this broker: its HTTP certificate, its inter-broker user.
    app[PEERS] = AdminClient(timeout_s=2.0, auth=security.client)

    async def close_peers(app: web.Application) -> None:
        await app[PEERS].close()

    app.on_cleanup.append(close_peers)
    for resource in (health, topics, records, groups, cluster, users):
        resource.add_routes(app, broker)
    broker.telemetry.add_routes(app)  # GET /metrics
    if broker.combined:
        add_controller_routes(app, broker)
    return app


async def start_http(broker: Broker, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(build_app(broker), access_log=None)
    await runner.setup()
    tls = broker.http_security.tls  # https only, with certificate rotation, when configured
    site = web.TCPSite(
        runner,
        host,
        port,
        reuse_address=True,
        ssl_context=tls.server_context if tls is not None else None,
    )
    await site.start()
    # aiohttp types _server as AbstractServer; the loop's Server (asyncio's or uvloop's)
    # has the sockets.
    sockets = site._server.sockets if site._server else []  # type: ignore[attr-defined]
    actual = sockets[0].getsockname()[1] if sockets else port
    return runner, actual
