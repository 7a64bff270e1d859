"""The segment files a broker keeps open, bounded: at most `limit` at once.

A broker with 100,000 partitions has at least as many segments; a descriptor each would
need a process limit far above the common default of 1,024 (Kafka asks operators for
100,000 or more). Here a segment opens its `.log` file on first use and the least
recently used one is closed when the limit is reached; a closed segment reopens on its
next read or append. Index files are opened only to append to them, so they hold none.

A cache is used from one thread only: the event loop's shared one, or a private one a
worker thread loads logs with before the event loop adopts them (`PartitionLog.adopt`).
Whoever takes `fd` uses it before its next await; a fetch that waits on its socket
asks again afterwards (the file may have been closed and reopened meanwhile).
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("straitmq.storage")

_NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class Openable(Protocol):
    """What the cache holds: a file that can be opened and closed again (a Segment)."""

    _fd: int

    def _open_file(self) -> int: ...


def process_fd_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def default_limit() -> int:
    """Half the process's descriptor limit: the rest is for client connections, the
    metadata log and everything else a broker opens."""
    return max(16, process_fd_limit() // 2)


class FileHandles:
    __slots__ = ("_last_warning", "_lru", "closed", "limit", "opened")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = max(1, limit if limit is not None else default_limit())
        self._lru: OrderedDict[Openable, None] = OrderedDict()
        self.opened = 0  # files opened, reopens included (a metric)
        self.closed = 0  # closed to stay under the limit
        self._last_warning = 0.0

    def __len__(self) -> int:
        return len(self._lru)

    def fd(self, f: Openable) -> int:
        """`f`'s descriptor, opening it (and closing the least recently used) if needed."""
        fd = f._fd
        if fd >= 0:
            self._lru.move_to_end(f)
            return fd
        while len(self._lru) >= self.limit:
            self._evict()
        fd = self._retrying(f._open_file)
        f._fd = fd
        self._lru[f] = None
        self.opened += 1
        return fd

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        """A descriptor for a short use (an index append, a snapshot), closed by the
        caller; under descriptor pressure, room is made as for segments."""
        return self._retrying(lambda: os.open(path, flags, mode))

    def _retrying(self, open_file: Callable[[], int]) -> int:
        try:
            return open_file()
        except OSError as e:
            if e.errno not in _NO_DESCRIPTORS:
                raise
        # Connections and other files took the room: give back half of ours, once.
        for _ in range(max(1, len(self._lru) // 2)):
            if self._lru:
                self._evict()
        try:
            return open_file()
        except OSError as again:
            if again.errno not in _NO_DESCRIPTORS:
                raise
            raise self._exhausted(again) from again

    def release(self, f: Openable) -> None:
        """Close `f`'s descriptor if it holds one (the segment closes or is deleted)."""
        fd = f._fd
        if fd >= 0:
            f._fd = -1
            self._lru.pop(f, None)
            os.close(fd)

    def close_all(self) -> None:
        while self._lru:
            self._evict()

    def _evict(self) -> None:
        f, _ = self._lru.popitem(last=False)
        fd, f._fd = f._fd, -1
        self.closed += 1
        os.close(fd)

    def _exhausted(self, e: OSError) -> OSError:
        """The error a request gets (KAFKA_STORAGE_ERROR) when no descriptor is left,
        naming both limits; logged at most every 10 s."""
        msg = (
            f"out of file descriptors: {len(self._lru)} segment files open "
            f"(--max-open-files {self.limit}), process limit RLIMIT_NOFILE "
            f"{process_fd_limit()}; the rest are connections and other files"
        )
        now = time.monotonic()
        if now - self._last_warning >= 10:
            self._last_warning = now
            log.warning(msg, extra={"errno": e.errno})
        return OSError(e.errno, msg)
