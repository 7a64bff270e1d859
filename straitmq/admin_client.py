"""The one client of StraitMQ's HTTP admin API (`/api/v1`, `/healthz`, `/readyz`).

Used by the `strait` CLI, the operator, a broker asking its peers, and the tests. JSON in
and out (orjson); a broker's 307 to a partition's leader or a group's coordinator is
followed with the method and body kept; every refusal or unreachable server is an
`AdminError` carrying the HTTP status, the server's one-line message and, where the
server gave one, the Kafka error code and name.

    async with AdminClient("http://127.0.0.1:8080") as admin:
        topics = await admin.get("/api/v1/topics")

    request_sync("http://127.0.0.1:8080", "POST", "/api/v1/topics", {"name": "t"})
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

DEFAULT_TIMEOUT_S = 10.0


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

    def __init__(self, base_url: str = "", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AdminClient:
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
                    status, str(answer["error"]), answer.get("error_name"),
                    answer.get("error_code"),
                )  # fmt: skip
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
            self._session = aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with self._session.request(
                method, url, data=data, headers=headers, timeout=timeout
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except aiohttp.TooManyRedirects as e:
            raise AdminError(
                508, f"{method} {path}: redirected too often (last to {e.request_info.real_url})"
            ) from None
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
    base_url: str, method: str, path: str, body: Any = None, timeout_s: float = 30.0
) -> Any:
    """One call from synchronous code (the CLI, tests)."""

    async def go() -> Any:
        async with AdminClient(base_url, timeout_s) as admin:
            return await admin.request(method, path, body)

    return asyncio.run(go())


def exchange_sync(
    base_url: str, method: str, path: str, body: Any = None, timeout_s: float = 30.0
) -> tuple[int, Any]:
    """(status, JSON answer) from synchronous code, whatever the status."""

    async def go() -> tuple[int, Any]:
        async with AdminClient(base_url, timeout_s) as admin:
            return await admin.exchange(method, path, body)

    return asyncio.run(go())


def _origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"
