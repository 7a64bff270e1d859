"""fsync of rolled segments, in a background thread.

A segment that rolls is fsynced once, as Kafka flushes it (`flush-log`, scheduled off the
request path). Done inline, that fsync held the event loop for as long as the disk took
to write the segment's dirty pages: up to a segment's worth (1 GiB by default), seconds
on a slow disk, and every produce and fetch of every partition waited. The roll hands a
duplicate of the segment's descriptor to this one worker instead: the data reached the
kernel already (pwritev), so nothing acknowledged depends on the fsync, and a duplicate
stays valid when the segment's own descriptor is closed, the file deleted or swapped by
the cleaner meanwhile.

The same thread lets go of deleted files, as Kafka's scheduler deletes them off the request
path: a segment's last descriptor is closed here (the close of an unlinked file is what
frees its blocks: tens of milliseconds for a GiB on ext4), and a removed replica's folder,
renamed out of the way on the loop first, is deleted here file by file.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger("straitmq.storage")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_pending: set[Future[None]] = set()
# Each queued fsync holds a descriptor outside the open-files cache: at most this many,
# a roll past it waits for the oldest (a disk that slow is what the bound is for).
MAX_PENDING = 16


def _fsync_and_close(fd: int, name: str) -> None:
    try:
        os.fsync(fd)
    except OSError as e:  # the data is in the page cache still; say so, do not crash
        log.error("cannot fsync a rolled segment", extra={"segment": name, "error": str(e)})
    finally:
        os.close(fd)


def flush_in_background(fd: int, name: str) -> Future[None]:
    """fsync `fd` (a descriptor the caller gave up: it is closed afterwards) in the
    flusher thread, in submission order."""
    fut = _submit(_fsync_and_close, fd, name)
    assert fut is not None  # a waiting submit always queues
    return fut


def _close(fd: int, name: str) -> None:
    try:
        os.close(fd)
    except OSError as e:
        log.error("cannot close a deleted segment", extra={"segment": name, "error": str(e)})


def close_in_background(fd: int, name: str) -> None:
    """Close `fd`, the last descriptor of a file already unlinked, in the flusher thread:
    its blocks are freed there. With the queue full (a retention pass deleting many
    segments right after as many rolls) it is closed here instead: waiting for the queue
    would hold the caller longer than the close does."""
    if _submit(_close, fd, name, wait=False) is None:
        _close(fd, name)


def remove_tree_in_background(path: str) -> None:
    """Delete the folder `path` (a name nothing else will use: the caller renamed it
    first) in the flusher thread. It holds no descriptor while queued: never waits."""
    _submit(shutil.rmtree, path, True, bounded=False)


def _submit(
    fn: Callable[..., None], *args: object, wait: bool = True, bounded: bool = True
) -> Future[None] | None:
    """Queue fn(*args). Past MAX_PENDING jobs, a bounded one waits for the oldest
    (wait=True) or is not queued (wait=False: None)."""
    global _executor
    with _lock:
        waiting = list(_pending)
    if bounded and len(waiting) >= MAX_PENDING:
        if not wait:
            return None
        for oldest in waiting[: len(waiting) - MAX_PENDING + 1]:
            oldest.result()
    with _lock:
        if _executor is None:
            # Not a daemon: the interpreter waits for pending work at exit.
            _executor = ThreadPoolExecutor(1, thread_name_prefix="segment-flush")
        fut = _executor.submit(fn, *args)
        _pending.add(fut)
    fut.add_done_callback(_done)
    return fut


def _done(fut: Future[None]) -> None:
    with _lock:
        _pending.discard(fut)


def pending() -> int:
    """Jobs queued or running (fsyncs, closes, folder deletes): each of the first two
    holds a descriptor until it is done."""
    with _lock:
        return len(_pending)


def drain(timeout: float | None = None) -> bool:
    """Wait for the jobs submitted so far (a log's close); whether all finished."""
    with _lock:
        waiting = list(_pending)
    for fut in waiting:
        try:
            fut.result(timeout)
        except TimeoutError:
            return False
    return True
