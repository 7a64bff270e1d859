"""Leader epoch cache of one partition (Kafka's LeaderEpochFileCache).

An ordered list of (leader epoch, first offset written in that epoch). A follower asks the
leader where its last epoch ended (OffsetForLeaderEpoch, KIP-101/KIP-279) and truncates
its log there before fetching, so logs that diverged after an unclean or fast leader
change are repaired instead of silently mixing histories.

Persisted as `leader-epoch-checkpoint` in the partition directory, in Kafka's text format
(version, count, then "epoch start_offset" lines), rewritten atomically on every change:
changes happen only on leader changes, truncation and retention, never per append.
"""

from __future__ import annotations

import errno
import logging
import os
from bisect import bisect_right

log = logging.getLogger("straitmq.storage")

CHECKPOINT_NAME = "leader-epoch-checkpoint"
_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    """Epochs and their start offsets, both increasing; `latest_epoch` is -1 when empty."""

    __slots__ = ("_epochs", "_starts", "dirty", "latest_epoch", "path")

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, CHECKPOINT_NAME)
        self._epochs: list[int] = []
        self._starts: list[int] = []
        # A plain attribute (not a property): the leader's append compares against it.
        self.latest_epoch = UNDEFINED_EPOCH
        self.dirty = False  # changed in memory, checkpoint not written yet (assign(persist=False))

    # -- reading ---------------------------------------------------------------------

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    @property
    def latest_start(self) -> int:
        return self._starts[-1] if self._starts else -1

    def epoch_for(self, offset: int) -> int:
        """The epoch the record at `offset` was written in (Kafka's epochForOffset), or
        -1 if it lies before every known epoch (ListOffsets answers it with offsets)."""
        i = bisect_right(self._starts, offset) - 1
        return self._epochs[i] if i >= 0 else UNDEFINED_EPOCH

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) as Kafka's `endOffsetFor` answers OffsetForLeaderEpoch.

        - the latest epoch ends at the log end offset (it is still being written);
        - otherwise the largest known epoch <= `epoch` ends where the next higher one
          starts;
        - `epoch` below every known epoch (its history was deleted by retention): the
          requested epoch with the earliest entry's start offset, so the follower
          truncates to where the leader's known history begins;
        - undefined (< 0), above the latest epoch, or nothing cached: (-1, -1).
        """
        if epoch < 0 or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if epoch == self.latest_epoch:
            return epoch, log_end_offset
        higher = bisect_right(self._epochs, epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return epoch, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    # -- changes (each persisted at once) ------------------------------------------------

    def assign(self, epoch: int, start_offset: int, persist: bool = True) -> bool:
        """Record that `epoch` starts at `start_offset`; a lower or equal epoch (already
        known, or a stale leader) is ignored. Returns True when an entry was added.

        persist=False leaves the checkpoint to `flush` (a leader change of thousands of
        partitions at once writes them later, a slice at a time). A crash before then
        loses nothing: an epoch that wrote no batch is dropped by Kafka's rules anyway,
        and one that did is rebuilt from the batches at load."""
        if epoch <= self.latest_epoch or epoch < 0:
            return False
        if self._starts and start_offset < self._starts[-1]:
            raise ValueError(
                f"leader epoch {epoch} starts at {start_offset}, before epoch "
                f"{self.latest_epoch} which starts at {self._starts[-1]}"
            )
        before = (list(self._epochs), list(self._starts), self.latest_epoch)
        if self._starts and start_offset == self._starts[-1]:
            # The previous epoch wrote nothing (a leader that never appended): Kafka drops
            # it so start offsets stay strictly increasing.
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        self.latest_epoch = epoch
        if not persist:
            self.dirty = True
            return True
        try:
            self._write()
        except OSError:
            # Not assigned after all (a full disk): the next append tries again and is
            # refused with a storage error until the checkpoint can be written.
            self._epochs, self._starts, self.latest_epoch = before
            raise
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop epochs that start at or after `end_offset` (the log was cut there)."""
        n = len(self._starts)
        while n and self._starts[n - 1] >= end_offset:
            n -= 1
        if n < len(self._starts):
            del self._epochs[n:]
            del self._starts[n:]
            self.latest_epoch = self._epochs[-1] if self._epochs else UNDEFINED_EPOCH
            self._write()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset`: drop epochs that end at or before it and
        move the start of the epoch holding it up to it."""
        if not self._starts or self._starts[0] >= start_offset:
            return
        keep = bisect_right(self._starts, start_offset) - 1  # the epoch holding it
        del self._epochs[:keep]
        del self._starts[:keep]
        self._starts[0] = start_offset
        self._write()

    def clear(self) -> None:
        self._epochs.clear()
        self._starts.clear()
        self.latest_epoch = UNDEFINED_EPOCH
        self._write()

    # -- persistence -------------------------------------------------------------------

    def load(self) -> bool:
        """Read the checkpoint; False (and empty) if it is missing or unreadable."""
        self._epochs.clear()
        self._starts.clear()
        self.latest_epoch = UNDEFINED_EPOCH
        try:
            with open(self.path, "rb") as f:
                lines = f.read().decode("ascii").split("\n")
            if int(lines[0]) != _VERSION:
                raise ValueError(f"unknown version {lines[0]!r}")
            count = int(lines[1])
            epochs, starts = [], []
            for line in lines[2 : 2 + count]:
                e, s = line.split()
                epochs.append(int(e))
                starts.append(int(s))
            if len(epochs) != count or any(
                epochs[i] >= epochs[i + 1] or starts[i] > starts[i + 1] for i in range(count - 1)
            ):
                raise ValueError("entries missing or out of order")
        except FileNotFoundError:
            return False
        except (OSError, ValueError, IndexError, UnicodeDecodeError) as e:
            log.warning(
                "ignoring unreadable leader epoch checkpoint",
                extra={"path": self.path, "error": str(e)},
            )
            return False
        self._epochs, self._starts = epochs, starts
        self.latest_epoch = epochs[-1] if epochs else UNDEFINED_EPOCH
        return True

    def replace(self, entries: list[tuple[int, int]]) -> None:
        """Set all entries at once (rebuilt from the log) and persist them."""
        self._epochs = [e for e, _ in entries]
        self._starts = [s for _, s in entries]
        self.latest_epoch = self._epochs[-1] if self._epochs else UNDEFINED_EPOCH
        self._write()

    def flush(self) -> None:
        """Write the checkpoint if an assign(persist=False) left it behind."""
        if self.dirty:
            self._write()

    def _write(self) -> None:
        """tmp + rename: a crash leaves the old or the new file, never a torn one. No
        fsync (Kafka also took it off the leader-change path, KAFKA-15046): the batches
        carry their epochs, so a checkpoint a machine crash lost or emptied is rebuilt
        from the log at load (see PartitionLog._load_epochs), and the log itself is not
        fsynced either. At startup each leader's new epoch cost two fsyncs."""
        body = "".join(f"{e} {s}\n" for e, s in zip(self._epochs, self._starts, strict=True))
        data = f"{_VERSION}\n{len(self._epochs)}\n{body}".encode("ascii")
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, f"short write to {tmp}")
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self.dirty = False

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.entries})"
