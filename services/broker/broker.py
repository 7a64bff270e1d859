"""One StraitMQ broker node: the composition root of its subsystems.

The Broker builds every subsystem with the few collaborators it uses (metadata view,
partition manager, replication, group and share coordinators, security, metrics, the
Kafka and HTTP listeners), starts them in order and stops them in reverse; the
subsystems never reach back into it.

In a cluster the broker follows the metadata log as a Raft observer of the controller
quorum and calls the active controller over HTTP. A combined node (`--single`, the
default when no controllers are given) runs a one-voter quorum and its controller in
the same process and serves the controller endpoints on its own HTTP port; that
controller is built above this package (`straitmq.node`) and known here only as a
`ColocatedController`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import uuid
from collections.abc import Awaitable, Iterator
from typing import Any

import orjson
from aiohttp import web
from kio.schema.errors import ErrorCode
from straitmq.controller.client import ControllerClient
from straitmq.controller.quorum import Quorum, parse_voters
from straitmq.metadata.image import MetadataImage
from straitmq.raft.core import RaftConfig

from straitmq.errors import KafkaError
from straitmq.formats import check_data_root
from straitmq.invariants import broken
from straitmq.security.acls import Authorizer, AuthorizerSettings
from straitmq.security.http_security import HttpSecurity, with_scheme
from straitmq.tasks import cancel_and_wait
from straitmq.telemetry import Telemetry
from straitmq.telemetry.loop_monitor import LoopMonitor

from . import metrics as broker_metrics
from .api.context import RequestContext
from .api.deps import AdminDeps, FetchDeps, GroupDeps, MetadataDeps, TxnDeps
from .api.dispatch import ApiSpec, kafka_api
from .api.metadata import TopicAnswers
from .api.partition_txns import PartitionTxnDeps
from .cleaner_settings import CleanerSettings
from .client_registry import ClientRegistry
from .colocated import Colocate, ColocatedController
from .config import BrokerConfig
from .dynamic_configs import check_static, topic_defaults
from .errors import BrokerStartupError
from .fetch_sessions import FetchSessions
from .groups.coordinator import GroupCoordinator, GroupSettings
from .groups.offsets import OFFSETS_TOPIC, OffsetStore
from .http_api import (
    ClientsDeps,
    ClusterDeps,
    GroupsDeps,
    HealthDeps,
    HttpApi,
    Peers,
    RecordsDeps,
    TopicsDeps,
    UsersDeps,
    start_http,
)
from .lifecycle import Lifecycle
from .log_cleaner import CleanerLog, LogCleaner
from .metadata_view import MetadataView
from .metrics import BrokerMetrics
from .partition_write import PartitionWriter
from .partitions import LEADER, Partition, PartitionManager
from .quotas import ClientQuotas, ConnectionRates
from .records import BatchInfo
from .replication.fetcher import FetcherSettings, ReplicaFetchers
from .replication.isr import IsrManager
from .replication.throttle import ReplicationThrottle
from .security.build import build_listeners
from .security.listeners import Listener, bind_listeners
from .security.sasl import ConnectionSecurity
from .server import ConnectionLimits, KafkaConnection, ListenerDeps, bind, serve
from .share.coordinator import ShareCoordinator
from .transactions.channel import InterBrokerChannel
from .transactions.coordinator import TransactionCoordinator, TxnSettings
from .transactions.verification import TxnVerifier
from .views import LocalReplicas

log = logging.getLogger("straitmq.broker")
OFFSETS_SEGMENT_BYTES = 64 * 1024 * 1024
STORAGE_RETRY_S = 5.0  # how often replicas whose log could not be opened are retried

# Metadata records that change a topic's replicas ("topic" or "name" says which).
_TOPIC_RECORDS = frozenset({"topic", "partition", "partition_change", "config", "remove_topic"})


class Broker:
    def __init__(self, config: BrokerConfig, colocate: Colocate | None = None) -> None:
        """`colocate` builds the controller of a combined node (no controller voters
        configured) in this process; `straitmq.node.build_broker` passes it."""
        self.config = config
        self.metrics = BrokerMetrics()
        self.connections: set[KafkaConnection] = set()
        self.stopping = False
        # Asked to stop: /readyz answers 503 from then on (see stop()), and counts so.
        self.leaving = False
        self._unready_answers = 0
        self._probes_seen = asyncio.Event()
        self.metadata_ready = False
        # What the broker is doing until it serves: the reason /readyz and the HTTP API
        # give while they refuse. "serving" once the Kafka listener accepts.
        self.phase = "starting"
        self.serving = False
        self._kafka_sockets: list[Any] = []
        try:  # a bad listener, certificate or SASL setting stops the broker here, saying why
            self.listeners = build_listeners(config)
        except ValueError as e:
            raise BrokerStartupError(str(e)) from None
        self._bound: list[tuple[Listener, list[Any]]] = []
        self.incarnation = str(uuid.uuid4())
        self._http: web.AppRunner | None = None
        self._kafka_servers: list[Any] = []  # one per listener, closed first on stop
        self._tasks: list[asyncio.Task] = []
        # The data directory's file formats, before any file in it is opened (FormatError:
        # a newer release's data, refused with nothing changed).
        check_data_root(config.data_dir, "broker")
        self.cluster_id = self._check_meta()
        if problem := check_static(config):  # a bad log.cleaner.* setting, say, says why
            raise BrokerStartupError(problem)
        # The broker's topic defaults (message.max.bytes, log.cleanup.policy, ...): one
        # dict, shared by every user, kept in step with the dynamic broker configs by
        # _refresh_topic_defaults.
        self.topic_defaults = topic_defaults(config, {})
        self.partitions = PartitionManager(
            os.path.join(config.data_dir, "logs"),
            self.topic_defaults,
            config.node_id,
            config.max_open_files,
        )
        # Off (everything allowed, as before ACLs) unless authorizer.class.name is set.
        # Both read the image when asked, by which time the quorum shell below exists.
        self.authorizer = Authorizer(
            AuthorizerSettings.from_properties(config.security), lambda: self.image
        )
        try:  # TLS and authentication of the HTTP port (off unless http.* settings say)
            self.http_security = HttpSecurity(
                config.security,
                self.authorizer,
                lambda user: self.image.scram_credentials.get(user),
                self.listeners,
            )
        except ValueError as e:
            raise BrokerStartupError(str(e)) from None
        self.telemetry = Telemetry("straitmq-broker", str(config.node_id), config.otlp_endpoint)
        self._build_quorum(colocate)
        self.metadata = MetadataView(self.quorum, self.controller, self.partitions)
        image = self.metadata.current
        self.metadata_answers = TopicAnswers()
        self.fetch_sessions = FetchSessions()
        self.partitions.change_listener = self.fetch_sessions.changed
        inter_broker = self.listeners[0]  # replication and share state go over the first
        self.fetchers = ReplicaFetchers(
            FetcherSettings(config.node_id, config.rack, inter_broker, image, self.incarnation)
        )
        self.isr = IsrManager(
            config.node_id,
            config.replica_lag_time_max_ms,
            self.controller,
            image,
            lambda: self.ready,
        )
        self.throttle = ReplicationThrottle(image)
        # A listener of its own for brokers is never throttled by client quotas (a
        # follower's fetch is exempt on any listener).
        self._quota_exempt_listener = (
            inter_broker.name
            if config.inter_broker_listener_name and len(self.listeners) > 1
            else None
        )
        self.quotas = ClientQuotas(
            image, config.quota_window_num, config.quota_window_size_seconds * 1000.0
        )
        self.writer = PartitionWriter(self.metrics, self.partitions, image, lambda: self.serving)
        # Who connects, with which software and API versions (GET /api/v1/clients).
        self.clients = ClientRegistry(
            config.client_registry_max_entries, config.client_registry_expiry_ms / 1000.0
        )
        self.partitions.role_listeners.append(self.fetchers.on_role)
        self.partitions.role_listeners.append(self.isr.on_role)
        self.partitions.role_listeners.append(self._on_role)
        self.offsets = OffsetStore(config.offsets_topic_partitions)
        self.offsets.bind(self._append_offsets)
        self.groups = GroupCoordinator(self.offsets, GroupSettings.from_config(config))
        self.groups.bind(self._offsets_durable)
        self.share = ShareCoordinator(
            config,
            self.metadata,
            self.partitions,
            self.offsets,
            inter_broker,
            lambda: self.stopping,
            self.groups.group_type,
        )
        self.transactions = TransactionCoordinator(
            config.node_id,
            TxnSettings(
                config.transaction_state_log_num_partitions,
                config.transaction_state_log_replication_factor,
                config.transaction_state_log_segment_bytes,
                config.transaction_max_timeout_ms,
                config.transactional_id_expiration_ms,
                config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            ),
            self.partitions,
            self.metadata,
            inter_broker,
            self.next_producer_id,
            self._create_internal_topic,
        )
        self.partitions.role_listeners.append(self.transactions.on_role)
        # Its own connections: a verification never waits behind the markers.
        self.txn_verifier = TxnVerifier(
            self.transactions,
            InterBrokerChannel(config.node_id, self.metadata, inter_broker, "txn-verify"),
            config.transaction_partition_verification_enable,
        )
        # Every compacted log on this broker, leader or follower (each replica cleans
        # its own, as in Kafka); the settings are read again at every round.
        # STRAITMQ_CLEANER_EXECUTOR=thread: cleanings in a thread instead of a worker
        # process, for bench/cleaner.py's process-vs-thread comparison only (no setting).
        self.cleaner = LogCleaner(
            self._cleaner_logs,
            lambda: CleanerSettings.of(config, self.image.cluster_configs),
            executor=os.environ.get("STRAITMQ_CLEANER_EXECUTOR", "process"),
        )
        self.lifecycle = Lifecycle(
            config,
            self.cluster_id,
            self.incarnation,
            self.listeners,
            self.controller,
            self.metadata,
            self.partitions,
        )
        self._listener_deps = ListenerDeps(
            self.metrics,
            self.connections,
            config.socket_request_max_bytes,
            image,
            self._request_context,
            self._kafka_api(),
            self.quotas,
            self._quota_exempt_listener,
            self.clients,
            # Kafka protects the inter-broker listener from max.connections when there
            # are other listeners: the same one quotas exempt.
            ConnectionLimits(
                config.max_connections,
                config.max_connections_per_ip,
                self._quota_exempt_listener,
            ),
            ConnectionRates(lambda: self.image),
        )
        self._producer_ids: list[int] = []  # [next, limit) of the block we hold
        broker_metrics.install(
            self.telemetry,
            self.metrics,
            self.partitions,
            self.isr,
            self.fetch_sessions,
            self.groups,
            self.offsets,
            self.share,
            self.cleaner,
            self.transactions,
            self.quotas,
        )
        broker_metrics.install_clients(self.telemetry, self.clients)
        broker_metrics.install_host(
            self.telemetry,
            self.partitions.data_dir,
            lambda: [
                t
                for t in [self.http_security.tls, *(lst.tls for lst in self.listeners)]
                if t is not None
            ],
        )
        self.loop_monitor = LoopMonitor().install(self.telemetry)
        self._http_api = self._build_http_api()

    def _kafka_api(self) -> dict[int, ApiSpec]:
        """The Kafka handlers, each family given the few collaborators it uses (see
        api/deps.py), never the Broker."""
        metadata, cfg = self.metadata, self.config
        replicas = LocalReplicas(metadata, self.partitions)
        return kafka_api(
            writer=self.writer,
            verifier=self.txn_verifier,
            fetch_deps=FetchDeps(
                replicas,
                self.fetch_sessions,
                self.throttle,
                self.metrics,
                cfg.fetch_max_wait_s,
                lambda: self.stopping,
                self.quotas,
                lambda broker_id: self.quorum.image.broker_incarnation(broker_id),
            ),
            replicas=replicas,
            metadata_deps=MetadataDeps(
                metadata, self.metadata_answers, metadata.control, cfg, self.listeners
            ),
            metadata_view=metadata,
            group_deps=GroupDeps(
                self.groups,
                self.offsets,
                metadata,
                self.partitions,
                self.ensure_offsets_topic,
                self.share,
                self.transactions,
            ),
            txn_deps=TxnDeps(
                self.transactions,
                metadata,
                self.next_producer_id,
                self.groups,
                self.offsets,
                self.ensure_offsets_topic,
                self._offsets_durable,
                self.txn_verifier,
            ),
            admin_deps=AdminDeps(
                metadata,
                metadata.control,
                cfg,
                self.topic_defaults,
                self.partitions,
                self.next_producer_id,
            ),
            controller=self.controller.call,
            share_coordinator=self.share,
            partition_txn_deps=PartitionTxnDeps(
                self.writer, replicas, self.offsets.complete_transaction
            ),
        )

    def _build_http_api(self) -> HttpApi:
        cfg, metadata = self.config, self.metadata
        peers = Peers(cfg.node_id, self.http_security.scheme, metadata.current)
        permitted = self.http_security.permitted
        extra = []
        if self.colocated is not None:  # the controller's endpoints, on our port
            extra.append(self.colocated.add_routes)
        return HttpApi(
            security=self.http_security,
            telemetry=self.telemetry,
            serving=lambda: self.serving,
            not_ready_reason=self.not_ready_reason,
            health=HealthDeps(
                metadata,
                self.quorum,
                self.metrics,
                peers,
                self.not_ready_reason,
                self._answered_not_ready,
            ),
            topics=TopicsDeps(
                metadata,
                self.partitions,
                self.topic_defaults,
                cfg.num_partitions,
                cfg.default_replication_factor,
                permitted,
                self.cleaner.stats,
            ),
            records=RecordsDeps(
                metadata, self.partitions, self.writer, self.offsets, peers, self.quotas
            ),
            groups=GroupsDeps(
                metadata, self.partitions, self.groups, self.share, self.offsets, peers, permitted
            ),
            cluster=ClusterDeps(metadata, self.partitions, peers, self._voters, self.combined),
            users=UsersDeps(metadata),
            extra_routes=extra,
            clients=ClientsDeps(self.clients, cfg.node_id),
        )

    def _build_quorum(self, colocate: Colocate | None) -> None:
        """The metadata quorum shell and the client of the active controller; on a
        combined node also the controller itself (built by `colocate`), active while
        this node leads its one-voter quorum."""
        cfg = self.config
        raft = RaftConfig(
            election_timeout_ms=cfg.election_timeout_ms, fetch_timeout_ms=cfg.fetch_timeout_ms
        )
        self.colocated: ColocatedController | None = None
        security = self.http_security
        if not self.combined:  # https to the controllers: controller.http.ssl.*
            self._voters = with_scheme(
                parse_voters(cfg.controller_voters or ""), security.controller_scheme
            )
            quorum = self.quorum = Quorum(
                cfg.node_id, self._voters, cfg.data_dir, raft, security.client
            )
            self.controller = ControllerClient(
                self._voters, lambda: quorum.leader_id, auth=security.client
            )
            return
        if colocate is None:
            raise BrokerStartupError(
                "no controller voters are configured, so this node runs its own controller: "
                "start it with straitmq.node.build_broker (as strait-broker does)"
            )
        # Our own voter URL is known once the HTTP port is bound (start fills it in): the
        # quorum and the controller client share this dict.
        self._voters = {cfg.node_id: ""}
        quorum = self.quorum = Quorum(cfg.node_id, self._voters, cfg.data_dir, raft)
        colocated = self.colocated = colocate(quorum, self.cluster_id, self.telemetry)
        self.controller = ControllerClient(
            self._voters,
            lambda: quorum.leader_id,
            (colocated.is_active, dict(colocated.handlers())),
            security.client,
        )

    # -- identity --------------------------------------------------------------------

    def _check_meta(self) -> str:
        """The data dir remembers which cluster and node id it belongs to."""
        path = os.path.join(self.config.data_dir, "meta.json")
        meta: dict = {}
        if os.path.exists(path):
            with open(path, "rb") as f:
                meta = orjson.loads(f.read())
            if meta.get("node_id") != self.config.node_id:
                raise BrokerStartupError(
                    f"data directory {self.config.data_dir} belongs to node "
                    f"{meta.get('node_id')}, not {self.config.node_id}"
                )
            if self.config.cluster_id and meta.get("cluster_id") != self.config.cluster_id:
                raise BrokerStartupError(
                    f"data directory {self.config.data_dir} belongs to cluster "
                    f"{meta.get('cluster_id')!r}, not {self.config.cluster_id!r}"
                )
        cluster_id = self.config.cluster_id or meta.get("cluster_id") or _new_cluster_id()
        if not meta:
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(orjson.dumps({"node_id": self.config.node_id, "cluster_id": cluster_id}))
            os.replace(tmp, path)
        return cluster_id

    @property
    def image(self) -> MetadataImage:
        return self.quorum.image

    @property
    def combined(self) -> bool:
        return not self.config.controller_voters

    # -- metadata --------------------------------------------------------------------

    def _on_metadata(self, offset: int, records: list[dict], reset: bool) -> None:
        if not self.metadata_ready:
            return
        if reset:
            self._refresh_topic_defaults()
            self._sync_replicas()
            return
        # Only the topics the records name: a sync over 100,000 partitions for each
        # ISR change would stall the listener.
        topics = {r.get("topic") or r["name"] for r in records if r["type"] in _TOPIC_RECORDS}
        if any(r["type"] == "cluster_config" for r in records) and self._refresh_topic_defaults():
            # A broker default of a topic config changed (log.cleanup.policy, ...): every
            # topic without its own value takes it.
            topics |= set(self.image.topics)
        if topics:
            self._sync_replicas(topics)
            for r in records:
                if r["type"] == "remove_topic":
                    self.offsets.delete_topic(r["name"])

    def _refresh_topic_defaults(self) -> bool:
        """Apply the image's dynamic broker configs to the topic defaults; whether they
        changed."""
        now = topic_defaults(self.config, self.image.cluster_configs)
        if now == self.topic_defaults:
            return False
        self.topic_defaults.clear()
        self.topic_defaults.update(now)
        return True

    def _offsets_layout(self) -> None:
        # The group -> partition mapping must be current before leaderships load groups.
        if OFFSETS_TOPIC in self.image.topics:
            self.offsets.partitions_count = len(self.image.topics[OFFSETS_TOPIC].partitions)

    def _sync_replicas(self, topics: set[str] | None = None) -> None:
        self._offsets_layout()
        if topics is None:
            self.partitions.sync(self.image)
        else:
            self.partitions.sync_soon(self.image, topics)

    async def _wait_metadata(self) -> None:
        """Apply nothing to local logs until the metadata log has been caught up once:
        a stale or empty image would delete replicas that still exist."""
        while not self.stopping:
            if self.quorum.leader_id is None:
                self.phase = "waiting for the controller quorum (no active controller known yet)"
            elif self.quorum.caught_up() and self.image.cluster_id:
                break
            else:
                self.phase = (
                    f"catching up with the metadata log (applied offset {self.image.offset})"
                )
            await self.quorum.changed()
        if self.image.cluster_id != self.cluster_id:
            raise BrokerStartupError(
                f"this broker was started for cluster {self.cluster_id!r} but the controllers "
                f"run cluster {self.image.cluster_id!r}"
            )

    async def _open_replicas(self) -> None:
        """After registering: only now may this process act as the node id's replicas
        (a refused duplicate must never fetch as, or serve for, another broker)."""
        self.metadata_ready = True
        self._offsets_layout()
        self._refresh_topic_defaults()
        await self.partitions.sync_all(self.image)

    # -- groups follow the leadership of __consumer_offsets partitions ----------------

    def _on_role(self, part: Partition, role: str) -> None:
        if part.topic != OFFSETS_TOPIC:
            return
        if role == LEADER:
            plog = part.log
            self.offsets.load_partition(
                part.index, plog.batches(plog.log_start_offset, plog.log_end_offset)
            )
            self.groups.loaded(lambda g: self.offsets.partition_for(g) == part.index)
        else:
            self.offsets.unload_partition(part.index)
            self.groups.unload(lambda g: self.offsets.partition_for(g) == part.index)

    def _append_offsets(self, index: int, data: memoryview, batches: list[BatchInfo]) -> int:
        part = self.partitions.leader_of(OFFSETS_TOPIC, index)
        if part is None:
            raise KafkaError(ErrorCode.not_coordinator, "not the coordinator for this group")
        try:
            part.append(data, batches)
        except OSError as e:
            # Kafka answers a group write that met KAFKA_STORAGE_ERROR with NOT_COORDINATOR
            # (GroupMetadataManager): the client looks the coordinator up again, retries.
            raise KafkaError(ErrorCode.not_coordinator, f"storage error: {e}") from e
        return part.log.log_end_offset

    def _offsets_durable(self, group_id: str, end: int) -> Awaitable[bool]:
        """Group records written up to `end` are in the ISR of the group's offsets
        partition (offsets.commit.required.acks=-1, as commits). Called right after the
        write: the wait is bound to the leader epoch of now, even if awaited later."""
        part = self.partitions.leader_of(OFFSETS_TOPIC, self.offsets.partition_for(group_id))
        if part is None:
            return _resolved(False)
        return part.wait_for_hw(end, 5.0, part.leader_epoch)

    async def ensure_offsets_topic(self) -> bool:
        if OFFSETS_TOPIC in self.image.topics:
            return True
        try:
            await self._create_internal_topic(
                {
                    "name": OFFSETS_TOPIC,
                    "partitions": self.config.offsets_topic_partitions,
                    "replication_factor": self.config.offsets_topic_replication_factor,
                    # Compacted, as Kafka's is: the latest commit per key stays, and no
                    # time or size retention (compact alone deletes nothing) drops the
                    # commits of idle groups.
                    "configs": {
                        "cleanup.policy": "compact",
                        "segment.bytes": str(OFFSETS_SEGMENT_BYTES),
                    },
                    "internal": True,
                }
            )
        except KafkaError as e:
            log.debug("cannot create the offsets topic yet", extra={"reason": e.message})
            return False
        return OFFSETS_TOPIC in self.image.topics

    async def _create_internal_topic(self, body: dict) -> None:
        """create_topic for an internal topic; someone else having made it is fine."""
        try:
            await self.controller.call("create_topic", body, within_s=5.0)
        except KafkaError as e:
            if e.code != ErrorCode.topic_already_exists:
                raise

    def _cleaner_logs(self) -> Iterator[CleanerLog]:
        for p in list(self.partitions.partitions.values()):
            yield CleanerLog(p.topic, p.index, p.log, p.high_watermark)

    async def _offsets_topic_compacted(self) -> None:
        """An offsets topic made before it was created compacted (it has no policy of its
        own) gets cleanup.policy=compact once: the first upgraded broker asks; a failure is
        retried at the next start, the topic keeps working meanwhile. A policy someone
        set on purpose stays."""
        topic = self.image.topics.get(OFFSETS_TOPIC)
        if topic is None or "cleanup.policy" in topic.configs:
            return
        try:
            await self.controller.call(
                "alter_configs",
                {"name": OFFSETS_TOPIC, "changes": {"cleanup.policy": "compact"}},
                within_s=5.0,
            )
        except KafkaError as e:
            log.warning(
                "cannot set cleanup.policy=compact on the offsets topic yet",
                extra={"reason": e.message},
            )

    async def control(self, op: str, body: dict, within_s: float = 15.0) -> dict:
        """See MetadataView.control (kept here for the callers that still hold the Broker)."""
        return await self.metadata.control(op, body, within_s)

    def _request_context(
        self,
        api_key: int,
        version: int,
        correlation_id: int,
        client_id: str | None,
        client_host: str,
        listener: str,
        security: ConnectionSecurity,
    ) -> RequestContext:
        """The facts of one Kafka request, and the authorizer its handler asks
        (server.ListenerDeps.context); what the handler works with it was given when
        the API table was bound (`_kafka_api`)."""
        return RequestContext(
            api_key,
            version,
            correlation_id,
            client_id,
            client_host,
            listener,
            security,
            self.authorizer,
        )

    # -- producer ids ----------------------------------------------------------------

    async def next_producer_id(self) -> int:
        if not self._producer_ids or self._producer_ids[0] >= self._producer_ids[1]:
            reply = await self.controller.call("allocate_producer_ids", {"broker": self.node_id})
            self._producer_ids = [reply["start"], reply["start"] + reply["count"]]
        pid = self._producer_ids[0]
        self._producer_ids[0] += 1
        return pid

    @property
    def node_id(self) -> int:
        return self.config.node_id

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Bring the broker up; the Kafka listener accepts connections only at the end,
        once this broker is registered, caught up, unfenced and has opened its replicas
        (as Kafka does): a client that connects the moment the port opens never sees an
        empty or stale view. HTTP comes up first, for liveness and a readiness reason."""
        cfg = self.config
        # Bound now (the port is ours and known, also for port 0), listening only later.
        self._bound = bind_listeners(cfg, self.listeners, bind)
        self._kafka_sockets = [s for _, socks in self._bound for s in socks]
        self._http, http_port = await start_http(self._http_api, cfg.http_host, cfg.http_port)
        cfg.http_port = http_port
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.loop_monitor.run()))
        if self.http_security.tls is not None:  # rotated certificate files, new connections
            self._tasks.append(loop.create_task(self.http_security.watch()))
        if self.combined:  # our voter URL, now that the HTTP port is known
            self._voters[cfg.node_id] = f"{self.http_security.scheme}://{cfg.http_host}:{http_port}"
        self.quorum.listeners.append(self._on_metadata)
        await self.quorum.start()
        if self.colocated is not None:
            await self.colocated.start()
        await self._wait_metadata()
        self.phase = "registering with the active controller"
        await self.lifecycle.register()
        self._tasks.append(loop.create_task(self.lifecycle.session_stream_loop()))
        self.phase = "opening partition logs (recovering any torn tails)"
        await self.partitions.preopen(self.image)
        await self._open_replicas()
        self._tasks.append(loop.create_task(self.lifecycle.heartbeat_loop()))
        self._tasks.append(loop.create_task(self.isr.run()))
        self._tasks.append(loop.create_task(self._retention_loop()))
        self._tasks.append(loop.create_task(self._offsets_expiry_loop()))
        self._tasks.append(loop.create_task(self._storage_retry_loop()))
        self.share.start()
        self.cleaner.start()
        self.transactions.start()
        self.phase = "waiting for the active controller to unfence this broker"
        while not self.ready:
            if self.stopping:
                return
            await self.quorum.changed()
        # Once enough brokers are up the offsets topic can exist; FindCoordinator retries.
        if await self.ensure_offsets_topic():
            await self._offsets_topic_compacted()
        for listener, socks in self._bound:
            self._kafka_servers.append(await serve(self._listener_deps, socks, listener))
            if listener.tls is not None:  # rotated certificate files, for new connections
                self._tasks.append(loop.create_task(listener.tls.watch()))
        self._bound = []
        self._kafka_sockets = []  # the server owns (and closes) them now
        self.serving = True
        self.phase = "serving"
        log.info("broker started", extra={"port": cfg.port, "http": http_port})

    @property
    def ready(self) -> bool:
        """Registered (this incarnation), unfenced, and not leaving."""
        b = self.image.brokers.get(self.node_id) if self.metadata_ready else None
        return (
            not self.stopping
            and b is not None
            and b.incarnation == self.incarnation
            and not b.fenced
        )

    def _answered_not_ready(self) -> None:
        if self.leaving:
            self._unready_answers += 1
            if self._unready_answers >= self.config.shutdown_readiness_probes:
                self._probes_seen.set()

    async def _until_seen_unready(self) -> None:
        """Wait, listeners closed (connections refused), until the readiness probe has
        seen this broker unready often enough for its Service to stop routing here
        (config.shutdown_readiness_probes); only then may the pod and its address go."""
        want = self.config.shutdown_readiness_probes
        if want <= 0 or self._unready_answers >= want:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                self._probes_seen.wait(), self.config.shutdown_readiness_timeout_ms / 1000
            )

    def not_ready_reason(self) -> str | None:
        """None while this broker serves clients; otherwise what it is waiting for."""
        if self.stopping or self.leaving:
            return "this broker is shutting down"
        if not self.serving:
            return f"this broker is starting: {self.phase}"
        if not self.ready:
            b = self.image.brokers.get(self.node_id)
            if b is not None and b.incarnation == self.incarnation and b.fenced:
                return "the active controller has fenced this broker (no heartbeat got through)"
            return "this broker is not registered with the active controller"
        return None

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_check_interval_ms / 1000)
            try:
                deleted = await self.partitions.apply_retention()
                if deleted:
                    log.info("retention deleted segments", extra={"segments": deleted})
            except OSError:
                log.exception("retention check failed")

    async def _offsets_expiry_loop(self) -> None:
        """offsets.retention.minutes, checked every offsets.retention.check.interval.ms
        over the groups this broker coordinates (Kafka's offsets cleanup)."""
        retention_ms = int(self.config.offsets_retention_minutes * 60_000)
        while True:
            await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            try:
                removed = self.groups.expire_groups(retention_ms)
                if removed:
                    log.info("removed expired groups", extra={"groups": removed})
            except KafkaError as e:  # its tombstones not written (a full disk, a moved
                # leadership): the next check expires them
                log.warning("offsets expiry failed", extra={"error": e.message})
            except Exception as e:  # a bug: the rest decides in memory
                broken("offsets expiry fails only on its writes", error=f"{type(e).__name__}: {e}")

    async def _storage_retry_loop(self) -> None:
        """Replicas whose log could not be opened (a full disk, no descriptors) are
        tried again every few seconds, not only at the next metadata change."""
        while True:
            await asyncio.sleep(STORAGE_RETRY_S)
            if self.partitions.unavailable and self.metadata_ready and not self.stopping:
                self._sync_replicas(set())

    async def stop(self, controlled: bool = True) -> None:
        """Stop what start started, in reverse order (also after a start cut short)."""
        self.leaving = True
        if controlled and self.serving and not self.stopping:
            # Leaderships move away first; until then this broker keeps serving them.
            with contextlib.suppress(Exception):
                await self.lifecycle.controlled_shutdown()
        self.stopping = True
        self.phase = "shutting down"
        # Stop answering before anything else goes: a leaving broker must not go on
        # acting as a leader; clients reconnect to the brokers that lead now.
        self.serving = False
        for server in self._kafka_servers:
            server.close()
        self._kafka_servers = []
        for c in list(self.connections):
            c.close()
        for sock in self._kafka_sockets:  # bound, never served
            sock.close()
        self._kafka_sockets = []
        if controlled and self._http is not None:
            await self._until_seen_unready()
        await self.share.stop()
        await self.groups.stop()
        await self.transactions.stop()
        self.txn_verifier.close()
        await self.cleaner.stop()
        await cancel_and_wait(self._tasks)
        self._tasks = []
        await self.isr.stop()
        await self.fetchers.stop()
        if self.colocated is not None:
            await self.colocated.stop()
        await self.quorum.stop()
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        await self.controller.close()
        # The logs close once the quorum shell is stopped: until then a metadata record
        # may still open or sync replicas (_on_metadata).
        self.partitions.close()
        self.telemetry.shutdown()


def _new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


__all__ = ["Broker", "BrokerConfig", "BrokerStartupError"]


async def _resolved(value: bool) -> bool:
    return value
