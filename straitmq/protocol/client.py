"""A small asyncio Kafka client connection, for broker-to-broker calls (replica fetch,
OffsetForLeaderEpoch). Requests and responses go through kio's generated schemas.
One request in flight per connection, which is how a replica fetcher uses it.

Optional security (`ClientSecurity`), as a Kafka client's security.protocol: TLS with the
given SSLContext (CA, client certificate for mTLS, hostname check), and a SASL login
(SaslHandshake v1 + SaslAuthenticate v2; PLAIN, SCRAM-SHA-256/512) done right after
connecting, before the first request. When the broker answers a session lifetime
(KIP-368), the connection logs in again at 85-95 % of it, as Kafka's client does: between
two requests, so a long-poll fetch in flight is never cut. A refused login raises
`AuthenticationFailed` (a ConnectionClosed) with the broker's reason.
"""

from __future__ import annotations

import asyncio
import io
import random
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from .codec import _reader, _writer, request_schema, response_schema
from .sasl_client import MECHANISMS, SaslClientError, new_exchange

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_HEADER = struct.Struct(">ihhi")  # size (set later), api key, version, correlation id


class ConnectionClosed(Exception):
    pass


class MalformedResponse(ConnectionClosed):
    """The peer's answer could not be decoded: the connection is closed."""


class AuthenticationFailed(ConnectionClosed):
    """The TLS handshake or the SASL login was refused; retrying at once will not help."""


@dataclass(frozen=True, slots=True)
class SaslLogin:
    mechanism: str  # PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
    username: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"SASL mechanism {self.mechanism}: one of {', '.join(MECHANISMS)}")


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How to reach a secured listener: `tls` (None: plaintext) and `sasl` (None: no login).
    Whether the server's name is checked is the context's check_hostname."""

    tls: ssl.SSLContext | None = None
    sasl: SaslLogin | None = None
    # Gives the context for each new connection, rebuilt when its files rotate; `tls`
    # is then the one the files gave at startup.
    tls_reload: Callable[[], ssl.SSLContext] | None = field(default=None, compare=False)

    def context(self) -> ssl.SSLContext | None:
        return self.tls_reload() if self.tls_reload is not None else self.tls

    @property
    def protocol(self) -> str:
        if self.sasl is not None:
            return "SASL_SSL" if self.tls is not None else "SASL_PLAINTEXT"
        return "SSL" if self.tls is not None else "PLAINTEXT"


class _Frames(asyncio.BufferedProtocol):
    """Reads each response straight into a buffer of its own size: one copy from the
    socket, none after (a follower's fetch responses are the replicated data)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._size = bytearray(4)
        self._frame: bytearray | None = None  # None: reading the 4-byte size
        self._filled = 0
        self.frames: list[memoryview] = []
        self.waiter: asyncio.Future[None] | None = None
        self.closed: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream connection's transport is a (read-write) Transport.
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        target = self._size if self._frame is None else self._frame
        return memoryview(target)[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._frame is None:
            if self._filled < 4:
                return
            (size,) = _I32.unpack(self._size)
            if size < 4:
                self._lost(f"bad frame size {size}")
                return
            self._frame, self._filled = bytearray(size), 0
            return
        if self._filled < len(self._frame):
            return
        self.frames.append(memoryview(self._frame).toreadonly())
        self._frame, self._filled = None, 0
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _lost(self, why: str) -> None:
        self.closed = why
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = "closed by the peer"
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = self.closed or (str(exc) if exc else "closed")
        self._wake()

    async def next_frame(self, within_s: float | None = None) -> memoryview:
        """The next response frame; TimeoutError after `within_s` (None: no limit).
        The limit is a timer on the waiter rather than asyncio.timeout, which costs a
        context manager, a task lookup and a reschedule per request (a follower
        fetches once per leader append)."""
        if self.frames:
            return self.frames.pop(0)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(within_s, self._expire) if within_s is not None else None
        try:
            while not self.frames:
                if self.closed is not None:
                    raise ConnectionClosed(self.closed)
                self.waiter = loop.create_future()
                await self.waiter
        finally:
            if timer is not None:
                timer.cancel()
        return self.frames.pop(0)

    def _expire(self) -> None:
        # Runs only while next_frame awaits its waiter; one already set (a frame came)
        # is left as it is, and that frame is returned.
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(TimeoutError())


class KafkaConnection:
    def __init__(
        self, host: str, port: int, client_id: str, security: ClientSecurity | None = None
    ) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        # The header's client id (a nullable string, never a compact one).
        raw = client_id.encode() if client_id is not None else None
        self._client_id_bytes = _I16.pack(-1) if raw is None else _I16.pack(len(raw)) + raw
        self.security = security
        self._proto: _Frames | None = None
        self._correlation = 0
        self._reauth_at: float | None = None  # monotonic time of the next login
        self.logins = 0  # SASL logins on this object, re-authentications included
        self.session_lifetime_ms = 0  # the last one the broker answered

    async def connect(self, within_s: float = 3.0) -> None:
        sec = self.security
        tls = sec.context() if sec is not None else None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(within_s):
                _, self._proto = await loop.create_connection(
                    _Frames,
                    self.host,
                    self.port,
                    ssl=tls,
                    ssl_handshake_timeout=within_s if tls is not None else None,
                )
        except ssl.SSLError as e:  # an untrusted or misnamed certificate, a refused client one
            raise AuthenticationFailed(
                f"{self.host}:{self.port}: TLS handshake failed: {e.reason or e}"
            ) from None
        if sec is not None and sec.sasl is not None:
            try:
                await self._login(sec.sasl, within_s)
            except BaseException:
                self.close()
                raise

    async def _login(self, login: SaslLogin, within_s: float) -> None:
        where = f"{self.host}:{self.port}"
        hs = await self._roundtrip(17, 1, SaslHandshakeRequest(mechanism=login.mechanism), within_s)
        if int(hs.error_code) != ErrorCode.none:
            raise AuthenticationFailed(
                f"{where}: SASL mechanism {login.mechanism} refused "
                f"({ErrorCode(hs.error_code).name}); the listener offers "
                f"{', '.join(hs.mechanisms) or 'none'}"
            )
        exchange = new_exchange(login.mechanism, login.username, login.password)
        token: bytes | None = exchange.first()
        lifetime_ms = 0
        while token is not None:
            resp = await self._roundtrip(36, 2, SaslAuthenticateRequest(auth_bytes=token), within_s)
            if int(resp.error_code) != ErrorCode.none:
                raise AuthenticationFailed(
                    f"{where}: SASL {login.mechanism} login as {login.username!r} refused: "
                    f"{resp.error_message or ErrorCode(resp.error_code).name}"
                )
            lifetime_ms = int(resp.session_lifetime.total_seconds() * 1000)
            try:
                token = exchange.step(bytes(resp.auth_bytes))
            except SaslClientError as e:
                raise AuthenticationFailed(f"{where}: SASL {login.mechanism}: {e}") from None
        self.logins += 1
        self.session_lifetime_ms = lifetime_ms
        # Kafka's client re-authenticates at a random 85-95 % of the lifetime, so many
        # connections made together do not all log in again at the same moment.
        self._reauth_at = (
            time.monotonic() + lifetime_ms / 1000 * random.uniform(0.85, 0.95)
            if lifetime_ms > 0
            else None
        )

    def close(self) -> None:
        if self._proto is not None:
            if self._proto.transport is not None:
                self._proto.transport.close()
            self._proto = None

    async def request(self, api_key: int, version: int, body: Any, within_s: float) -> Any:
        if self._proto is None:
            await self.connect()
        elif self._reauth_at is not None and time.monotonic() >= self._reauth_at:
            # KIP-368: between requests, so nothing in flight is cut; a refused
            # re-authentication ends the connection like a refused first login.
            assert self.security is not None and self.security.sasl is not None
            try:
                await self._login(self.security.sasl, min(within_s, 10.0))
            except BaseException:
                self.close()
                raise
        return await self._roundtrip(api_key, version, body, within_s)

    async def _roundtrip(self, api_key: int, version: int, body: Any, within_s: float) -> Any:
        proto = self._proto
        if proto is None:
            raise ConnectionClosed(f"{self.host}:{self.port}: not connected")
        assert proto is not None and proto.transport is not None
        self._correlation += 1
        schema = request_schema(api_key, version)  # any API: typed per call by its caller
        buf = io.BytesIO()
        # The request header (v1, or v2 with no tagged fields), written directly: a
        # header entity and kio's writer for it cost more than the follower's fetch body.
        buf.write(_HEADER.pack(0, api_key, version, self._correlation))
        buf.write(self._client_id_bytes)
        if schema.__header_schema__.__flexible__:
            buf.write(b"\x00")
        if type(body) is bytes:  # encoded by the caller (a follower's Fetch)
            buf.write(body)
        else:
            _writer(schema)(buf, body)
        data = buf.getbuffer()
        _I32.pack_into(data, 0, len(data) - 4)
        try:
            if proto.closed is not None:
                raise ConnectionClosed(proto.closed)
            proto.transport.write(bytes(data))
            del data
            # A timer on the waiter, not wait_for: on 3.11 wait_for can swallow a
            # cancellation (CPython gh-86296) and a stopping broker would wait on its
            # fetcher forever.
            frame = await proto.next_frame(within_s)
        except (OSError, ConnectionClosed, TimeoutError) as e:
            self.close()
            raise ConnectionClosed(f"{self.host}:{self.port}: {e or type(e).__name__}") from None
        rschema = response_schema(api_key, version)
        try:
            header, offset = _reader(rschema.__header_schema__)(frame, 0)
            if header.correlation_id != self._correlation:
                raise ConnectionClosed("correlation id mismatch")
            resp, _ = _reader(rschema)(frame, offset)
        except ConnectionClosed:
            self.close()
            raise
        except Exception as e:  # kio raises several types on malformed input
            # The peer's answer cannot be read: as a broken connection to its callers.
            self.close()
            raise MalformedResponse(
                f"{self.host}:{self.port}: malformed {rschema.__name__}: {type(e).__name__}: {e}"
            ) from None
        return resp
