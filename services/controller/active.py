"""The active controller: the Raft leader's duties.

Every request becomes metadata records through `operations`; they take effect when the
quorum commits them. Requests are serialized by one lock and each waits for its commit,
so validation always sees every earlier change. Broker sessions (`sessions.py`) live
only in memory: a new active controller gives every broker a fresh session.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from straitmq.metadata import features
from straitmq.metadata.image import MetadataImage, Record

from . import operations as ops
from .config import DEFAULTS
from .election import (
    leaderless_elections,
    on_broker_leaving,
    on_broker_returning,
    on_replicas_offline,
    preferred_leader_changes,
    unclean_offline_elections,
)
from .errors import ControllerError, NotController
from .mutation_quotas import THROTTLED, MutationQuotas
from .quorum import Quorum
from .sessions import GRACE_S, BrokerSessions

log = logging.getLogger("straitmq.controller")
PROBE_TIMEOUT_S = 1.0
NON_ATOMIC_ENTRY_RECORDS = 1000


@dataclass
class ControllerSettings:
    cluster_id: str
    # The defaults are ControllerConfig's (config.py).
    session_timeout_ms: int = DEFAULTS.broker_session_timeout_ms
    leader_rebalance_interval_ms: int = DEFAULTS.leader_rebalance_interval_ms
    auto_leader_rebalance: bool = DEFAULTS.auto_leader_rebalance
    default_partitions: int = DEFAULTS.default_partitions
    default_replication_factor: int = DEFAULTS.default_replication_factor
    # Written with the cluster id when the metadata log is created (bootstrap.py).
    bootstrap_records: tuple[dict, ...] = ()
    # straitmq.metadata.version of a new cluster (config.py); 1 writes no feature records.
    bootstrap_metadata_level: int = DEFAULTS.bootstrap_metadata_level
    # The controller_mutation_rate buckets' size: quota.window.num x .size.seconds.
    quota_window_num: int = DEFAULTS.quota_window_num
    quota_window_size_seconds: int = DEFAULTS.quota_window_size_seconds


def bootstrap_feature_records(level: int) -> list[Record]:
    """The feature levels a new cluster starts at: every feature at the newest level of
    the release `level` names (this code's: the newest), or none at all for level 1
    (release 0.1.0 reads no feature record)."""
    if level == 1:
        return []
    try:
        levels = features.levels_at(level)
    except ValueError as e:
        raise ValueError(f"--bootstrap-metadata-level {level}: {e}") from None
    return [{"type": "feature_level", "name": n, "level": v} for n, v in levels.items()]


def _partitions_in(records: list[Record]) -> int:
    """The partitions a topic creation (or CreatePartitions) makes: what it is charged."""
    return sum(1 for r in records if r.get("type") == "partition")


def _mono() -> float:
    return time.monotonic()


async def _answers(host: str, port: int) -> bool | None:
    """True: an HTTP server answers there. False: nothing listens (refused, or the
    connection reset before any answer: a dying process's kernel can still accept for a
    moment after the process's other sockets closed). None: no answer in time."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), PROBE_TIMEOUT_S
        )
    except ConnectionRefusedError:
        return False
    except (OSError, TimeoutError) as e:
        log.debug("probe: no answer", extra={"host": host, "port": port, "error": str(e)})
        return None
    try:
        writer.write(b"GET /healthz HTTP/1.0\r\nHost: probe\r\n\r\n")
        first = await asyncio.wait_for(reader.read(1), PROBE_TIMEOUT_S)
        if first == b"":  # nothing serves there, or an https port closing on plaintext
            return await _answers_tls(host, port)
        return True
    except (ConnectionResetError, BrokenPipeError):
        return False
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()


async def _answers_tls(host: str, port: int) -> bool | None:
    """The probe of a broker whose HTTP port speaks https (http.ssl.*): a completed TLS
    handshake is an answer (the certificate is not what is probed, so it is not checked);
    refused, or closed before the handshake ends, is nothing serving there."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx), PROBE_TIMEOUT_S
        )
    except (ConnectionRefusedError, ConnectionResetError, ssl.SSLError):
        return False
    except (OSError, TimeoutError):
        return None
    writer.close()
    return True


class ActiveController:
    def __init__(self, quorum: Quorum, settings: ControllerSettings) -> None:
        self.quorum = quorum
        self.settings = settings
        self.active = False
        self._lock = asyncio.Lock()
        self.sessions = BrokerSessions(settings.session_timeout_ms / 1000)
        self._streams: set[Any] = set()  # open session streams, closed on losing leadership
        self._probes: set[asyncio.Task] = set()
        self._caught_up_at: dict[int, int] = {}  # broker id -> metadata offset to unfence
        # The image including our appended but uncommitted entries, and the last of them.
        self._spec: MetadataImage | None = None
        self._tail: tuple[int, asyncio.Future[None]] | None = None
        self._task: asyncio.Task | None = None
        self._activation: asyncio.Task | None = None
        self.fencings = 0  # brokers fenced on session expiry while active (a metric)
        self.fast_fencings = 0  # brokers fenced at once: stream closed, port refused
        # controller_mutation_rate, for the whole cluster (the brokers name the client).
        self.mutation_quotas = MutationQuotas(
            settings.quota_window_num, settings.quota_window_size_seconds
        )
        quorum.leader_listeners.append(self._on_leadership)

    @property
    def image(self) -> MetadataImage:
        return self.quorum.image

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._housekeeping())
        self._on_leadership()

    async def stop(self) -> None:
        for t in (self._task, self._activation, *self._probes):
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    # -- becoming active -------------------------------------------------------------

    def _on_leadership(self) -> None:
        self.active = False
        self._spec, self._tail = None, None  # our uncommitted entries may be truncated
        if not self.quorum.is_leader:
            # The brokers reconnect their streams to the next active controller.
            for ws in list(self._streams):
                asyncio.get_running_loop().create_task(ws.close())
        if self.quorum.is_leader and (self._activation is None or self._activation.done()):
            self._activation = asyncio.get_running_loop().create_task(self._activate())

    async def _activate(self) -> None:
        """Wait until everything before our epoch is committed and applied, then serve."""
        try:
            await self.quorum.propose([])
            if not self.image.cluster_id:
                await self.quorum.propose(
                    [
                        {"type": "cluster", "cluster_id": self.settings.cluster_id},
                        *self.settings.bootstrap_records,
                        *bootstrap_feature_records(self.settings.bootstrap_metadata_level),
                    ]
                )
        except ControllerError:
            return
        to_probe = self.sessions.reset(
            {b.id: b.incarnation for b in self.image.brokers.values()}, _mono()
        )
        self._caught_up_at = {}
        self.active = self.quorum.is_leader
        if self.active:
            log.info("active controller", extra={"epoch": self.quorum.node.epoch})
            # A broker that died with the previous active controller has no stream left
            # to close: ask each once whether it is still there.
            for bid in to_probe:
                b = self.image.brokers.get(bid)
                if b is not None and not b.fenced:
                    self._spawn_probe(bid, b.incarnation)
            try:
                await self._finish_moves()
            except ControllerError as e:
                log.info("finishing leadership moves skipped", extra={"reason": e.message})

    async def _finish_moves(self) -> None:
        """Leadership moves are written in several entries (see `_commit`), so a failover
        can cut them short: the first entries committed, the rest lost with the previous
        active controller. Finish them: move what a fenced or shut-down broker still
        leads or is in sync for, and lead the offline partitions a live replica can.
        When nothing was cut short, this writes nothing."""
        for b in sorted(self.image.brokers.values(), key=lambda b: b.id):
            if not b.alive:
                await self._commit(functools.partial(on_broker_leaving, broker=b.id), atomic=False)
        await self._commit(leaderless_elections, atomic=False)

    def _check_active(self) -> None:
        if not self.active or not self.quorum.is_leader:
            raise NotController(self.quorum.leader_id)

    async def _commit(
        self, build: Callable[[MetadataImage], list[Record]], atomic: bool = True
    ) -> int:
        """Build records under the lock from the image as it will be once everything
        already appended commits, append them, and wait for their commit outside the
        lock: requests pipeline, and what piles up is written and replicated together.
        An answer with no records (an error, nothing to change) still waits for the
        entries it was judged against, so it never rests on an uncommitted view.

        Not `atomic`: records that are each valid alone (leadership moves when a broker
        leaves or returns) go in entries of at most NON_ATOMIC_ENTRY_RECORDS, as Kafka's
        controller writes them in bounded batches. Every process applies an entry in one
        piece, so a fencing that moves 30,000 leaderships would otherwise hold each
        broker's event loop for a second or more; the first entry carries the fencing."""
        async with self._lock:
            self._check_active()
            spec = await self._speculative()
            error: ControllerError | None = None
            done: asyncio.Future[None] | None
            try:
                records = build(spec)
            except ControllerError as e:
                error, records = e, []
            step = NON_ATOMIC_ENTRY_RECORDS if not atomic else max(len(records), 1)
            for start in range(0, len(records), step):
                entry = records[start : start + step]
                offset, done = self.quorum.append(entry)
                try:
                    spec.apply_entry(offset, entry)
                except Exception:
                    self._spec = None  # rebuilt from the committed image after this entry
                    raise
                self._tail = (offset, done)
            # With records, the wait is for the last entry: Raft commits them in order.
            if not records:
                if self._tail is not None and not self._tail[1].done():
                    offset, done = self._tail
                else:
                    offset, done = self.image.offset, None
        if done is not None:
            await self.quorum.committed(done)
        if error is not None:
            raise error
        return offset

    async def _speculative(self) -> MetadataImage:
        """The image after every entry this leader appended (committed or not). Made
        from the committed image once nothing of ours is pending: at activation every
        earlier entry is committed and applied (`_activate`)."""
        if self._spec is None:
            if self._tail is not None:
                await self.quorum.committed(self._tail[1])
            self._spec = self.image.copy()
        return self._spec

    # -- brokers ---------------------------------------------------------------------

    async def register_broker(self, req: dict) -> dict:
        bid = int(req["id"])

        def build(image: MetadataImage) -> list[Record]:
            if req.get("cluster_id") != image.cluster_id:
                raise ControllerError(
                    ErrorCode.inconsistent_cluster_id,
                    f"broker {bid} has cluster id {req.get('cluster_id')!r} but this cluster "
                    f"is {image.cluster_id!r}; point it at the right controllers or wipe "
                    "its data directory",
                )
            ranges = req.get("features") or features.RELEASE_0_1_0
            why = features.unsupported(image.finalized_features(), ranges)
            if why:
                raise ControllerError(
                    ErrorCode.unsupported_version,
                    f"broker {bid} cannot join: the cluster has finalized {why}; "
                    "run a StraitMQ release that supports these levels",
                )
            old = image.brokers.get(bid)
            # A restart reuses its listener address, so the old process is gone; a live
            # session with another address is a second process claiming the same id.
            if (
                old is not None
                and old.incarnation != req["incarnation"]
                and (old.host, old.port) != (req["host"], int(req["port"]))
                and not old.fenced
                and self.sessions.live(bid, _mono())
            ):
                raise ControllerError(
                    ErrorCode.duplicate_broker_registration,
                    f"node id {bid} is already registered by a live broker at "
                    f"{old.host}:{old.port}; every broker needs its own node id",
                )
            rec = {
                "type": "register_broker",
                "id": bid,
                "incarnation": req["incarnation"],
                "host": req["host"],
                "port": int(req["port"]),
                "http_port": int(req["http_port"]),
                "rack": req.get("rack"),
            }
            if req.get("endpoints"):  # named listeners: {name: [host, port]}
                rec["endpoints"] = {n: [h, int(p)] for n, (h, p) in req["endpoints"].items()}
            if req.get("features"):  # supported ranges (none from release 0.1.0)
                rec["features"] = {n: [int(lo), int(hi)] for n, (lo, hi) in ranges.items()}
            # A restarted broker comes back fenced: its old leaderships move first.
            return [rec, *on_broker_leaving(image, bid)] if old is not None else [rec]

        offset = await self._commit(build, atomic=False)
        self.sessions.touch(bid, req["incarnation"], _mono())
        self._caught_up_at[bid] = offset
        return {"metadata_offset": offset}

    async def heartbeat(self, req: dict) -> dict:
        self._check_active()
        bid = int(req["id"])
        b = self.image.brokers.get(bid)
        if b is None or b.incarnation != req["incarnation"]:
            raise ControllerError(ErrorCode.stale_broker_epoch, f"broker {bid} must register again")
        self.sessions.touch(bid, b.incarnation, _mono())
        offset = int(req.get("metadata_offset", -1))
        target = self._caught_up_at.setdefault(bid, self.image.offset)
        if req.get("want_shutdown"):
            if not b.shutting_down:

                def build_shutdown(image: MetadataImage) -> list[Record]:
                    return [{"type": "broker_shutdown", "id": bid}, *on_broker_leaving(image, bid)]

                await self._commit(build_shutdown, atomic=False)
        elif b.fenced and offset >= target:

            def build_unfence(image: MetadataImage) -> list[Record]:
                if not image.brokers[bid].fenced:
                    return []
                return [{"type": "unfence_broker", "id": bid}, *on_broker_returning(image, bid)]

            await self._commit(build_unfence, atomic=False)
        elif not b.fenced and (offline := [(str(t), int(i)) for t, i in req.get("offline", ())]):
            # Replicas it holds but cannot open: move what it leads and drop it from ISRs.
            # Judged first against the committed image, so a steady report costs no write.
            if on_replicas_offline(self.image, bid, offline):

                def build_offline(image: MetadataImage) -> list[Record]:
                    return on_replicas_offline(image, bid, offline)

                log.warning(
                    "replicas offline on broker", extra={"broker": bid, "replicas": len(offline)}
                )
                await self._commit(build_offline, atomic=False)
        b = self.image.brokers[bid]
        # Only a leaving broker asks (a scan of every partition, not for each heartbeat).
        shutdown_ok = b.shutting_down and not any(
            p.leader == bid for t in self.image.topics.values() for p in t.partitions
        )
        return {
            "fenced": b.fenced,
            "shutting_down": b.shutting_down,
            "shutdown_ok": shutdown_ok,
            "metadata_offset": self.image.offset,
        }

    async def _fence(self, bid: int, incarnation: str, why: str) -> bool:
        """Fence this incarnation of the broker and move its leaderships; False: no need."""

        def build(image: MetadataImage) -> list[Record]:
            b = image.brokers.get(bid)
            if b is None or b.fenced or b.incarnation != incarnation:
                return []
            return [{"type": "fence_broker", "id": bid}, *on_broker_leaving(image, bid)]

        b = self.image.brokers.get(bid)
        if b is None or b.fenced or b.incarnation != incarnation:
            return False
        log.warning("fencing broker", extra={"broker": bid, "reason": why})
        # A broker that wakes up (SIGSTOP, a healed partition) is unfenced only once
        # its metadata shows its own fencing and the leadership moves that followed.
        self._caught_up_at[bid] = await self._commit(build, atomic=False)
        return True

    async def _fence_expired(self) -> None:
        for bid in self.sessions.expired(_mono()):
            b = self.image.brokers.get(bid)
            if b is not None and await self._fence(bid, b.incarnation, "session expired"):
                self.fencings += 1

    # -- session streams: a broker's death seen at once -------------------------------

    def stream_opened(self, bid: int, incarnation: str, ws: Any) -> None:
        """A broker's session stream is open; raises if this is not the place for it."""
        self._check_active()
        arm = self.sessions.stream_opened(bid, incarnation)
        if arm is None:
            raise ControllerError(ErrorCode.stale_broker_epoch, f"broker {bid} must register again")
        self._streams.add(ws)
        log.debug("session stream open", extra={"broker": bid, "incarnation": incarnation})
        if arm:  # see that its port accepts while it lives
            self._spawn_probe(bid, incarnation)

    def stream_closed(self, bid: int, incarnation: str, ws: Any) -> None:
        self._streams.discard(ws)
        log.debug("session stream closed", extra={"broker": bid, "incarnation": incarnation})
        if self.active and self.sessions.stream_closed(bid, incarnation):
            self._spawn_probe(bid, incarnation)

    def _spawn_probe(self, bid: int, incarnation: str) -> None:
        task = asyncio.get_running_loop().create_task(self._probe(bid, incarnation))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, bid: int, incarnation: str) -> None:
        """Ask the broker's HTTP port for /healthz: an answer arms the fast path for it;
        a refusal, or a reset without an answer, fences it at once if the sessions say a
        refusal counts now. No answer in time (a frozen process) proves nothing."""
        b = self.image.brokers.get(bid)
        if b is None or b.incarnation != incarnation:
            return  # a fenced one is probed too: a broker registers fenced, then arms
        answer = await _answers(b.host, b.http_port)
        if answer:
            self.sessions.probe_connected(bid, incarnation)
            log.debug("probe: answered", extra={"broker": bid, "incarnation": incarnation})
        if answer is not False:
            return  # alive, or no proof either way: the session timeout decides
        if self.sessions.needs_grace(bid):
            await asyncio.sleep(GRACE_S)  # a running broker reconnects its stream meanwhile
        if not self.active or not self.sessions.probe_refused(bid, incarnation):
            log.debug("probe: refused, not counted", extra={"broker": bid})
            return
        try:
            if await self._fence(
                bid, incarnation, "its session stream closed and its port refuses connections"
            ):
                self.fast_fencings += 1
        except ControllerError as e:
            log.info("fencing skipped", extra={"broker": bid, "reason": e.message})

    async def _housekeeping(self) -> None:
        last_rebalance = _mono()
        while True:
            await asyncio.sleep(0.25)
            if not self.active:
                continue
            try:
                await self._fence_expired()
                interval = self.settings.leader_rebalance_interval_ms / 1000
                if self.settings.auto_leader_rebalance and _mono() - last_rebalance > interval:
                    last_rebalance = _mono()
                    await self._commit(preferred_leader_changes, atomic=False)
            except ControllerError as e:
                log.info("housekeeping skipped", extra={"reason": e.message})

    # -- topics ----------------------------------------------------------------------

    async def create_topic(self, req: dict) -> dict:
        charged: dict[str, Any] = {}

        def build(image: MetadataImage) -> list[Record]:
            records = ops.create_topic(
                image,
                req["name"],
                int(req.get("partitions", -1)),
                int(req.get("replication_factor", -1)),
                req.get("configs") or {},
                self.settings.default_partitions,
                self.settings.default_replication_factor,
                req.get("assignments"),
                bool(req.get("internal", False)),
            )
            if req.get("validate_only"):
                return []
            return self._charge(image, req, _partitions_in(records), charged, records)

        return self._charged({"offset": await self._commit(build)}, charged)

    async def delete_topic(self, req: dict) -> dict:
        charged: dict[str, Any] = {}

        def build(image: MetadataImage) -> list[Record]:
            records = ops.delete_topic(image, req["name"])
            partitions = len(image.topics[req["name"]].partitions)
            return self._charge(image, req, partitions, charged, records)

        return self._charged({"offset": await self._commit(build)}, charged)

    async def create_partitions(self, req: dict) -> dict:
        charged: dict[str, Any] = {}

        def build(image: MetadataImage) -> list[Record]:
            records = ops.create_partitions(
                image, req["name"], int(req["count"]), req.get("assignments")
            )
            if req.get("validate_only"):
                return []
            return self._charge(image, req, _partitions_in(records), charged, records)

        return self._charged({"offset": await self._commit(build)}, charged)

    def _charge(
        self, image: MetadataImage, req: dict, partitions: int, out: dict, records: list[Record]
    ) -> list[Record]:
        """A topic passed its checks: charge its partitions to the client's
        controller_mutation_rate allowance, if the broker named a client and a quota
        applies (Kafka's ReplicationControlManager, `applyPartitionChangeQuota`, with
        ControllerApis' Strict/PermissiveControllerMutationQuota). The records, or none
        when a strict request is over its quota (`out` says so, with the throttle)."""
        client = req.get("client")
        if not client or not partitions:
            return records
        now = _mono() * 1000.0
        allowance = self.mutation_quotas.allowance(
            image, str(client.get("user", "")), str(client.get("client_id", "")), now
        )
        if allowance is None:
            return records
        refused, ms = self.mutation_quotas.charge(
            allowance, partitions, bool(client.get("strict")), now
        )
        out["throttle_ms"] = ms
        if refused:
            out["refused"] = True
            return []
        return records

    @staticmethod
    def _charged(reply: dict, charged: dict) -> dict:
        """The answer with the quota's verdict: `throttle_ms`, and Kafka's
        THROTTLING_QUOTA_EXCEEDED for a topic refused (nothing was changed)."""
        if charged.get("throttle_ms"):
            reply["throttle_ms"] = charged["throttle_ms"]
        if charged.get("refused"):
            reply["error_code"] = ErrorCode.throttling_quota_exceeded
            reply["message"] = THROTTLED
        return reply

    async def alter_configs(self, req: dict) -> dict:
        def build(image: MetadataImage) -> list[Record]:
            records = ops.alter_configs(image, req["name"], req["changes"])
            if req.get("validate_only"):
                return []
            if req["changes"].get("unclean.leader.election.enable") == "true":
                records += unclean_offline_elections(image, req["name"])
            return records

        return {"offset": await self._commit(build)}

    async def alter_cluster_configs(self, req: dict) -> dict:
        return {
            "offset": await self._commit(lambda image: ops.alter_cluster_configs(req["changes"]))
        }

    async def alter_scram_credentials(self, req: dict) -> dict:
        """Upsert and delete SCRAM credentials (already salted and hashed by the broker);
        deleting one that does not exist is that user's RESOURCE_NOT_FOUND."""
        errors: dict[str, str] = {}

        def build(image: MetadataImage) -> list[Record]:
            errors.clear()
            records, missing = ops.alter_scram_credentials(
                image, req.get("upsertions", []), req.get("deletions", [])
            )
            errors.update(missing)
            return records

        return {"offset": await self._commit(build), "errors": errors}

    async def alter_acls(self, req: dict) -> dict:
        """Add and remove ACL bindings (7-value lists, Kafka's codes)."""

        def build(image: MetadataImage) -> list[Record]:
            return ops.alter_acls(image, req.get("creations", []), req.get("deletions", []))

        return {"offset": await self._commit(build)}

    async def alter_client_quotas(self, req: dict) -> dict:
        """{"entries": [{"entity", "ops"}], "validate_only"}: the refused entries by
        position ({"errors": {"i": why}}); the others commit together."""
        refused: dict[int, str] = {}

        def build(image: MetadataImage) -> list[Record]:
            records, why = ops.alter_client_quotas(image, list(req.get("entries", ())))
            refused.clear()
            refused.update(why)
            return [] if req.get("validate_only") else records

        offset = await self._commit(build)
        return {"offset": offset, "errors": {str(i): why for i, why in refused.items()}}

    async def allocate_producer_ids(self, req: dict) -> dict:
        start = 0

        def build(image: MetadataImage) -> list[Record]:
            nonlocal start
            start, records = ops.allocate_producer_ids(image)
            return records

        offset = await self._commit(build)
        return {"start": start, "count": ops.PRODUCER_ID_BLOCK, "offset": offset}

    # -- partitions ------------------------------------------------------------------

    async def alter_partition(self, req: dict) -> dict:
        name, index = req["topic"], int(req["index"])
        offset = await self._commit(
            lambda image: ops.alter_partition(
                image,
                int(req["broker"]),
                name,
                index,
                int(req["leader_epoch"]),
                int(req["partition_epoch"]),
                [int(r) for r in req["isr"]],
                ops.incarnations_of(req),
            )
        )
        p = self.image.topics[name].partitions[index]
        return {
            "offset": offset,
            "leader": p.leader,
            "leader_epoch": p.leader_epoch,
            "partition_epoch": p.partition_epoch,
            "isr": p.isr,
        }

    async def alter_partitions(self, req: dict) -> dict:
        """A leader's batch of ISR changes in one metadata entry; an answer per item, in
        order: the partition's new state, or the refusal alter_partition would give."""
        items = list(req["partitions"])
        refused: dict[int, ControllerError] = {}

        def build(image: MetadataImage) -> list[Record]:
            records, why = ops.alter_partitions(image, int(req["broker"]), items)
            refused.clear()
            refused.update(why)
            return records

        offset = await self._commit(build)
        answers: list[dict] = []
        for i, it in enumerate(items):
            e = refused.get(i)
            t = self.image.topics.get(it["topic"])
            if e is None and (t is None or int(it["index"]) >= len(t.partitions)):
                e = ControllerError(ErrorCode.unknown_topic_or_partition, "deleted meanwhile")
            if e is not None:
                answers.append({"error_code": int(e.code), "message": e.message})
                continue
            assert t is not None
            p = t.partitions[int(it["index"])]
            answers.append(
                {
                    "error_code": 0,
                    "leader": p.leader,
                    "leader_epoch": p.leader_epoch,
                    "partition_epoch": p.partition_epoch,
                    "isr": p.isr,
                }
            )
        return {"offset": offset, "partitions": answers}

    async def reassign(self, req: dict) -> dict:
        """{"partitions": [{"topic", "index", "replicas": [ids] | null}], "throttle":
        bytes/s | null (optional)}: all or nothing, the throttle (when given) and the moves
        in one metadata entry, so the copying starts throttled and a refused move leaves
        the throttle as it was."""

        def build(image: MetadataImage) -> list[Record]:
            records: list[Record] = []
            if "throttle" in req:
                rate = req["throttle"]
                records += ops.alter_cluster_configs(
                    {"replication.throttled.rate": None if rate is None else str(rate)}
                )
            for item in req["partitions"]:
                target = item.get("replicas")
                records += ops.reassign(
                    image,
                    item["topic"],
                    int(item["index"]),
                    [int(r) for r in target] if target is not None else None,
                )
            return records

        return {"offset": await self._commit(build)}

    def list_reassignments(self) -> dict:
        out = []
        for t in self.image.topics.values():
            for i, p in enumerate(t.partitions):
                if p.adding or p.removing:
                    out.append(
                        {
                            "topic": t.name,
                            "index": i,
                            "replicas": p.replicas,
                            "adding": p.adding,
                            "removing": p.removing,
                            "isr": p.isr,
                        }
                    )
        return {"reassignments": out}

    async def elect_preferred(self, req: dict) -> dict:
        """{"partitions": [{"topic", "index"}]} or nothing for every partition."""
        items = req.get("partitions")
        only = {(p["topic"], int(p["index"])) for p in items} if items is not None else None
        offset = await self._commit(
            lambda image: preferred_leader_changes(image, only), atomic=False
        )
        return {"offset": offset}

    # -- feature levels --------------------------------------------------------------

    async def update_features(self, req: dict) -> dict:
        """{"updates": {feature: [level, upgrade type]}, "validate_only": bool} ->
        {"errors": {feature: [code, message]}, "offset"}: UpdateFeatures, all or nothing,
        refused unless every broker and every voter supports the new levels."""
        self._check_active()
        updates = {str(n): (int(lv), int(kind)) for n, (lv, kind) in req["updates"].items()}
        voters = await self._voter_ranges()
        refusals: dict[str, features.FeatureRefused] = {}

        def build(image: MetadataImage) -> list[Record]:
            nodes: dict[str, Any] = dict(voters)
            for bid in image.brokers:
                nodes[f"broker {bid}"] = image.broker_features.get(bid, features.RELEASE_0_1_0)
            records, refused = features.plan_update(image.features, updates, nodes)
            refusals.update(refused)
            return [] if req.get("validate_only") else records

        offset = await self._commit(build)
        if refusals:
            log.info(
                "feature update refused",
                extra={"refusals": {n: e.message for n, e in refusals.items()}},
            )
        elif not req.get("validate_only"):
            log.info("features finalized", extra={"updates": updates, "offset": offset})
        return {
            "errors": {n: [e.code, e.message] for n, e in refusals.items()},
            "offset": offset,
        }

    async def _voter_ranges(self) -> dict[str, Any]:
        """Each voter's supported ranges; release 0.1.0's for a voter that does not know
        the call, and a refusal for one that cannot be asked (it might be older)."""
        out: dict[str, Any] = {}
        me = self.quorum.node_id
        # The voter set in force (KIP-853), not the address book: a removed voter is gone.
        for vid in sorted(self.quorum.node.voter_set.ids):
            name = f"controller {vid}"
            if vid == me:
                out[name] = features.supported_ranges()
                continue
            status, body = await self.quorum.call_peer(vid, "supported_features", {})
            if status == 200 and isinstance(body, dict) and "features" in body:
                out[name] = body["features"]
            elif status == 404:
                out[name] = features.RELEASE_0_1_0
            else:
                raise ControllerError(
                    ErrorCode.feature_update_failed,
                    f"cannot ask {name} which feature levels it supports "
                    f"({body if isinstance(body, str) else status}); every voter must "
                    "answer before a level is finalized",
                )
        return out

    def describe(self) -> dict:
        """Brokers and partition health as the active controller sees them."""
        image = self.image
        offline, under = image.partition_health()
        return {
            "offset": image.offset,
            "cluster_id": image.cluster_id,
            "active": self.active,
            "brokers": image.describe_brokers(),
            "offline_partitions": offline,
            "under_replicated_partitions": under,
        }


Handler = Callable[[dict], Awaitable[dict]]


def handlers(c: ActiveController) -> dict[str, Handler]:
    """The controller RPCs by name, for the HTTP API and the in-process client."""

    async def list_reassignments(req: dict) -> dict:
        c._check_active()
        return c.list_reassignments()

    async def describe(req: dict) -> dict:
        return c.describe()

    async def supported_features(req: dict) -> dict:
        """This controller's supported ranges (any controller answers, not just the
        active one): what a finalization must fit."""
        return {"features": features.supported_ranges()}

    async def describe_quorum(req: dict) -> dict:
        """The Raft leader's view of its voters and observers (DescribeQuorum), times as
        wall-clock milliseconds (the core keeps monotonic ones)."""
        c._check_active()
        st = c.quorum.status()
        replicas = (*st["voters"], *st["observers"])  # a leader removing itself observes
        core_now = next(v["last_fetch_ms"] for v in replicas if v["node_id"] == st["node_id"])
        skew = int(time.time() * 1000) - core_now

        def wall(ms: int | None) -> int:
            return -1 if ms is None else ms + skew

        for r in (*st["voters"], *st["observers"]):
            r["last_fetch_ms"] = wall(r["last_fetch_ms"])
            r["last_caught_up_ms"] = wall(r["last_caught_up_ms"])
        st["voter_urls"] = {str(n): url for n, url in c.quorum.voters.items()}
        return st

    def voter_change(op: str) -> Handler:
        async def change(req: dict) -> dict:
            """{"node_id", "directory_id", "endpoint" ("host:port"), "timeout_s"}: the
            voter change, answered once committed (KIP-853's AddRaftVoter and friends)."""
            c._check_active()
            directory_id = req.get("directory_id")
            endpoint = req.get("endpoint")
            if directory_id is not None and not isinstance(directory_id, str):
                raise ValueError("directory_id must be a string")
            if endpoint is not None and (not isinstance(endpoint, str) or ":" not in endpoint):
                raise ValueError("endpoint must be host:port")
            if op == "add" and endpoint is None and int(req["node_id"]) not in c.quorum.voters:
                raise ValueError(
                    "endpoint (host:port) is needed: the voters must reach the new one"
                )
            return await c.quorum.change_voter(
                op,
                int(req["node_id"]),
                directory_id,
                endpoint,
                within_s=float(req.get("timeout_s", 30.0)),
            )

        return change

    table: dict[str, Any] = {
        "register": c.register_broker,
        "heartbeat": c.heartbeat,
        "create_topic": c.create_topic,
        "delete_topic": c.delete_topic,
        "create_partitions": c.create_partitions,
        "alter_configs": c.alter_configs,
        "alter_cluster_configs": c.alter_cluster_configs,
        "allocate_producer_ids": c.allocate_producer_ids,
        "alter_scram_credentials": c.alter_scram_credentials,
        "alter_acls": c.alter_acls,
        "alter_client_quotas": c.alter_client_quotas,
        "alter_partition": c.alter_partition,
        "alter_partitions": c.alter_partitions,
        "reassign": c.reassign,
        "list_reassignments": list_reassignments,
        "elect_preferred": c.elect_preferred,
        "describe": describe,
        "describe_quorum": describe_quorum,
        "update_features": c.update_features,
        "supported_features": supported_features,
        "add_voter": voter_change("add"),
        "remove_voter": voter_change("remove"),
        "update_voter": voter_change("update"),
    }
    return table
