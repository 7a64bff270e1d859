"""One controller process: a voter of the metadata quorum, active when it leads."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from aiohttp import web
from straitmq.raft.core import RaftConfig

from straitmq.formats import check_data_root
from straitmq.security.acls import Authorizer, AuthorizerSettings
from straitmq.security.http_security import HttpSecurity, with_scheme
from straitmq.telemetry import Telemetry, add_metrics_route
from straitmq.telemetry.loop_monitor import LoopMonitor

from . import metrics
from .active import ActiveController, ControllerSettings
from .http_api import add_routes
from .quorum import Quorum, load_directory_id

log = logging.getLogger("straitmq.controller")
EXIT_CONFIG = 78


class ControllerNode:
    def __init__(
        self,
        node_id: int,
        voters: dict[int, str],
        data_dir: str,
        settings: ControllerSettings,
        raft_config: RaftConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 9093,
        otlp_endpoint: str | None = None,
        security: dict[str, str] | None = None,
    ) -> None:
        # A controller not among the --voters joins as an observer of the metadata log;
        # `strait quorum add` (or kafka-metadata-quorum add-controller) makes it a voter.
        self.host, self.port = host, port
        # The HTTP port's TLS and who may call it (http.* settings, as a broker's; the
        # ACLs and SCRAM users are those of the quorum's own image). Off by default.
        props = security or {}
        self.authorizer = Authorizer(
            AuthorizerSettings.from_properties(props), lambda: self.quorum.image
        )
        self.http_security = HttpSecurity(
            props, self.authorizer, lambda user: self.quorum.image.scram_credentials.get(user), []
        )
        if self.http_security.enabled and "mtls" not in self.http_security.methods:
            raise ValueError(
                "http.authentication on a controller needs mtls: the voters prove who they "
                "are to each other with their certificates (basic may be added for brokers)"
            )
        voters = with_scheme(voters, self.http_security.scheme)  # the voters share settings
        # The data directory's file formats, before any file in it is opened (FormatError:
        # a newer release's data, refused with nothing changed).
        check_data_root(data_dir, "controller")
        # The storage's identity (KIP-853): new storage, new id, so a controller whose disk
        # was lost never counts as the voter it was until it is added again.
        self.directory_id = load_directory_id(data_dir, node_id, settings.cluster_id)
        self.quorum = Quorum(
            node_id,
            voters,
            data_dir,
            raft_config,
            self.http_security.client,
            directory_id=self.directory_id,
        )
        self.active = ActiveController(self.quorum, settings)
        self.quorum.listeners.append(self._check_cluster_id)
        self._runner: web.AppRunner | None = None
        self._tls_watch: asyncio.Task | None = None
        self.telemetry = Telemetry("straitmq-controller", str(node_id), otlp_endpoint)
        metrics.install(self.telemetry, self.quorum, self.active)
        metrics.install_process(self.telemetry, self.http_security.tls)
        self.loop_monitor = LoopMonitor().install(self.telemetry)
        self._loop_watch: asyncio.Task | None = None

    def _check_cluster_id(self, offset: int, records: list, reset: bool) -> None:
        have = self.quorum.image.cluster_id
        if have and have != self.active.settings.cluster_id:
            log.error(
                "wrong cluster id",
                extra={"configured": self.active.settings.cluster_id, "metadata_log": have},
            )
            print(
                f"strait-controller: this quorum belongs to cluster {have!r}, but this node "
                f"was started with --cluster-id {self.active.settings.cluster_id!r}",
                file=sys.stderr,
            )
            sys.stderr.flush()
            os._exit(EXIT_CONFIG)

    async def start(self) -> None:
        security = self.http_security
        middlewares = [security.middleware()] if security.enabled else []
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)

        async def healthz(request: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def readyz(request: web.Request) -> web.Response:
            ok = self.quorum.leader_id is not None
            return web.json_response(
                {"ready": ok, "leader_id": self.quorum.leader_id}, status=200 if ok else 503
            )

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        add_routes(app, self)
        add_metrics_route(app, self.telemetry)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        tls = security.tls
        site = web.TCPSite(
            self._runner,
            self.host,
            self.port,
            reuse_address=True,
            ssl_context=tls.server_context if tls is not None else None,
        )
        await site.start()
        self._loop_watch = asyncio.get_running_loop().create_task(self.loop_monitor.run())
        if tls is not None:  # rotated certificate files, for new connections
            self._tls_watch = asyncio.get_running_loop().create_task(security.watch())
        await self.quorum.start()
        await self.active.start()
        log.info("controller started", extra={"node": self.quorum.node_id, "port": self.port})

    async def stop(self) -> None:
        if self._tls_watch is not None:
            self._tls_watch.cancel()
        if self._loop_watch is not None:
            self._loop_watch.cancel()
        await self.active.stop()
        await self.quorum.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        self.telemetry.shutdown()
