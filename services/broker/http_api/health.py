"""Liveness, readiness and the cluster overview."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from .common import _json

if TYPE_CHECKING:
    from ..broker import Broker


def add_routes(app: web.Application, broker: Broker) -> None:
    """GET /healthz, /readyz and /api/v1/cluster."""
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

    app.add_routes(routes)
