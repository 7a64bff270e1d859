"""`GET /metrics` on a process's aiohttp app: the Prometheus text exposition."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:  # provider.py imports this module; the name is only an annotation here
    from .provider import Telemetry


def add_metrics_route(app: web.Application, telemetry: Telemetry) -> None:
    async def metrics(_: web.Request) -> web.Response:
        # In a worker thread, not on the event loop: a broker's scrape walks every
        # partition through the OTel SDK (0.2-0.3 s at 2,000 partitions on a loaded
        # 2-core machine), and on the loop every request waited that long. Off it, the
        # loop gets the GIL back every switch interval (5 ms). The callbacks only read
        # loop-owned state and skip a read that races a change (provider.observe), as
        # they do on the OTLP exporter's thread.
        body = await asyncio.to_thread(telemetry.render)
        return web.Response(body=body, headers={"Content-Type": telemetry.content_type})

    app.router.add_get("/metrics", metrics)
