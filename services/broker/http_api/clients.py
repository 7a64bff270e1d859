"""GET /api/v1/clients: the clients this broker has seen lately (its own view; `strait
clients` asks every broker and joins the answers)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web

from ..client_registry import ClientRegistry
from .common import _json


@dataclass(frozen=True, slots=True)
class ClientsDeps:
    registry: ClientRegistry
    node_id: int


def add_routes(app: web.Application, deps: ClientsDeps) -> None:
    routes = web.RouteTableDef()

    @routes.get("/api/v1/clients")
    async def clients(_: web.Request) -> web.Response:
        registry = deps.registry
        listed = registry.snapshot(time.time())
        return _json(
            {
                "broker": deps.node_id,
                "clients": listed,
                "max_entries": registry.max_entries,
                "expiry_ms": int(registry.expiry_s * 1000),
                "dropped": registry.dropped,
                "expired": registry.expired,
            }
        )

    app.add_routes(routes)
