"""The epoch cache: where each leader epoch starts in the log.

Fetch validation and follower truncation only ever ask one question of it:
"what is the largest epoch <= E in this log, and at which offset does it end?"
(Kafka's OffsetForLeaderEpoch). A log that starts after a snapshot keeps the
snapshot's id as its base: the snapshot's epoch ends at the snapshot's end offset
unless log entries of the same epoch follow it.
"""

from __future__ import annotations

from bisect import bisect_right

from straitmq.invariants import broken


class EpochCache:
    __slots__ = ("_base_epoch", "_base_offset", "_epochs", "_starts")

    def __init__(self, base_epoch: int = 0, base_offset: int = 0) -> None:
        self._base_epoch = base_epoch
        self._base_offset = base_offset
        self._epochs: list[int] = []  # ascending, one per epoch present in the log
        self._starts: list[int] = []  # first offset of each, ascending

    def reset(self, base_epoch: int, base_offset: int) -> None:
        """Forget every epoch: the log is now empty and starts at base_offset, after a
        snapshot whose last entry has base_epoch (0 and 0 for no snapshot)."""
        self._base_epoch, self._base_offset = base_epoch, base_offset
        self._epochs.clear()
        self._starts.clear()

    @property
    def last_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else self._base_epoch

    def append(self, epoch: int, offset: int) -> None:
        """Record that the entry at `offset` has `epoch` (entries are appended in order)."""
        last = self.last_epoch
        if epoch < last:
            broken("epochs never decrease along the log", epoch=epoch, after=last, offset=offset)
        if not self._epochs or epoch > self._epochs[-1]:
            self._epochs.append(epoch)
            self._starts.append(offset)

    def truncate_end(self, end_offset: int) -> None:
        """The log lost every entry at offsets >= end_offset."""
        while self._starts and self._starts[-1] >= end_offset:
            self._starts.pop()
            self._epochs.pop()

    def truncate_start(self, start_offset: int, start_epoch: int, log_end: int) -> None:
        """The log now starts at start_offset after a snapshot of epoch start_epoch."""
        epochs: list[int] = []
        starts: list[int] = []
        for i, (epoch, start) in enumerate(zip(self._epochs, self._starts, strict=True)):
            end = self._starts[i + 1] if i + 1 < len(self._starts) else log_end
            if end > start_offset:
                epochs.append(epoch)
                starts.append(max(start, start_offset))
        self._base_epoch, self._base_offset = start_epoch, start_offset
        self._epochs, self._starts = epochs, starts

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int] | None:
        """(largest epoch <= `epoch` in the log, the offset where it ends), or None
        when every epoch the log knows is larger (it lies inside the snapshot)."""
        i = bisect_right(self._epochs, epoch) - 1
        if i >= 0:
            end = self._starts[i + 1] if i + 1 < len(self._starts) else log_end
            return self._epochs[i], end
        if self._base_epoch <= epoch:
            return self._base_epoch, self._base_offset
        return None
