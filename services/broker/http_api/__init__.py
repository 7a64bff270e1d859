"""HTTP side of a broker, by resource: health and readiness, topics, records (REST
produce/consume), groups, cluster operations, SCRAM users and ACLs, plus the controller's
endpoints on a combined node. JSON in and out (orjson); every error is a 4xx/5xx with
{"error": "..."} that says what to fix; nothing here can take the broker down.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from straitmq.admin_client import AdminClient
from straitmq.security.http_security import HttpSecurity
from straitmq.telemetry import Telemetry

from . import clients, cluster, groups, health, records, topics, users
from .clients import ClientsDeps
from .cluster import ClusterDeps
from .common import PEERS, Peers, Permitted, _error
from .groups import GroupsDeps
from .health import HealthDeps
from .records import RecordsDeps
from .topics import TopicsDeps
from .users import UsersDeps

__all__ = [
    "ClientsDeps",
    "ClusterDeps",
    "GroupsDeps",
    "HealthDeps",
    "HttpApi",
    "Peers",
    "Permitted",
    "RecordsDeps",
    "TopicsDeps",
    "UsersDeps",
    "start_http",
]

# Answered in every phase: liveness, readiness (with its reason) and metrics.
ALWAYS_OPEN = frozenset({"/healthz", "/readyz", "/metrics"})
# The controller quorum's own endpoints: they answer from the quorum, not from this
# broker's view (a combined node votes through them).
QUORUM_PATHS = ("/raft", "/controller/", "/api/v1/quorum")


@dataclass(frozen=True, slots=True)
class HttpApi:
    """What the broker's HTTP app is built from: its security, the broker's state as
    the gate sees it, and each resource's collaborators."""

    security: HttpSecurity
    telemetry: Telemetry  # GET /metrics
    serving: Callable[[], bool]
    not_ready_reason: Callable[[], str | None]
    health: HealthDeps
    topics: TopicsDeps
    records: RecordsDeps
    groups: GroupsDeps
    cluster: ClusterDeps
    users: UsersDeps
    # More routes on the same port (a combined node's controller endpoints).
    extra_routes: Sequence[Callable[[web.Application], None]] = ()
    clients: ClientsDeps | None = None  # GET /api/v1/clients


def _gate(api: HttpApi) -> Any:
    """Until the broker serves (and once it is leaving), admin and REST calls get a 503
    with the reason instead of an answer from a view the broker does not have yet."""
    serving, not_ready_reason = api.serving, api.not_ready_reason

    @web.middleware
    async def gate(request: web.Request, handler: Any) -> web.StreamResponse:
        path = request.path
        if serving() or path in ALWAYS_OPEN or path.startswith(QUORUM_PATHS):
            return await handler(request)
        resp = _error(503, f"{not_ready_reason()}; retry shortly")
        resp.headers["Retry-After"] = "1"
        return resp

    return gate


def build_app(api: HttpApi) -> web.Application:
    security = api.security
    # Who is calling and what the ACLs allow them, first (straitmq/security/http_security.py);
    # nothing is added while http.authentication is none.
    middlewares = [security.middleware()] if security.enabled else []
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[*middlewares, _gate(api)])
    # Peers are asked as this broker: its HTTP certificate, its inter-broker user.
    app[PEERS] = AdminClient(timeout_s=2.0, auth=security.client)

    async def close_peers(app: web.Application) -> None:
        await app[PEERS].close()

    app.on_cleanup.append(close_peers)
    health.add_routes(app, api.health)
    topics.add_routes(app, api.topics)
    records.add_routes(app, api.records)
    groups.add_routes(app, api.groups)
    cluster.add_routes(app, api.cluster)
    users.add_routes(app, api.users)
    if api.clients is not None:
        clients.add_routes(app, api.clients)
    api.telemetry.add_routes(app)  # GET /metrics
    for add in api.extra_routes:
        add(app)
    return app


async def start_http(api: HttpApi, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(build_app(api), access_log=None)
    await runner.setup()
    tls = api.security.tls  # https only, with certificate rotation, when configured
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
