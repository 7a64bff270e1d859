"""`GET /metrics` on a process's aiohttp app: the Prometheus text exposition."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:  # provider.py imports this module; the name is only an annotation here
    from .provider import Telemetry


def add_metrics_route(app: web.Application, telemetry: Telemetry) -> None:
    async def metrics(_: web.Request) -> web.Response:
        # On the event loop: the callbacks read loop-owned state, and a scrape of a
        # broker with a few thousand partitions takes milliseconds.
        return web.Response(
            body=telemetry.render(), headers={"Content-Type": telemetry.content_type}
        )

    app.router.add_get("/metrics", metrics)
