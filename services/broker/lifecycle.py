"""A broker's life as the controller sees it: register, heartbeat, controlled shutdown.

A broker registers with a fresh incarnation id each start and stays fenced until its
metadata has caught up; heartbeats keep its session; a broker that stops heartbeating
is fenced by the controller and its leaderships move. On SIGTERM it asks to shut down,
waits until it leads nothing, then stops.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING

import aiohttp
from kio.schema.errors import ErrorCode
from straitmq.controller.errors import ControllerError

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger("straitmq.broker")
FATAL = {ErrorCode.inconsistent_cluster_id, ErrorCode.duplicate_broker_registration}
REGISTRATION_WAIT_S = 10.0
STREAM_RETRY_S = 0.2
OFFLINE_MAX = 2000  # unavailable replicas named per heartbeat


class Lifecycle:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.want_shutdown = False
        self.shutdown_ok = asyncio.Event()

    def _registration(self) -> dict:
        c = self.broker.config
        # Named listeners register every advertised endpoint; the single default
        # listener registers as before (its host/port are the endpoint).
        endpoints = (
            {
                ln.name: [ln.spec.advertised_host, ln.spec.advertised_port]
                for ln in self.broker.listeners
            }
            if c.listeners
            else None
        )
        return {
            "endpoints": endpoints,
            "id": c.node_id,
            "incarnation": self.broker.incarnation,
            "cluster_id": self.broker.cluster_id,
            "host": c.advertised_host,
            "port": c.advertised_port,
            "http_port": c.http_port,
            "rack": c.rack,
        }

    async def register(self) -> None:
        from .broker import BrokerStartupError

        while True:
            try:
                reply = await self.broker.controller.call("register", self._registration())
                # Our image must show the registration before the first heartbeat, which
                # then unfences us at once instead of one heartbeat interval later.
                await self.broker.quorum.wait_applied(
                    reply.get("metadata_offset", -1), REGISTRATION_WAIT_S
                )
                return
            except ControllerError as e:
                if e.code in FATAL:
                    raise BrokerStartupError(e.message) from None
                log.warning("registration failed; retrying", extra={"reason": e.message})
                await asyncio.sleep(0.5)

    async def heartbeat_loop(self) -> None:
        interval = self.broker.config.heartbeat_interval_ms / 1000
        while True:
            await self.heartbeat()
            await asyncio.sleep(interval / 4 if self.want_shutdown else interval)

    async def session_stream_loop(self) -> None:
        """Hold a session stream open to the active controller for this process's life.

        The kernel closes it when the process dies, however it dies, and the controller
        then fences this broker at once instead of after the session timeout.
        """
        b = self.broker
        while True:
            url = b.controller.session_url()
            if url is None:
                await asyncio.sleep(STREAM_RETRY_S)
                continue
            try:
                async with b.controller.session().ws_connect(
                    url,
                    params={"id": str(b.node_id), "incarnation": b.incarnation},
                    heartbeat=None,
                    timeout=aiohttp.ClientWSTimeout(ws_close=1.0),
                ) as ws:
                    async for _ in ws:
                        pass  # the controller sends nothing; it closes when it steps down
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass  # not the active controller (any more), or unreachable: try again
            await asyncio.sleep(STREAM_RETRY_S)

    async def heartbeat(self) -> None:
        b = self.broker
        try:
            reply = await b.controller.call(
                "heartbeat",
                {
                    "id": b.node_id,
                    "incarnation": b.incarnation,
                    "metadata_offset": b.image.offset,
                    "want_shutdown": self.want_shutdown,
                    # Replicas whose log cannot be opened: the controller leads them
                    # elsewhere. At most a few thousand per heartbeat; the rest follow.
                    "offline": list(itertools.islice(b.partitions.unavailable, OFFLINE_MAX)),
                },
                within_s=b.config.heartbeat_interval_ms / 1000,
            )
        except ControllerError as e:
            if e.code == ErrorCode.stale_broker_epoch and not self.want_shutdown:
                log.warning("controller forgot this broker; registering again")
                try:
                    await b.controller.call("register", self._registration())
                except ControllerError as e2:
                    log.warning("re-registration failed", extra={"reason": e2.message})
            else:
                log.info("heartbeat failed", extra={"reason": e.message})
            return
        if reply.get("shutdown_ok"):
            self.shutdown_ok.set()

    async def controlled_shutdown(self, within_s: float | None = None) -> None:
        """Ask the controller to move our leaderships away; wait until it has."""
        b = self.broker
        if within_s is None:
            within_s = b.config.controlled_shutdown_timeout_ms / 1000
        self.want_shutdown = True
        try:
            await asyncio.wait_for(self._shutdown_wait(), within_s)
        except TimeoutError:
            log.warning("controlled shutdown timed out; stopping anyway")

    async def _shutdown_wait(self) -> None:
        while not self.shutdown_ok.is_set():
            await self.heartbeat()
            if self.shutdown_ok.is_set():
                break
            await asyncio.sleep(0.1)
        # Let the partition changes reach us so clients get redirected, not dropped.
        await asyncio.sleep(0.2)
