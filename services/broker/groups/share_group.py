"""Share groups' membership (KIP-932) on the group coordinator, as a sans-IO state machine.

ShareGroupHeartbeat in, answers out; the caller passes the time in milliseconds and a
view of the topics. Like Kafka's share groups:

- A member names its own id (a UUID the client makes) and joins with epoch 0, leaves
  with epoch -1; any other epoch must be the member's current one, else
  FENCED_MEMBER_EPOCH; an id the group does not know gets UNKNOWN_MEMBER_ID.
- The group epoch moves on every change of members or of their subscribed topics'
  partitions; the target assignment is recomputed then, and a member takes it (with the
  group's epoch as its member epoch) at its next heartbeat. There is no revocation
  handshake: partitions are shared, not owned.
- Assignment (Kafka's "simple" assignor in spirit): every partition of the subscribed
  topics to at least one member and every member at least one partition, round-robin
  over sorted members and partitions; with more members than partitions, several
  members share one.
- A member that sends no heartbeat within the session timeout is removed (checked at
  every call, so no timer is needed: `expire(now)` may also be called from a tick).

Membership is held in memory by the coordinator: after a coordinator move members get
UNKNOWN_MEMBER_ID and join again with the same id (the share-partition state on the
partition leaders, which is what delivery depends on, is not affected).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Protocol

from kio.schema.errors import ErrorCode

from ..config import DEFAULTS

JOIN_EPOCH = 0
LEAVE_EPOCH = -1


class TopicsView(Protocol):
    def topic(self, name: str) -> tuple[uuid.UUID, int] | None:
        """(topic id, partition count), or None if there is no such topic."""


@dataclass(frozen=True, slots=True)
class ShareSettings:
    """Declared once, in BrokerConfig: the defaults come from there."""

    session_timeout_ms: int = DEFAULTS.group_share_session_timeout_ms
    heartbeat_interval_ms: int = DEFAULTS.group_share_heartbeat_interval_ms
    max_size: int = 200  # group.share.max.size


@dataclass(slots=True)
class ShareMember:
    member_id: str
    epoch: int
    client_id: str
    client_host: str
    rack_id: str | None
    subscribed: tuple[str, ...]
    deadline: int
    assignment: dict[uuid.UUID, tuple[int, ...]] = field(default_factory=dict)


@dataclass(slots=True)
class ShareGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    target: dict[str, dict[uuid.UUID, tuple[int, ...]]] = field(default_factory=dict)
    # (topic name, topic id, partitions) of every subscribed topic when last assigned.
    topics: tuple[tuple[str, uuid.UUID, int], ...] = ()

    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        return "Stable"  # no reconciliation to wait for: members take the target at once


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    error: int
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: dict[uuid.UUID, tuple[int, ...]] | None = None


def assign(
    members: list[str], partitions: list[tuple[uuid.UUID, int]]
) -> dict[str, dict[uuid.UUID, tuple[int, ...]]]:
    """Every partition to at least one member, every member at least one partition."""
    out: dict[str, dict[uuid.UUID, list[int]]] = {m: {} for m in members}
    if members and partitions:
        for i in range(max(len(members), len(partitions))):
            tid, p = partitions[i % len(partitions)]
            parts = out[members[i % len(members)]].setdefault(tid, [])
            if p not in parts:
                parts.append(p)
    return {m: {t: tuple(sorted(ps)) for t, ps in a.items()} for m, a in out.items()}


class ShareGroupStateMachine:
    def __init__(self, settings: ShareSettings) -> None:
        self.settings = settings
        self.groups: dict[str, ShareGroup] = {}
        # (group, member) of every member that left or was expired since the shell last
        # took them (`take_removed`): the shell releases what they hold on this broker.
        self.removed: list[tuple[str, str]] = []

    def take_removed(self) -> list[tuple[str, str]]:
        out, self.removed = self.removed, []
        return out

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        rack_id: str | None,
        subscribed: tuple[str, ...] | None,
        client_id: str,
        client_host: str,
        topics: TopicsView,
        now: int,
    ) -> HeartbeatAnswer:
        if not group_id:
            return HeartbeatAnswer(ErrorCode.invalid_request, "GroupId can't be empty.")
        if not member_id:
            return HeartbeatAnswer(ErrorCode.invalid_request, "MemberId can't be empty.")
        if member_epoch < LEAVE_EPOCH:
            return HeartbeatAnswer(ErrorCode.invalid_request, "MemberEpoch is invalid.")
        if member_epoch == JOIN_EPOCH and not subscribed:
            return HeartbeatAnswer(
                ErrorCode.invalid_request, "SubscribedTopicNames must be set in first request."
            )
        self.expire(now)
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member_epoch == LEAVE_EPOCH:
            if group is None or member is None:
                return HeartbeatAnswer(
                    ErrorCode.unknown_member_id, f"member {member_id} is not in group {group_id}"
                )
            self._remove(group, member_id, topics)
            return HeartbeatAnswer(0, None, member_id, LEAVE_EPOCH)
        if group is None or member is None:  # no group: no member either
            if member_epoch != JOIN_EPOCH:
                return HeartbeatAnswer(
                    ErrorCode.unknown_member_id, f"member {member_id} is not in group {group_id}"
                )
            if group is None:
                group = self.groups[group_id] = ShareGroup(group_id)
            if len(group.members) >= self.settings.max_size:
                return HeartbeatAnswer(
                    ErrorCode.group_max_size_reached,
                    f"group {group_id} has reached its maximum size",
                )
            member = ShareMember(
                member_id, 0, client_id, client_host, rack_id, tuple(subscribed or ()), now
            )
            group.members[member_id] = member
            group.epoch += 1
        elif member_epoch != member.epoch and member_epoch != JOIN_EPOCH:
            return HeartbeatAnswer(
                ErrorCode.fenced_member_epoch,
                f"member epoch {member_epoch} is not the current {member.epoch}",
            )
        else:
            if member_epoch == JOIN_EPOCH:
                member.epoch = 0  # a rejoin with the same id: send it everything again
            if subscribed is not None and tuple(subscribed) != member.subscribed:
                member.subscribed = tuple(subscribed)
                group.epoch += 1
            if rack_id is not None:
                member.rack_id = rack_id
        member.deadline = now + self.settings.session_timeout_ms
        self._refresh(group, topics)
        answer_assignment = None
        if member.epoch != group.assignment_epoch:
            member.epoch = group.assignment_epoch
            member.assignment = group.target.get(member_id, {})
            answer_assignment = member.assignment
        return HeartbeatAnswer(
            0,
            None,
            member_id,
            member.epoch,
            self.settings.heartbeat_interval_ms,
            answer_assignment,
        )

    def expire(self, now: int) -> list[tuple[str, str]]:
        """Remove members whose session timed out; (group, member) of each."""
        gone = []
        for group in list(self.groups.values()):
            for m in [m for m in group.members.values() if m.deadline <= now]:
                del group.members[m.member_id]
                group.target.pop(m.member_id, None)
                group.epoch += 1
                gone.append((group.group_id, m.member_id))
        self.removed += gone
        return gone

    def describe(self, group_id: str) -> ShareGroup | None:
        return self.groups.get(group_id)

    def delete(self, group_id: str) -> int:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.group_id_not_found
        if group.members:
            return ErrorCode.non_empty_group
        del self.groups[group_id]
        return 0

    def _remove(self, group: ShareGroup, member_id: str, topics: TopicsView) -> None:
        del group.members[member_id]
        group.target.pop(member_id, None)
        group.epoch += 1
        self.removed.append((group.group_id, member_id))
        self._refresh(group, topics)

    def _refresh(self, group: ShareGroup, topics: TopicsView) -> None:
        """Recompute the target when members, subscriptions or partitions changed."""
        names = sorted({t for m in group.members.values() for t in m.subscribed})
        seen = []
        for name in names:
            t = topics.topic(name)
            if t is not None:
                seen.append((name, t[0], t[1]))
        seen_t = tuple(seen)
        if seen_t != group.topics:
            group.topics = seen_t
            if group.epoch == group.assignment_epoch:  # one new epoch per change at most
                group.epoch += 1
        if group.assignment_epoch == group.epoch:
            return
        target: dict[str, dict[uuid.UUID, tuple[int, ...]]] = {}
        # Members subscribed to the same topics are assigned together.
        by_subscription: dict[frozenset[str], list[str]] = {}
        for m in sorted(group.members.values(), key=lambda m: m.member_id):
            by_subscription.setdefault(frozenset(m.subscribed), []).append(m.member_id)
        for subs, members in by_subscription.items():
            parts = [(tid, p) for name, tid, n in seen if name in subs for p in range(n)]
            target.update(assign(members, parts))
        group.target = target
        group.assignment_epoch = group.epoch
