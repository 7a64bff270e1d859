"""A broker's life as the controller sees it: register, heartbeat, controlled shutdown.

A broker registers with a fresh incarnation id each start and stays fenced until its
metadata has caught up; heartbeats keep its session; a broker that stops heartbeating
is fenced by the controller and its leaderships move. On SIGTERM it asks to shut down,
waits until it leads nothing, then stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Sequence

import aiohttp
from kio.schema.errors import ErrorCode
from straitmq.controller.client import ControllerClient
from straitmq.metadata.features import supported_ranges

from straitmq.errors import KafkaError

from .config import BrokerConfig
from .errors import BrokerStartupError
from .metadata_view import MetadataView
from .partitions import PartitionManager
from .security.listeners import Listener

log = logging.getLogger("straitmq.broker")
# unsupported_version: the cluster finalized a feature level this release cannot serve.
FATAL = {
    ErrorCode.inconsistent_cluster_id,
    ErrorCode.duplicate_broker_registration,
    ErrorCode.unsupported_version,
}
REGISTRATION_WAIT_S = 10.0
STREAM_RETRY_S = 0.2
OFFLINE_MAX = 2000  # unavailable replicas named per heartbeat


class Lifecycle:
    def __init__(
        self,
        config: BrokerConfig,
        cluster_id: str,
        incarnation: str,
        listeners: Sequence[Listener],
        controller: ControllerClient,
        metadata: MetadataView,
        partitions: PartitionManager,
    ) -> None:
        # The config is read when used: http_port is the bound one only once HTTP is up.
        self.config = config
        self.cluster_id = cluster_id
        self.incarnation = incarnation
        self.listeners = listeners
        self.controller = controller
        self.metadata = metadata
        self.partitions = partitions
        self.want_shutdown = False
        self.shutdown_ok = asyncio.Event()

    def _registration(self) -> dict:
        c = self.config
        # Named listeners register every advertised endpoint; the single default
        # listener registers as before (its host/port are the endpoint).
        endpoints = (
            {ln.name: [ln.spec.advertised_host, ln.spec.advertised_port] for ln in self.listeners}
            if c.listeners
            else None
        )
        return {
            "endpoints": endpoints,
            "id": c.node_id,
            "incarnation": self.incarnation,
            "cluster_id": self.cluster_id,
            "host": c.advertised_host,
            "port": c.advertised_port,
            "http_port": c.http_port,
            "rack": c.rack,
            # What this release supports: a finalization must fit every broker's ranges.
            "features": supported_ranges(),
        }

    async def register(self) -> None:
        while True:
            try:
                reply = await self.controller.call("register", self._registration())
                # Our image must show the registration before the first heartbeat, which
                # then unfences us at once instead of one heartbeat interval later.
                await self.metadata.wait_applied(
                    reply.get("metadata_offset", -1), REGISTRATION_WAIT_S
                )
                return
            except KafkaError as e:
                if e.code in FATAL:
                    raise BrokerStartupError(e.message) from None
                log.warning("registration failed; retrying", extra={"reason": e.message})
                await asyncio.sleep(0.5)

    async def heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        while True:
            await self.heartbeat()
            await asyncio.sleep(interval / 4 if self.want_shutdown else interval)

    async def session_stream_loop(self) -> None:
        """Hold a session stream open to the active controller for this process's life.

        The kernel closes it when the process dies, however it dies, and the controller
        then fences this broker at once instead of after the session timeout.
        """
        controller = self.controller
        while True:
            url = controller.session_url()
            if url is None:
                await asyncio.sleep(STREAM_RETRY_S)
                continue
            try:
                async with controller.session().ws_connect(
                    url,
                    params={"id": str(self.config.node_id), "incarnation": self.incarnation},
                    heartbeat=None,
                    timeout=aiohttp.ClientWSTimeout(ws_close=1.0),
                ) as ws:
                    async for _ in ws:
                        pass  # the controller sends nothing; it closes when it steps down
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass  # not the active controller (any more), or unreachable: try again
            await asyncio.sleep(STREAM_RETRY_S)

    async def heartbeat(self) -> dict | None:
        """One heartbeat; the controller's answer, or None if it failed (logged)."""
        try:
            reply = await self.controller.call(
                "heartbeat",
                {
                    "id": self.config.node_id,
                    "incarnation": self.incarnation,
                    "metadata_offset": self.metadata.image.offset,
                    "want_shutdown": self.want_shutdown,
                    # Replicas whose log cannot be opened or appended to: the
                    # controller leads them elsewhere. At most a few thousand per
                    # heartbeat; the rest follow.
                    "offline": list(itertools.islice(self.partitions.offline(), OFFLINE_MAX)),
                },
                within_s=self.config.heartbeat_interval_ms / 1000,
            )
        except KafkaError as e:
            if e.code == ErrorCode.stale_broker_epoch and not self.want_shutdown:
                log.warning("controller forgot this broker; registering again")
                try:
                    await self.controller.call("register", self._registration())
                except KafkaError as e2:
                    log.warning("re-registration failed", extra={"reason": e2.message})
            else:
                log.info("heartbeat failed", extra={"reason": e.message})
            return None
        if reply.get("shutdown_ok"):
            self.shutdown_ok.set()
        return reply

    async def controlled_shutdown(self, within_s: float | None = None) -> None:
        """Ask the controller to move our leaderships away; wait until it has."""
        if within_s is None:
            within_s = self.config.controlled_shutdown_timeout_ms / 1000
        self.want_shutdown = True
        try:
            await asyncio.wait_for(self._shutdown_wait(), within_s)
        except TimeoutError:
            log.warning("controlled shutdown timed out; stopping anyway")

    async def _shutdown_wait(self) -> None:
        # The controller moves our leaderships by committing partition changes: between
        # heartbeats, wait for the next one to reach our image (or a short while, if the
        # controller is slow to act or to answer).
        retry_s = self.config.heartbeat_interval_ms / 4000
        committed: int | None = None  # the controller's offset when it said we lead nothing
        while committed is None:
            seen = self.metadata.image.offset
            reply = await self.heartbeat()
            if reply is not None and reply.get("shutdown_ok"):
                committed = int(reply.get("metadata_offset", -1))
                break
            with contextlib.suppress(KafkaError):
                await self.metadata.wait_applied(seen + 1, retry_s)
        # Let the partition changes reach us so clients get redirected, not dropped.
        with contextlib.suppress(KafkaError):
            await self.metadata.wait_applied(committed, retry_s)
