"""The log cleaner: compacts the partitions whose cleanup.policy includes `compact`.

Kafka's `LogCleaner` and `LogCleanerManager`: every `log.cleaner.backoff.ms` (and when
asked), the dirtiest compacted log above its `min.cleanable.dirty.ratio` (or past its
`max.compaction.lag.ms`) is cleaned, at most `log.cleaner.threads` at once. The cleaning
itself (`storage.compaction.clean`) reads and writes files only, so it runs in worker
*processes*: it touches every record, and a thread would hold the GIL against the event
loop's produce and fetch (bench/cleaner.py measures both). The event loop only picks the
logs and swaps the cleaned segments in, which takes renames and no reads.

What may be cleaned ends at the first of: the active segment, the high watermark (a
record above it may still be truncated away, and the older record of its key with it),
and the first segment younger than `min.compaction.lag.ms`. Followers clean their own
logs, as Kafka's do. A partition whose data the cleaner cannot read is left alone (until
a restart) and keeps serving: the reason is logged and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Protocol

from straitmq.invariants import broken
from straitmq.tasks import cancel_and_wait

from .loop_slice import LoopSlice
from .storage.compaction import CleanJob, CleanResult, CorruptSegment, clean, is_disk_full
from .storage.log import PartitionLog

log = logging.getLogger("straitmq.cleaner")

# How long a swapped-out segment's descriptor stays open for fetches still sending it.
RETIRED_GRACE_S = 60.0
# A round's look at every log yields the event loop after this much of it, the clock
# read every SCAN_CHECK logs.
SCAN_SLICE_S = 0.005
SCAN_CHECK = 64
# Python's dict of bytes keys costs about this much per entry (Kafka's map: 24 bytes).
MAP_BYTES_PER_ENTRY = 128


class CleanerSettings(Protocol):
    """The broker-level `log.cleaner.*` settings, read again at every round."""

    @property
    def threads(self) -> int: ...
    @property
    def io_max_bytes_per_second(self) -> float: ...
    @property
    def dedupe_buffer_size(self) -> int: ...
    @property
    def backoff_ms(self) -> int: ...
    @property
    def enabled(self) -> bool: ...


@dataclass(slots=True)
class CleanerLog:
    """One local replica as the cleaner sees it."""

    topic: str
    partition: int
    log: PartitionLog
    high_watermark: int


@dataclass(slots=True)
class PartitionStats:
    last_clean_ms: int = 0  # wall clock of the last swap, 0: never
    dirty_ratio: float = 0.0
    uncleanable: str | None = None  # why the cleaner stopped cleaning this partition


@dataclass(slots=True)
class CleanerStats:
    """For /metrics and `strait topic describe`."""

    bytes_read: int = 0
    bytes_written: int = 0
    records_removed: int = 0
    cleanings: int = 0
    errors: int = 0
    abandoned: int = 0  # results not swapped in: the log changed meanwhile
    busy_seconds: float = 0.0  # summed over workers
    last_seconds: float = 0.0
    partitions: dict[tuple[str, int], PartitionStats] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Cleanable:
    first_dirty: int
    clean_end: int
    dirty_bytes: int
    total_bytes: int
    forced: bool  # past max.compaction.lag.ms

    @property
    def ratio(self) -> float:
        return self.dirty_bytes / self.total_bytes if self.total_bytes else 0.0


def cleanable(plog: PartitionLog, high_watermark: int, now_ms: int) -> Cleanable:
    """Which part of `plog` may be cleaned now, and how dirty it is (segment sizes)."""
    cfg = plog.config
    first_dirty, horizon = plog.read_cleaner_checkpoint()
    # Never past the last stable offset (Kafka's firstUncleanableOffset): a transaction
    # whose outcome is not known cannot be cleaned by it.
    clean_end = min(plog.segments[-1].base_offset, plog.last_stable_offset(high_watermark))
    closed = plog.closed_segments()
    for seg in closed if cfg.min_compaction_lag_ms > 0 else ():
        if seg.next_offset > first_dirty and now_ms - seg.max_timestamp < cfg.min_compaction_lag_ms:
            clean_end = min(clean_end, seg.base_offset)
            break
    dirty = total = 0
    forced = False
    for seg in closed:
        if seg.base_offset >= clean_end:
            break
        if seg.next_offset > clean_end:  # the high watermark falls inside it
            clean_end = seg.base_offset
            break
        total += seg.size
        if seg.next_offset > first_dirty:
            dirty += seg.size
            if not forced and seg.max_timestamp >= 0:
                forced = now_ms - seg.max_timestamp > cfg.max_compaction_lag_ms
    if horizon is not None and now_ms >= horizon and total:
        forced = True  # tombstones whose delete.retention.ms is over: clean them away
    return Cleanable(first_dirty, clean_end, dirty, total, forced)


def make_job(plog: PartitionLog, c: Cleanable, s: CleanerSettings, now: int) -> CleanJob:
    segs = [x for x in plog.closed_segments() if x.base_offset < c.clean_end]
    threads = max(1, s.threads)
    return CleanJob(
        directory=plog.directory,
        segments=plog.segment_files(segs),
        first_dirty=c.first_dirty,
        clean_end=c.clean_end,
        now_ms=now,
        delete_retention_ms=plog.config.delete_retention_ms,
        segment_bytes=plog.config.segment_bytes,
        index_interval=plog.config.index_interval_bytes,
        max_map_entries=max(1, s.dedupe_buffer_size // threads // MAP_BYTES_PER_ENTRY),
        io_bytes_per_second=s.io_max_bytes_per_second / threads,
        producer_last_offsets={
            pid: e.batches[-1].last_offset
            for pid, e in plog.producers.producers.items()
            if e.batches
        },
        aborted=tuple(
            (a.producer_id, a.first_offset, a.last_offset)
            for a in plog.aborted_transactions(segs[0].base_offset if segs else 0, c.clean_end)
        ),
    )


def clean_in_place(
    plog: PartitionLog, high_watermark: int, s: CleanerSettings, now_ms: int
) -> CleanResult | None:
    """One whole cleaning in this thread, swap included (tests and tools; the broker
    goes through `LogCleaner`). None when nothing is dirty."""
    c = cleanable(plog, high_watermark, now_ms)
    if not (c.dirty_bytes or c.forced):
        return None
    job = make_job(plog, c, s, now_ms)
    result = clean(job)
    if plog.swap_cleaned(job.segments, result.groups) is not None:
        plog.write_cleaner_checkpoint(result.map_end, result.horizon_ms)
        plog.unpin_retired()
    return result


class LogCleaner:
    def __init__(
        self,
        logs: Callable[[], Iterable[CleanerLog]],
        settings: Callable[[], CleanerSettings],
        executor: str = "process",
    ) -> None:
        self._logs = logs
        self._settings = settings
        self._executor_kind = executor  # "process" or "thread" (the benchmark compares)
        self._pool: Executor | None = None
        self._pool_size = 0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.stats = CleanerStats()
        self.started = time.time()
        self.finished = asyncio.Condition()  # notified after every cleaning (tests wait)

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait([self._task, *self._running.values()])
        self._task = None
        self._running.clear()
        self._shutdown_pool()

    def partition_stats(self) -> dict[tuple[str, int], PartitionStats]:
        """Every compacted log's stats (for /metrics): one the rounds have not looked at
        yet gets its dirty ratio now."""
        now = int(time.time() * 1000)
        parts = self.stats.partitions
        for cl in self._logs():
            key = (cl.topic, cl.partition)
            if key not in parts and cl.log.config.compact and not cl.log.closed:
                st = parts[key] = PartitionStats()
                st.dirty_ratio = cleanable(cl.log, cl.high_watermark, now).ratio
        return parts

    async def run_once(self) -> int:
        """Clean every log that needs it now and wait for the cleanings (tests, tools);
        returns how many were swapped in."""
        before = self.stats.cleanings
        for _ in range(100):  # a full offset map asks for another round; bounded
            await self._start_cleanings(self._settings())
            if not self._running:
                break
            await asyncio.gather(*list(self._running.values()), return_exceptions=True)
        return self.stats.cleanings - before

    def wake(self) -> None:
        """Look for work now (a test, an operator, a config change)."""
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            s = self._settings()
            try:
                if s.enabled:
                    await self._start_cleanings(s)
            except OSError as e:  # a log's files, read to judge it: the next round
                log.warning("log cleaner round failed", extra={"error": str(e)})
            except Exception as e:  # a bug: the round judges logs in memory
                broken("a log cleaner round fails only on I/O", error=f"{type(e).__name__}: {e}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), s.backoff_ms / 1000)
            self._wake.clear()

    async def _start_cleanings(self, s: CleanerSettings) -> None:
        """One round: every local log is looked at, in slices of the event loop (a
        broker with 100,000 partitions would otherwise stall its listener every
        backoff), then the dirtiest are started."""
        now = int(time.time() * 1000)
        candidates: list[tuple[float, CleanerLog, Cleanable]] = []
        live: set[tuple[str, int]] = set()
        pacer = LoopSlice(SCAN_SLICE_S, SCAN_CHECK)
        for cl in self._logs():
            if pacer.due():
                await pacer.pause()
            key = (cl.topic, cl.partition)
            live.add(key)
            if not cl.log.config.compact or cl.log.closed:
                continue
            st = self.stats.partitions.setdefault(key, PartitionStats())
            c = cleanable(cl.log, cl.high_watermark, now)
            st.dirty_ratio = c.ratio
            if key in self._running or st.uncleanable or not (c.dirty_bytes or c.forced):
                continue
            if c.forced or c.ratio >= cl.log.config.min_cleanable_dirty_ratio:
                candidates.append((2.0 if c.forced else c.ratio, cl, c))
        for key in list(self.stats.partitions):
            if key not in live:
                del self.stats.partitions[key]
        free = max(1, s.threads) - len(self._running)
        candidates.sort(key=lambda x: x[0], reverse=True)
        for _score, cl, c in candidates[: max(0, free)]:
            if (cl.topic, cl.partition) in self._running or cl.log.closed:
                continue  # another round started it, or it closed, while this one paused
            job = make_job(cl.log, c, s, now)
            task = asyncio.get_running_loop().create_task(self._clean(cl, job))
            self._running[(cl.topic, cl.partition)] = task

    async def _clean(self, cl: CleanerLog, job: CleanJob) -> None:
        try:
            await self._clean_one(cl, job)
        finally:
            async with self.finished:
                self.finished.notify_all()

    async def _clean_one(self, cl: CleanerLog, job: CleanJob) -> None:
        key = (cl.topic, cl.partition)
        st = self.stats.partitions.setdefault(key, PartitionStats())
        try:
            result = await self._submit(job)
        except CorruptSegment as e:
            self._give_up(key, st, f"corrupt data: {e}")
            return
        except BrokenProcessPool:
            self._shutdown_pool()
            self._give_up(key, st, "the cleaner's worker process died while cleaning it")
            return
        except OSError as e:
            self.stats.errors += 1
            level = logging.WARNING if is_disk_full(e) else logging.ERROR
            log.log(
                level,
                "log cleaning failed",
                extra={"topic": cl.topic, "partition": cl.partition, "error": str(e)},
            )
            return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._give_up(key, st, f"{type(e).__name__}: {e}")
            return
        finally:
            self._running.pop(key, None)
        self._account(result)
        retired = cl.log.swap_cleaned(job.segments, result.groups)
        if retired is None:
            self.stats.abandoned += 1
        else:
            cl.log.write_cleaner_checkpoint(result.map_end, result.horizon_ms)
            st.last_clean_ms = int(time.time() * 1000)
            self.stats.cleanings += 1
            if retired:
                asyncio.get_running_loop().call_later(
                    RETIRED_GRACE_S, cl.log.unpin_retired, retired
                )
            log.debug(
                "cleaned a log",
                extra={
                    "topic": cl.topic,
                    "partition": cl.partition,
                    "read": result.bytes_read,
                    "written": result.bytes_written,
                    "removed": result.records_removed,
                    "seconds": round(result.seconds, 3),
                },
            )
        if result.map_end < job.clean_end:
            self.wake()  # the map was full: go on from where it stopped

    def _account(self, r: CleanResult) -> None:
        s = self.stats
        s.bytes_read += r.bytes_read
        s.bytes_written += r.bytes_written
        s.records_removed += r.records_removed
        s.busy_seconds += r.seconds
        s.last_seconds = r.seconds

    def _give_up(self, key: tuple[str, int], st: PartitionStats, reason: str) -> None:
        self.stats.errors += 1
        st.uncleanable = reason
        log.warning(
            "stopped cleaning a partition; it keeps serving",
            extra={"topic": key[0], "partition": key[1], "reason": reason},
        )

    # -- workers ----------------------------------------------------------------------

    async def _submit(self, job: CleanJob) -> CleanResult:
        pool = self._ensure_pool()
        return await asyncio.get_running_loop().run_in_executor(pool, clean, job)

    def _ensure_pool(self) -> Executor:
        size = max(1, self._settings().threads)
        if self._pool is not None and size != self._pool_size and not self._running:
            self._shutdown_pool()
        if self._pool is None:
            if self._executor_kind == "thread":
                self._pool = ThreadPoolExecutor(size, thread_name_prefix="log-cleaner")
            else:
                # spawn: a fork of a process running an event loop and threads is unsafe.
                self._pool = ProcessPoolExecutor(size, multiprocessing.get_context("spawn"))
            self._pool_size = size
        return self._pool

    def _shutdown_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # A worker in the middle of a long cleaning would hold the broker's exit until it
        # ends (the interpreter joins them): stop it. Its .cleaned files go at the next
        # load, as after a crash. (Python 3.14 has terminate_workers for this.)
        workers = list(getattr(pool, "_processes", None) or {})
        processes = getattr(pool, "_processes", None) or {}
        pool.shutdown(wait=False, cancel_futures=True)
        for pid in workers:
            proc = processes.get(pid)
            if proc is not None and proc.is_alive():
                proc.terminate()
