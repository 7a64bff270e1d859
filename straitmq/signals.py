"""Foreground processes stop cleanly on SIGINT (Ctrl-C) and SIGTERM."""

from __future__ import annotations

import asyncio
import signal


def stop_signal() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM from now on (also while the process starts)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def wait_for_stop_signal() -> None:
    await stop_signal().wait()
