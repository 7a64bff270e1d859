"""What goes into the group state machine and what comes out of it.

In: requests (JoinRequest, SyncRequest, ... as typed values) and the time. Out
(`Output`, from `GroupStateMachine.take_output`): answers to parked requests by the
shell's handle, timers to arm or cancel by key, and what must be persisted.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from .classic_group import Protocols


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    require_known_member_id: bool = True  # JoinGroup v4+: MEMBER_ID_REQUIRED round trip
    supports_skip_assignment: bool = False  # JoinGroup v9+


@dataclass(frozen=True, slots=True)
class SyncRequest:
    group_id: str
    member_id: str
    instance_id: str | None
    generation: int
    assignments: dict[str, bytes]
    protocol_type: str | None = None  # SyncGroup v5+: checked against the group's
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class JoinResponse:
    error: int
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[dict, ...] = ()  # only the leader's answer lists the members
    skip_assignment: bool = False  # v9+: the leader keeps the current assignment

    def as_dict(self) -> dict:
        return {
            "error_code": self.error,
            "generation_id": self.generation,
            "protocol_type": self.protocol_type,
            "protocol_name": self.protocol_name,
            "leader": self.leader,
            "skip_assignment": self.skip_assignment,
            "member_id": self.member_id,
            "members": list(self.members),
        }


@dataclass(frozen=True, slots=True)
class SyncResponse:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to the parked request the shell registered under `handle`."""

    handle: int
    response: JoinResponse | SyncResponse


@dataclass(frozen=True, slots=True)
class TimerKey:
    """heartbeat: a member's session (or a new member's join timeout); join: the end of
    a group's join phase; sync: the deadline for SyncGroup after a join phase."""

    kind: str
    group_id: str
    member_id: str = ""


HEARTBEAT = "heartbeat"
JOIN = "join"
SYNC = "sync"
CONSUMER_SESSION = "consumer-session"  # a KIP-848 member's session
REVOCATION = "revocation"  # a KIP-848 member's deadline to give partitions up
REJOIN = "rejoin"  # a classic member of a KIP-848 group told to rejoin: its deadline


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeatRequest:
    """ConsumerGroupHeartbeat (KIP-848). None (or -1 for the timeout) means unchanged
    since the member's last heartbeat."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    server_assignor: str | None = None
    owned: tuple[tuple[uuid.UUID, tuple[int, ...]], ...] | None = None
    client_id: str = ""
    client_host: str = ""
    # v1: an RE2 expression matched against every topic name ("" clears it).
    subscribed_topic_regex: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeatResponse:
    error: int
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    # topic id -> partitions; None: the assignment did not change since the last answer.
    assignment: dict[uuid.UUID, tuple[int, ...]] | None = None


@dataclass(frozen=True, slots=True)
class TimerSet:
    """Arm `key` to fire at `deadline_ms` (replacing its earlier deadline, if any)."""

    key: TimerKey
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class TimerCancel:
    key: TimerKey


@dataclass(frozen=True, slots=True)
class DeleteGroupOffsets:
    """Write tombstones for every committed offset of the group (DeleteGroups)."""

    group_id: str


@dataclass(frozen=True, slots=True)
class GroupRecords:
    """Records of a KIP-848 group's state to append, in one batch, to the group's
    offsets partition (`records.py`: (key, value), a None value is a tombstone)."""

    group_id: str
    records: tuple[tuple[tuple[str, str, str], dict | None], ...]


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """Something an operator wants in the log (a member removed and why, a generation
    formed); the shell logs it."""

    group_id: str
    member_id: str
    what: str


@dataclass(slots=True)
class Output:
    replies: list[Reply] = field(default_factory=list)
    timers: list[TimerSet | TimerCancel] = field(default_factory=list)
    # To write to __consumer_offsets, in order. Classic group membership is not
    # persisted (a new coordinator starts with no members and they rejoin); KIP-848
    # groups write their epochs, members and assignments (GroupRecords).
    persist: list[DeleteGroupOffsets | GroupRecords] = field(default_factory=list)
    events: list[GroupEvent] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.replies or self.timers or self.persist or self.events)
