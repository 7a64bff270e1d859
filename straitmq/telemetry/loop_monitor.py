"""Event-loop stalls, counted by a heartbeat task on the loop itself.

A task sleeps `interval_s` again and again; when it wakes up `threshold_s` or more after
it asked to, the loop was busy that long (one callback blocked, or many queued up), and
every request on the process waited with it. The count and the summed length are
exported (straitmq.process.event_loop.stalls / .stalled) for the EventLoopStalls alert.
The cost is one timer wake-up per interval (10 per second by default).
"""

from __future__ import annotations

import asyncio
import time

from . import catalog as C
from .provider import Telemetry

INTERVAL_S = 0.1
STALL_THRESHOLD_S = 0.25  # what the catalog's description promises


class LoopMonitor:
    def __init__(self, interval_s: float = INTERVAL_S, threshold_s: float = STALL_THRESHOLD_S):
        self.interval_s = interval_s
        self.threshold_s = threshold_s
        self.stalls = 0
        self.stalled_s = 0.0

    def install(self, telemetry: Telemetry) -> LoopMonitor:
        telemetry.observe(C.EVENT_LOOP_STALLS, lambda: [(self.stalls, {})])
        telemetry.observe(C.EVENT_LOOP_STALLED, lambda: [(self.stalled_s, {})])
        return self

    def late(self, seconds: float) -> None:
        """One heartbeat `seconds` late: a stall if it reaches the threshold."""
        if seconds >= self.threshold_s:
            self.stalls += 1
            self.stalled_s += seconds

    async def run(self) -> None:
        while True:
            due = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.late(time.monotonic() - due)
