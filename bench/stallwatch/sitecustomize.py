"""Event-loop stall finder for StraitMQ brokers (a diagnostic, not used in production).

    PYTHONPATH=bench/stallwatch STALLWATCH=1 python -m bench.metadata_scale ...

Every broker process started with that environment runs a 10 ms heartbeat task on its
event loop. A thread watches it: while the heartbeat is late by more than
STALLWATCH_SAMPLE_MS (default 40) it samples the main thread's stack every millisecond
or five, and when the loop is back it appends the stall's length and its most frequent
stacks to STALLWATCH_DIR/<pid>.log (default /tmp/stallwatch) if it lasted more than
STALLWATCH_MS (default 100). A late heartbeat is exactly what a request waiting on that
loop sees, whether one callback blocked or many queued up.

Every heartbeat also goes into a histogram of its lateness, written to
STALLWATCH_DIR/<pid>.hist.json every second: `late` counts every beat by how late it
came; `on_cpu` and `off_cpu` split the beats later than 5 ms by whether the main thread
ran for at least half of the lateness (our own work on the loop) or not (it waited: the
kernel ran someone else, a blocking system call, or another thread held the GIL); `gc0`,
`gc1` and `gc2` count the cyclic collector's pauses by generation. Each
logged stall says too how much CPU the main thread and each other thread used during it.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)  # upper bounds; then "inf"


def bucket(ms: float) -> str:
    for b in BUCKETS_MS:
        if ms < b:
            return f"<{b}"
    return f">={BUCKETS_MS[-1]}"


def _thread_cpu() -> dict[str, float]:
    """CPU seconds per thread of this process, by Python thread name (native id if none)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), f"tid-{tid}")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _install() -> None:
    import asyncio

    import uvloop

    beat = [time.monotonic()]
    hist: dict[str, collections.Counter[str]] = {
        "late": collections.Counter(),
        "on_cpu": collections.Counter(),
        "off_cpu": collections.Counter(),
        # pauses of the cyclic collector, by generation ("gc0", "gc1", "gc2")
        "gc0": collections.Counter(),
        "gc1": collections.Counter(),
        "gc2": collections.Counter(),
    }
    period = 0.01

    async def _heartbeat() -> None:
        last, cpu = time.monotonic(), time.thread_time()
        while True:
            now, cpu_now = time.monotonic(), time.thread_time()
            late = max(0.0, now - last - period) * 1000
            hist["late"][bucket(late)] += 1
            if late >= 5:
                ran = (cpu_now - cpu) * 1000
                hist["on_cpu" if ran >= late / 2 else "off_cpu"][bucket(late)] += 1
            last, cpu = now, cpu_now
            beat[0] = now
            await asyncio.sleep(period)

    def run(main: Coroutine[Any, Any, T], **kwargs: Any) -> T:
        async def watched() -> T:
            task = asyncio.get_running_loop().create_task(_heartbeat())
            try:
                return await main
            finally:
                task.cancel()

        return real_run(watched(), **kwargs)

    real_run = uvloop.run
    uvloop.run = run
    # Collections of the oldest generation walk every object (a 100,000-partition image
    # is millions): their time is counted, so a stall can be told apart from them.
    import gc

    gcs: collections.deque[tuple[float, float, int]] = collections.deque(maxlen=1000)
    gc_start = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            took, generation = time.perf_counter() - gc_start[0], info.get("generation", -1)
            gcs.append((time.monotonic(), took, generation))
            hist[f"gc{generation}"][bucket(took * 1000)] += 1

    gc.callbacks.append(on_gc)
    out_dir = os.environ.get("STALLWATCH_DIR", "/tmp/stallwatch")
    limit = float(os.environ.get("STALLWATCH_MS", "100")) / 1000
    sample_after = float(os.environ.get("STALLWATCH_SAMPLE_MS", "40")) / 1000
    tick = 0.001 if sample_after < 0.02 else 0.005

    def watch() -> None:
        main_id = threading.main_thread().ident
        assert main_id is not None
        main_clock = time.pthread_getcpuclockid(main_id)
        os.makedirs(out_dir, exist_ok=True)
        samples: collections.Counter[str] = collections.Counter()
        began: float | None = None
        cpu0 = 0.0
        threads0: dict[str, float] = {}
        censused = False
        last_dump = time.monotonic()
        hist_path = os.path.join(out_dir, f"{os.getpid()}.hist.json")
        with open(os.path.join(out_dir, f"{os.getpid()}.log"), "a") as out:
            while True:
                time.sleep(tick)
                now = time.monotonic()
                if now - last_dump >= 1.0:
                    last_dump = now
                    tmp = hist_path + ".tmp"
                    with open(tmp, "w") as f:
                        json.dump({k: dict(v) for k, v in hist.items()}, f)
                    os.replace(tmp, hist_path)
                if now - beat[0] > period + sample_after:
                    frame = sys._current_frames().get(main_id)
                    if frame is None:
                        return
                    if began is None:
                        began = beat[0]
                        cpu0 = time.clock_gettime(main_clock)
                        threads0 = _thread_cpu()
                    stack = traceback.StackSummary.extract(
                        traceback.walk_stack(frame), lookup_lines=False
                    )
                    names = [f"{s.filename.rsplit('/', 1)[-1]}:{s.lineno}:{s.name}" for s in stack]
                    samples[" < ".join(names[:7])] += 1  # innermost first
                elif began is not None:
                    stalled = beat[0] - began
                    if stalled > limit:
                        main_cpu = time.clock_gettime(main_clock) - cpu0
                        threads = _thread_cpu()
                        others = {
                            n: round(c - threads0.get(n, 0.0), 3)
                            for n, c in threads.items()
                            if c - threads0.get(n, 0.0) > 0 and n != "MainThread"
                        }
                        within = [(took, g) for end, took, g in list(gcs) if end >= began]
                        out.write(
                            f"STALL {stalled:.3f}s at {time.time():.3f} "
                            f"(main thread CPU {main_cpu:.3f}s, other threads {others}; "
                            f"gc: {sum(t for t, _ in within):.3f}s in {len(within)}, gen-2 "
                            f"{sum(t for t, g in within if g == 2):.3f}s)\n"
                        )
                        for stack_text, n in samples.most_common(5):
                            out.write(f"  {n}x {stack_text}\n")
                        if sum(t for t, g in within if g == 2) > 0.3 and not censused:
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
