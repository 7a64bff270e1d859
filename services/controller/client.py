"""Calls to the active controller from brokers and tools, wherever it is.

Tries the known leader, follows NOT_CONTROLLER redirects, walks the voters when nobody
is known, and gives up after a deadline with REQUEST_TIMED_OUT. A combined node passes
its own handlers so calls to itself skip HTTP.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
from kio.schema.errors import ErrorCode

from straitmq.admin_client import AdminAuth

from . import errors as E
from .errors import ControllerError

Handler = Callable[[dict], Awaitable[dict]]


class ControllerClient:
    def __init__(
        self,
        voters: dict[int, str],
        leader_hint: Callable[[], int | None] = lambda: None,
        local: tuple[Callable[[], bool], dict[str, Handler]] | None = None,
        auth: AdminAuth | None = None,
    ) -> None:
        self.voters = voters
        self.auth = auth  # TLS context and credentials for https voters (None: plain)
        self.leader_hint = leader_hint
        self.local = local
        self._hint: int | None = None
        self._order = itertools.cycle(sorted(voters))
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def session_url(self) -> str | None:
        """Where a session stream goes: the active controller's, if known and not us.

        A combined node whose own controller is active needs none: if the process dies,
        the controller dies with it and the next one probes every broker.
        """
        if self.local is not None and self.local[0]():
            return None
        target = self._hint if self._hint in self.voters else self.leader_hint()
        return f"{self.voters[target]}/controller/session" if target in self.voters else None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            auth = self.auth
            ctx = auth.context() if auth is not None else None
            url = next(iter(self.voters.values()), "")  # the voters share one scheme
            header = auth.header_for(url) if auth is not None else None
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ctx) if ctx is not None else None,
                headers={"Authorization": header} if header else None,
            )
        return self._session

    async def call(self, op: str, body: dict, within_s: float = 15.0) -> dict:
        if self.local is not None and self.local[0]():
            try:
                return await self.local[1][op](body)
            except E.NotController:
                pass
        session = self.session()
        deadline = time.monotonic() + within_s
        last = "no controller answered"
        while time.monotonic() < deadline:
            target = self._hint if self._hint in self.voters else self.leader_hint()
            if target not in self.voters:
                target = next(self._order)
            try:
                async with session.post(
                    f"{self.voters[target]}/controller/{op}",
                    data=orjson.dumps(body),
                    headers={"content-type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=max(1.0, deadline - time.monotonic())),
                ) as resp:
                    reply = orjson.loads(await resp.read())
                    if resp.status == 200:
                        self._hint = target
                        return reply
                    if resp.status == 409:
                        self._hint = reply.get("leader_id")
                        last = reply.get("message", "not the active controller")
                        if self._hint is None or self._hint == target:
                            self._hint = None
                            await asyncio.sleep(0.1)
                        continue
                    raise ControllerError(
                        int(reply.get("error_code", ErrorCode.invalid_request)),
                        reply.get("message", f"controller answered {resp.status}"),
                    )
            except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError) as e:
                last = f"controller {target}: {e or type(e).__name__}"
                self._hint = None
                await asyncio.sleep(0.1)
        raise ControllerError(
            ErrorCode.request_timed_out,
            f"no active controller answered within {within_s:.0f}s ({last})",
        )
