"""Foreground processes stop cleanly on SIGINT (Ctrl-C) and SIGTERM."""

from __future__ import annotations

import asyncio
import signal


async def wait_for_stop_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
