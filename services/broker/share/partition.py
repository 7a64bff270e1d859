"""One share-partition's state (KIP-932) on the partition's leader, sans-IO.

A share group reads a topic-partition as a queue: records are *acquired* by one member
at a time under an acquisition lock, and each is then acknowledged ACCEPT (done),
RELEASE (give it to someone else) or REJECT (poison: never deliver again), or its lock
times out. Kafka's names, which this module keeps:

- SPSO, the share-partition start offset: every record before it is done (acknowledged
  or archived); `next_offset` (Kafka's endOffset + 1) is the first record never fetched.
- Between them the *in-flight* records, kept as offset ranges with one state, one
  delivery count, one owner and one lock deadline each. A range is split only when an
  acknowledgement or a lock covers part of it, so a batch fetched and accepted whole
  stays one object, whatever its record count.
- States: AVAILABLE (may be acquired), ACQUIRED (locked by a member until a deadline),
  ACKNOWLEDGED, ARCHIVED (rejected, or released / timed out after `delivery_limit`
  deliveries: Kafka's group.share.delivery.count.limit).

No clock and no I/O inside: the caller passes `now` (milliseconds) and the log bounds;
expired locks are found at each call (`expire`) and `next_deadline()` tells the shell
when the next one falls due. The state lives in memory on the leader and is saved
durably by `checkpoints.py` (`snapshot()` / `restore()`), so a new leader goes on from it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from straitmq.invariants import broken

from ..config import DEFAULTS  # declared once, in BrokerConfig

AVAILABLE = 0
ACQUIRED = 1
ACKNOWLEDGED = 2
ARCHIVED = 4
STATE_NAMES = {
    AVAILABLE: "Available",
    ACQUIRED: "Acquired",
    ACKNOWLEDGED: "Acknowledged",
    ARCHIVED: "Archived",
}

# Acknowledge types on the wire (ShareFetch / ShareAcknowledge v1).
GAP = 0
ACCEPT = 1
RELEASE = 2
REJECT = 3


class InvalidRecordState(Exception):
    """An acknowledgement of records this member does not hold (Kafka's
    INVALID_RECORD_STATE): not acquired, acquired by another, or its lock expired."""


@dataclass(slots=True)
class InFlight:
    first: int
    last: int
    state: int
    delivery_count: int
    member: str | None = None
    deadline: int = 0  # the acquisition lock's end, when ACQUIRED

    def split_at(self, offset: int) -> InFlight:
        """Cut this range before `offset`; return the part from `offset` on."""
        if not self.first < offset <= self.last:
            broken("a split falls inside the range", first=self.first, last=self.last, at=offset)
        tail = InFlight(
            offset, self.last, self.state, self.delivery_count, self.member, self.deadline
        )
        self.last = offset - 1
        return tail


@dataclass(frozen=True, slots=True)
class Acquired:
    """Records handed to a member by one ShareFetch: the response's AcquiredRecords."""

    first: int
    last: int
    delivery_count: int


class SharePartition:
    def __init__(
        self,
        start_offset: int,
        lock_duration_ms: int = DEFAULTS.group_share_record_lock_duration_ms,
        delivery_limit: int = DEFAULTS.group_share_delivery_count_limit,
        max_in_flight: int = DEFAULTS.group_share_partition_max_record_locks,
    ) -> None:
        if start_offset < 0:
            broken("the SPSO is an offset", spso=start_offset)
        self.spso = start_offset
        self.next_offset = start_offset
        self.lock_duration_ms = lock_duration_ms
        self.delivery_limit = delivery_limit
        self.max_in_flight = max_in_flight  # group.share.partition.max.record.locks
        self.ranges: list[InFlight] = []  # sorted, contiguous from spso to next_offset
        # The state last written durably (checkpoints.py): (SPSO, snapshot()).
        self.saved: tuple[int, str] | None = None

    # -- reading the state -----------------------------------------------------------

    def check(self) -> None:
        """Check that the ranges tile [spso, next_offset) in order."""
        at = self.spso
        for r in self.ranges:
            if r.first != at or r.last < r.first:
                broken("the in-flight ranges tile from the SPSO", at=at, range=r)
            at = r.last + 1
        if at != self.next_offset:
            broken("the in-flight ranges end at next_offset", end=at, next_offset=self.next_offset)

    def state_of(self, offset: int) -> tuple[int, int, str | None]:
        """(state, delivery count, owner) of one offset (tests and describe)."""
        if offset < self.spso:
            return ACKNOWLEDGED, 0, None
        if offset >= self.next_offset:
            return AVAILABLE, 0, None
        r = self.ranges[self._index(offset)]
        return r.state, r.delivery_count, r.member

    def next_deadline(self) -> int | None:
        deadlines = [r.deadline for r in self.ranges if r.state == ACQUIRED]
        return min(deadlines) if deadlines else None

    def in_flight(self) -> int:
        return self.next_offset - self.spso

    # -- durable form -------------------------------------------------------------------

    def snapshot(self, max_chars: int = 4000) -> str:
        """The in-flight ranges relative to the SPSO, as `first,length,state,count` joined
        by `;`: what a new leader needs to go on without redelivering acknowledged or
        archived records (acquired ones are saved as available, their locks die with the
        leader). Cut at `max_chars` on a range boundary: what is cut off is fetched again
        as new records (at-least-once)."""
        out: list[str] = []
        size = 0
        for r in self.ranges:
            state = AVAILABLE if r.state == ACQUIRED else r.state
            item = f"{r.first - self.spso},{r.last - r.first},{state},{r.delivery_count}"
            size += len(item) + 1
            if size > max_chars:
                break
            out.append(item)
        return ";".join(out)

    def restore(self, text: str, log_start: int, log_end: int) -> None:
        """Take the ranges of a snapshot() saved at this SPSO (a new leader's start)."""
        if self.ranges or self.next_offset != self.spso:
            broken("a snapshot is restored into a fresh share-partition", spso=self.spso)
        at = self.spso
        for item in filter(None, text.split(";")):
            first, length, state, count = (int(x) for x in item.split(","))
            first += self.spso
            last = min(first + length, log_end - 1)
            if first != at or last < first or state not in (AVAILABLE, ACKNOWLEDGED, ARCHIVED):
                break  # not a tiling of what the log holds: keep what was read so far
            if state == AVAILABLE and count >= self.delivery_limit:
                state = ARCHIVED  # it was acquired for the last time when the leader died
            self.ranges.append(InFlight(first, last, state, count))
            at = last + 1
        self.next_offset = at
        self._compact()
        self.skip_to(log_start)

    # -- time -----------------------------------------------------------------------

    def expire(self, now: int) -> bool:
        """Locks past their deadline: the records become AVAILABLE again (ARCHIVED at
        the delivery limit). True if anything changed."""
        changed = False
        for r in self.ranges:
            if r.state == ACQUIRED and r.deadline <= now:
                self._give_back(r)
                changed = True
        if changed:
            self._compact()
        return changed

    # -- acquiring ----------------------------------------------------------------------

    def acquire(
        self,
        member: str,
        now: int,
        max_records: int,
        new_batches: Iterable[tuple[int, int]] = (),
    ) -> list[Acquired]:
        """Lock records for `member`: first those AVAILABLE in flight (released or timed
        out, lowest offsets first), then new ones from `new_batches`, the (base, last)
        offsets of the log's batches from `next_offset` on, whole batches, as far as
        `max_records` (a soft limit: batches are not cut) and the in-flight cap allow."""
        self.expire(now)
        deadline = now + self.lock_duration_ms
        out: list[Acquired] = []
        budget = max_records
        i = 0
        while i < len(self.ranges) and budget > 0:
            r = self.ranges[i]
            if r.state == AVAILABLE:
                r.state, r.member, r.deadline = ACQUIRED, member, deadline
                r.delivery_count += 1
                out.append(Acquired(r.first, r.last, r.delivery_count))
                budget -= r.last - r.first + 1
            i += 1
        for base, last in new_batches:
            if budget <= 0 or self.in_flight() >= self.max_in_flight:
                break
            if last < self.next_offset:
                continue
            first = max(base, self.next_offset)
            if first != self.next_offset:
                broken("new batches follow next_offset", first=first, next_offset=self.next_offset)
            self.ranges.append(InFlight(first, last, ACQUIRED, 1, member, deadline))
            self.next_offset = last + 1
            out.append(Acquired(first, last, 1))
            budget -= last - first + 1
        self._compact()
        return out

    # -- acknowledging ------------------------------------------------------------------

    def acknowledge(self, member: str, first: int, last: int, types: list[int]) -> None:
        """Apply one AcknowledgementBatch: `types` holds one type for the whole range or
        one per offset. All or nothing: raises InvalidRecordState (and changes nothing)
        unless every offset is ACQUIRED by `member`."""
        if last < first or (len(types) != 1 and len(types) != last - first + 1):
            raise ValueError("acknowledge types must be one, or one per offset")
        if first < self.spso or last >= self.next_offset:
            raise InvalidRecordState(f"offsets {first}-{last} are not in flight")
        i = self._index(first)
        j = i
        while j < len(self.ranges) and self.ranges[j].first <= last:
            r = self.ranges[j]
            if r.state != ACQUIRED or r.member != member:
                raise InvalidRecordState(f"offsets {first}-{last} are not acquired by this member")
            j += 1
        if len(types) == 1:
            self._set_range(first, last, types[0])
        else:
            # Runs of equal types, so a batch acknowledged with one type per record still
            # costs one range per run.
            start = first
            for k in range(1, len(types) + 1):
                if k == len(types) or types[k] != types[k - 1]:
                    self._set_range(start, first + k - 1, types[k - 1])
                    start = first + k
        self._compact()

    def release_member(self, member: str) -> bool:
        """The member left (its share session closed): its records go back, as Kafka
        does when a member's session ends. True if any were held."""
        changed = False
        for r in self.ranges:
            if r.state == ACQUIRED and r.member == member:
                self._give_back(r)
                changed = True
        if changed:
            self._compact()
        return changed

    def skip_to(self, log_start: int) -> None:
        """Records before the log start are gone (retention, DeleteRecords): the SPSO
        moves up to it."""
        if log_start <= self.spso:
            return
        if log_start >= self.next_offset:
            self.ranges.clear()
            self.spso = self.next_offset = log_start
            return
        i = self._index(log_start)
        r = self.ranges[i]
        if r.first < log_start:
            self.ranges.insert(i + 1, r.split_at(log_start))
            i += 1
        del self.ranges[:i]
        self.spso = log_start

    # -- internals -------------------------------------------------------------------

    def _index(self, offset: int) -> int:
        i = bisect_right([r.first for r in self.ranges], offset) - 1
        if i < 0 or self.ranges[i].last < offset:
            broken("an offset looked up is in flight", offset=offset, spso=self.spso)
        return i

    def _give_back(self, r: InFlight) -> None:
        r.member, r.deadline = None, 0
        r.state = ARCHIVED if r.delivery_count >= self.delivery_limit else AVAILABLE

    def _set_range(self, first: int, last: int, kind: int) -> None:
        i = self._index(first)
        if self.ranges[i].first < first:
            self.ranges.insert(i + 1, self.ranges[i].split_at(first))
            i += 1
        while i < len(self.ranges) and self.ranges[i].first <= last:
            r = self.ranges[i]
            if r.last > last:
                self.ranges.insert(i + 1, r.split_at(last + 1))
            if kind == ACCEPT:
                r.state, r.member, r.deadline = ACKNOWLEDGED, None, 0
            elif kind == RELEASE:
                self._give_back(r)
            elif kind in (REJECT, GAP):
                r.state, r.member, r.deadline = ARCHIVED, None, 0
            else:
                raise ValueError(f"unknown acknowledge type {kind}")
            i += 1

    def _compact(self) -> None:
        """Advance the SPSO past finished ranges and merge neighbours alike."""
        ranges = self.ranges
        done = 0
        while done < len(ranges) and ranges[done].state in (ACKNOWLEDGED, ARCHIVED):
            done += 1
        if done:
            self.spso = ranges[done - 1].last + 1
            del ranges[:done]
        merged: list[InFlight] = []
        for r in ranges:
            p = merged[-1] if merged else None
            if (
                p is not None
                and p.state == r.state
                and p.delivery_count == r.delivery_count
                and p.member == r.member
                and p.deadline == r.deadline
                and p.state != ACQUIRED  # acquired ranges are what the client acks: keep
            ):
                p.last = r.last
            else:
                merged.append(r)
        self.ranges = merged
        if not ranges:
            self.spso = self.next_offset
