"""The asyncio shell around the sans-IO Raft node: disk, HTTP transport, timers, and the
metadata image built from what commits.

Transport is request/response over HTTP: a request message (Fetch, Vote, ...) is POSTed
to the peer's `/raft`; the peer steps it and answers with the response message its node
produces for that sender (a parked long-poll Fetch answers when the node releases it).
Voters and observers (brokers following the metadata log) use the same shell.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import heapq
import itertools
import logging
import os
import random
import sys
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
import orjson
from kio.schema.errors import ErrorCode
from straitmq.metadata.image import MetadataImage, MetadataVersionError, Record
from straitmq.raft import messages as M
from straitmq.raft.core import NotLeader, RaftConfig, RaftNode, VoterChangeRefused
from straitmq.raft.storage import FileStorage, Snapshot, StorageOp
from straitmq.raft.storage import apply as apply_ops
from straitmq.raft.voters import Voter, VoterSet, is_control

from straitmq.admin_client import AdminAuth
from straitmq.invariants import InvariantBroken, broken

from .errors import ControllerError, NotController

log = logging.getLogger("straitmq.quorum")

T = TypeVar("T")
TICK_S = 0.02
EXIT_STORAGE = 74  # EX_IOERR: the metadata log could not be written
# EX_CONFIG: the metadata log holds what this release cannot read or serve (a newer record,
# a finalized feature level beyond its range). The node stops instead of misreading it.
EXIT_METADATA_VERSION = 78
SNAPSHOT_EVERY = 2000  # applied entries between metadata snapshots
# Longest stretch the event loop spends applying committed entries before it serves its
# sockets again: a broker catching up on thousands of topic records at once must not
# stall its Kafka listener. The image stays whole-entry consistent (its offset says how
# far it got), and the rest is applied on the next turn of the loop.
APPLY_SLICE_S = 0.02
# Requests waiting for this node's image to reach an offset (wait_applied: a broker's
# admin request after its controller call, a lifecycle step); past it one is refused
# with REQUEST_TIMED_OUT (retriable), after dropping the waits that timed out already.
MAX_APPLIED_WAITERS = 10_000
# A peer's Raft requests of one kind waiting for our node's answer: one, unless its
# earlier ones timed out on its side; past it one goes unanswered (204), as at a timeout.
MAX_REPLY_WAITERS_PER_PEER = 8
RESPONSE_OF = {
    "FetchRequest": "FetchResponse",
    "FetchSnapshotRequest": "FetchSnapshotResponse",
    "VoteRequest": "VoteResponse",
    "BeginQuorumEpoch": "BeginQuorumEpochResponse",
    "EndQuorumEpoch": "EndQuorumEpochResponse",
}
# Listener(offset, records, reset): reset=True means the image was replaced by a snapshot.
Listener = Callable[[int, list[Record], bool], None]


def _no_op() -> None:
    return None


def now_ms() -> int:
    return int(time.monotonic() * 1000)


RAFT_DIR = "metadata-raft"  # the Raft log, under the data directory
CONTROLLER_LISTENER = "CONTROLLER"  # the endpoint name voters are reached on
# Why a voter change was refused -> the Kafka error code the admin APIs answer with.
REFUSAL_CODES = {
    VoterChangeRefused.NOT_READY: ErrorCode.request_timed_out,
    VoterChangeRefused.PENDING: ErrorCode.request_timed_out,
    VoterChangeRefused.NOT_CAUGHT_UP: ErrorCode.request_timed_out,
    VoterChangeRefused.DUPLICATE: ErrorCode.duplicate_voter,
    VoterChangeRefused.NOT_FOUND: ErrorCode.voter_not_found,
    VoterChangeRefused.LAST_VOTER: ErrorCode.invalid_request,
    VoterChangeRefused.LOSES_MAJORITY: ErrorCode.invalid_request,
}


def new_directory_id() -> str:
    """A Kafka directory id: a random UUID, URL-safe base64 without padding."""
    return kafka_uuid(uuid.uuid4())


def kafka_uuid(u: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


def parse_kafka_uuid(s: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(s + "=" * (-len(s) % 4)))


def load_directory_id(data_dir: str, node_id: int, cluster_id: str) -> str:
    """This controller's directory id, from `meta.properties` in its data directory
    (Kafka's v1 layout, so Kafka's tools read it); a new one when the storage is new."""
    path = os.path.join(data_dir, "meta.properties")
    props: dict[str, str] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep and not key.startswith("#"):
                    props[key.strip()] = value.strip()
    raft_dir = os.path.join(data_dir, RAFT_DIR)
    if props.get("directory.id") and os.path.isdir(raft_dir):
        return props["directory.id"]
    # No id yet, or the metadata log is gone (its votes and entries with it): this is
    # new storage, and must not pass for the voter the old one was.
    props.update(
        {
            "version": "1",
            "cluster.id": props.get("cluster.id", cluster_id),
            "node.id": props.get("node.id", str(node_id)),
            "directory.id": new_directory_id(),
        }
    )
    os.makedirs(raft_dir, exist_ok=True)
    os.makedirs(data_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(f"{k}={v}\n" for k, v in props.items()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return props["directory.id"]


def static_voter_set(voters: dict[int, str]) -> VoterSet:
    """The --voters flags as the first voter set: no directory ids (any storage of that
    id counts, as a static KRaft quorum), the flags' addresses as endpoints."""
    out = []
    for node, url in voters.items():
        address = url.partition("://")[2]
        endpoints = ((CONTROLLER_LISTENER, address),) if address else ()
        out.append(Voter(node, None, endpoints))
    return VoterSet.of(out)


def parse_voters(spec: str) -> dict[int, str]:
    """'1@127.0.0.1:9093,2@host:9093' -> {1: 'http://127.0.0.1:9093', ...}"""
    voters: dict[int, str] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        node, _, addr = part.partition("@")
        if not node.isdigit() or ":" not in addr:
            raise ValueError(f"voter '{part}' is not of the form <id>@<host>:<port>")
        voters[int(node)] = f"http://{addr}"
    if not voters:
        raise ValueError("no controller voters given")
    return voters


class Quorum:
    def __init__(
        self,
        node_id: int,
        voters: dict[int, str],
        data_dir: str,
        config: RaftConfig | None = None,
        auth: AdminAuth | None = None,
        directory_id: str | None = None,
    ) -> None:
        self.node_id = node_id
        # Where each node is reached: the --voters flags, plus every voter of the set in
        # force (its endpoints), kept up to date in place (a ControllerClient shares it).
        self.voters = voters
        self.auth = auth  # TLS context and credentials for https voters (None: plain)
        self.config = config or RaftConfig()
        self.storage = FileStorage(os.path.join(data_dir, RAFT_DIR))
        self.node = RaftNode(
            node_id,
            static_voter_set(voters),
            self.storage,
            self.config,
            random.Random(),
            now_ms(),
            persist_inline=False,
            directory_id=directory_id,
        )
        self._voter_set_seen: VoterSet | None = None
        # Storage ops handed out by the node, written by one worker thread at a time;
        # what piles up while a batch is written goes out as the next batch (one fsync).
        self._unwritten: list[tuple[list[StorageOp], int]] = []
        self._writing: asyncio.Task | None = None
        self.image = MetadataImage()
        self.listeners: list[Listener] = []
        self.leader_listeners: list[Callable[[], None]] = []
        self._applied_since_snapshot = 0
        self._to_apply: deque[tuple[int, Any] | Snapshot] = deque()  # committed, not applied
        self._apply_again: asyncio.Handle | None = None
        self._commit_waiters: dict[int, tuple[int, asyncio.Future[None]]] = {}
        # (offset, seq, future): resolved once the image has applied `offset`.
        self._applied_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_seq = itertools.count()
        # Resolved at the end of every pump: a wake-up for "has anything changed?" waits.
        self._pumped: asyncio.Future[None] | None = None
        self._reply_waiters: dict[tuple[int, str], deque[asyncio.Future[Any]]] = defaultdict(deque)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task] = set()
        self._ticker: asyncio.Task | None = None
        self._was_leader = False
        self.closed = False
        self.commit_latency: Callable[[float], None] | None = None  # seconds, per proposal

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        auth = self.auth
        url = next(iter(self.voters.values()), "")  # the voters share one scheme
        header = auth.header_for(url) if auth is not None else None
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None),
            connector=aiohttp.TCPConnector(
                limit_per_host=8, ssl=(auth.context() if auth else None) or True
            ),
            headers={"Authorization": header} if header else None,
        )
        self._advance(lambda: None)
        self._ticker = asyncio.get_running_loop().create_task(self._tick_loop())

    async def stop(self, resign: bool = True) -> None:
        if resign and self.node.is_leader:
            await self._resign()
        self.closed = True
        if self._writing is not None:  # never cut a write short
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._writing
        if self._ticker:
            self._ticker.cancel()
        if self._apply_again is not None:
            self._apply_again.cancel()
        for t in list(self._tasks):
            t.cancel()
        for task in [self._ticker, *self._tasks]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._session:
            await self._session.close()
        self._fail_waiters(NotController(None))

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self._advance(lambda: self.node.tick(now_ms()))

    async def _resign(self) -> None:
        """Hand over leadership: EndQuorumEpoch to every other voter, so the most caught
        up one campaigns at once instead of after an election timeout. Returns once those
        messages are answered (or failed), within one request timeout in all: they wait
        in the node for what it has not persisted yet, then go out as HTTP requests."""
        before = set(self._tasks)
        self._advance(lambda: self.node.resign(now_ms()))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_ms / 1000
        while self.node.unsent and loop.time() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed(), deadline - loop.time())
        sends = self._tasks - before
        if sends:
            await asyncio.wait(sends, timeout=max(0.0, deadline - loop.time()))

    def _advance(self, op: Callable[[], T]) -> T:
        """Every call into the Raft node goes through here, then the pump. The core's
        invariants stop the process themselves (`straitmq.invariants`); a plain assert
        of the core that fails does the same, through the same check, wherever the call
        came from (tick, a peer's request, a proposal): a node whose state is known to
        be wrong must not go on voting, leading or answering."""
        try:
            result = op()
            self._pump()
            return result
        except InvariantBroken:
            raise  # already recorded (in-process tests and simulations only)
        except AssertionError as e:
            broken("the raft core's assertions hold", node=self.node_id, error=str(e))

    # -- status ----------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.node.is_leader

    @property
    def leader_id(self) -> int | None:
        return self.node.leader_id

    def status(self) -> dict:
        st = self.node.status()
        st["applied_offset"] = self.image.offset
        return st

    def caught_up(self) -> bool:
        """A leader is known and our image holds everything it had committed when it
        last told us its high watermark."""
        st = self.node.status()
        return st.get("leader_id") is not None and self.image.offset + 1 >= st["high_watermark"]

    # -- waiting on the image ----------------------------------------------------------

    async def wait_applied(self, offset: int, within_s: float) -> None:
        """Return once the image has applied the entry at `offset`; ControllerError
        ErrorCode.request_timed_out if it has not within `within_s` (never act on a stale view)."""
        if self.image.offset >= offset:
            return
        if len(self._applied_waiters) >= MAX_APPLIED_WAITERS:
            # Waits that timed out stay in the heap until the image passes them: drop
            # them now; still full, this one is refused as if it had timed out.
            self._applied_waiters = [w for w in self._applied_waiters if not w[2].done()]
            heapq.heapify(self._applied_waiters)
            if len(self._applied_waiters) >= MAX_APPLIED_WAITERS:
                raise ControllerError(
                    ErrorCode.request_timed_out,
                    f"{MAX_APPLIED_WAITERS} requests wait for this node's metadata to reach "
                    f"an offset already (it is at {self.image.offset}); try again",
                )
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._applied_waiters, (offset, next(self._waiter_seq), fut))
        try:
            await asyncio.wait_for(fut, within_s)
        except TimeoutError:
            raise ControllerError(
                ErrorCode.request_timed_out,
                f"this node's metadata has reached offset {self.image.offset}, not {offset}, "
                f"after {within_s:g} s (is the controller quorum reachable?)",
            ) from None

    async def changed(self) -> None:
        """Return after the next pump: messages handled, entries applied or a tick."""
        if self._pumped is None or self._pumped.done():
            self._pumped = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._pumped)

    def _wake_waiters(self) -> None:
        waiters = self._applied_waiters
        while waiters and waiters[0][0] <= self.image.offset:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(None)
        if self._pumped is not None and not self._pumped.done():
            self._pumped.set_result(None)

    # -- proposing -------------------------------------------------------------------

    async def propose(self, records: list[Record], within_s: float = 10.0) -> int:
        """Append records as one entry; return its offset once it is committed and applied."""
        offset, done = self.append(records)
        await self.committed(done, within_s)
        return offset

    def append(self, records: list[Record]) -> tuple[int, asyncio.Future[None]]:
        """Append records as one entry without waiting: its offset, and a future resolved
        once it is committed and applied (NotController if it never will be)."""
        start = time.monotonic()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def append() -> int:
            offset = self.node.propose(records)
            # Registered before the pump: a one-voter quorum commits within it.
            self._commit_waiters[offset] = (self.node.epoch, fut)
            return offset

        try:
            offset = self._advance(append)
        except NotLeader as e:
            raise NotController(e.leader_id) from None

        def done(f: asyncio.Future[None]) -> None:
            if f.cancelled() or f.exception() is not None:  # retrieved: nobody may wait
                return
            if self.commit_latency is not None:
                self.commit_latency(time.monotonic() - start)

        fut.add_done_callback(done)
        return offset, fut

    @staticmethod
    async def committed(done: asyncio.Future[None], within_s: float = 10.0) -> None:
        """Wait for an appended entry's future (several callers may share one)."""
        finished, _ = await asyncio.wait({done}, timeout=within_s)
        if not finished:
            raise ControllerError(
                ErrorCode.request_timed_out,
                "the metadata change did not commit in time (no quorum?)",
            )
        done.result()

    def _fail_waiters(self, exc: Exception) -> None:
        for _, fut in self._commit_waiters.values():
            if not fut.done():
                fut.set_exception(exc)
        self._commit_waiters.clear()

    # -- the pump: move what the node produced to disk, network and the image ---------

    def _pump(self) -> None:
        node = self.node
        ops, seq = node.take_storage()
        if ops:
            self._unwritten.append((ops, seq))
        if self._unwritten and self._writing is None and not self.closed:
            batches, self._unwritten = self._unwritten, []
            self._writing = asyncio.get_running_loop().create_task(self._write(batches))
        for msg in node.take_messages():
            kind = type(msg).__name__
            if kind in RESPONSE_OF.values():
                waiters = self._reply_waiters.get((msg.dst, kind))
                while waiters:
                    fut = waiters.popleft()
                    if not fut.done():
                        fut.set_result(msg)
                        break
            else:
                self._spawn(self._send(msg))
        if node.voter_set is not self._voter_set_seen:
            self._sync_voter_urls()
        self._to_apply.extend(node.take_committed())
        self._apply_committed()
        if self._applied_since_snapshot >= SNAPSHOT_EVERY:
            self._applied_since_snapshot = 0
            # Pre-encoded JSON, re-encoding only the topics changed since the last one;
            # storage and FetchSnapshot embed it as it is.
            node.create_snapshot(self.image.offset + 1, orjson.Fragment(self.image.encoded()))
        leader = node.is_leader
        if leader != self._was_leader:
            self._was_leader = leader
            if not leader:
                self._fail_waiters(NotController(node.leader_id))
            for cb in self.leader_listeners:
                cb()
        self._wake_waiters()

    def _apply_committed(self) -> None:
        """Apply committed entries in order, for at most APPLY_SLICE_S; what is left goes
        on in a later turn of the loop (through the pump, so waiters and snapshots follow)."""
        if self._apply_again is not None:
            self._apply_again.cancel()
            self._apply_again = None
        queue = self._to_apply
        started = time.monotonic()
        while queue:
            if time.monotonic() - started > APPLY_SLICE_S and not self.closed:
                self._apply_again = asyncio.get_running_loop().call_soon(self._advance, _no_op)
                return
            item = queue.popleft()
            try:
                self._apply_one(item)
            except MetadataVersionError as e:
                _refuse(e)

    def _apply_one(self, item: tuple[int, Any] | Snapshot) -> None:
        if isinstance(item, Snapshot):
            self.image = MetadataImage.from_dict(item.data)
            self.image.offset = item.end_offset - 1
            self._applied_since_snapshot = 0
            for listener in self.listeners:
                listener(self.image.offset, [], True)
            return
        offset, entry = item
        records = [] if is_control(entry.data) else entry.data
        self.image.apply_entry(offset, records)
        self._applied_since_snapshot += 1
        waiter = self._commit_waiters.pop(offset, None)
        if waiter is not None and not waiter[1].done():
            if waiter[0] == entry.epoch:
                waiter[1].set_result(None)
            else:
                waiter[1].set_exception(NotController(self.node.leader_id))
        if records:
            for listener in self.listeners:
                listener(offset, records, False)

    async def _write(self, batches: list[tuple[list[StorageOp], int]]) -> None:
        """Persist off the event loop, then tell the node (which may release messages,
        move the high watermark and hand out the next batch)."""
        ops = [op for batch, _ in batches for op in batch]
        try:
            await asyncio.to_thread(apply_ops, self.storage, ops)
        except OSError as e:
            # The metadata log cannot be written: this node must not vote or acknowledge
            # anything it did not persist. Stop, saying why (a restart recovers).
            log.critical("cannot write the metadata log; stopping this node", exc_info=True)
            print(f"cannot write the metadata log ({e}); stopping", file=sys.stderr, flush=True)
            os._exit(EXIT_STORAGE)
        finally:
            self._writing = None
        if not self.closed:
            self._advance(lambda: self.node.persisted(batches[-1][1]))

    def _sync_voter_urls(self) -> None:
        vs = self._voter_set_seen = self.node.voter_set
        scheme = next((u.partition("://")[0] for u in self.voters.values() if u), "http")
        for v in vs.voters:
            address = dict(v.endpoints).get(CONTROLLER_LISTENER)
            if address:
                self.voters[v.node_id] = f"{scheme}://{address}"

    # -- voter changes (KIP-853) -----------------------------------------------------

    async def change_voter(
        self,
        op: str,
        node_id: int,
        directory_id: str | None,
        endpoint: str | None = None,
        within_s: float = 30.0,
    ) -> dict[str, Any]:
        """Add, remove or update a voter on the leader; return once the new voter set
        is committed. NotController on a follower; ControllerError with the reason when
        refused (nothing changed), or when it did not commit in time."""
        endpoints = ((CONTROLLER_LISTENER, endpoint),) if endpoint else ()
        voter = Voter(node_id, directory_id, endpoints)
        calls = {
            "add": lambda: self.node.add_voter(voter),
            "remove": lambda: self.node.remove_voter(node_id, directory_id),
            "update": lambda: self.node.update_voter(voter),
        }
        if op not in calls:
            raise ControllerError(ErrorCode.invalid_request, f"no voter change {op!r}")
        started = time.monotonic()
        try:
            offset = self._advance(calls[op])
        except NotLeader as e:
            raise NotController(e.leader_id) from None
        except VoterChangeRefused as e:
            # Kafka's own message where Kafka has one for the refusal (AddVoterHandler,
            # RemoveVoterHandler); StraitMQ's own refusals are prefixed with their name.
            kafkas = e.code in (VoterChangeRefused.PENDING, VoterChangeRefused.NOT_READY)
            message = str(e) if kafkas else f"{e.code}: {e}"
            raise ControllerError(REFUSAL_CODES[e.code], message) from None
        epoch = self.node.epoch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while self.node.high_watermark <= offset:
            if self.node.epoch != epoch or not self.node.is_leader:
                # The entry may still commit under the next leader, or be truncated.
                raise ControllerError(
                    ErrorCode.not_leader_or_follower,
                    f"leadership moved before the voter change at offset {offset} committed; "
                    "describe the quorum to see whether it is in force",
                )
            if loop.time() >= deadline:
                raise ControllerError(
                    ErrorCode.request_timed_out,
                    f"the voter change at offset {offset} did not commit within {within_s:g} s "
                    "(it stays in force while the log holds it)",
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed(), deadline - loop.time())
        return {
            "offset": offset,
            "epoch": epoch,
            "commit_ms": round((time.monotonic() - started) * 1000, 1),
            "voters": self.node.voter_set.to_list(),
        }

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, msg: Any) -> None:
        url = self.voters.get(msg.dst)
        if url is None or self._session is None:
            return
        wait = self.config.fetch_max_wait_ms / 1000 + 2.0
        try:
            async with self._session.post(
                url + "/raft",
                data=orjson.dumps(M.to_dict(msg)),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=wait, connect=1.0),
            ) as resp:
                if resp.status != 200:
                    return
                body = await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return
        if self.closed:
            return
        reply = M.from_dict(orjson.loads(body))
        self._advance(lambda: self.node.step(reply, now_ms()))

    async def call_peer(
        self, node_id: int, op: str, body: dict, timeout_s: float = 5.0
    ) -> tuple[int, Any]:
        """A controller RPC on another voter: (HTTP status, its JSON answer), or (0, the
        reason) when it cannot be reached."""
        url = self.voters.get(node_id)
        if url is None or self._session is None:
            return 0, f"no address for node {node_id}"
        try:
            async with self._session.post(
                f"{url}/controller/{op}",
                data=orjson.dumps(body),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout_s, connect=1.0),
            ) as resp:
                raw = await resp.read()
                try:
                    return resp.status, orjson.loads(raw) if raw else None
                except orjson.JSONDecodeError:
                    return resp.status, raw[:200].decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return 0, f"{type(e).__name__}: {e}"

    async def handle_request(self, body: dict) -> dict | None:
        """A peer's request: step it and wait for our node's answer to that peer."""
        msg = M.from_dict(body)
        kind = RESPONSE_OF.get(type(msg).__name__)
        if kind is None:
            raise ValueError(f"not a request: {type(msg).__name__}")
        key = (msg.src, kind)
        if len(self._reply_waiters.get(key, ())) >= MAX_REPLY_WAITERS_PER_PEER:
            return None  # unanswered (204), as at a timeout: the peer asks again
        fut = asyncio.get_running_loop().create_future()
        self._reply_waiters[key].append(fut)
        self._advance(lambda: self.node.step(msg, now_ms()))
        try:
            reply = await asyncio.wait_for(fut, self.config.fetch_max_wait_ms / 1000 + 1.0)
        except TimeoutError:
            return None
        finally:
            waiters = self._reply_waiters.get(key)
            if waiters is not None and fut in waiters:
                waiters.remove(fut)
            if not waiters:
                self._reply_waiters.pop(key, None)
        return M.to_dict(reply)


def _refuse(e: MetadataVersionError) -> None:
    """Stop this node: its metadata log holds what this release cannot read or serve.
    Never applied past, never rewritten; the release that wrote it (or a newer one)
    starts on the same data."""
    log.critical("stopping: %s", e, extra={"exit_code": EXIT_METADATA_VERSION})
    print(f"StraitMQ cannot run on this cluster's metadata: {e}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(EXIT_METADATA_VERSION)
