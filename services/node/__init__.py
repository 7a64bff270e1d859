"""A StraitMQ node process: a broker, and on a combined node (`--single`, no
`--controllers`) the controller of its one-voter quorum in the same process.

This package sits above `straitmq.broker` and `straitmq.controller` and is the one
place that wires them together: the controller never imports the broker, and the
broker knows the controller in its process only as a `ColocatedController`.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from straitmq.broker.broker import Broker
from straitmq.broker.colocated import ColocatedController
from straitmq.broker.config import BrokerConfig
from straitmq.controller import metrics as controller_metrics
from straitmq.controller.active import ActiveController, ControllerSettings, handlers
from straitmq.controller.client import Handler
from straitmq.controller.http_api import add_routes
from straitmq.controller.quorum import Quorum

from straitmq.telemetry import Telemetry


class InProcessController:
    """The active controller of a combined node, as its broker sees it."""

    def __init__(self, quorum: Quorum, settings: ControllerSettings, telemetry: Telemetry) -> None:
        # `quorum` and `active` are what the controller's HTTP endpoints read.
        self.quorum = quorum
        self.active = ActiveController(quorum, settings)
        self._handlers = handlers(self.active)
        controller_metrics.install(telemetry, quorum, self.active)

    def is_active(self) -> bool:
        return self.active.active

    def handlers(self) -> Mapping[str, Handler]:
        return self._handlers

    def add_routes(self, app: web.Application) -> None:
        add_routes(app, self)

    async def start(self) -> None:
        await self.active.start()

    async def stop(self) -> None:
        await self.active.stop()


def build_broker(config: BrokerConfig) -> Broker:
    """The broker of `config`, with its controller in process when it runs combined."""
    if config.controller_voters:
        return Broker(config)

    def colocate(quorum: Quorum, cluster_id: str, telemetry: Telemetry) -> ColocatedController:
        return InProcessController(
            quorum,
            ControllerSettings(
                cluster_id=cluster_id,
                session_timeout_ms=config.session_timeout_ms,
                leader_rebalance_interval_ms=config.leader_rebalance_interval_ms,
                default_partitions=config.num_partitions,
                default_replication_factor=config.default_replication_factor,
                quota_window_num=config.quota_window_num,
                quota_window_size_seconds=config.quota_window_size_seconds,
            ),
            telemetry,
        )

    return Broker(config, colocate)


__all__ = ["InProcessController", "build_broker"]
