"""The group coordinator's decisions, as a sans-IO state machine (classic protocol).

No asyncio, no clock, no sockets: the shell (`coordinator.py`) feeds requests and the
time in milliseconds, then applies `take_output()`: it answers parked requests by
handle, arms or cancels timers by key (and calls `expire(key, now)` when one fires;
`tick(now)` fires every due timer instead, which is what tests with a fake clock use),
and persists what it is told to. Tests drive this very class request by request.

Semantics follow Kafka's group coordinator for classic groups (GroupMetadataManager /
ClassicGroup, Kafka 3.7+), state by state:

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
          --leader's SyncGroup--> Stable --join with new metadata / leave / expiry-->
    PreparingRebalance ...

- JoinGroup v4+ without a member id gets MEMBER_ID_REQUIRED and a pending id, which
  blocks the join phase until it rejoins or its session timeout passes.
- The first rebalance of an empty group waits `initial_rebalance_delay_ms`, longer
  while new members keep arriving, up to the rebalance timeout.
- At the end of a join phase, dynamic members that did not rejoin are removed; static
  members stay until their session times out. Members that do not send SyncGroup
  within the rebalance timeout are removed and the group rebalances again.
- Static membership: a JoinGroup with a known group.instance.id and no member id takes
  the old member's place under a new member id; the old id is fenced
  (FENCED_INSTANCE_ID) in every later request. In Stable it does not rebalance unless
  the group's selected protocol would change.

KIP-848 consumer groups (ConsumerGroupHeartbeat) live in the same class: their
heartbeat is one more input, answered at once; group, assignment and member epochs are
state in `consumer_group.py`, the server-side assignors pure functions in
`assignors.py`; they share the offsets view and the timers with classic groups, and a
group id is one kind or the other. A classic group upgrades online to a KIP-848 group
(its first ConsumerGroupHeartbeat), whose classic members go on with JoinGroup,
SyncGroup and Heartbeat while they are replaced (see "classic members of KIP-848
groups" below). Their state goes out as records to persist
(`Output.persist`, `records.py`): after each input, the records of every group it
touched that differ from what was last written (new values, tombstones for members
gone), one GroupRecords per group; `load_consumer_groups` rebuilds groups from the
newest records when this broker becomes their coordinator.

Internal invariants go through `straitmq.invariants` (never stripped by -O): a broken
one names itself and its facts and stops the process, as the Raft core's do (tests and
simulations may make it raise instead).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from kio.schema.errors import ErrorCode

from straitmq.invariants import broken

from ..config import DEFAULTS, BrokerConfig
from .assignors import ASSIGNORS, TopicPartition
from .classic_group import (
    COMPLETING,
    DEAD,
    EMPTY,
    PREPARING,
    STABLE,
    ClassicGroup,
    ClassicMember,
)
from .consumer_group import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    UNRELEASED,
    UNREVOKED,
    ClassicInfo,
    ConsumerGroup,
    ConsumerMember,
    reconcile,
)
from .consumer_protocol import (
    MalformedProtocol,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    version_of,
)
from .messages import (
    CONSUMER_SESSION,
    HEARTBEAT,
    JOIN,
    REJOIN,
    REVOCATION,
    SYNC,
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    DeleteGroupOffsets,
    GroupEvent,
    GroupRecords,
    JoinRequest,
    JoinResponse,
    Output,
    Reply,
    SyncRequest,
    SyncResponse,
    TimerCancel,
    TimerKey,
    TimerSet,
)
from .records import (
    RecordKey,
    classic_image,
    classic_key,
    group_image,
    member_image,
    member_keys,
    rebuild,
    rebuild_classic,
)
from .regex import INTERNAL_TOPICS, RegexError, compile_regex


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """What the state machine is told. The broker settings are declared once, in
    BrokerConfig (Kafka name, flag, default, help): these take their defaults from
    there, and `from_config` their values from a broker's."""

    min_session_timeout_ms: int = DEFAULTS.group_min_session_timeout_ms
    max_session_timeout_ms: int = DEFAULTS.group_max_session_timeout_ms
    initial_rebalance_delay_ms: int = DEFAULTS.group_initial_rebalance_delay_ms
    max_size: int = 1000  # group.max.size (Kafka's default is unlimited); not a setting
    new_member_join_timeout_ms: int = 300_000  # Kafka's, not configurable there either
    # KIP-848 consumer groups.
    consumer_session_timeout_ms: int = DEFAULTS.group_consumer_session_timeout_ms
    consumer_heartbeat_interval_ms: int = DEFAULTS.group_consumer_heartbeat_interval_ms
    consumer_assignors: tuple[str, ...] = ("uniform", "range")  # the first is the default

    @classmethod
    def from_config(cls, config: BrokerConfig) -> GroupSettings:
        return cls(
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            consumer_session_timeout_ms=config.group_consumer_session_timeout_ms,
            consumer_heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
        )


class CommittedGroups(Protocol):
    """What the state machine reads of the committed offsets (OffsetStore has it): a
    group with offsets exists (Empty) even with no members in memory."""

    def has_group(self, group_id: str) -> bool: ...

    def group_ids(self) -> list[str]: ...


class TopicsView(Protocol):
    """The metadata image as a consumer group's assignment needs it."""

    def topic(self, name: str) -> tuple[uuid.UUID, int] | None:
        """(topic id, partition count), or None if there is no such topic."""

    def names(self) -> frozenset[str]:
        """Every topic name (regular expression subscriptions match them)."""


class GroupStateMachine:
    def __init__(
        self,
        settings: GroupSettings,
        offsets: CommittedGroups,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.groups: dict[str, ClassicGroup] = {}
        self.consumer_groups: dict[str, ConsumerGroup] = {}
        self._offsets = offsets
        self._rng = rng or random.Random()
        self._timers: dict[TimerKey, int] = {}  # armed timers: key -> deadline (ms)
        self._now = 0
        self._out = Output()
        # (which groups, until when): KIP-848 assignments held after a coordinator move.
        self._holds: list[tuple[Callable[[str], bool], int]] = []
        # KIP-848 groups: the records last written (or loaded), per group...
        self._persisted: dict[str, dict[RecordKey, dict]] = {}
        # ...and what this input touched: group -> member ids (None: every member).
        self._dirty: dict[str, set[str] | None] = {}
        self._dirty_classic: set[str] = set()  # classic groups to write if Stable/Empty
        self._restored: set[str] = set()  # rebuilt from records here (never held)
        # Classic groups without members: when they became empty (offsets expire from then).
        self._empty_since: dict[str, int] = {}

    # -- what the shell reads back --------------------------------------------------------

    def take_output(self) -> Output:
        self._flush_records()
        out, self._out = self._out, Output()
        return out

    def next_deadline(self) -> int | None:
        return min(self._timers.values(), default=None)

    def timers(self) -> dict[TimerKey, int]:
        return dict(self._timers)

    # -- time ---------------------------------------------------------------------------

    def tick(self, now: int) -> None:
        """Fire every timer due at `now`, earliest first, each at its own deadline (as
        if the clock had moved there step by step: what it re-arms counts from then). A
        fired timer may arm or cancel others, so the due set is read again after each."""
        while True:
            due = [(d, k) for k, d in self._timers.items() if d <= now]
            if not due:
                break
            deadline, key = min(due, key=lambda dk: dk[0])
            self.expire(key, max(deadline, self._now))
        self._now = now

    def expire(self, key: TimerKey, now: int) -> None:
        """The timer `key` fired. The shell calls this when its own timer for the key
        runs; a key no longer armed (cancelled or re-armed meanwhile) does nothing."""
        self._now = now
        if self._timers.pop(key, None) is None:
            return
        if key.kind in (CONSUMER_SESSION, REVOCATION, REJOIN):
            return self._expire_consumer_member(key)
        group = self.groups.get(key.group_id)
        if group is None:
            return
        if key.kind == HEARTBEAT:
            self._expire_heartbeat(group, key.member_id)
        elif key.kind == JOIN:
            self._expire_join(group)
        elif key.kind == SYNC:
            self._expire_sync(group)
        else:
            broken("every timer kind is handled", group=key.group_id, kind=key.kind)

    # -- JoinGroup ------------------------------------------------------------------------

    def join(
        self, handle: int, req: JoinRequest, now: int, topics: TopicsView | None = None
    ) -> None:
        """The answer comes out as a Reply for `handle`: at once, or when the join phase
        completes. `topics` is needed for a KIP-848 group with members (a classic member
        joins it during an online upgrade)."""
        self._now = now
        s = self.settings
        if not req.group_id:
            return self._reply_join(handle, ErrorCode.invalid_group_id, req.member_id)
        if not s.min_session_timeout_ms <= req.session_timeout_ms <= s.max_session_timeout_ms:
            return self._reply_join(handle, ErrorCode.invalid_session_timeout, req.member_id)
        consumer = self.consumer_groups.get(req.group_id)
        if consumer is not None:
            if consumer.members and topics is not None:
                return self._classic_join_consumer_group(handle, consumer, req, topics)
            if consumer.members:
                return self._reply_join(
                    handle, ErrorCode.inconsistent_group_protocol, req.member_id
                )
            self._drop_consumer_group(consumer, tombstones=True)
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id:
                # A member id for a group that does not exist here: it is not a member.
                return self._reply_join(handle, ErrorCode.unknown_member_id, req.member_id)
            group = self.groups[req.group_id] = ClassicGroup(req.group_id)
        if not self._accepts_joining(group, req.member_id):
            self._drop_refused(group, req.member_id)
            return self._reply_join(handle, ErrorCode.group_max_size_reached, "")
        if not req.member_id:
            self._join_new_member(handle, group, req)
        else:
            self._join_existing_member(handle, group, req)

    def _accepts_joining(self, group: ClassicGroup, member_id: str) -> bool:
        member = group.members.get(member_id)
        if group.state in (EMPTY, DEAD):
            return True
        if group.state == PREPARING:
            # Counting members awaiting a join (not all members) lets the group shrink
            # back under a lowered max size: the last to rejoin are turned away.
            return (member is not None and member.awaiting_join) or (
                group.awaiting_join_count() < self.settings.max_size
            )
        return member is not None or len(group.members) < self.settings.max_size

    def _drop_refused(self, group: ClassicGroup, member_id: str) -> None:
        if member_id in group.pending_join:
            group.pending_join.discard(member_id)
            self._cancel(TimerKey(HEARTBEAT, group.group_id, member_id))
        member = group.members.get(member_id)
        if member is not None:
            self._remove_member(
                group, member, ErrorCode.group_max_size_reached, "group max size reached"
            )
            self._after_member_left(group)

    def _join_new_member(self, handle: int, group: ClassicGroup, req: JoinRequest) -> None:
        if not group.supports_protocols(req.protocol_type, {n for n, _ in req.protocols}):
            return self._reply_join(handle, ErrorCode.inconsistent_group_protocol, "")
        new_id = f"{req.instance_id or req.client_id}-{self._new_uuid()}"
        if req.instance_id is not None:
            old_id = group.static.get(req.instance_id)
            if old_id is None:
                return self._add_member_and_rebalance(handle, group, req, new_id)
            return self._replace_static_member(handle, group, req, old_id, new_id)
        if req.require_known_member_id:
            if len(group.pending_join) >= self.settings.max_size:
                # Ids handed out and not yet joined with are bounded too: a client asking
                # for id after id would otherwise grow the group's pending set (and its
                # timers) for a whole session timeout each.
                return self._reply_join(handle, ErrorCode.group_max_size_reached, "")
            # The client learns its id first, so a retried JoinGroup after a lost answer
            # finds the same member instead of adding a ghost one.
            group.pending_join.add(new_id)
            self._arm(TimerKey(HEARTBEAT, group.group_id, new_id), req.session_timeout_ms)
            return self._reply_join(handle, ErrorCode.member_id_required, new_id)
        self._add_member_and_rebalance(handle, group, req, new_id)

    def _join_existing_member(self, handle: int, group: ClassicGroup, req: JoinRequest) -> None:
        member_id = req.member_id
        if not group.supports_protocols(req.protocol_type, {n for n, _ in req.protocols}):
            return self._reply_join(handle, ErrorCode.inconsistent_group_protocol, member_id)
        if member_id in group.pending_join:
            if req.instance_id is not None:
                # Pending ids are only handed to dynamic members.
                return self._reply_join(handle, ErrorCode.unknown_member_id, member_id)
            return self._add_member_and_rebalance(handle, group, req, member_id)
        if code := group.validate_member(member_id, req.instance_id):
            return self._reply_join(handle, code, member_id)
        member = group.members[member_id]
        if group.state == PREPARING:
            return self._update_member_and_rebalance(handle, group, member, req)
        if group.state == COMPLETING:
            if member.protocols == req.protocols:
                # It lost the answer of this generation's join: answer it again.
                return self._reply_current_generation(handle, group, member_id)
            return self._update_member_and_rebalance(handle, group, member, req)
        if group.state == STABLE:
            if member_id == group.leader_id or member.protocols != req.protocols:
                # The leader rejoins to have the group reassigned (e.g. topics changed).
                return self._update_member_and_rebalance(handle, group, member, req)
            return self._reply_current_generation(handle, group, member_id, members=False)
        # Empty: the member is gone from this generation; let it start over.
        self._reply_join(handle, ErrorCode.unknown_member_id, member_id)

    def _add_member_and_rebalance(
        self, handle: int, group: ClassicGroup, req: JoinRequest, member_id: str
    ) -> None:
        member = ClassicMember(
            member_id,
            req.instance_id,
            req.client_id,
            req.client_host,
            req.session_timeout_ms,
            self._rebalance_timeout(req),
            req.protocol_type,
            req.protocols,
            join_handle=handle,
            is_new=True,
        )
        if group.state == PREPARING and group.previous_state == EMPTY:
            group.new_member_added = True  # extends the initial rebalance delay
        group.add(member)
        # It cannot heartbeat while its JoinGroup is parked and a disconnect goes
        # unnoticed, so a new member that never completes a join is dropped after this.
        self._arm(
            TimerKey(HEARTBEAT, group.group_id, member_id),
            self.settings.new_member_join_timeout_ms,
        )
        self._prepare_rebalance_or_complete_join(group)

    def _update_member_and_rebalance(
        self, handle: int, group: ClassicGroup, member: ClassicMember, req: JoinRequest
    ) -> None:
        self._update_member(member, req, handle)
        self._prepare_rebalance_or_complete_join(group)

    def _update_member(self, member: ClassicMember, req: JoinRequest, handle: int) -> None:
        member.protocols = req.protocols
        member.rebalance_timeout_ms = self._rebalance_timeout(req)
        member.session_timeout_ms = req.session_timeout_ms
        if member.join_handle is not None:
            # A retried JoinGroup replaces the parked one, whose client gave up on it.
            self._reply_join(member.join_handle, ErrorCode.rebalance_in_progress, member.member_id)
        member.join_handle = handle

    def _replace_static_member(
        self, handle: int, group: ClassicGroup, req: JoinRequest, old_id: str, new_id: str
    ) -> None:
        old = group.members[old_id]
        # Whatever the old incarnation still has parked is fenced now.
        if old.join_handle is not None:
            self._out.replies.append(
                Reply(old.join_handle, JoinResponse(ErrorCode.fenced_instance_id, old_id))
            )
            old.join_handle = None
        if old.sync_handle is not None:
            self._out.replies.append(
                Reply(old.sync_handle, SyncResponse(ErrorCode.fenced_instance_id))
            )
            old.sync_handle = None
        self._cancel(TimerKey(HEARTBEAT, group.group_id, old_id))
        self._event(group.group_id, new_id, f"static member {req.instance_id} replaced {old_id}")
        previous_leader = group.leader_id
        member = group.replace_static(req.instance_id or "", old_id, new_id)
        self._arm(TimerKey(HEARTBEAT, group.group_id, new_id), member.session_timeout_ms)
        self._update_member(member, req, handle)
        if group.state == STABLE:
            # A restarted static member (same protocols) keeps its assignment without
            # a rebalance, unless the protocol the group would select changes.
            if group.select_protocol() == group.protocol_name:
                self._dirty_classic.add(group.group_id)  # the new member id, as Kafka
                member.join_handle = None
                if req.supports_skip_assignment:
                    # v9+: a returning leader learns the members and that it must not
                    # compute a new assignment.
                    skip = member.member_id == group.leader_id
                    members = tuple(group.join_members()) if skip else ()
                    leader = group.leader_id or ""
                else:
                    # Older clients would reassign if they saw themselves as leader: they
                    # are told the leader as it was before the replacement.
                    skip, members, leader = False, (), previous_leader or ""
                self._out.replies.append(
                    Reply(
                        handle,
                        JoinResponse(
                            ErrorCode.none,
                            new_id,
                            group.generation,
                            group.protocol_type,
                            group.protocol_name,
                            leader,
                            members,
                            skip,
                        ),
                    )
                )
                return
            return self._prepare_rebalance_or_complete_join(group)
        if group.state == COMPLETING:
            # The leader may already hold the old id in its member list and would assign
            # nothing to the new one: rebalance so the new id gets an assignment.
            return self._prepare_rebalance(group)
        if group.state != PREPARING:
            broken(
                "a known static member rejoins a group that is Empty, Stable, "
                "CompletingRebalance or PreparingRebalance",
                group=group.group_id,
                state=group.state,
            )
        self._maybe_complete_join_phase(group)

    def _reply_current_generation(
        self, handle: int, group: ClassicGroup, member_id: str, members: bool = True
    ) -> None:
        leader = member_id == group.leader_id
        self._out.replies.append(
            Reply(
                handle,
                JoinResponse(
                    ErrorCode.none,
                    member_id,
                    group.generation,
                    group.protocol_type,
                    group.protocol_name,
                    group.leader_id or "",
                    tuple(group.join_members()) if members and leader else (),
                ),
            )
        )

    # -- rebalance phases -----------------------------------------------------------------

    def _prepare_rebalance_or_complete_join(self, group: ClassicGroup) -> None:
        if group.state in (STABLE, COMPLETING, EMPTY):
            self._prepare_rebalance(group)
        else:
            self._maybe_complete_join_phase(group)

    def _prepare_rebalance(self, group: ClassicGroup) -> None:
        if group.state == COMPLETING:
            # Members parked in SyncGroup learn that the generation is moving on.
            self._propagate_assignment(group, ErrorCode.rebalance_in_progress, reset=True)
        self._cancel(TimerKey(SYNC, group.group_id))
        initial = group.state == EMPTY
        delay = self.settings.initial_rebalance_delay_ms
        group.transition(PREPARING)
        if initial and delay > 0:
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            group.initial_delay = (delay, remaining)
            self._arm(TimerKey(JOIN, group.group_id), delay)
            return
        self._complete_join_or_schedule(group)

    def _complete_join_or_schedule(self, group: ClassicGroup) -> None:
        if group.has_all_members_joined():
            self._complete_join(group)
        else:
            self._arm(TimerKey(JOIN, group.group_id), group.rebalance_timeout_ms())

    def _maybe_complete_join_phase(self, group: ClassicGroup) -> None:
        # During the initial delay only its timer ends the join phase.
        if (
            group.state == PREPARING
            and group.has_all_members_joined()
            and group.initial_delay is None
        ):
            self._complete_join(group)

    def _expire_join(self, group: ClassicGroup) -> None:
        if group.state != PREPARING:
            return
        if group.initial_delay is not None:
            delay, remaining = group.initial_delay
            if group.new_member_added and remaining:
                # Someone joined during the delay: wait once more, within the timeout.
                group.new_member_added = False
                next_delay = min(self.settings.initial_rebalance_delay_ms, remaining)
                group.initial_delay = (next_delay, max(remaining - delay, 0))
                self._arm(TimerKey(JOIN, group.group_id), next_delay)
                return
        self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> None:
        self._cancel(TimerKey(JOIN, group.group_id))
        group.initial_delay = None
        group.new_member_added = False
        for m in [m for m in group.members.values() if not m.awaiting_join]:
            # Static members keep their place until their session runs out.
            if m.instance_id is None:
                self._remove_member(
                    group, m, ErrorCode.unknown_member_id, "did not rejoin in the rebalance timeout"
                )
        if not group.elect_joined_leader() and group.members:
            # Only static members that did not rejoin are left: wait for them (or for
            # their sessions to expire) another rebalance timeout.
            self._arm(TimerKey(JOIN, group.group_id), group.rebalance_timeout_ms())
            return
        group.init_next_generation()
        self._dirty_classic.add(group.group_id)  # written if it is Empty now
        self._event(
            group.group_id,
            group.leader_id or "",
            f"generation {group.generation}: {len(group.members)} members, "
            f"protocol {group.protocol_name}",
        )
        if group.state == EMPTY:
            return
        members = tuple(group.join_members())
        for m in group.members.values():
            if m.join_handle is not None:
                leader = m.member_id == group.leader_id
                self._out.replies.append(
                    Reply(
                        m.join_handle,
                        JoinResponse(
                            ErrorCode.none,
                            m.member_id,
                            group.generation,
                            group.protocol_type,
                            group.protocol_name,
                            group.leader_id or "",
                            members if leader else (),
                        ),
                    )
                )
                m.join_handle = None
            self._arm(TimerKey(HEARTBEAT, group.group_id, m.member_id), m.session_timeout_ms)
            m.is_new = False
            group.pending_sync.add(m.member_id)
        self._arm(TimerKey(SYNC, group.group_id), group.rebalance_timeout_ms())

    def _expire_sync(self, group: ClassicGroup) -> None:
        if group.state not in (COMPLETING, STABLE) or not group.pending_sync:
            return
        for member_id in sorted(group.pending_sync):
            member = group.members.get(member_id)
            if member is not None:
                self._remove_member(
                    group,
                    member,
                    ErrorCode.unknown_member_id,
                    "no SyncGroup in the rebalance timeout",
                )
        self._prepare_rebalance(group)

    def _propagate_assignment(self, group: ClassicGroup, error: int, reset: bool) -> None:
        for m in group.members.values():
            if reset:
                m.assignment = b""
            if m.sync_handle is None:
                continue
            ok = error == ErrorCode.none
            self._out.replies.append(
                Reply(
                    m.sync_handle,
                    SyncResponse(
                        error,
                        m.assignment,
                        group.protocol_type if ok else None,
                        group.protocol_name if ok else None,
                    ),
                )
            )
            m.sync_handle = None
            # Its session was on hold while it waited; it starts again now.
            self._arm(TimerKey(HEARTBEAT, group.group_id, m.member_id), m.session_timeout_ms)

    # -- SyncGroup ------------------------------------------------------------------------

    def sync(self, handle: int, req: SyncRequest, now: int) -> None:
        self._now = now
        if (consumer := self.consumer_groups.get(req.group_id)) is not None:
            return self._classic_sync_consumer_group(handle, consumer, req)
        group = self.groups.get(req.group_id)
        if group is None:
            return self._reply_sync(handle, ErrorCode.unknown_member_id)
        code = group.validate_member(req.member_id, req.instance_id)
        if not code and req.generation != group.generation:
            code = ErrorCode.illegal_generation
        if not code and (
            _differs(req.protocol_type, group.protocol_type)
            or _differs(req.protocol_name, group.protocol_name)
        ):
            code = ErrorCode.inconsistent_group_protocol
        if code:
            return self._reply_sync(handle, code)
        if group.state == EMPTY:
            return self._reply_sync(handle, ErrorCode.unknown_member_id)
        if group.state == PREPARING:
            return self._reply_sync(handle, ErrorCode.rebalance_in_progress)
        member = group.members[req.member_id]
        self._synced(group, req.member_id)
        if group.state == STABLE:
            self._out.replies.append(
                Reply(
                    handle,
                    SyncResponse(
                        ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name
                    ),
                )
            )
            return
        # CompletingRebalance: park until the leader's assignment arrives.
        if member.sync_handle is not None:
            self._reply_sync(member.sync_handle, ErrorCode.rebalance_in_progress)
        member.sync_handle = handle
        if req.member_id == group.leader_id:
            for m in group.members.values():
                # A member the leader left out gets an empty assignment.
                m.assignment = req.assignments.get(m.member_id, b"")
            self._propagate_assignment(group, ErrorCode.none, reset=False)
            group.transition(STABLE)
            self._dirty_classic.add(group.group_id)

    def _synced(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            self._cancel(TimerKey(SYNC, group.group_id))

    # -- Heartbeat, OffsetCommit ----------------------------------------------------------

    def heartbeat(
        self, group_id: str, member_id: str, instance_id: str | None, generation: int, now: int
    ) -> int:
        self._now = now
        if (consumer := self.consumer_groups.get(group_id)) is not None:
            return self._classic_heartbeat_consumer_group(
                consumer, member_id, instance_id, generation
            )
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if code := group.validate_member(member_id, instance_id):
            return code
        if generation != group.generation:
            return ErrorCode.illegal_generation
        if group.state == EMPTY:
            return ErrorCode.unknown_member_id
        member = group.members[member_id]
        self._arm(TimerKey(HEARTBEAT, group_id, member_id), member.session_timeout_ms)
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def commit_check(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        generation: int,
        now: int,
        version: int | None = None,
    ) -> int:
        """May this OffsetCommit (v2-9) be written? Kafka's validateOffsetCommit.
        `generation` is the member epoch for a KIP-848 group (v9 names it so); the
        request's version decides the errors that changed at v9 (None: not checked)."""
        self._now = now
        consumer = self.consumer_groups.get(group_id)
        if consumer is not None:
            return self._consumer_commit_check(consumer, member_id, generation, version)
        group = self.groups.get(group_id)
        if group is None:
            if generation < 0:
                return ErrorCode.none  # a "simple" group: manual assignment, no members
            if self._offsets.has_group(group_id):
                return ErrorCode.unknown_member_id  # an Empty group knows no members
            if version is not None and version >= 9:
                return ErrorCode.group_id_not_found
            return ErrorCode.illegal_generation  # what Kafka answers before v9
        if generation < 0 and group.state == EMPTY:
            return ErrorCode.none
        if generation >= 0 or member_id or instance_id is not None:
            if code := group.validate_member(member_id, instance_id):
                return code
            if generation != group.generation:
                return ErrorCode.illegal_generation
        elif group.state != EMPTY:
            return ErrorCode.unknown_member_id  # no member id: only while nobody is in it
        if group.state == COMPLETING:
            return ErrorCode.rebalance_in_progress
        member = group.members.get(member_id)
        if member is not None:
            # A commit shows the member is alive, as Kafka's classic coordinator counted it.
            self._arm(TimerKey(HEARTBEAT, group_id, member_id), member.session_timeout_ms)
        return ErrorCode.none

    # -- LeaveGroup -----------------------------------------------------------------------

    def leave(
        self, group_id: str, members: Iterable[tuple[str, str | None]], now: int
    ) -> list[tuple[str, str | None, int]]:
        """(member id, instance id, error) per member leaving. A member id of "" with an
        instance id removes that static member (LeaveGroup v3+, e.g. by an admin)."""
        self._now = now
        if (consumer := self.consumer_groups.get(group_id)) is not None:
            return self._classic_leave_consumer_group(consumer, members)
        group = self.groups.get(group_id)
        if group is None:
            return [(m, i, ErrorCode.unknown_member_id) for m, i in members]
        results: list[tuple[str, str | None, int]] = []
        left = False
        for member_id, instance_id in members:
            code: int = ErrorCode.none
            if not member_id:
                current = group.static.get(instance_id) if instance_id is not None else None
                if current is None:
                    code = ErrorCode.unknown_member_id
                else:
                    self._remove_member(
                        group, group.members[current], ErrorCode.unknown_member_id, "left"
                    )
            elif member_id in group.pending_join:
                group.pending_join.discard(member_id)
                self._cancel(TimerKey(HEARTBEAT, group_id, member_id))
            elif code := group.validate_member(member_id, instance_id):
                pass
            else:
                self._remove_member(
                    group, group.members[member_id], ErrorCode.unknown_member_id, "left"
                )
            left = left or code == ErrorCode.none
            results.append((member_id, instance_id, code))
        if left:
            if group.state in (STABLE, COMPLETING):
                self._prepare_rebalance_or_complete_join(group)
            elif group.state == PREPARING:
                self._maybe_complete_join_phase(group)
        return results

    # -- expiry and removal ---------------------------------------------------------------

    def _expire_heartbeat(self, group: ClassicGroup, member_id: str) -> None:
        if member_id in group.pending_join:
            # Got MEMBER_ID_REQUIRED and never came back.
            group.pending_join.discard(member_id)
            if group.state in (STABLE, COMPLETING):
                self._prepare_rebalance_or_complete_join(group)
            elif group.state == PREPARING:
                self._maybe_complete_join_phase(group)
            return
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            # A parked member's session restarts when its request is answered.
            return
        reason = "its join did not complete in time" if member.is_new else "session expired"
        self._remove_member(group, member, ErrorCode.unknown_member_id, reason)
        self._after_member_left(group)

    def _after_member_left(self, group: ClassicGroup) -> None:
        if group.state in (STABLE, COMPLETING):
            self._prepare_rebalance_or_complete_join(group)
        elif group.state == PREPARING and group.has_all_members_joined():
            self._complete_join(group)

    def _remove_member(
        self, group: ClassicGroup, member: ClassicMember, error: int, reason: str
    ) -> None:
        """Take the member out; a request it has parked is answered with `error` (a
        member timed out in a JoinGroup retries with UNKNOWN_MEMBER_ID)."""
        self._event(group.group_id, member.member_id, f"member removed: {reason}")
        if member.join_handle is not None:
            self._out.replies.append(Reply(member.join_handle, JoinResponse(error, "")))
            member.join_handle = None
        if member.sync_handle is not None:
            self._reply_sync(member.sync_handle, error)
            member.sync_handle = None
        self._cancel(TimerKey(HEARTBEAT, group.group_id, member.member_id))
        group.remove(member.member_id)
        if not group.members:
            self._empty_since[group.group_id] = self._now

    # -- admin: describe, list, delete, unload --------------------------------------------

    def describe(self, group_id: str) -> dict:
        consumer = self.consumer_groups.get(group_id)
        if consumer is not None:
            return {
                "group_id": group_id,
                "group_state": consumer.state,
                "protocol_type": "consumer",
                "protocol_data": "",
                "members": [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.instance_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "member_metadata": b"",
                        "member_assignment": b"",
                    }
                    for m in consumer.members.values()
                ],
            }
        group = self.groups.get(group_id)
        if group is None:
            state = EMPTY if self._offsets.has_group(group_id) else DEAD
            return {
                "group_id": group_id,
                "group_state": state,
                "protocol_type": "",
                "protocol_data": "",
                "members": [],
            }
        # As Kafka: metadata and assignments only once they are settled (Stable).
        stable = group.state == STABLE
        return {
            "group_id": group_id,
            "group_state": group.state,
            "protocol_type": group.protocol_type or "",
            "protocol_data": (group.protocol_name or "") if stable else "",
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata_for(group.protocol_name) if stable else b"",
                    "member_assignment": m.assignment if stable else b"",
                }
                for m in group.members.values()
            ],
        }

    def list_groups(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state), sorted by id."""
        out = {gid: ("consumer", EMPTY) for gid in self._offsets.group_ids()}
        for gid, g in self.groups.items():
            # A group made only by a JoinGroup that got MEMBER_ID_REQUIRED has nothing
            # to show yet.
            if g.state == EMPTY and not g.protocol_type and gid not in out:
                continue
            out[gid] = (g.protocol_type or "consumer", g.state)
        for gid, cg in self.consumer_groups.items():
            out[gid] = ("consumer", cg.state)
        return [(gid, pt, st) for gid, (pt, st) in sorted(out.items())]

    def delete(self, group_id: str) -> int:
        consumer = self.consumer_groups.get(group_id)
        if consumer is not None:
            if consumer.members:
                return ErrorCode.non_empty_group
            self._drop_consumer_group(consumer, tombstones=True)
            self._out.persist.append(DeleteGroupOffsets(group_id))
            return ErrorCode.none
        group = self.groups.get(group_id)
        if group is not None and group.state != EMPTY:
            return ErrorCode.non_empty_group
        if group is None and not self._offsets.has_group(group_id):
            return ErrorCode.group_id_not_found
        if group is not None:
            self._drop_group(group, tombstones=True)
        self._out.persist.append(DeleteGroupOffsets(group_id))
        return ErrorCode.none

    def unload(self, belongs: Callable[[str], bool]) -> None:
        """This broker stopped coordinating some groups (it no longer leads their offsets
        partition): forget them; parked members get NOT_COORDINATOR and find the new one."""
        for gid in [g for g in self.groups if belongs(g)]:
            group = self.groups[gid]
            self._answer_parked(group, ErrorCode.not_coordinator)
            group.transition(DEAD)
            self._drop_group(group)
        for gid in [g for g in self.consumer_groups if belongs(g)]:
            self._drop_consumer_group(self.consumer_groups[gid])
        for gid in [g for g in self._persisted if belongs(g)]:
            del self._persisted[gid]
        for gid in [g for g in self._empty_since if belongs(g)]:
            del self._empty_since[gid]
        self._restored = {g for g in self._restored if not belongs(g)}

    def _answer_parked(self, group: ClassicGroup, error: int) -> None:
        """Answer every JoinGroup and SyncGroup its members have parked with `error`."""
        for m in group.members.values():
            if m.join_handle is not None:
                self._out.replies.append(Reply(m.join_handle, JoinResponse(error, m.member_id)))
                m.join_handle = None
            if m.sync_handle is not None:
                self._reply_sync(m.sync_handle, error)
                m.sync_handle = None

    def _drop_group(self, group: ClassicGroup, tombstones: bool = False) -> None:
        for key in [k for k in self._timers if k.group_id == group.group_id]:
            self._cancel(key)
        del self.groups[group.group_id]
        self._dirty_classic.discard(group.group_id)
        if tombstones:
            written = self._persisted.pop(group.group_id, None)
            if written:
                self._out.persist.append(
                    GroupRecords(group.group_id, tuple((k, None) for k in sorted(written)))
                )

    # -- ConsumerGroupHeartbeat (KIP-848) ----------------------------------------------

    def consumer_heartbeat(
        self, req: ConsumerHeartbeatRequest, topics: TopicsView, now: int
    ) -> ConsumerHeartbeatResponse:
        """Answered at once: the member learns its epoch and, when it changed, its
        assignment; it heartbeats again within the interval to move on."""
        self._now = now
        if error := self._invalid_consumer_heartbeat(req):
            return error
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._consumer_leave(req)
        classic = self.groups.get(req.group_id)
        if classic is not None:
            if not (classic.members or classic.pending_join):
                # An empty classic group turns into this one.
                self._drop_group(classic, tombstones=True)
            elif req.member_epoch != 0 or not self._upgrade(classic, topics):
                return _consumer_error(
                    ErrorCode.group_id_not_found,
                    f"Group {req.group_id} is not a consumer group: a classic group whose "
                    "members do not all use the consumer protocol cannot be upgraded.",
                )
        group = self.consumer_groups.get(req.group_id)
        if group is None:
            if req.member_epoch != 0:
                # No such group here (deleted, expired, or from before membership was
                # persisted): the member rejoins (Kafka says GROUP_ID_NOT_FOUND).
                return _consumer_error(ErrorCode.unknown_member_id, "rejoin with epoch 0")
            group = self.consumer_groups[req.group_id] = ConsumerGroup(req.group_id)
        member, changed, error = self._consumer_member(group, req)
        if error is not None:
            return error
        if member is None:
            broken("a consumer member is found, made or refused", group=group.group_id)
        self._touch(group.group_id, member.member_id)
        changed |= self._update_consumer_member(member, req)
        changed |= self._refresh_topics(group, topics)
        if changed:
            group.epoch += 1
        self._advance(group, member, _owned(req.owned))
        self._arm(
            TimerKey(CONSUMER_SESSION, group.group_id, member.member_id),
            self.settings.consumer_session_timeout_ms,
        )
        assignment = None
        if req.member_epoch == 0 or member.assigned != member.last_sent:
            member.last_sent = member.assigned
            assignment = _by_topic(member.assigned)
        return ConsumerHeartbeatResponse(
            ErrorCode.none,
            None,
            member.member_id,
            member.epoch,
            self.settings.consumer_heartbeat_interval_ms,
            assignment,
        )

    def _advance(
        self,
        group: ConsumerGroup,
        member: ConsumerMember,
        owned: frozenset[TopicPartition] | None,
    ) -> None:
        """Bring the target up to the group epoch and move the member one step toward
        its part of it (`owned`: what it says it holds; None: not said)."""
        if group.assignment_epoch < group.epoch:
            self._compute_target(group)
        was_revoking = member.state == UNREVOKED
        target = group.target.get(member.member_id, frozenset())
        owners = group.owner_of()
        if self._held(group.group_id) and group.group_id not in self._restored:
            # Just became this group's coordinator and it had no records: members from
            # before may still hold any partition, so none is handed out yet.
            owners = {tp: owners.get(tp, _HELD_BEFORE) for tp in target}
        reconcile(member, group.assignment_epoch, target, owners, owned)
        revocation = TimerKey(REVOCATION, group.group_id, member.member_id)
        if member.state == UNREVOKED and not was_revoking:
            self._arm(revocation, member.rebalance_timeout_ms)
        elif member.state != UNREVOKED and was_revoking:
            self._cancel(revocation)

    def _invalid_consumer_heartbeat(
        self, req: ConsumerHeartbeatRequest
    ) -> ConsumerHeartbeatResponse | None:
        if not req.group_id:
            return _consumer_error(ErrorCode.invalid_request, "GroupId can't be empty.")
        if (req.member_epoch > 0 or req.member_epoch == LEAVE_EPOCH) and not req.member_id:
            return _consumer_error(ErrorCode.invalid_request, "MemberId can't be empty.")
        if req.member_epoch == 0:
            if req.rebalance_timeout_ms == -1:
                return _consumer_error(ErrorCode.invalid_request, "RebalanceTimeoutMs must be set.")
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                # Kafka accepts an empty list (a member subscribed to nothing), not none.
                return _consumer_error(
                    ErrorCode.invalid_request,
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
                )
            if req.owned:
                return _consumer_error(
                    ErrorCode.invalid_request, "TopicPartitions must be empty when (re-)joining."
                )
        if req.member_epoch == STATIC_LEAVE_EPOCH and req.instance_id is None:
            return _consumer_error(ErrorCode.invalid_request, "InstanceId can't be null.")
        if req.member_epoch < STATIC_LEAVE_EPOCH:
            return _consumer_error(ErrorCode.invalid_request, "MemberEpoch is invalid.")
        if req.subscribed_topic_regex:
            try:
                compile_regex(req.subscribed_topic_regex)
            except RegexError as e:
                # Refused before anything changes: the group and the member are unharmed.
                return _consumer_error(
                    ErrorCode.invalid_regular_expression,
                    f"SubscribedTopicRegex `{req.subscribed_topic_regex}` is not a valid "
                    f"regular expression: {e}.",
                )
        if req.server_assignor is not None and req.server_assignor not in (
            self.settings.consumer_assignors
        ):
            return _consumer_error(
                ErrorCode.unsupported_assignor, f"{req.server_assignor} is not supported."
            )
        return None

    def _consumer_member(
        self, group: ConsumerGroup, req: ConsumerHeartbeatRequest
    ) -> tuple[ConsumerMember | None, bool, ConsumerHeartbeatResponse | None]:
        """The member the heartbeat is from: (member, it is new, error)."""
        if req.member_epoch == 0 and req.instance_id is not None:
            current = group.static.get(req.instance_id)
            if current is not None and current != req.member_id:
                old = group.members[current]
                if old.epoch != STATIC_LEAVE_EPOCH:
                    return (
                        None,
                        False,
                        _consumer_error(
                            ErrorCode.unreleased_instance_id,
                            f"instance {req.instance_id} is in use by another member",
                        ),
                    )
                # A static member restarted after its temporary leave: the new member
                # id takes its place and partitions, from epoch 0.
                new = self._replace_static_consumer_member(
                    group, old, req.member_id or str(self._new_uuid())
                )
                return new, False, None
        member = group.members.get(req.member_id) if req.member_id else None
        if member is None:
            if req.member_epoch != 0:
                return None, False, _consumer_error(ErrorCode.unknown_member_id, None)
            if len(group.members) >= self.settings.max_size:
                return None, False, _consumer_error(ErrorCode.group_max_size_reached, None)
            member = ConsumerMember(
                req.member_id or str(self._new_uuid()),
                req.instance_id,
                req.rack_id,
                req.client_id,
                req.client_host,
                req.rebalance_timeout_ms,
            )
            group.members[member.member_id] = member
            if req.instance_id is not None:
                group.static[req.instance_id] = member.member_id
            return member, True, None
        if req.instance_id is not None and group.static.get(req.instance_id) != member.member_id:
            return None, False, _consumer_error(ErrorCode.fenced_instance_id, None)
        received = req.member_epoch
        owned = _owned(req.owned)
        if received > member.epoch or (
            received < member.epoch
            and (received != member.previous_epoch or owned is None or not owned <= member.assigned)
        ):
            # It missed more than the last answer: it must drop its partitions and rejoin.
            return (
                None,
                False,
                _consumer_error(
                    ErrorCode.fenced_member_epoch,
                    f"member epoch {received} is not the coordinator's {member.epoch}",
                ),
            )
        return member, False, None

    def _replace_static_consumer_member(
        self, group: ConsumerGroup, old: ConsumerMember, new_id: str
    ) -> ConsumerMember:
        """A static member restarted: the new member id takes its place, partitions and
        target, from epoch 0, so nothing moves."""
        if old.instance_id is None:
            broken("only a static member is replaced", group=group.group_id, member=old.member_id)
        new = ConsumerMember(
            new_id,
            old.instance_id,
            old.rack_id,
            old.client_id,
            old.client_host,
            old.rebalance_timeout_ms,
            old.subscribed,
            old.assignor,
            assigned=old.assigned,
            pending_revocation=old.pending_revocation,
            classic=old.classic,
        )
        inherited = group.target.get(old.member_id, old.assigned)
        self._remove_consumer_member(group, old, "replaced by a new member id", bump=False)
        group.members[new.member_id] = new
        group.static[old.instance_id] = new.member_id
        group.target[new.member_id] = inherited
        return new

    def _update_consumer_member(
        self, member: ConsumerMember, req: ConsumerHeartbeatRequest
    ) -> bool:
        """Apply what the heartbeat changes; True if the assignment must be recomputed."""
        changed = False
        if req.subscribed_topic_names is not None:
            subscribed = frozenset(req.subscribed_topic_names)
            changed |= subscribed != member.subscribed
            member.subscribed = subscribed
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None  # "" clears it
            changed |= regex != member.subscribed_regex
            member.subscribed_regex = regex
        if req.server_assignor is not None:
            changed |= req.server_assignor != member.assignor
            member.assignor = req.server_assignor
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.client_id:
            member.client_id, member.client_host = req.client_id, req.client_host
        return changed

    def _refresh_topics(self, group: ConsumerGroup, topics: TopicsView) -> bool:
        """The subscribed topics as the metadata has them now; True if that changed
        (a topic created, deleted or given more partitions)."""
        regexes = {
            m.subscribed_regex for m in group.members.values() if m.subscribed_regex is not None
        }
        if regexes:
            # Kafka matches every topic but the internal ones, in full (RE2/J matches()).
            all_names = [n for n in topics.names() if n not in INTERNAL_TOPICS]
            group.regex_matches = {
                r: frozenset(n for n in all_names if compile_regex(r).fullmatch(n))
                for r in sorted(regexes)
            }
        else:
            group.regex_matches = {}
        names = sorted({n for m in group.members.values() for n in group.subscribed_names(m)})
        seen = {n: t for n in names if (t := topics.topic(n)) is not None}
        if seen == group.topics:
            return False
        group.topics = seen
        return True

    def _compute_target(self, group: ConsumerGroup) -> None:
        votes: dict[str, int] = {}
        for m in group.members.values():
            if m.assignor is not None:
                votes[m.assignor] = votes.get(m.assignor, 0) + 1
        name = (
            max(sorted(votes), key=lambda a: votes[a])
            if votes
            else self.settings.consumer_assignors[0]
        )
        subscriptions = {
            mid: frozenset(
                group.topics[n][0] for n in group.subscribed_names(m) if n in group.topics
            )
            for mid, m in group.members.items()
        }
        partitions = dict(group.topics.values())
        current = {mid: group.target.get(mid, frozenset()) for mid in group.members}
        group.target = ASSIGNORS[name](subscriptions, partitions, current)
        group.assignment_epoch = group.epoch
        self._touch(group.group_id)

    def _consumer_leave(self, req: ConsumerHeartbeatRequest) -> ConsumerHeartbeatResponse:
        group = self.consumer_groups.get(req.group_id)
        member = group.members.get(req.member_id) if group is not None else None
        if req.member_epoch == STATIC_LEAVE_EPOCH and group is not None and member is None:
            current = group.static.get(req.instance_id or "")
            member = group.members.get(current) if current is not None else None
        if group is None or member is None:
            return _consumer_error(ErrorCode.unknown_member_id, None)
        if req.instance_id is not None and group.static.get(req.instance_id) != member.member_id:
            return _consumer_error(ErrorCode.fenced_instance_id, None)
        if req.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # It means to come back: its partitions wait for it until its session ends.
            member.epoch = STATIC_LEAVE_EPOCH
            self._touch(group.group_id, member.member_id)
            self._cancel(TimerKey(REVOCATION, group.group_id, member.member_id))
            self._arm(
                TimerKey(CONSUMER_SESSION, group.group_id, member.member_id),
                self.settings.consumer_session_timeout_ms,
            )
        else:
            self._remove_consumer_member(group, member, "left")
        return ConsumerHeartbeatResponse(
            ErrorCode.none, None, member.member_id, req.member_epoch, 0, None
        )

    def _expire_consumer_member(self, key: TimerKey) -> None:
        group = self.consumer_groups.get(key.group_id)
        member = group.members.get(key.member_id) if group is not None else None
        if group is None or member is None:
            return
        if key.kind == REVOCATION and member.state != UNREVOKED:
            return
        # Silent past its session, or holding on to partitions past its rebalance
        # timeout: fenced, and its partitions go to the others.
        reason = {
            CONSUMER_SESSION: "session expired",
            REVOCATION: "did not revoke in time",
            REJOIN: "did not rejoin in time",
        }[key.kind]
        self._remove_consumer_member(group, member, reason)

    def _remove_consumer_member(
        self, group: ConsumerGroup, member: ConsumerMember, reason: str, bump: bool = True
    ) -> None:
        self._event(group.group_id, member.member_id, f"member removed: {reason}")
        for kind in (CONSUMER_SESSION, REVOCATION, REJOIN):
            self._cancel(TimerKey(kind, group.group_id, member.member_id))
        group.remove(member.member_id)
        if bump:
            group.epoch += 1
        self._touch(group.group_id, member.member_id)

    def _consumer_commit_check(
        self, group: ConsumerGroup, member_id: str, member_epoch: int, version: int | None
    ) -> int:
        if member_epoch < 0 and not group.members:
            return ErrorCode.none
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if member.classic is not None:
            # A classic member commits as in a classic group: its epoch is its generation.
            return ErrorCode.illegal_generation if member_epoch != member.epoch else 0
        if version is not None and version < 9:
            # Kafka: members of the consumer protocol commit with v9+ only.
            return ErrorCode.unsupported_version
        if member_epoch != member.epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    # -- classic members of KIP-848 groups (online upgrade) -----------------------------
    #
    # As Kafka 4: a ConsumerGroupHeartbeat for a classic group whose members all use the
    # "consumer" protocol type turns it into a KIP-848 group in which those members go
    # on with JoinGroup/SyncGroup/Heartbeat. Their assignment is computed here, not by a
    # leader: a JoinGroup reconciles the member (with what its subscription says it
    # still owns) and answers at once with its member epoch as the generation; SyncGroup
    # returns its assignment; Heartbeat answers REBALANCE_IN_PROGRESS when it has to
    # rejoin to give partitions up or to get new ones. Not done: turning the group back
    # into a classic group when its last consumer-protocol member leaves (Kafka's
    # downgrade); classic members simply stay members of the KIP-848 group.

    def _upgrade(self, classic: ClassicGroup, topics: TopicsView) -> bool:
        """Turn `classic` into a KIP-848 group with the same members, generation and
        assignments. False (nothing changes) if it cannot be."""
        if classic.protocol_type != "consumer" or len(classic.members) >= self.settings.max_size:
            return False
        gen = classic.generation
        group = ConsumerGroup(classic.group_id, epoch=gen, assignment_epoch=gen)
        try:
            for m in classic.members.values():
                meta = m.metadata_for(classic.protocol_name) or m.protocols[0][1]
                sub = decode_subscription(meta)
                assigned = _topic_ids(decode_assignment(m.assignment), topics)
                group.members[m.member_id] = ConsumerMember(
                    m.member_id,
                    m.instance_id,
                    sub.rack_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    sub.topics,
                    epoch=gen,
                    previous_epoch=gen,
                    assigned=assigned,
                    classic=ClassicInfo(m.session_timeout_ms, m.protocols),
                )
                group.target[m.member_id] = assigned
                if m.instance_id is not None:
                    group.static[m.instance_id] = m.member_id
        except MalformedProtocol:
            return False
        # A rebalance under way is over: they rejoin the new group.
        self._answer_parked(classic, ErrorCode.rebalance_in_progress)
        self._drop_group(classic, tombstones=True)
        self._empty_since.pop(group.group_id, None)
        self.consumer_groups[group.group_id] = group
        self._refresh_topics(group, topics)
        for cm in group.members.values():
            self._arm(
                TimerKey(CONSUMER_SESSION, group.group_id, cm.member_id), self._session_ms(cm)
            )
        self._touch(group.group_id)
        self._event(group.group_id, "", f"upgraded from classic at generation {gen}")
        return True

    def _session_ms(self, member: ConsumerMember) -> int:
        if member.classic is not None:
            return member.classic.session_timeout_ms
        return self.settings.consumer_session_timeout_ms

    def _classic_join_consumer_group(
        self, handle: int, group: ConsumerGroup, req: JoinRequest, topics: TopicsView
    ) -> None:
        gid = group.group_id
        try:
            if req.protocol_type != "consumer" or not req.protocols:
                raise MalformedProtocol(req.protocol_type)
            sub = decode_subscription(req.protocols[0][1])
        except MalformedProtocol:
            return self._reply_join(handle, ErrorCode.inconsistent_group_protocol, req.member_id)
        if not req.member_id and req.instance_id is None and req.require_known_member_id:
            new_id = f"{req.client_id}-{self._new_uuid()}"
            return self._reply_join(handle, ErrorCode.member_id_required, new_id)
        member = group.members.get(req.member_id) if req.member_id else None
        changed = False
        if req.instance_id is not None:
            current = group.static.get(req.instance_id)
            if current is not None and current != req.member_id:
                if req.member_id:
                    return self._reply_join(handle, ErrorCode.fenced_instance_id, req.member_id)
                # A static member restarted: its new id takes the old one's place.
                member = self._replace_static_consumer_member(
                    group, group.members[current], f"{req.instance_id}-{self._new_uuid()}"
                )
        if member is None:
            if len(group.members) >= self.settings.max_size:
                return self._reply_join(handle, ErrorCode.group_max_size_reached, "")
            member_id = req.member_id or f"{req.instance_id or req.client_id}-{self._new_uuid()}"
            member = ConsumerMember(
                member_id,
                req.instance_id,
                sub.rack_id,
                req.client_id,
                req.client_host,
                req.rebalance_timeout_ms,
            )
            group.members[member_id] = member
            if req.instance_id is not None:
                group.static[req.instance_id] = member_id
            changed = True
        elif member.classic is None:
            # A member of the consumer protocol does not speak JoinGroup.
            return self._reply_join(handle, ErrorCode.unknown_member_id, req.member_id)
        changed |= sub.topics != member.subscribed
        member.subscribed, member.subscribed_regex, member.assignor = sub.topics, None, None
        member.rack_id = sub.rack_id or member.rack_id
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        member.classic = ClassicInfo(req.session_timeout_ms, req.protocols)
        self._touch(gid, member.member_id)
        changed |= self._refresh_topics(group, topics)
        if changed:
            group.epoch += 1
        self._advance(group, member, _topic_ids(sub.owned, topics))
        self._cancel(TimerKey(REJOIN, gid, member.member_id))
        self._arm(TimerKey(CONSUMER_SESSION, gid, member.member_id), self._session_ms(member))
        # No leader: the assignment comes from here, in SyncGroup.
        answer = JoinResponse(
            ErrorCode.none,
            member.member_id,
            member.epoch,
            "consumer",
            member.classic.protocol_name,
        )
        self._out.replies.append(Reply(handle, answer))

    def _classic_member(
        self,
        group: ConsumerGroup,
        member_id: str,
        instance_id: str | None,
        generation: int,
    ) -> tuple[ConsumerMember | None, int]:
        """The classic member a SyncGroup/Heartbeat is from, or Kafka's error for it."""
        member = group.members.get(member_id)
        if instance_id is not None and group.static.get(instance_id) not in (None, member_id):
            return None, ErrorCode.fenced_instance_id
        if member is None or member.classic is None:
            return None, ErrorCode.unknown_member_id
        if generation != member.epoch:
            return None, ErrorCode.illegal_generation
        return member, ErrorCode.none

    def _classic_sync_consumer_group(
        self, handle: int, group: ConsumerGroup, req: SyncRequest
    ) -> None:
        member, code = self._classic_member(group, req.member_id, req.instance_id, req.generation)
        if member is None:
            return self._reply_sync(handle, code)
        if member.classic is None:
            broken(
                "a member found as classic has its classic protocols",
                group=group.group_id,
                member=member.member_id,
            )
        if _differs(req.protocol_type, "consumer") or _differs(
            req.protocol_name, member.classic.protocol_name
        ):
            return self._reply_sync(handle, ErrorCode.inconsistent_group_protocol)
        if group.epoch > member.epoch and member.state != UNREVOKED:
            # Something changed since its JoinGroup: it rejoins first (a member giving
            # partitions up keeps its epoch until it has, and syncs meanwhile).
            return self._reply_sync(handle, ErrorCode.rebalance_in_progress)
        names = {tid: name for name, (tid, _) in group.topics.items()}
        by_name: dict[str, list[int]] = {}
        for tid, p in member.assigned:
            if tid in names:
                by_name.setdefault(names[tid], []).append(p)
        try:
            version = version_of(member.classic.protocols[0][1])
        except MalformedProtocol:
            version = 0
        member.last_sent = member.assigned
        self._arm(
            TimerKey(CONSUMER_SESSION, group.group_id, member.member_id), self._session_ms(member)
        )
        assignment = encode_assignment(by_name, version)
        self._out.replies.append(
            Reply(
                handle,
                SyncResponse(ErrorCode.none, assignment, "consumer", member.classic.protocol_name),
            )
        )

    def _classic_heartbeat_consumer_group(
        self, group: ConsumerGroup, member_id: str, instance_id: str | None, generation: int
    ) -> int:
        member, code = self._classic_member(group, member_id, instance_id, generation)
        if member is None:
            return code
        gid = group.group_id
        self._arm(TimerKey(CONSUMER_SESSION, gid, member_id), self._session_ms(member))
        # It rejoins when the group moved on, when it has partitions to give up, or when
        # everything it waits for has been released.
        if (
            member.epoch < group.epoch
            or member.state == UNREVOKED
            or (member.state == UNRELEASED and not self._waits_for_release(group, member))
        ):
            rejoin = TimerKey(REJOIN, gid, member_id)
            if rejoin not in self._timers:
                self._arm(rejoin, member.rebalance_timeout_ms)
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    @staticmethod
    def _waits_for_release(group: ConsumerGroup, member: ConsumerMember) -> bool:
        owners = group.owner_of()
        wanted = group.target.get(member.member_id, frozenset()) - member.assigned
        return any(owners.get(tp, member.member_id) != member.member_id for tp in wanted)

    def _classic_leave_consumer_group(
        self, group: ConsumerGroup, members: Iterable[tuple[str, str | None]]
    ) -> list[tuple[str, str | None, int]]:
        results: list[tuple[str, str | None, int]] = []
        for member_id, instance_id in members:
            mid = member_id or group.static.get(instance_id or "", "")
            member = group.members.get(mid) if mid else None
            code: int = ErrorCode.none
            if member is None:
                code = ErrorCode.unknown_member_id
            elif instance_id is not None and group.static.get(instance_id) != mid:
                code = ErrorCode.fenced_instance_id
            else:
                self._remove_consumer_member(group, member, "left")
            results.append((member_id, instance_id, code))
        return results

    def hold_assignments(self, belongs: Callable[[str], bool], until_ms: int) -> None:
        """This broker just became the coordinator of the groups `belongs` selects. A
        group rebuilt from its records knows its members; one that has committed offsets
        but no records (written by a broker from before membership was persisted) may
        have members unknown here, which may still consume their partitions until they
        heartbeat and hear UNKNOWN_MEMBER_ID, as every live one does within its session
        timeout. Until `until_ms`, members of such a group join and get their epochs but
        no partition, so no partition is consumed by two members at once."""
        self._holds = [(b, u) for b, u in self._holds if u > self._now] + [(belongs, until_ms)]

    def _held(self, group_id: str) -> bool:
        # Only groups with committed offsets can have had members here before (a group
        # whose members never committed is not held: a brand-new group starts at once).
        return any(
            self._now < until and belongs(group_id) for belongs, until in self._holds
        ) and self._offsets.has_group(group_id)

    def fetch_check(self, group_id: str, member_id: str | None, member_epoch: int) -> int:
        """May this OffsetFetch (v9+, with the member) read the group's offsets? Kafka
        checks the member only in a KIP-848 group; an admin sends no member and epoch -1."""
        group = self.consumer_groups.get(group_id)
        if group is None or (member_id is None and member_epoch < 0):
            return ErrorCode.none
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        if member_epoch != member.epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    def group_type(self, group_id: str) -> str | None:
        """ "consumer" (KIP-848), "classic", or None if unknown (ListGroups v5)."""
        if group_id in self.consumer_groups:
            return "consumer"
        if group_id in self.groups or self._offsets.has_group(group_id):
            return "classic"
        return None

    def consumer_describe(self, group_id: str) -> tuple[int, str | None, dict | None]:
        """ConsumerGroupDescribe: (error, message, the group with topic ids in its
        assignments; the handler adds the names)."""
        group = self.consumer_groups.get(group_id)
        if group is None:
            if group_id in self.groups:
                why = f"Group {group_id} is not a consumer group."
            else:
                why = f"Group {group_id} not found."
            return ErrorCode.group_id_not_found, why, None
        votes = [m.assignor for m in group.members.values() if m.assignor is not None]
        default = self.settings.consumer_assignors[0]
        assignor = max(sorted(set(votes)), key=votes.count) if votes else default
        members = [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "rack_id": m.rack_id,
                "member_epoch": m.epoch,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "subscribed_topic_names": tuple(sorted(m.subscribed)),
                "subscribed_topic_regex": m.subscribed_regex,
                "assignment": _by_topic(m.assigned),
                "target_assignment": _by_topic(group.target.get(m.member_id, frozenset())),
                "member_type": 0 if m.classic is not None else 1,  # v1: 0 classic, 1 consumer
            }
            for m in group.members.values()
        ]
        return (
            ErrorCode.none,
            None,
            {
                "group_id": group_id,
                "group_state": group.state,
                "group_epoch": group.epoch,
                "assignment_epoch": group.assignment_epoch,
                "assignor_name": assignor,
                "members": members,
            },
        )

    def _drop_consumer_group(self, group: ConsumerGroup, tombstones: bool = False) -> None:
        """Forget the group; with `tombstones`, its records are deleted too (a group
        deleted, expired or turned classic; not one another broker coordinates now)."""
        for key in [k for k in self._timers if k.group_id == group.group_id]:
            self._cancel(key)
        del self.consumer_groups[group.group_id]
        self._dirty.pop(group.group_id, None)
        self._restored.discard(group.group_id)
        written = self._persisted.pop(group.group_id, None)
        if tombstones and written:
            self._out.persist.append(
                GroupRecords(group.group_id, tuple((k, None) for k in sorted(written)))
            )

    # -- persistence (KIP-848 groups) ---------------------------------------------------

    def _touch(self, group_id: str, member_id: str | None = None) -> None:
        """This input changed the group (and this member's records; None: any member's)."""
        if member_id is None:
            self._dirty[group_id] = None
        elif group_id not in self._dirty:
            self._dirty[group_id] = {member_id}
        elif (touched := self._dirty[group_id]) is not None:
            touched.add(member_id)

    def _flush_records(self) -> None:
        dirty_classic, self._dirty_classic = self._dirty_classic, set()
        for gid in sorted(dirty_classic):
            g = self.groups.get(gid)
            # Kafka writes a classic group as a generation settles (Stable) or it empties.
            if g is None or g.state not in (STABLE, EMPTY) or g.generation == 0:
                continue
            key, value = classic_key(gid), classic_image(g)
            written = self._persisted.setdefault(gid, {})
            if written.get(key) != value:
                written[key] = value
                self._out.persist.append(GroupRecords(gid, ((key, value),)))
        dirty, self._dirty = self._dirty, {}
        for gid, member_ids in dirty.items():
            group = self.consumer_groups.get(gid)
            if group is None:
                continue
            written = self._persisted.setdefault(gid, {})
            want: dict[RecordKey, dict | None] = dict(group_image(group))
            if member_ids is None:
                member_ids = set(group.members) | {k[2] for k in written if k[2]}
            for mid in sorted(member_ids):
                m = group.members.get(mid)
                if m is not None:
                    want.update(member_image(group, m))
                else:
                    want.update((k, None) for k in member_keys(gid, mid) if k in written)
            records = tuple((k, v) for k, v in want.items() if written.get(k) != v)
            if not records:
                continue
            for k, v in records:
                if v is None:
                    written.pop(k, None)
                else:
                    written[k] = v
            self._out.persist.append(GroupRecords(gid, records))

    def load_consumer_groups(
        self, records: dict[str, dict[RecordKey, dict]], now: int
    ) -> list[str]:
        """This broker became the coordinator of these groups (it leads their offsets
        partition): rebuild each from its newest records. Members keep their epochs and
        assignments; their sessions (and a revocation under way) restart from now, as
        Kafka gives every member a full session timeout after a failover. Returns the
        groups rebuilt."""
        self._now = now
        loaded = []
        for gid, recs in sorted(records.items()):
            if gid in self.consumer_groups or gid in self.groups:
                continue  # already here (the partition was not unloaded in between)
            classic = recs.get(classic_key(gid))
            if classic is not None:
                self._load_classic(rebuild_classic(gid, classic), recs)
                loaded.append(gid)
                continue
            group = rebuild(gid, recs)
            if group is None:
                continue
            self.consumer_groups[gid] = group
            self._persisted[gid] = dict(recs)
            self._restored.add(gid)
            loaded.append(gid)
            for m in group.members.values():
                self._arm(TimerKey(CONSUMER_SESSION, gid, m.member_id), self._session_ms(m))
                if m.state == UNREVOKED:
                    self._arm(TimerKey(REVOCATION, gid, m.member_id), m.rebalance_timeout_ms)
            self._event(gid, "", f"loaded: epoch {group.epoch}, {len(group.members)} members")
        return loaded

    def assignment_unsent(self, group_id: str, member_id: str) -> None:
        """The member's last answer was not delivered (its records were not written):
        the next one carries its whole assignment."""
        group = self.consumer_groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is not None:
            member.last_sent = None

    def _load_classic(self, group: ClassicGroup, recs: dict[RecordKey, dict]) -> None:
        """A classic group as last written: Stable (its members heartbeat on with their
        generation, each with a full session from now) or Empty."""
        gid = group.group_id
        self.groups[gid] = group
        self._persisted[gid] = dict(recs)
        if not group.members:
            self._empty_since[gid] = self._now
        for m in group.members.values():
            self._arm(TimerKey(HEARTBEAT, gid, m.member_id), m.session_timeout_ms)
        self._event(gid, "", f"loaded: generation {group.generation}, {len(group.members)} members")

    # -- empty groups whose offsets expired ----------------------------------------------

    def empty_groups(self) -> dict[str, int | None]:
        """Groups with no member, whose offsets may expire: group id -> since when it has
        been empty here, which is when its offsets' retention starts (Kafka's classic
        groups: the state timestamp), or None: from each commit's time (Kafka's KIP-848
        groups and simple groups; a classic group whose emptying was not seen here)."""
        out: dict[str, int | None] = {}
        for gid in {*self._offsets.group_ids(), *self.groups, *self.consumer_groups}:
            cg = self.consumer_groups.get(gid)
            g = self.groups.get(gid)
            if (cg is not None and cg.members) or (g is not None and (g.members or g.pending_join)):
                continue
            out[gid] = self._empty_since.get(gid) if g is not None else None
        return out

    def empty_since(self, group_id: str, since: int) -> None:
        """The Empty classic group became empty at `since` (this machine's time; the
        shell learns it from the group's record after a move)."""
        g = self.groups.get(group_id)
        if g is not None and not g.members:
            self._empty_since[group_id] = since

    def subscribed_topics(self) -> dict[str, frozenset[str]]:
        """KIP-848 groups with members: the topics they subscribe to (names and what
        their expressions match). Kafka expires such a group's offsets of other topics
        by commit time; these never expire while it has members."""
        return {
            gid: frozenset(n for m in g.members.values() for n in g.subscribed_names(m))
            for gid, g in self.consumer_groups.items()
            # Not before every expression was matched (a group just loaded), to be safe.
            if g.members
            and all(
                m.subscribed_regex in g.regex_matches
                for m in g.members.values()
                if m.subscribed_regex is not None
            )
        }

    def remove_expired(self, group_id: str, now: int) -> None:
        """The empty group's offsets are all gone (expired): remove it, as Kafka does,
        and delete its records."""
        self._now = now
        cg = self.consumer_groups.get(group_id)
        g = self.groups.get(group_id)
        if (cg is not None and cg.members) or (g is not None and (g.members or g.pending_join)):
            return
        if cg is not None:
            self._drop_consumer_group(cg, tombstones=True)
        if g is not None:
            self._drop_group(g, tombstones=True)
        self._empty_since.pop(group_id, None)
        self._event(group_id, "", "removed: empty and its offsets expired")

    # -- helpers --------------------------------------------------------------------------

    def _event(self, group_id: str, member_id: str, what: str) -> None:
        self._out.events.append(GroupEvent(group_id, member_id, what))

    def _arm(self, key: TimerKey, after_ms: int) -> None:
        deadline = self._now + after_ms
        self._timers[key] = deadline
        self._out.timers.append(TimerSet(key, deadline))

    def _cancel(self, key: TimerKey) -> None:
        if self._timers.pop(key, None) is not None:
            self._out.timers.append(TimerCancel(key))

    def _reply_join(self, handle: int, error: int, member_id: str) -> None:
        self._out.replies.append(Reply(handle, JoinResponse(error, member_id)))

    def _reply_sync(self, handle: int, error: int) -> None:
        self._out.replies.append(Reply(handle, SyncResponse(error)))

    def _new_uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self._rng.getrandbits(128), version=4)

    @staticmethod
    def _rebalance_timeout(req: JoinRequest) -> int:
        # JoinGroup v0 has no rebalance timeout: the session timeout stands in.
        return req.rebalance_timeout_ms if req.rebalance_timeout_ms > 0 else req.session_timeout_ms


_HELD_BEFORE = ""  # the owner of a partition during a hold: a member from before (no id)


def _differs(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current


def _consumer_error(code: int, message: str | None) -> ConsumerHeartbeatResponse:
    return ConsumerHeartbeatResponse(code, message, None, -1)


def _owned(
    owned: tuple[tuple[uuid.UUID, tuple[int, ...]], ...] | None,
) -> frozenset[TopicPartition] | None:
    if owned is None:
        return None
    return frozenset((t, p) for t, parts in owned for p in parts)


def _by_topic(tps: frozenset[TopicPartition]) -> dict[uuid.UUID, tuple[int, ...]]:
    out: dict[uuid.UUID, list[int]] = {}
    for t, p in tps:
        out.setdefault(t, []).append(p)
    return {t: tuple(sorted(ps)) for t, ps in sorted(out.items(), key=lambda kv: str(kv[0]))}


def _topic_ids(
    by_name: dict[str, tuple[int, ...]], topics: TopicsView
) -> frozenset[TopicPartition]:
    """{topic name: partitions} of the consumer protocol as (topic id, partition), for
    the topics and partitions that exist."""
    out: set[TopicPartition] = set()
    for name, parts in by_name.items():
        t = topics.topic(name)
        if t is not None:
            out.update((t[0], p) for p in parts if 0 <= p < t[1])
    return frozenset(out)
