"""Event-loop stall finder for StraitMQ brokers (a diagnostic, not used in production).

    PYTHONPATH=bench/stallwatch STALLWATCH=1 python -m bench.metadata_scale ...

Every broker process started with that environment runs a 10 ms heartbeat task on its
event loop. A thread watches it: while the heartbeat is late it samples the main
thread's stack every 5 ms, and when the loop is back it appends the stall's length and
its most frequent stacks to STALLWATCH_DIR/<pid>.log (default /tmp/stallwatch) if it
lasted more than STALLWATCH_MS (default 100). A late heartbeat is exactly what a
request waiting on that loop sees, whether one callback blocked or many queued up.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import traceback
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _install() -> None:
    import asyncio

    import uvloop

    beat = [time.monotonic()]
    real_run = uvloop.run

    async def _heartbeat() -> None:
        while True:
            beat[0] = time.monotonic()
            await asyncio.sleep(0.01)

    def run(main: Coroutine[Any, Any, T], **kwargs: Any) -> T:
        async def watched() -> T:
            task = asyncio.get_running_loop().create_task(_heartbeat())
            try:
                return await main
            finally:
                task.cancel()

        return real_run(watched(), **kwargs)

    uvloop.run = run
    # Collections of the oldest generation walk every object (a 100,000-partition image
    # is millions): their time is counted, so a stall can be told apart from them.
    import gc

    gcs: collections.deque[tuple[float, float]] = collections.deque(maxlen=1000)  # end, took
    gc_start = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gcs.append((time.monotonic(), time.perf_counter() - gc_start[0]))

    gc.callbacks.append(on_gc)
    out_dir = os.environ.get("STALLWATCH_DIR", "/tmp/stallwatch")
    limit = float(os.environ.get("STALLWATCH_MS", "100")) / 1000

    def watch() -> None:
        main_id = threading.main_thread().ident
        os.makedirs(out_dir, exist_ok=True)
        samples: collections.Counter[str] = collections.Counter()
        began: float | None = None
        censused = False
        with open(os.path.join(out_dir, f"{os.getpid()}.log"), "a") as out:
            while True:
                time.sleep(0.005)
                if time.monotonic() - beat[0] > 0.05:
                    frame = sys._current_frames().get(main_id)
                    if frame is None:
                        return
                    stack = traceback.StackSummary.extract(
                        traceback.walk_stack(frame), lookup_lines=False
                    )
                    names = [f"{s.filename.rsplit('/', 1)[-1]}:{s.lineno}:{s.name}" for s in stack]
                    samples[" < ".join(names[:7])] += 1  # innermost first
                    began = beat[0] if began is None else began
                elif began is not None:
                    stalled = beat[0] - began
                    if stalled > limit:
                        within = [took for end, took in list(gcs) if end >= began]
                        out.write(
                            f"STALL {stalled:.3f}s at {time.time():.3f} "
                            f"(gen-2 gc: {sum(within):.3f}s in {len(within)})\n"
                        )
                        for stack_text, n in samples.most_common(5):
                            out.write(f"  {n}x {stack_text}\n")
                        if sum(within) > 0.3 and not censused:
                            # Once: what the collector walks (a pause of its own).
                            censused = True
                            kinds = collections.Counter(type(o).__name__ for o in gc.get_objects())
                            out.write(
                                f"  gc tracks {sum(kinds.values())} objects: "
                                f"{kinds.most_common(20)}\n"
                            )
                        out.flush()
                    samples.clear()
                    began = None

    threading.Thread(target=watch, name="stallwatch", daemon=True).start()


if os.environ.get("STALLWATCH") and "straitmq.broker" in " ".join(sys.orig_argv):
    _install()
