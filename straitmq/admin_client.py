"""The one client of StraitMQ's HTTP admin API (`/api/v1`, `/healthz`, `/readyz`).

Used by the `strait` CLI, the operator, a broker asking its peers, and the tests. JSON in
and out (orjson); a broker's 307 to a partition's leader or a group's coordinator is
followed with the method and body kept; every refusal or unreachable server is an
`AdminError` carrying the HTTP status, the server's one-line message and, where the
server gave one, the Kafka error code and name.

    async with AdminClient("http://127.0.0.1:8080") as admin:
        topics = await admin.get("/api/v1/topics")

    request_sync("http://127.0.0.1:8080", "POST", "/api/v1/topics", {"name": "t"})

A broker with HTTP security (`http.ssl.*`, `http.authentication`) is reached with an
`AdminAuth`: the CA its certificate chains to, a client certificate (mTLS) and/or a
user and password (HTTP Basic, checked against the cluster's SCRAM or PLAIN users):

    AdminClient("https://kafka-1:8443", auth=AdminAuth(ca_file="ca.pem",
                username="alice", password="alice-secret"))
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import urljoin

import aiohttp
import orjson

DEFAULT_TIMEOUT_S = 10.0
MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True, slots=True)
class AdminAuth:
    """How to reach a secured HTTP API. `ssl_context` wins over the files when given."""

    ca_file: str | None = None  # CAs the server's certificate must chain to (default: system)
    cert_file: str | None = None  # client certificate (PEM; may hold the key too)
    key_file: str | None = None
    username: str | None = None
    password: str | None = None
    ssl_context: ssl.SSLContext | None = None
    check_hostname: bool = True
    basic_over_http: bool = True  # False: the password goes to https URLs only

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> AdminAuth | None:
        """From $STRAIT_CA_FILE, $STRAIT_CERT, $STRAIT_KEY, $STRAIT_USER and
        $STRAIT_PASSWORD (as `strait` reads them); None when none is set."""
        ca, cert, user = env.get("STRAIT_CA_FILE"), env.get("STRAIT_CERT"), env.get("STRAIT_USER")
        if not (ca or cert or user):
            return None
        return cls(
            ca_file=ca,
            cert_file=cert,
            key_file=env.get("STRAIT_KEY"),
            username=user,
            password=env.get("STRAIT_PASSWORD"),
        )

    def context(self) -> ssl.SSLContext | None:
        """The client TLS context, or None for the defaults (https against system CAs)."""
        if self.ssl_context is not None:
            return self.ssl_context
        if not (self.ca_file or self.cert_file) and self.check_hostname:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.check_hostname = self.check_hostname
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def header(self) -> str | None:
        if self.username is None:
            return None
        token = f"{self.username}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(token).decode()

    def header_for(self, url: str) -> str | None:
        """The Authorization header to send to `url` (None over http when the password
        is for https only)."""
        if not url.startswith("https://") and not self.basic_over_http:
            return None
        return self.header()


class AdminError(Exception):
    """The admin API refused a request (4xx/5xx) or could not be reached (status 0)."""

    def __init__(
        self,
        status: int,
        message: str,
        error_name: str | None = None,
        error_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_name = error_name
        self.error_code = error_code

    @property
    def unreachable(self) -> bool:
        return self.status == 0


class AdminClient:
    """One aiohttp session; `base_url` is where paths go (a full URL goes as it is)."""

    def __init__(
        self,
        base_url: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        auth: AdminAuth | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.auth = auth
        self._ssl: ssl.SSLContext | None = None
        if auth is not None:
            try:
                self._ssl = auth.context()
            except (OSError, ssl.SSLError) as e:
                raise AdminError(0, f"cannot load the TLS files for the admin API: {e}") from None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self, method: str, path: str, body: Any = None, timeout_s: float | None = None
    ) -> Any:
        """The JSON answer of a 2xx (None when empty); AdminError otherwise."""
        return (await self.call(method, path, body, timeout_s))[1]

    async def call(
        self, method: str, path: str, body: Any = None, timeout_s: float | None = None
    ) -> tuple[int, Any]:
        """(status, JSON answer) of a 2xx; AdminError otherwise."""
        status, answer, raw = await self._exchange(method, path, body, timeout_s)
        if status >= 400:
            if isinstance(answer, dict) and "error" in answer:
                raise AdminError(
                    status,
                    str(answer["error"]),
                    answer.get("error_name"),
                    answer.get("error_code"),
                )
            text = raw[:200].decode(errors="replace") or f"HTTP {status}"
            raise AdminError(status, f"{method} {path}: {text}")
        return status, answer

    async def exchange(
        self, method: str, path: str, body: Any = None, timeout_s: float | None = None
    ) -> tuple[int, Any]:
        """(status, JSON answer or None) whatever the status; AdminError only when the
        server cannot be reached (for callers that look at refusals themselves)."""
        status, answer, _ = await self._exchange(method, path, body, timeout_s)
        return status, answer

    async def _exchange(
        self, method: str, path: str, body: Any, timeout_s: float | None
    ) -> tuple[int, Any, bytes]:
        url = path if path.startswith(("http://", "https://")) else self.base_url + path
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
            self._session = aiohttp.ClientSession(connector=connector)
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        # Redirects (a partition's leader, a group's coordinator) are followed here, not
        # by aiohttp: it drops the Authorization header when the origin changes, and the
        # other broker of the same cluster needs the same credentials.
        try:
            for _ in range(MAX_REDIRECTS + 1):
                headers.pop("Authorization", None)
                authorization = self.auth.header_for(url) if self.auth is not None else None
                if authorization is not None:
                    headers["Authorization"] = authorization
                async with self._session.request(
                    method,
                    url,
                    data=data,
                    headers=headers or None,
                    timeout=timeout,
                    allow_redirects=False,
                ) as resp:
                    raw = await resp.read()
                    status = resp.status
                    location = resp.headers.get("Location")
                if status not in _REDIRECTS or not location:
                    break
                url = urljoin(url, location)
                if status == 303:
                    method, data = "GET", None
                    headers.pop("Content-Type", None)
            else:
                raise AdminError(508, f"{method} {path}: redirected too often (last to {url})")
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            why = str(e) or type(e).__name__
            raise AdminError(0, f"the admin API at {_origin(url)} is unreachable: {why}") from None
        try:
            answer = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            answer = None
        return status, answer, raw

    async def get(self, path: str, timeout_s: float | None = None) -> Any:
        return await self.request("GET", path, timeout_s=timeout_s)


def request_sync(
    base_url: str,
    method: str,
    path: str,
    body: Any = None,
    timeout_s: float = 30.0,
    auth: AdminAuth | None = None,
) -> Any:
    """One call from synchronous code (the CLI, tests)."""

    async def go() -> Any:
        async with AdminClient(base_url, timeout_s, auth) as admin:
            return await admin.request(method, path, body)

    return asyncio.run(go())


def exchange_sync(
    base_url: str,
    method: str,
    path: str,
    body: Any = None,
    timeout_s: float = 30.0,
    auth: AdminAuth | None = None,
) -> tuple[int, Any]:
    """(status, JSON answer) from synchronous code, whatever the status."""

    async def go() -> tuple[int, Any]:
        async with AdminClient(base_url, timeout_s, auth) as admin:
            return await admin.exchange(method, path, body)

    return asyncio.run(go())


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"
