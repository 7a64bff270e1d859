"""What a broker needs of a controller running in its own process (a combined node).

The broker does not build that controller: the layer above both (`straitmq.node`) does,
through a `Colocate` the broker calls once it has made its quorum shell. The broker then
calls it locally while it is the active controller, serves its endpoints on its HTTP
port, and starts and stops it with its own subsystems.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from aiohttp import web
from straitmq.controller.client import Handler
from straitmq.controller.quorum import Quorum

from straitmq.telemetry import Telemetry


class ColocatedController(Protocol):
    def is_active(self) -> bool:
        """This process's controller is the active one (calls go to it locally)."""

    def handlers(self) -> Mapping[str, Handler]:
        """The controller calls, by name, as the HTTP endpoints serve them."""

    def add_routes(self, app: web.Application) -> None:
        """Its endpoints (Raft, controller calls, sessions) on the broker's HTTP port."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


# (the broker's one-voter quorum shell, the cluster id, the broker's telemetry) -> the
# controller voting in it.
Colocate = Callable[[Quorum, str, Telemetry], ColocatedController]
