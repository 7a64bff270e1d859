"""Stopping background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


async def cancel_and_wait(tasks: Iterable[asyncio.Task | None]) -> None:
    """Cancel every task, then wait for each to end; how it ended does not matter to a
    subsystem that is stopping (its own logs said what went wrong)."""
    running = [t for t in tasks if t is not None]
    for t in running:
        t.cancel()
    for t in running:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
