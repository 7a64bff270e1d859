"""Share sessions (KIP-932) on a partition leader, and the share-partitions they read.

A share session belongs to one (group, member) on one broker. The client opens it with
ShareFetch epoch 0 naming every partition it wants from this broker, then sends epochs
1, 2, ... naming only partitions to add (and forgotten ones to drop); epoch -1 closes it
(after applying the acknowledgements it carries). Like Kafka:

- epoch 0 with acknowledgements: INVALID_REQUEST; epoch 0 for a (group, member) that has
  a session replaces it. The member keeps what it acquired: a client opens a new
  session after any error or timeout of its requests, and still acknowledges the
  records it is processing (acknowledgements are checked by member, not by session).
- any other epoch with no session: SHARE_SESSION_NOT_FOUND; the wrong epoch:
  INVALID_SHARE_SESSION_EPOCH; at `max_sessions` open sessions, one idle for longer
  than `session_idle_ms` is evicted for the new one, else it gets
  SHARE_SESSION_LIMIT_REACHED.
- A session closed by its client (epoch -1), or a member that left the group or was
  expired by the coordinator, gets its acquired records released at once; an evicted
  session's records wait for their locks to time out (its member may still be alive).

The share-partitions (`SharePartition`) are created at the first fetch of a group on a
partition this broker leads, starting at the SPSO saved by the previous leader
(`checkpoints.py`), else at the high watermark (Kafka's default
share.auto.offset.reset=latest) or the log start (earliest), and dropped when this
broker stops leading the partition. Sessions are not persisted (clients open new ones).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from ..config import DEFAULTS  # declared once, in BrokerConfig
from .partition import SharePartition

INITIAL_EPOCH = 0
FINAL_EPOCH = -1

TopicPartitionKey = tuple[uuid.UUID, int]
SharePartitionKey = tuple[str, str, int]  # group, topic name, partition


@dataclass(slots=True)
class ShareSession:
    group_id: str
    member_id: str
    epoch: int = 1  # the epoch the next request must carry
    partitions: set[TopicPartitionKey] = field(default_factory=set)
    last_used: int = 0  # ms, for evicting the sessions of clients that went away


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= 2**31 - 1 else epoch + 1


class ShareState:
    """Every share session and share-partition of one broker."""

    def __init__(
        self,
        lock_duration_ms: int = DEFAULTS.group_share_record_lock_duration_ms,
        delivery_limit: int = DEFAULTS.group_share_delivery_count_limit,
        max_record_locks: int = DEFAULTS.group_share_partition_max_record_locks,
        max_sessions: int = 2000,
        auto_offset_reset: str = DEFAULTS.share_auto_offset_reset,
        session_idle_ms: int = DEFAULTS.group_share_session_timeout_ms,
    ) -> None:
        self.session_idle_ms = session_idle_ms
        self.lock_duration_ms = lock_duration_ms
        self.delivery_limit = delivery_limit
        self.max_record_locks = max_record_locks
        self.max_sessions = max_sessions
        self.auto_offset_reset = auto_offset_reset
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        self.partitions: dict[SharePartitionKey, SharePartition] = {}

    # -- sessions -------------------------------------------------------------------------

    def session_for(
        self, group_id: str, member_id: str, epoch: int, acks: bool, now: int = 0
    ) -> tuple[ShareSession | None, int, str | None]:
        """(the session, an error code, its message) for a request's epoch. Epoch -1
        returns the session to close after its acknowledgements (see `close`)."""
        key = (group_id, member_id)
        session: ShareSession | None
        if epoch == INITIAL_EPOCH:
            if acks:
                message = "acknowledgements cannot be sent with share session epoch 0"
                return None, ErrorCode.invalid_request, message
            if self.sessions.pop(key, None) is None and len(self.sessions) >= self.max_sessions:
                self.evict_idle(now)
                if len(self.sessions) >= self.max_sessions:
                    return None, ErrorCode.share_session_limit_reached, None
            session = self.sessions[key] = ShareSession(group_id, member_id, last_used=now)
            return session, 0, None
        session = self.sessions.get(key)
        if session is None:
            return None, ErrorCode.share_session_not_found, None
        session.last_used = now
        if epoch == FINAL_EPOCH:
            return session, 0, None
        if epoch != session.epoch:
            return None, ErrorCode.invalid_share_session_epoch, None
        session.epoch = next_epoch(epoch)
        return session, 0, None

    def evict_idle(self, now: int) -> None:
        """Forget the sessions nobody used for `session_idle_ms` (clients that went away
        without closing them). Their records stay with their members until released,
        acknowledged or timed out: a member still alive may acknowledge them."""
        for key in [
            k for k, s in self.sessions.items() if now - s.last_used > self.session_idle_ms
        ]:
            del self.sessions[key]

    def drop_member(self, group_id: str, member_id: str) -> bool:
        """The member left its group (or was expired): close its session, release its
        records. True if anything was released."""
        self.sessions.pop((group_id, member_id), None)
        return self.release_member(group_id, member_id)

    def close(self, session: ShareSession) -> None:
        if self.sessions.get((session.group_id, session.member_id)) is session:
            del self.sessions[(session.group_id, session.member_id)]
        self.release_member(session.group_id, session.member_id)

    def release_member(self, group_id: str, member_id: str) -> bool:
        changed = False
        for (g, _, _), sp in self.partitions.items():
            if g == group_id:
                changed |= sp.release_member(member_id)
        return changed

    # -- share-partitions ---------------------------------------------------------------

    def partition(
        self,
        group_id: str,
        topic: str,
        index: int,
        log_start: int,
        high_watermark: int,
        saved: int | None = None,
        reset: str | None = None,
        saved_state: str | None = None,
        log_end: int | None = None,
    ) -> SharePartition:
        """The share-partition, made at its first use: from the `saved` SPSO if there
        is one (within the log), else share.auto.offset.reset."""
        key = (group_id, topic, index)
        sp = self.partitions.get(key)
        if sp is None:
            # A new leader's high watermark may still be behind the old one's (it learns
            # the true one as its followers fetch): saved state is bounded by the log end.
            end = log_end if log_end is not None else high_watermark
            if saved is not None:
                start = max(log_start, min(saved, end))
            elif (reset or self.auto_offset_reset) == "earliest":
                start = log_start
            else:
                start = high_watermark
            sp = self.partitions[key] = SharePartition(
                start, self.lock_duration_ms, self.delivery_limit, self.max_record_locks
            )
            if saved is not None and saved_state and start == saved:
                sp.restore(saved_state, log_start, end)
        sp.skip_to(log_start)
        return sp

    def existing(self, group_id: str, topic: str, index: int) -> SharePartition | None:
        return self.partitions.get((group_id, topic, index))

    def drop_partition(self, topic: str, index: int) -> None:
        """This broker no longer leads the partition: forget its share state."""
        for key in [k for k in self.partitions if k[1] == topic and k[2] == index]:
            del self.partitions[key]

    def next_deadline(self, keys: list[SharePartitionKey]) -> int | None:
        deadlines = [
            d
            for k in keys
            if (sp := self.partitions.get(k)) is not None
            if (d := sp.next_deadline()) is not None
        ]
        return min(deadlines) if deadlines else None
