"""Stopping background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


def settle(fut: asyncio.Future, value: object = None) -> None:
    """Set `fut`'s result unless it is done already: for timers and loop callbacks that
    end a wait (call_later(t, settle, fut, False) instead of asyncio.wait_for)."""
    if not fut.done():
        fut.set_result(value)


async def cancel_and_wait(tasks: Iterable[asyncio.Task | None]) -> None:
    """Cancel every task, then wait for each to end; how it ended does not matter to a
    subsystem that is stopping (its own logs said what went wrong)."""
    running = [t for t in tasks if t is not None]
    for t in running:
        t.cancel()
    for t in running:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
