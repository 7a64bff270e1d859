"""Long loops on the broker's event loop, cut into slices of wall time so the Kafka
listener keeps answering while a loop walks tens of thousands of partitions."""

from __future__ import annotations

import asyncio
import time


class LoopSlice:
    """`if s.due(): await s.pause()` once per item: due when `seconds` of work have
    passed since the last pause, the clock read only every `check_every` items (a
    clock read per partition would cost more than some loops' own work)."""

    __slots__ = ("_count", "_started", "check_every", "seconds")

    def __init__(self, seconds: float, check_every: int = 1) -> None:
        self.seconds = seconds
        self.check_every = check_every
        self._count = 0
        self._started = time.monotonic()

    def due(self) -> bool:
        self._count += 1
        return (
            self._count % self.check_every == 0 and time.monotonic() - self._started >= self.seconds
        )

    async def pause(self) -> None:
        await asyncio.sleep(0)
        self._started = time.monotonic()
