"""Liveness, readiness and the cluster overview."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from straitmq.controller.quorum import Quorum

from ..metadata_view import MetadataView
from ..metrics import BrokerMetrics
from .common import Peers, _json


@dataclass(frozen=True, slots=True)
class HealthDeps:
    metadata: MetadataView
    quorum: Quorum
    metrics: BrokerMetrics
    peers: Peers
    not_ready_reason: Callable[[], str | None]  # None while the broker serves
    # Told of every 503 /readyz answer: a leaving broker counts the kubelet's probes
    # that saw it unready before it lets its pod's address go (Broker.stop).
    answered_not_ready: Callable[[], None] = lambda: None


def add_routes(app: web.Application, deps: HealthDeps) -> None:
    """GET /healthz, /readyz and /api/v1/cluster."""
    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(_: web.Request) -> web.Response:
        return _json({"status": "ok"})

    @routes.get("/readyz")
    async def readyz(_: web.Request) -> web.Response:
        reason = deps.not_ready_reason()
        if reason is None:
            return _json({"status": "ready"})
        deps.answered_not_ready()
        return _json({"status": "not ready", "reason": reason}, 503)

    @routes.get("/api/v1/cluster")
    async def cluster(_: web.Request) -> web.Response:
        image = deps.metadata.image
        offline, under = image.partition_health()
        return _json(
            {
                "cluster_id": image.cluster_id,
                "node_id": deps.peers.node_id,
                "controller": deps.quorum.leader_id,
                "brokers": image.describe_brokers(),
                "offline_partitions": offline,
                "under_replicated_partitions": under,
                "quorum": deps.quorum.status(),
                "metrics": deps.metrics.snapshot(),
            }
        )

    app.add_routes(routes)
