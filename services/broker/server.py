"""The Kafka listener: framing, per-connection ordering, dispatch, zero-copy writes.

Each connection handles its requests one at a time, in order, as Kafka does (responses
must come back in request order); clients pipeline, so the next request is already
buffered. One exception, where Kafka waits: while an acks=all Produce waits for its
in-sync replicas, the connection's next Produce is appended (up to MAX_PIPELINED
waiting), so a producer's in-flight batches replicate together; their answers still go
out in request order, and any other request waits until they have.

Frames over `socket.request.max.bytes`, unknown API keys and versions, and undecodable
bodies close that connection only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, cast

from kio.schema.errors import ErrorCode
from straitmq.metadata.image import MetadataImage

from straitmq.protocol.build import build
from straitmq.protocol.codec import (
    LOADED,
    ProtocolError,
    encode_response,
    parse_header_prefix,
    parse_request,
    response_schema,
)
from straitmq.protocol.codec import load as load_schemas
from straitmq.protocol.guard import check_array_lengths
from straitmq.protocol.produce_response import encode_produce_response
from straitmq.security.tls import principal_from_cert
from straitmq.tasks import settle

from .api.context import Deferred, RawResponse, RequestContext
from .api.dispatch import ApiSpec
from .api.versions import api_versions_fallback
from .client_registry import ClientRegistry, ConnectionClient
from .metrics import FOLLOWER_FETCH_KEY, BrokerMetrics
from .quotas import ClientQuotas, ConnectionRates, user_of
from .security.listeners import Listener
from .security.sasl import ConnectionSecurity
from .storage.log import ReadSlice

log = logging.getLogger("straitmq.server")
_SIZE = struct.Struct(">i")
MAX_QUEUED_FRAMES = 64
MAX_PIPELINED = 8  # Produce answers one connection may have waiting for replication
_API_KEY = struct.Struct(">h")
# A TLS fetch answer is written through the TLS layer in pieces of this much, each one
# buffer holding the response's own bytes and its file ranges: full 16 KiB TLS records,
# not one small record per partition header. Not larger: a piece, its ciphertext in
# OpenSSL's memory BIO and the bytes read out of it stay within the core's cache.
TLS_WRITE_BYTES = 256 * 1024
SCRATCH_BYTES = 8 * 1024  # per connection: small frames; large ones get their own
# A frame up to this size gets its whole buffer when its size prefix arrives; a larger
# one grows as its bytes do (one copy more), so a size claimed and never sent costs
# nothing (socket.request.max.bytes is 100 MB, and a client may be anonymous).
PREALLOC_BYTES = 4 * 1024 * 1024
TLS_POOLED_BUFFERS = 4  # TLS_WRITE_BYTES buffers kept for the next fetch answers
_TLS_BUFFERS: list[bytearray] = []
PRE_AUTH_MAX_BYTES = 512 * 1024  # Kafka's sasl.server.max.receive.size
# Large frames (up to PREALLOC_BYTES: a ~1 MB Produce) are read into buffers of a
# pool shared by the connections: a new bytearray of that size is zeroed and
# faulted in every time (3-4% of a TLS produce's CPU here). A pooled buffer is handed
# out again only once nothing refers to it (the request and every view into it gone).
FRAME_POOL_BUFFERS = 8
_FRAME_BUFFERS: list[bytearray] = []
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# A plaintext answer up to this size (file ranges included) is copied and written at
# once; a larger one goes by sendfile.
SMALL_RAW_BYTES = 32 * 1024


# Builds the context one request's handler gets: (api key, version, correlation id,
# client id, client host, listener name, the connection's security state).
ContextFactory = Callable[[int, int, int, str | None, str, str, ConnectionSecurity], RequestContext]


@dataclass(slots=True)
class ListenerDeps:
    """What the Kafka listener's connections use of the broker."""

    metrics: BrokerMetrics
    connections: set[KafkaConnection]  # open ones, closed by the broker when it stops
    request_max_bytes: int  # socket.request.max.bytes
    image: Callable[[], MetadataImage]  # SCRAM credentials for SASL logins
    context: ContextFactory
    kafka_api: dict[int, ApiSpec]  # API key -> versions and bound handler (dispatch.py)
    quotas: ClientQuotas  # client quotas: throttles for produce, fetch, request time
    # A listener only brokers use (inter.broker.listener.name beside client listeners):
    # never throttled by client quotas.
    quota_exempt_listener: str | None = None
    # The clients seen lately (GET /api/v1/clients), told of each API version a
    # connection uses for the first time; None: not recorded.
    clients: ClientRegistry | None = None
    # max.connections and max.connections.per.ip (default: no cap).
    limits: ConnectionLimits = field(default_factory=lambda: ConnectionLimits())
    # connection_creation_rate of ip quota entities (KIP-612); None: not enforced.
    connection_rates: ConnectionRates | None = None


# Refused connections are logged at most this often (a client retrying in a loop would
# otherwise write a line per attempt); each line says how many went since the last.
REFUSAL_LOG_INTERVAL_S = 10.0


class ConnectionLimits:
    """Kafka's max.connections and max.connections.per.ip, checked as a connection is
    made: past either, the new connection is closed at once, as Kafka closes it
    (ConnectionQuotas). The connections of a listener only brokers use (the inter-broker
    listener beside client listeners) count towards the per-address cap but not towards
    max.connections, as in Kafka, so replication keeps working when clients fill it.

    Unlike Kafka, a connection past max.connections is closed rather than left in the
    accept backlog until a slot frees (KIP-402): a client sees a closed connection and
    retries with its reconnect backoff. A TLS connection is counted once its handshake
    is done (the handshake has its own timeout)."""

    def __init__(
        self,
        max_connections: int = 2**31 - 1,
        max_per_ip: int = 2**31 - 1,
        protected_listener: str | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.protected_listener = protected_listener
        self.counted = 0  # open connections counted against max.connections
        self.per_ip: dict[str, int] = {}  # address -> open connections from it
        self._logged_at = -REFUSAL_LOG_INTERVAL_S
        self._unlogged = 0

    def admit(self, listener: str, address: str) -> str | None:
        """Count a new connection from `address` on `listener`, or name the limit (its
        Kafka name) it is past: then it is not counted and must be closed."""
        n = self.per_ip.get(address, 0)
        if n >= self.max_per_ip:
            return "max.connections.per.ip"
        protected = self.protected_listener is not None and listener == self.protected_listener
        if not protected:
            if self.counted >= self.max_connections:
                return "max.connections"
            self.counted += 1
        self.per_ip[address] = n + 1
        return None

    def release(self, listener: str, address: str) -> None:
        """An admitted connection closed."""
        if listener != self.protected_listener:
            self.counted -= 1
        n = self.per_ip.get(address, 0) - 1
        if n > 0:
            self.per_ip[address] = n
        else:
            self.per_ip.pop(address, None)

    def log_refusal(
        self, limit: str, address: str, listener: str, cap: float | None = None
    ) -> None:
        now = time.monotonic()
        self._unlogged += 1
        if now - self._logged_at < REFUSAL_LOG_INTERVAL_S:
            return
        if cap is None:
            cap = self.max_per_ip if limit == "max.connections.per.ip" else self.max_connections
        log.info(
            "closing a new connection: %s (%s) reached",
            limit,
            cap,
            extra={
                "client": address,
                "listener": listener,
                "refused_since_last_line": self._unlogged,
            },
        )
        self._logged_at, self._unlogged = now, 0


class KafkaConnection(asyncio.BufferedProtocol):
    """A listener's connection. The event loop reads (and the TLS layer decrypts)
    straight into our buffers: small frames land in a small scratch buffer and are
    copied out once; a large frame (a Produce) is read into a buffer of exactly its size
    that becomes the frame, with no copy at all. As a plain Protocol, each read came as
    a new bytes object of up to 256 KiB (allocated, and faulted in, each time), appended
    to the connection's buffer, then copied again into the frame: a plaintext produce
    cost twice the CPU per GB it costs now."""

    def __init__(self, deps: ListenerDeps, listener: Listener | None = None) -> None:
        self.deps = deps
        self.listener = listener
        self.listener_name = listener.name if listener is not None else ""
        self.tls = listener is not None and listener.tls is not None
        self.security = ConnectionSecurity(None, _no_credentials)
        self._scratch = bytearray(SCRATCH_BYTES)
        self._filled = 0  # bytes of _scratch holding data not framed yet
        self._body: memoryview | None = None  # the large frame being read, and how far
        self._body_filled = 0
        self._grow: bytearray | None = None  # a frame over PREALLOC_BYTES, so far
        self._grow_size = 0
        self.frames: deque[memoryview] = deque()
        # What run() awaits while no frame is queued: a bare future, set by the next
        # frame or the close (an asyncio.Event is Python code on every request).
        self._wakeup: asyncio.Future[None] | None = None
        self.drained = asyncio.Event()
        self.drained.set()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task | None = None
        self.closed = False
        self.paused = False
        self.client_host = ""
        self._dup_fd = -1
        # (answer, api_key, version, correlation_id, started, metrics key, throttle ms),
        # in request order
        self._waiting: deque[tuple[asyncio.Future, int, int, int, float, int, int]] = deque()
        # Loop time until which the connection is muted (a client over its quota):
        # nothing more is read or handled until then (Kafka mutes the channel).
        self.muted_until = 0.0
        # (quotas version, generation, principal, client id, allowances) of the last request
        self._quota_allowances: tuple[int, int, str, str, tuple] | None = None
        # The (API key, version) pairs this connection has used: the client registry is
        # told of each pair once, never on the request path after that.
        self.api_seen: set[tuple[int, int]] = set()
        self.client: ConnectionClient | None = None  # this connection in the registry
        self._admitted = False  # counted by the connection limits (released when lost)

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's connections get a (read-write) Transport.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=0)
        peer = transport.get_extra_info("peername")
        self.client_host = f"/{peer[0]}" if peer else ""
        limits = self.deps.limits
        rates = self.deps.connection_rates
        if rates is not None and self.listener_name != limits.protected_listener:
            throttle = rates.admit(self.client_host.lstrip("/"), time.time() * 1000.0)
            if throttle > 0:
                self._throttle_close(throttle, rates)
                return
        refused = limits.admit(self.listener_name, self.client_host)
        if refused is not None:
            self.deps.metrics.limit_refusals[refused] += 1
            limits.log_refusal(refused, self.client_host, self.listener_name)
            self.closed = True
            self.transport.close()
            return
        self._admitted = True
        if self.listener is not None:
            # Called once the TLS handshake is done: the client certificate (if any) is
            # verified by now and names the principal until SASL names another.
            cert = transport.get_extra_info("peercert") if self.tls else None
            image = self.deps.image
            self.security = ConnectionSecurity(
                self.listener.sasl,
                lambda user, mech: image().scram_credentials.get(user, {}).get(mech),
                principal_from_cert(cert),
            )
        self.deps.connections.add(self)
        self.deps.metrics.listener_connections[self.listener_name] += 1
        self.task = asyncio.get_running_loop().create_task(self.run())

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return self._body[self._body_filled :]  # never past the frame's end
        return memoryview(self._scratch)[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed:
            return
        if self._body is not None:
            self._body_filled += nbytes
            if self._body_filled < len(self._body):
                return
            self.frames.append(self._body.toreadonly())
            self._body = None
        elif self._grow is not None:  # the scratch buffer was handed out whole
            take = min(nbytes, self._grow_size - len(self._grow))
            self._grow += self._scratch[:take]
            if len(self._grow) < self._grow_size:
                return
            self.frames.append(memoryview(self._grow).toreadonly())
            self._grow = None
            rest = nbytes - take
            self._scratch[:rest] = self._scratch[take:nbytes]
            self._filled = rest
            self._frame_scratch()
        else:
            self._filled += nbytes
            self._frame_scratch()
        if self.frames:
            self._frames_queued()

    def _frame_scratch(self) -> None:
        """Take the whole frames out of the scratch buffer; a frame larger than what is
        left of it gets a buffer of its own, which the next reads fill directly."""
        scratch = self._scratch
        limit = (
            self.deps.request_max_bytes
            if self.security.authenticated
            else PRE_AUTH_MAX_BYTES  # nobody buffers 100 MB on a connection it cannot name
        )
        pos, end = 0, self._filled
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(scratch, pos)
            # Unframed SASL tokens (SaslHandshake v0) may be short or empty.
            if size < (0 if self.security.raw_tokens else 8) or size > limit:
                log.info(
                    "closing connection: bad frame size",
                    extra={"client": self.client_host, "size": size},
                )
                self.close()
                return
            start = pos + 4
            if end - start >= size:
                self.frames.append(memoryview(bytes(scratch[start : start + size])))
                pos = start + size
                continue
            if size > PREALLOC_BYTES:
                self._grow, self._grow_size = bytearray(scratch[start:end]), size
                pos = end
            elif size > len(scratch) - 4:
                body = frame_buffer(size)
                body[: end - start] = scratch[start:end]
                self._body = body
                self._body_filled = end - start
                pos = end
            break
        rest = end - pos
        if pos and rest:
            scratch[:rest] = scratch[pos:end]
        self._filled = rest

    def data_received(self, data: bytes) -> None:
        """For a transport that does not use the buffer (uvloop's and asyncio's, plain
        and TLS, all do): the same path, one copy."""
        view = memoryview(data)
        while view and not self.closed:
            buf = self.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            self.buffer_updated(n)

    def _wake(self) -> None:
        if self._wakeup is not None:
            settle(self._wakeup)

    def _frames_queued(self) -> None:
        self._wake()
        if len(self.frames) >= MAX_QUEUED_FRAMES and not self.paused:
            self.paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # as asyncio.Protocol's: the transport closes itself

    def pause_writing(self) -> None:
        self.drained.clear()

    def resume_writing(self) -> None:
        self.drained.set()

    def _throttle_close(self, throttle_ms: int, rates: ConnectionRates) -> None:
        """A connection past its address's connection_creation_rate: read nothing, close
        it once the throttle has passed (at most the quota's whole window), as Kafka's
        acceptor closes a throttled connection (KIP-612)."""
        assert self.transport is not None
        limit = "connection_creation_rate"
        self.deps.metrics.limit_refusals[limit] += 1
        address = self.client_host.lstrip("/")
        self.deps.limits.log_refusal(limit, address, self.listener_name, rates.quota(address))
        self.closed = True
        self.transport.pause_reading()
        delay_s = min(throttle_ms, rates.samples * rates.window_ms) / 1000.0
        asyncio.get_running_loop().call_later(delay_s, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.drained.set()
        self._wake()
        if self._admitted:
            self._admitted = False
            self.deps.limits.release(self.listener_name, self.client_host)
        self.deps.connections.discard(self)
        if self.client is not None and self.deps.clients is not None:
            self.deps.clients.closed(self.client, time.time())
            self.client = None
        if self._dup_fd >= 0:
            os.close(self._dup_fd)
            self._dup_fd = -1

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        self._wake()
        for answer, *_ in self._waiting:
            answer.cancel()

    # -- request loop -----------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.closed:
                if not self.frames:
                    self._wakeup = loop.create_future()
                    await self._wakeup
                    continue
                frame = self.frames.popleft()
                if self.paused and len(self.frames) < MAX_QUEUED_FRAMES // 2:
                    self.paused = False
                    assert self.transport is not None
                    self.transport.resume_reading()
                if self._waiting:
                    # Only another Produce may start while Produces replicate; anything
                    # else sees their outcome first.
                    produce = _API_KEY.unpack_from(frame, 0)[0] == 0
                    await self._until_waiting(MAX_PIPELINED - 1 if produce else 0)
                await self.handle(frame)
                if self.muted_until:
                    await self._muted()
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("closing connection after an internal error")
        finally:
            self.close()

    async def _muted(self) -> None:
        """Stop reading until the throttle is over, then read again (unless the frame
        queue itself holds the socket paused)."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        delay = self.muted_until - loop.time()
        self.muted_until = 0.0
        if delay <= 0 or self.closed:
            return
        self.transport.pause_reading()
        try:
            # The throttle the quota computed, not a fixed pause.
            await asyncio.sleep(delay)
        finally:
            if not self.paused and not self.closed:
                self.transport.resume_reading()

    def _allowances(self, version: int, client: str) -> tuple:
        """The client's quota allowances, kept on the connection while its principal and
        client id, the quotas (`version`) and the quota state's generation stay."""
        quotas = self.deps.quotas
        principal = self.security.principal
        kept = self._quota_allowances
        if (
            kept is None
            or kept[0] != version
            or kept[1] != quotas.generation
            or kept[2] is not principal
            or kept[3] != client
        ):
            found = quotas.lookup(user_of(principal), client, perf_counter() * 1000.0)
            kept = self._quota_allowances = (version, quotas.generation, principal, client, found)
        return kept[4]

    async def handle(self, frame: memoryview) -> None:
        start = perf_counter()
        deps = self.deps
        security = self.security
        if security.raw_tokens:
            self._raw_sasl_token(frame)
            return
        api_key, version, correlation_id = parse_header_prefix(frame)
        refusal = security.refusal(api_key)
        if refusal is not None:
            # Kafka's behaviour: the connection closes, the client reports it at once.
            log.info(
                "closing connection: %s",
                refusal,
                extra={
                    "client": self.client_host,
                    "api_key": api_key,
                    "listener": self.listener_name,
                },
            )
            self.close()
            return
        spec = deps.kafka_api.get(api_key)
        if spec is None or not spec.min_version <= version <= spec.max_version:
            if api_key == 18:  # ApiVersions: answer in v0 format with UNSUPPORTED_VERSION
                self.write(api_versions_fallback(correlation_id))
                return
            log.info(
                "closing connection: unsupported API",
                extra={"client": self.client_host, "api_key": api_key, "version": version},
            )
            deps.metrics.request_errors[(api_key, ErrorCode.unsupported_version)] += 1
            self.close()
            return
        used = (api_key, version)
        loading = 0.0
        if used not in LOADED:
            # The first request of this version: kio imports its schemas, off the loop
            # (a wait: not this request's handling time for request_percentage).
            loading = perf_counter()
            await asyncio.to_thread(load_schemas, api_key, version)
            loading = perf_counter() - loading
        try:
            check_array_lengths(frame, api_key, version)
            header, body = parse_request(frame, api_key, version)
        except ProtocolError as exc:
            log.info("closing connection: %s", exc, extra={"client": self.client_host})
            self.close()
            return
        if used not in self.api_seen:  # the only per-request cost of the client registry
            self._first_use(api_key, version, header.client_id, body)
        ctx = deps.context(
            api_key,
            version,
            correlation_id,
            header.client_id,
            self.client_host,
            self.listener_name,
            security,
        )
        metrics = deps.metrics
        metrics.requests[api_key] += 1
        key = api_key if api_key != 1 or body.replica_id < 0 else FOLLOWER_FETCH_KEY
        if key == FOLLOWER_FETCH_KEY:
            metrics.follower_fetches[(self.listener_name, security.principal)] += 1
        allowances = None
        if key != FOLLOWER_FETCH_KEY and self.listener_name != deps.quota_exempt_listener:
            image = deps.image()
            if image.client_quotas:  # quotas off: nothing more than this look
                allowances = ctx.quotas = self._allowances(
                    image.quotas_version, header.client_id or ""
                )
        if allowances is not None and allowances[2] is not None:
            # request_percentage counts the time this request's own code ran (Kafka's
            # thread time), not the time it waited: a long-polling Fetch or a JoinGroup
            # waiting for its group costs nothing while it waits.
            timed = _Timed(spec.handler(ctx, body), perf_counter() - start - loading)
            result = await timed
            handling = timed.spent
        else:
            result = await spec.handler(ctx, body)
            handling = 0.0
        throttle = 0
        if allowances is not None:
            now = perf_counter()
            produced = len(frame) if api_key == 0 else 0
            throttle = deps.quotas.charge(allowances, handling, produced, now * 1000.0)
        if type(result) is dict:
            # Admin answers may carry their own (controller_mutation_rate).
            throttle = max(throttle, result.get("throttle_time") or 0)
        elif type(result) is RawResponse:
            throttle = max(throttle, result.throttle_ms)  # a consumer's Fetch
        if throttle:
            result = _with_throttle(result, throttle)
            # Every version's answer goes out at once and the connection is muted (Kafka
            # 2.0+, KIP-219: ClientQuotaManager.throttle); a client of a version before
            # KIP-219 does not wait by itself (AbstractResponse.shouldClientThrottle).
            loop_time = asyncio.get_running_loop().time()
            self.muted_until = max(self.muted_until, loop_time + throttle / 1000.0)
        if type(result) is Deferred or (self._waiting and result is not None):
            self._wait_for(result, api_key, version, correlation_id, start, key, throttle)
            return
        if api_key == 36 and security.exchange is not None and security.exchange.done:
            if type(result) is dict and not result.get("error_code"):
                metrics.sasl_logins[(self.listener_name, security.principal)] += 1
        if result is not None and not self.closed:
            if isinstance(result, RawResponse):
                await self.write_raw(result)
            else:
                code = result.get("error_code") if type(result) is dict else None
                if code:  # a top-level error (Produce and Fetch count theirs per partition)
                    metrics.request_errors[(api_key, code)] += 1
                self._write_answer(result, api_key, version, correlation_id)
        if security.close_after_reply:  # a failed authentication: the answer, then close
            self.close()
        metrics.observe(key, perf_counter() - start)

    def _first_use(self, api_key: int, version: int, client_id: str | None, body: Any) -> None:
        """The connection uses this API version for the first time: the registry hears
        of it (with the software an ApiVersions v3+ names, and whether a Produce is
        transactional: a transactional Produce v12 is transactions v2)."""
        self.api_seen.add((api_key, version))
        registry = self.deps.clients
        if registry is None:
            return
        if self.client is None:
            self.client = registry.connection(self.client_host, self.listener_name)
        software = None
        if api_key == 18 and version >= 3:
            software = (body.client_software_name, body.client_software_version)
        registry.used(
            self.client,
            api_key,
            version,
            client_id,
            self.security.principal,
            time.time(),
            software=software,
            transactional=api_key == 0 and body.transactional_id is not None,
        )

    def _write_answer(self, result: dict, api_key: int, version: int, correlation_id: int) -> None:
        if api_key == 0:  # a Produce answer: per request at linger.ms=0, so written directly
            frame = encode_produce_response(version, correlation_id, result)
            if frame is not None:
                self.write(frame)
                return
        body = build(response_schema(api_key, version), result)
        self.write(encode_response(api_key, version, correlation_id, body))

    # -- Produce answers waiting for replication ------------------------------------

    def _wait_for(
        self,
        result: Any,
        api_key: int,
        version: int,
        correlation_id: int,
        start: float,
        key: int,
        throttle: int = 0,
    ) -> None:
        loop = asyncio.get_running_loop()
        if type(result) is Deferred:
            answer: asyncio.Future = loop.create_task(result.answer)
            answer.add_done_callback(self._answers_ready)
        else:  # answered at once, but behind answers still waiting
            answer = loop.create_future()
            answer.set_result(result)
        self._waiting.append((answer, api_key, version, correlation_id, start, key, throttle))

    def _answers_ready(self, _: object = None) -> None:
        """Write the answers that are ready at the head of the queue, in request order."""
        waiting = self._waiting
        while waiting and waiting[0][0].done():
            answer, api_key, version, correlation_id, start, key, throttle = waiting.popleft()
            if answer.cancelled():
                continue
            exc = answer.exception()
            if exc is not None:
                log.error("closing connection after an internal error", exc_info=exc)
                self.close()
                continue
            result = answer.result()
            if throttle:
                result = _with_throttle(result, throttle)
            self._write_answer(result, api_key, version, correlation_id)
            self.deps.metrics.observe(key, perf_counter() - start)

    async def _until_waiting(self, room: int) -> None:
        while len(self._waiting) > room:
            head = self._waiting[0][0]
            if not head.done():
                await asyncio.wait((head,))
            self._answers_ready()

    def _raw_sasl_token(self, frame: memoryview) -> None:
        """After SaslHandshake v0 the tokens come and go size-prefixed, with no header;
        a failure closes the connection (v0 has no way to carry an error)."""
        outcome = self.security.authenticate(bytes(frame))
        if outcome.close:
            self.close()
            return
        self.write(_SIZE.pack(len(outcome.auth_bytes)) + outcome.auth_bytes)

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    async def write_raw(self, response: RawResponse) -> None:
        """Write bytes pieces through the transport, file ranges with os.sendfile."""
        assert self.transport is not None
        if self.tls:
            await self._write_raw_tls(response)
            return
        if response.size <= SMALL_RAW_BYTES:
            # A small answer (a follower's fetch of the last few records, a consumer's
            # at low rates): its file ranges are read and the whole answer goes in one
            # write. Header, sendfile and tail each cost a syscall and a wake-up of the
            # reader, more than copying a few KiB does.
            self.transport.write(_small_raw(response))
            return
        pending: list[bytes] = []
        for piece in response.pieces:
            if isinstance(piece, ReadSlice):
                if pending:
                    self.transport.write(b"".join(pending))
                    pending.clear()
                await self._sendfile(piece)
            else:
                pending.append(piece)
        if pending:
            self.transport.write(b"".join(pending))

    async def _sendfile(self, piece: ReadSlice) -> None:
        assert self.transport is not None
        if self.transport.get_write_buffer_size():
            await self.drained.wait()
        if self.closed:
            raise ConnectionError("closed")
        sock = self.transport.get_extra_info("socket")
        fd = sock.fileno()
        offset, remaining = piece.position, piece.size
        loop = asyncio.get_running_loop()
        while remaining:
            try:
                # piece.fd each time: the file may have been closed and reopened by the
                # bounded cache while this waited on the socket.
                sent = os.sendfile(fd, piece.fd, offset, remaining)
            except BlockingIOError:
                sent = -1
            except OSError as e:  # the segment was deleted, or no descriptor is left
                raise ConnectionError(f"cannot send a fetched range: {e}") from e
            if sent == 0:
                raise ConnectionError("file shrank under a fetch")  # truncated meanwhile
            if sent > 0:
                offset += sent
                remaining -= sent
                continue
            # The loop owns the socket fd, so wait on a duplicate of it for writability.
            if self._dup_fd < 0:
                self._dup_fd = os.dup(fd)
            fut = loop.create_future()
            loop.add_writer(self._dup_fd, settle, fut)
            try:
                await fut
            finally:
                loop.remove_writer(self._dup_fd)
            if self.closed:
                raise ConnectionError("closed")

    async def _write_raw_tls(self, response: RawResponse) -> None:
        """TLS encrypts in user space, so a file range cannot go by sendfile: the
        response is copied into a buffer of TLS_WRITE_BYTES (file ranges read straight
        into it) and each buffer's worth goes through the TLS layer in one write.

        The buffers come from a small pool shared by the connections (a new bytearray
        is zeroed, and faulted in, each time). A buffer is written into again
        only once the transport has nothing buffered: the TLS layer then holds no
        reference to it, it encrypted every byte already."""
        transport = self.transport
        assert transport is not None
        if transport.get_write_buffer_size():
            await self.drained.wait()  # the TLS layer is done with whatever it was given
        if self.closed:
            raise ConnectionError("closed")
        left = response.size
        buf = _TLS_BUFFERS.pop() if _TLS_BUFFERS else bytearray(TLS_WRITE_BYTES)
        whole = memoryview(buf)
        out = whole[: min(left, TLS_WRITE_BYTES)]
        pos = 0
        for piece in response.pieces:
            if isinstance(piece, ReadSlice):
                offset, remaining = piece.position, piece.size
            else:
                data, remaining = memoryview(piece), len(piece)
            while remaining:
                n = min(remaining, len(out) - pos)
                if isinstance(piece, ReadSlice):
                    # piece.fd each time: the bounded cache may have closed and
                    # reopened the file while this waited on the socket.
                    got = _read_range(piece.fd, out[pos : pos + n], offset)
                    offset += got
                else:
                    got = n
                    out[pos : pos + n] = data[:n]
                    data = data[n:]
                pos += got
                remaining -= got
                left -= got
                if pos < len(out):
                    continue
                transport.write(out)
                if transport.get_write_buffer_size():
                    await self.drained.wait()
                if self.closed:
                    raise ConnectionError("closed")
                out = whole[: min(left, TLS_WRITE_BYTES)]
                pos = 0
        if not transport.get_write_buffer_size() and len(_TLS_BUFFERS) < TLS_POOLED_BUFFERS:
            _TLS_BUFFERS.append(buf)  # else it may still be referenced: left to the GC


class _Timed:
    """Awaits a coroutine as `await` would, adding up the time spent in each of its
    steps (from a resumption to its next suspension): the event loop's time spent on
    this request, waits left out."""

    __slots__ = ("awaitable", "spent")

    def __init__(self, awaitable: Awaitable[Any], spent: float = 0.0) -> None:
        self.awaitable = awaitable
        self.spent = spent

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self.awaitable.__await__()
        value: Any = None
        error: BaseException | None = None
        while True:
            began = perf_counter()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as done:
                self.spent += perf_counter() - began
                return done.value
            finally:
                value, error = None, None
            self.spent += perf_counter() - began
            try:
                value = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:  # a cancellation, passed on to the handler
                error = e


def _free_buffer(size: int) -> bytearray | None:
    """A pooled frame buffer of at least `size` bytes that nothing else refers to."""
    for buf in _FRAME_BUFFERS:
        # The pool, `buf` and the call's argument: nothing else holds it (no frame, no
        # memoryview of it: a view holds its exporter).
        if len(buf) >= size and sys.getrefcount(buf) <= _FREE_REFS:
            return buf
    return None


def _free_refs() -> int:
    """What sys.getrefcount says of an unreferenced pool buffer in `_free_buffer` (the
    same code shape; measured rather than assumed, as it changes between Pythons)."""
    pool = [bytearray(1)]
    for buf in pool:
        return sys.getrefcount(buf)
    raise AssertionError("unreachable")


_FREE_REFS = _free_refs()


def frame_buffer(size: int) -> memoryview:
    """A writable view of `size` bytes for a frame: pooled (taken again once free) while
    the pool has room, else a buffer of its own."""
    buf = _free_buffer(size)
    if buf is None:
        buf = bytearray(size)
        if len(_FRAME_BUFFERS) < FRAME_POOL_BUFFERS:
            _FRAME_BUFFERS.append(buf)
        else:  # a free one too small for this frame makes room
            for i in range(len(_FRAME_BUFFERS)):
                old = _FRAME_BUFFERS[i]
                if sys.getrefcount(old) <= _FREE_REFS:
                    _FRAME_BUFFERS[i] = buf
                    break
    return memoryview(buf)[:size]


def _small_raw(response: RawResponse) -> bytearray:
    """A RawResponse's bytes, its file ranges read in (write_raw's small answers)."""
    out = bytearray(response.size)
    view = memoryview(out)
    pos = 0
    for piece in response.pieces:
        if isinstance(piece, ReadSlice):
            offset, end = piece.position, pos + piece.size
            while pos < end:
                got = _read_range(piece.fd, view[pos:end], offset)
                pos += got
                offset += got
        else:
            view[pos : pos + len(piece)] = piece
            pos += len(piece)
    return out


def _read_range(fd: int, into: memoryview, offset: int) -> int:
    """Read a fetched file range (or its start) into `into`, for the answers that cannot
    go by sendfile; the bytes read. A ConnectionError, as on the sendfile path, if the
    file cannot be read or shrank (truncated) after the answer was built."""
    try:
        got = os.preadv(fd, [into], offset)
    except OSError as e:  # the segment was deleted, or no descriptor is left
        raise ConnectionError(f"cannot send a fetched range: {e}") from e
    if got == 0:
        raise ConnectionError("file shrank under a fetch")
    return got


def _with_throttle(result: Any, throttle: int) -> Any:
    """The answer with its throttle_time_ms set (a Fetch's pieces are patched in place:
    the body starts with it, right after the size and the response header)."""
    if type(result) is dict:
        if "throttle_time" in result:
            result["throttle_time"] = throttle
    elif isinstance(result, RawResponse) and len(result.pieces) > 1:
        first = result.pieces[1]
        if isinstance(first, bytes) and len(first) >= 4:
            result.pieces[1] = _SIZE.pack(throttle) + first[4:]
    return result


def _no_credentials(user: str, mechanism: str) -> dict | None:
    return None


def bind(host: str, port: int) -> list[socket.socket]:
    """Bind the Kafka listener's sockets without listening: the port is reserved and
    known (also when 0 was asked for), but connections are refused until `serve`.
    Port 0 on a name with several addresses takes the first address's port for all."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, type_, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, type_, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            sock.bind(addr)
            sock.setblocking(False)
    except OSError as e:
        for sock in socks:
            sock.close()
        raise OSError(e.errno, f"cannot bind the Kafka listener {host}:{port}: {e.strerror}") from e
    return socks


async def serve(
    deps: ListenerDeps, socks: list[socket.socket], listener: Listener | None = None
) -> asyncio.Server | _Servers:
    """Start accepting on the sockets `bind` made: from now on clients are answered."""
    loop = asyncio.get_running_loop()
    ssl_ctx = listener.tls.server_context if listener is not None and listener.tls else None
    servers = [
        await loop.create_server(
            lambda: KafkaConnection(deps, listener),
            sock=s,
            backlog=1024,
            ssl=ssl_ctx,
            # A client that opens TLS and stalls holds a connection this long at most.
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if ssl_ctx else None,
        )
        for s in socks
    ]
    return servers[0] if len(servers) == 1 else _Servers(servers)


class _Servers:
    """Several listening addresses (a host name with IPv4 and IPv6) closed as one."""

    def __init__(self, servers: list[asyncio.Server]) -> None:
        self.servers = servers

    def close(self) -> None:
        for s in self.servers:
            s.close()
